"""What the pages share, so that a page is its inputs, one calc call and a view.

Pure Python, no streamlit import, tested on their own: URL parsing (``url_state``),
spreadsheet-safe exports (``export``), the one table of implementation labels and colours
(``labels``), the weight-dtype choice and the GPU memory "fits" uses (``weights``), and each
page's logic that is not the model's (``fit``, ``inference``, ``finetune``), and ``traced``:
models outside calc's rules answered by attnmem.trace's meta-device trace (issue 42), with
``traced_training`` for the Training step page's traced step.

Streamlit widgets: URL-bound input state (``state``) and the inputs bound to it (``widgets``),
the GB/GiB switch and byte formatting (``units``), tables (``tables``), charts and their
downloads (``charts``), the measured calls' charts and points table (``measured_calls``),
warnings and notes (``messages``), and the model, weight-dtype and GPU pickers (``pickers``)
with the two model sources they open: a Hugging Face Hub id (``hub_model``) and an uploaded or
pasted config.json (``custom_config``); the view of a traced answer (``traced_view``; a
traced training step: ``traced_training_view``; Model memory's:
``traced_memory_view``; Serving's: ``traced_serving_view``).

What is not the view lives in its room: computation in attnmem.calc (the pages' sweeps and
tables too: ``sweep``, ``cp_sweep``, ``scores``, ``memory_parts``), measured data read back in
attnmem.measure (``reference``, ``speed_runs``, ``ring.results``).

Uploaded config.json files are read within limits by attnmem.calc.config_json, which the
command line shares."""
