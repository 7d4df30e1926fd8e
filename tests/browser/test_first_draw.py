"""A number box shows its value from its first paint, never min_value first (issue 45, item 1), in
Chromium.

Streamlit 1.67's frontend (NumberInput) draws a box that is new to the browser from the
element's default and applies the value set through session state only in an effect after
that paint. Our boxes took their value from session state alone, so their default was
min_value: on every page visit (direct load, sidebar click, Back) every box read "1" for
60-300 ms on the 2-core machine, and a test that read the boxes then saw "1"
(attnmem/pages/ui/widgets.py passes the value as the default too).

A recorder in the page notes each number box's shown value whenever the DOM changes (a
MutationObserver runs after React's commit and before the browser paints it, so a value that
is drawn for one frame is seen, whatever the machine's speed). One tab opens Will it fit?
directly, clicks every other page in the sidebar, then presses Back twice; nothing is edited.
Each box, from its insertion until the page has settled, must show one value only.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
import load_test  # noqa: E402  (server start-up and Chromium flags)
import settle_times  # noqa: E402  (a page has settled: run over, no request, DOM quiet)

from tests.browser.test_navigation import PAGES  # noqa: E402  (sidebar titles and paths)

pytestmark = pytest.mark.browser

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

TIMEOUT_MS = 90_000
QUIET_MS = 500

# Per box (its <input> node), on the page path it was drawn under: the values it showed, in
# order. Recorded on every DOM change; `window.__boxes.take()` returns and clears them.
_RECORD = """
(() => {
  const seen = new Map();  // input node -> {path, label, values}
  const note = () => {
    for (const w of document.querySelectorAll('[data-testid="stNumberInput"]')) {
      const input = w.querySelector('input');
      if (!input) continue;
      const label = ((w.querySelector('label') || {}).innerText || '').trim();
      let r = seen.get(input);
      if (!r || r.path !== location.pathname || r.label !== label) {
        r = {path: location.pathname, label, values: []};
        seen.set(input, r);
        window.__boxes.log.push(r);
      }
      if (r.values[r.values.length - 1] !== input.value) r.values.push(input.value);
    }
  };
  window.__boxes = {log: [], take: () => window.__boxes.log.splice(0)};
  const start = () => new MutationObserver(note).observe(document.documentElement,
      {subtree: true, childList: true, attributes: true, characterData: true});
  if (document.documentElement) start(); else document.addEventListener('readystatechange', start, {once: true});
})();
"""


def _skip_reason() -> str | None:
    if sync_playwright is None:
        return "the playwright Python package is not installed (pip install -r requirements-dev.txt)"
    if not (Path(load_test.CHROMIUM).exists() or shutil.which("chromium")):
        return f"{load_test.CHROMIUM} is missing (apt-get install chromium)"
    return None


def _settle(page: Page, in_flight: set) -> None:
    page.wait_for_selector('[data-testid="stMain"] h1', timeout=TIMEOUT_MS)
    settle_times.settle(page, in_flight, QUIET_MS, timeout_s=TIMEOUT_MS / 1000)


def _flickers(page: Page, how: str) -> list[str]:
    """Boxes that showed more than one value since the last call, described."""
    return [f"{how}: {r['path']} {r['label']!r} showed {' then '.join(map(repr, r['values']))}"
            for r in page.evaluate("() => window.__boxes.take()") if len(r["values"]) > 1]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if (reason := _skip_reason()) is not None:
        pytest.skip(f"browser test skipped: {reason}")
    with load_test.app_server(None) as (url, _pid), sync_playwright() as p:
        exe = load_test.CHROMIUM if Path(load_test.CHROMIUM).exists() else shutil.which("chromium")
        b = p.chromium.launch(executable_path=exe, args=load_test.LAUNCH_ARGS)
        try:
            yield b, url
        finally:
            b.close()


def test_number_boxes_show_their_value_from_the_first_paint(browser: tuple[Any, str]) -> None:
    b, url = browser
    context = b.new_context(viewport={"width": 1280, "height": 800})
    try:
        context.add_init_script(settle_times.WATCH_JS)
        context.add_init_script(_RECORD)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        in_flight = settle_times.track_requests(page)
        problems: list[str] = []
        boxes = 0
        page.goto(f"{url}/{PAGES[0][1]}", wait_until="commit")
        _settle(page, in_flight)
        found = page.evaluate("() => window.__boxes.log.length")
        problems += _flickers(page, "direct load")
        boxes += found
        for title, path in PAGES[1:]:
            page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
            page.wait_for_url(lambda u, p=path: u.split("?")[0].rstrip("/").endswith("/" + p))
            _settle(page, in_flight)
            boxes += page.evaluate("() => window.__boxes.log.length")
            problems += _flickers(page, f"sidebar click to {title!r}")
        for _ in range(2):
            page.go_back()
            _settle(page, in_flight)
            boxes += page.evaluate("() => window.__boxes.log.length")
            problems += _flickers(page, "Back")
    finally:
        context.close()
    assert found > 0 and boxes > 20, f"the recorder saw {boxes} boxes: it is not recording"
    assert not problems, "a number box showed another value before its own: " + "; ".join(problems)
