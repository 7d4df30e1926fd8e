"""Entry point: page config, navigation and the shared sidebar. No math here: the pages call calc/ (NOTES.md, "Layout").

Run with `make app` (or `.venv/bin/python -m streamlit run app.py`). Every page is also a
script of its own (pages/*.py), so tests can run each with streamlit.testing.v1.AppTest.
"""

from __future__ import annotations

import streamlit as st

from pages.common import unit_switch

st.set_page_config(page_title="Attention memory", page_icon="🧮", layout="wide")

PAGES = [
    st.Page("pages/will_it_fit.py", title="Will it fit?", icon=":material/check_circle:", url_path="will_it_fit"),
    st.Page("pages/score_matrix.py", title="Score matrix", icon=":material/grid_on:", url_path="score_matrix", default=True),
    st.Page("pages/model_memory.py", title="Model memory", icon=":material/memory:", url_path="model_memory"),
    st.Page("pages/inference.py", title="Inference", icon=":material/output:", url_path="inference"),
    st.Page("pages/serving.py", title="Serving", icon=":material/dns:", url_path="serving"),
    st.Page("pages/training.py", title="Training step", icon=":material/model_training:", url_path="training"),
    st.Page("pages/scaling.py", title="Scaling", icon=":material/show_chart:", url_path="scaling"),
    st.Page("pages/flash_explainer.py", title="How FlashAttention works", icon=":material/bolt:", url_path="flash_explainer"),
    st.Page("pages/many_gpus.py", title="Many GPUs", icon=":material/hub:", url_path="many_gpus"),
    st.Page("pages/measure.py", title="GPU measurement", icon=":material/science:", url_path="measure"),
    st.Page("pages/kernel_speed.py", title="Kernel speed", icon=":material/speed:", url_path="kernel_speed"),
]

# url_path = file name: a deep link's first run on a fresh server is handed from Streamlit's old
# multipage mode back to this router by page hash (see pages/common.page_setup).
page = st.navigation(PAGES, position="sidebar")
with st.sidebar:
    unit_switch()
    st.caption(
        "Numbers marked *computed* come from the analytic model (formula cited beside them); "
        "*measured* ones from real GPU runs. Every input is in the URL: copy it to share the view."
    )
page.run()
