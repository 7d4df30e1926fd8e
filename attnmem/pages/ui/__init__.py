"""UI helpers the pages share, pure Python and tested on their own: URL state (``url_state``),
spreadsheet-safe exports (``export``) and the one table of implementation labels and colours
(``labels``). No streamlit import here. Uploaded config.json files are read within limits by
attnmem.calc.config_json, which the command line shares."""
