"""No request leaves the machine (issue 32, item 5): every page of the app, opened in headless
Chromium, asks only 127.0.0.1 for what it draws (scripts, fonts, icons, the favicon).

Requests to any other host are recorded and refused (so the test never reaches the network,
and a machine without internet behaves the same); each page is loaded and left to settle. The
pages are walked once for this check and the layout check together:
tests/browser/test_layout.py's `walk` fixture records the requests and its
test_no_page_requests_another_host asserts on them with `off_machine` below; this file holds
that rule and its own test.

Streamlit ships its fonts and the Material Symbols icon font in its static files; what it
fetches from fonts.gstatic.com is a favicon given as ":material/<name>:" to
st.set_page_config (its frontend builds a fonts.gstatic.com URL for that one icon).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.browser

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}

def off_machine(url: str) -> bool:
    """True for a request to a host other than this machine (data: and blob: URLs stay)."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https", "ws", "wss") and parts.hostname not in LOOPBACK


def test_off_machine_is_recognised() -> None:
    assert off_machine("https://fonts.gstatic.com/s/i/short-term/x/24px.svg")
    assert off_machine("http://10.0.0.1:8501/")
    assert not off_machine("http://127.0.0.1:8501/static/media/MaterialSymbols.woff2")
    assert not off_machine("ws://localhost:8501/_stcore/stream")
    assert not off_machine("data:image/svg+xml,<svg/>")
