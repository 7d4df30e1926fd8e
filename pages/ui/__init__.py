"""UI helpers the pages share, pure Python and tested on their own: URL state (``url_state``),
bounded parsing of uploaded files (``uploads``), spreadsheet-safe exports (``export``) and the one
table of implementation labels and colours (``labels``). No streamlit import here."""
