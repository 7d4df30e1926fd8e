"""The browser side of navigation: a small script app.py adds to every run (Streamlit widget).

Two faults of Streamlit's frontend (1.67) that the pages cannot fix from Python (issue 45):
every URL write of a page pushed a history entry, so Back took 2-3 presses and first landed
on an entry without the page's inputs; and a sidebar click made while a number box still
held un-Entered text, or just after an edit, lost either the page switch or the edit, because
the frontend sent the edit after the switch. nav_guard.js (beside this file) replaces
same-page history pushes and holds such a click until the edit's run is over.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import streamlit as st

_SCRIPT = Path(__file__).with_name("nav_guard.js")


@cache
def _script() -> str:
    return f"<script>{_SCRIPT.read_text()}</script>"


def nav_guard() -> None:
    """Add the guard to this run's page (it installs itself once per browser tab)."""
    st.html(_script(), unsafe_allow_javascript=True)
