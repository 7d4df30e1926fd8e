"""No request leaves the machine (issue 32, item 5): every page of the app, opened in headless
Chromium, asks only 127.0.0.1 for what it draws (scripts, fonts, icons, the favicon).

Requests to any other host are recorded and refused (so the test never reaches the network,
and a machine without internet behaves the same); each page is loaded and left to settle.
Streamlit ships its fonts and the Material Symbols icon font in its static files; what it
fetches from fonts.gstatic.com is a favicon given as ":material/<name>:" to
st.set_page_config (its frontend builds a fonts.gstatic.com URL for that one icon).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.browser.test_pages_in_chromium import CHROMIUM, LAUNCH_ARGS, TIMEOUT_MS, _app_server

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the import above already skips the module
    sync_playwright = None


def page_paths() -> list[str]:
    """Every page's URL path, read from app.py's st.Page(..., url_path=...) list; the default
    page is served at "/" (its url_path is reserved, not served)."""
    found = re.findall(r'url_path="([^"]+)"(, default=True)?', (ROOT / "app.py").read_text())
    assert found, "app.py lists no st.Page url_path"
    return ["" if default else path for path, default in found]


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


def test_no_page_requests_another_host() -> None:
    """Load every page; record each request the browser makes; none may leave 127.0.0.1."""
    external: dict[str, set[str]] = {}
    loopback_requests = 0
    with _app_server() as url, sync_playwright() as p:
        exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=exe, args=LAUNCH_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            # refuse (and so never send) anything off the machine; the request is recorded
            context.route(lambda u: off_machine(u), lambda route: route.abort())
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            current = [""]

            def record(request) -> None:
                nonlocal loopback_requests
                if off_machine(request.url):
                    external.setdefault(current[0], set()).add(request.url[:160])
                else:
                    loopback_requests += 1

            page.on("request", record)
            for path in page_paths():
                current[0] = path
                page.goto(f"{url}/{path}", wait_until="domcontentloaded")
                page.wait_for_selector('[data-testid="stMain"]', timeout=TIMEOUT_MS)
                page.wait_for_timeout(500)
                page.wait_for_function(
                    "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')",
                    timeout=TIMEOUT_MS)
                page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)
        finally:
            browser.close()
    assert loopback_requests > len(page_paths())  # the recorder saw the app's own requests
    assert not external, f"requests that left the machine, by page: {external}"
