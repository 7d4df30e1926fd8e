"""Entry point: page config, navigation and the shared sidebar. No math here: the pages call attnmem/calc/ (NOTES.md, "Layout").

Run with `make app` (or `.venv/bin/python -m streamlit run app.py`). Every page is also a
script of its own (attnmem/pages/*.py), so tests can run each with streamlit.testing.v1.AppTest.
"""

from __future__ import annotations

import streamlit as st

from attnmem.pages.ui.navigation import nav_guard
from attnmem.pages.ui.units import unit_switch

st.set_page_config(page_title="Attention memory", page_icon="🧮", layout="wide")

#: Where Will it fit? was served before it became the root page (links made then use it).
OLD_WILL_IT_FIT = "will_it_fit"
PAGES = [
    st.Page("attnmem/pages/will_it_fit.py", title="Will it fit?", icon=":material/check_circle:", url_path="home", default=True),
    st.Page("attnmem/pages/score_matrix.py", title="Score matrix", icon=":material/grid_on:", url_path="score_matrix"),
    st.Page("attnmem/pages/model_memory.py", title="Model memory", icon=":material/memory:", url_path="model_memory"),
    st.Page("attnmem/pages/inference.py", title="Inference", icon=":material/output:", url_path="inference"),
    st.Page("attnmem/pages/serving.py", title="Serving", icon=":material/dns:", url_path="serving"),
    st.Page("attnmem/pages/training.py", title="Training step", icon=":material/model_training:", url_path="training"),
    st.Page("attnmem/pages/scaling.py", title="Scaling", icon=":material/show_chart:", url_path="scaling"),
    st.Page("attnmem/pages/flash_explainer.py", title="How FlashAttention works", icon=":material/bolt:", url_path="flash_explainer"),
    st.Page("attnmem/pages/many_gpus.py", title="Many GPUs", icon=":material/hub:", url_path="many_gpus"),
    st.Page("attnmem/pages/measure.py", title="GPU measurement", icon=":material/science:", url_path="measure"),
    st.Page("attnmem/pages/kernel_speed.py", title="Kernel speed", icon=":material/speed:", url_path="kernel_speed"),
]

# The URL parameters of the Score-matrix page (attnmem/pages/score_matrix.py SPECS; tests/app/
# test_landing.py checks that they are the same).
SCORE_KEYS = frozenset({"b", "h", "s", "dtype", "e"})
_LANDED = "_landed"  # session state: the session's first run is over


def score_matrix_link(query: dict[str, str]) -> bool:
    """True for a link to "/" made while Score matrix was the app's root page: it names at least
    one input and only Score-matrix inputs (and the unit). A link Will it fit? writes always
    names its model, GPU and task (attnmem.pages.ui.state.sync_url writes every input), so it is never
    taken for one."""
    keys = set(query) - {"unit"}
    return bool(keys) and keys <= SCORE_KEYS


def _old_will_it_fit_link() -> None:
    """/will_it_fit, where Will it fit? was served before it became the root page: the same
    view at "/"."""
    st.switch_page(PAGES[0], query_params=st.query_params.to_dict())


# url_path = file name, so a page's address names its file. Will it fit? is
# the default page, served at "/"; Streamlit ignores a default page's url_path but reserves it, so
# it is "home", and its old address /will_it_fit stays valid through a hidden page.
page = st.navigation(
    [*PAGES, st.Page(_old_will_it_fit_link, title="Will it fit?", url_path=OLD_WILL_IT_FIT,
                     visibility="hidden")],
    position="sidebar")
if not st.session_state.get(_LANDED):
    # Only a session's first run (a link being opened): later runs at "/" are Will it fit?'s
    # own, and a page switched away from mid-run may still write its parameters into the URL.
    st.session_state[_LANDED] = True
    if page is PAGES[0] and score_matrix_link(st.query_params.to_dict()):
        st.switch_page(PAGES[1], query_params=st.query_params.to_dict())
with st.sidebar:
    nav_guard()  # first, before any URL write: one history entry per page visit
    unit_switch()
    st.caption(
        "Numbers marked *computed* come from the analytic model (formula cited beside them); "
        "*measured* ones from real GPU runs. Every input is in the URL: copy it to share the view."
    )
page.run()
