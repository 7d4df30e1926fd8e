"""Layout at a laptop's and a desktop's width (issue 32, item 4): nothing the user reads is cut off.

Every page of app.py is loaded in headless Chromium at 1280×800 and 1920×1080 (every expander
opened) and the DOM is searched for text that does not fit its box (scrollWidth > clientWidth
+ 1): any element Streamlit ellipsizes (text-overflow: ellipsis: widget labels
`stWidgetLabel`, metric labels `stMetricLabel`, checkbox labels, page links, multiselect
chips), a selectbox's shown value (an <input> that clips), a multiselect's chip row that
scrolls sideways, and an HTML table (st.table) that scrolls sideways in its box (a "wide
table"). st.dataframe draws on a canvas (glide data grid), so its cells cannot be read here:
the pages give their tables column widths that fit the content instead
(attnmem/pages/ui/tables.fit_widths), and a grid whose columns together are wider than its container
(its scroller's scrollWidth > clientWidth: the table scrolls sideways, its right-hand columns
out of view) is reported as a "wide table", named by its column headers.

The same walk of the pages records every request the browser makes, off-machine ones refused,
for tests/browser/test_offline.py's check (issue 32, item 5): one app server, one browser and
one run of each page serve both checks.

With SAVE_SCREENSHOTS=1 each page is saved, whole, per width to
docs/screenshots/layout/<page>_<width>.png:

    SAVE_SCREENSHOTS=1 .venv/bin/python -m pytest -m browser tests/browser/test_layout.py
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from attnmem.pages.ui.tables import CHAR_WIDTHS
from tests.browser.test_offline import off_machine
from tests.browser.test_pages_in_chromium import CHROMIUM, LAUNCH_ARGS, TIMEOUT_MS, _app_server

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import settle_times  # noqa: E402  (when a page has settled: the screenshots script's rule)

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "screenshots" / "layout"
SAVE = os.environ.get("SAVE_SCREENSHOTS") == "1"
SIZES = ((1280, 800), (1920, 1080))
QUIET_MS = 500

try:
    from playwright.sync_api import Page, sync_playwright
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # pragma: no cover - the import above already skips the module
    sync_playwright = None


def pages() -> list[tuple[str, str]]:
    """(url path, file name) of every page in app.py's st.Page list; the default page is at "/"."""
    found = re.findall(r'st\.Page\("attnmem/pages/(\w+)\.py"[^)]*url_path="([^"]+)"(, default=True)?',
                       (ROOT / "app.py").read_text())
    assert found, "app.py lists no st.Page url_path"
    return [("" if default else path, name) for name, path, default in found]


#: Text cut off by its box, as [test id of the nearest ancestor that has one, text, widths].
CUT_OFF_JS = r"""
() => {
  const roots = [...document.querySelectorAll('[data-testid="stMain"], [data-testid="stSidebar"]')];
  const cut = [];
  const testId = el => { for (let p = el; p; p = p.parentElement) {
    const t = p.getAttribute && p.getAttribute('data-testid'); if (t) return t; } return ''; };
  const check = (el, why) => {
    if (el.clientWidth <= 2 || el.scrollWidth <= el.clientWidth + 1) return;  // fits (or a 1 px a11y node)
    if (el.closest('.js-plotly-plot, [data-testid="stDataFrame"], .katex')) return;
    const text = (el.value !== undefined && el.tagName === 'INPUT' ? el.value : el.innerText) || '';
    cut.push([testId(el), why, text.replace(/\s+/g, ' ').slice(0, 80), el.scrollWidth, el.clientWidth]);
  };
  for (const root of roots) {
    for (const el of root.querySelectorAll('*')) {
      if (getComputedStyle(el).textOverflow === 'ellipsis') check(el, 'ellipsis');
    }
    root.querySelectorAll('[data-testid="stWidgetLabel"] p, [data-testid="stMetricLabel"] p, '
                          + '[data-testid="stMetricValue"] > div')
        .forEach(el => check(el, 'label'));
    root.querySelectorAll('[data-testid="stSelectbox"] input').forEach(el => check(el, 'value'));
    root.querySelectorAll('[data-testid="stMultiSelectTagsContainer"]')
        .forEach(el => check(el, 'chips'));
    // a data grid wider than its container scrolls sideways inside it: its own scroller is
    // wider than what it shows (named by its column headers)
    root.querySelectorAll('[data-testid="stDataFrame"]').forEach(grid => {
      const s = grid.querySelector('.dvn-scroller');
      if (!s || s.clientWidth <= 2 || s.scrollWidth <= s.clientWidth + 1) return;
      const heads = [...grid.querySelectorAll('[role="columnheader"]')].map(h => h.innerText);
      cut.push(['stDataFrame', 'wide table', heads.join(' | ').replace(/\s+/g, ' ').slice(0, 120),
                s.scrollWidth, s.clientWidth]);
    });
    // an HTML table (st.table) wider than its container scrolls sideways in the box around it
    root.querySelectorAll('[data-testid="stTable"] table').forEach(table => {
      const s = table.parentElement;
      if (s.clientWidth <= 2 || s.scrollWidth <= s.clientWidth + 1) return;
      const heads = [...table.querySelectorAll('thead th')].map(h => h.innerText);
      cut.push(['stTable', 'wide table', heads.join(' | ').replace(/\s+/g, ' ').slice(0, 120),
                s.scrollWidth, s.clientWidth]);
    });
  }
  return cut;
}
"""


#: The grid's font (from its CSS variables) and every listed character's width in it, measured
#: with canvas measureText; None when the page has no grid.
GRID_FONT_JS = r"""
(chars) => {
  const grid = document.querySelector('[data-testid="stDataFrame"] [style*="--gdg-font-family"]');
  if (!grid) return null;
  const css = getComputedStyle(grid);
  const fonts = ['--gdg-base-font-style', '--gdg-header-font-style'].map(
    v => css.getPropertyValue(v).trim() + ' ' + css.getPropertyValue('--gdg-font-family').trim());
  const ctx = document.createElement('canvas').getContext('2d');
  const widths = {};
  for (const font of fonts) {
    ctx.font = font;
    for (const ch of chars) widths[ch] = Math.max(widths[ch] || 0, ctx.measureText(ch).width);
  }
  return {fonts, widths, loaded: document.fonts.check(fonts[0])};
}
"""


HEADLINE_SELECTOR = '[data-testid="stMain"] [data-testid="stMetric"]'

#: Where the headline answer (the first number, st.metric, of the main area) ends at the top of
#: the page, as [its label, the bottom of its value in px, the window's height]; null without one.
HEADLINE_JS = r"""
() => {
  const main = document.querySelector('[data-testid="stMain"]');
  const m = main && main.querySelector('[data-testid="stMetric"]');
  if (!m) return null;
  const label = ((m.querySelector('[data-testid="stMetricLabel"]') || {}).innerText || '').trim();
  const value = m.querySelector('[data-testid="stMetricValue"]') || m;
  return [label, Math.ceil(value.getBoundingClientRect().bottom), window.innerHeight];
}
"""


def _settle(page: Page, in_flight: set) -> None:
    """Until the page has settled (scripts/settle_times.settle: its run over, no request in
    flight, no DOM change or long task for QUIET_MS). A fixed wait after the run missed the
    grids of GPU measurement, which are drawn seconds after its script has finished."""
    settle_times.settle(page, in_flight, QUIET_MS, timeout_s=TIMEOUT_MS / 1000)


def _until_headline(page: Page, in_flight: set) -> None:
    """Until the main area shows a number (st.metric), then settled again. A page's run can
    stop changing the page for longer than QUIET_MS before it draws its answer: GPU
    measurement draws its "No GPU here" note first, and its first run on a fresh server
    predicts the bundled reference before the headline (seen on a loaded machine: the walk
    moved on with no number drawn). A page that never draws one is left after TIMEOUT_MS,
    and test_the_headline_answer_is_above_the_fold fails on it."""
    try:
        page.wait_for_selector(HEADLINE_SELECTOR, timeout=TIMEOUT_MS)
    except PlaywrightTimeout:
        return
    _settle(page, in_flight)


def _open_expanders(page: Page, in_flight: set) -> None:
    page.evaluate("""() => document.querySelectorAll(
        '[data-testid="stExpander"] details:not([open]) > summary').forEach(s => s.click())""")
    _settle(page, in_flight)  # what an expander holds is drawn when it opens


def _screenshot(page: Page, name: str, width: int, height: int) -> None:
    """The whole page: Streamlit scrolls inside stMain, so the viewport is made as tall as it."""
    tall = page.evaluate(
        "() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": width, "height": min(max(tall, height), 8000)})
    page.wait_for_timeout(1000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}_{width}.png"))
    page.set_viewport_size({"width": width, "height": height})


def _relaid_out(page: Page) -> None:
    """Two animation frames: the browser has applied a viewport change's layout."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


#: off_machine as a pattern for context.route: Playwright matches a pattern in its driver, so
#: only the requests it refuses come back to Python; a Python predicate as the matcher made
#: every request of the walk (scripts, fonts, each page's messages) wait on a round trip to
#: this process (about 1 s per page on the 2-core machine). Held to off_machine by
#: test_the_route_pattern_is_off_machine; WebSockets are not routed (only recorded).
OFF_MACHINE_RE = re.compile(r"^(?:https?|wss?)://(?!(?:127\.0\.0\.1|localhost|\[::1\])(?:[:/?#]|$))")


@dataclass
class Walk:
    """What one walk over every page saw: the text cut off per size and page, the off-machine
    requests per page (refused), and how many requests went to this machine."""

    cut: dict[tuple[int, int], dict[str, list]] = field(default_factory=dict)
    external: dict[str, set[str]] = field(default_factory=dict)
    loopback_requests: int = 0
    grid_font: dict | None = None
    headline: dict[str, list | None] = field(default_factory=dict)  # page -> HEADLINE_JS at 1280x800


@pytest.fixture(scope="module")
def walk() -> Walk:
    """Each page is loaded and run ONCE, then checked at every size in turn (the viewport is
    resized in place). The pages draw nothing from the window's width on the server (no script
    reads it), so a resize reflows the same DOM exactly as a load at that size would lay it
    out. Requests to other hosts are recorded and refused (the test never reaches the
    network); a page counts as loaded once its run is over and the network is idle."""
    seen = Walk(cut={size: {} for size in SIZES})
    current = [""]

    def record(request) -> None:
        if off_machine(request.url):
            seen.external.setdefault(current[0], set()).add(request.url[:160])
        else:
            seen.loopback_requests += 1

    with _app_server() as url, sync_playwright() as p:
        exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=exe, args=LAUNCH_ARGS)
        try:
            context = browser.new_context(
                viewport={"width": SIZES[0][0], "height": SIZES[0][1]})
            context.route(OFF_MACHINE_RE, lambda route: route.abort())
            context.add_init_script(settle_times.WATCH_JS)
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.on("request", record)
            in_flight = settle_times.track_requests(page)
            for path, name in pages():
                current[0] = path
                page.set_viewport_size({"width": SIZES[0][0], "height": SIZES[0][1]})
                page.goto(f"{url}/{path}", wait_until="domcontentloaded")
                _settle(page, in_flight)
                _until_headline(page, in_flight)
                seen.headline[name] = page.evaluate(HEADLINE_JS)  # as opened: not scrolled
                _open_expanders(page, in_flight)
                if seen.grid_font is None:
                    seen.grid_font = page.evaluate(GRID_FONT_JS, "".join(CHAR_WIDTHS))
                for width, height in SIZES:
                    page.set_viewport_size({"width": width, "height": height})
                    _relaid_out(page)
                    cut = page.evaluate(CUT_OFF_JS)
                    if cut:  # maybe a layout mid-draw (seen once on a loaded machine): again
                        _settle(page, in_flight)
                        cut = page.evaluate(CUT_OFF_JS)
                    if cut:
                        seen.cut[(width, height)][name] = cut
                    if SAVE:
                        _screenshot(page, name, width, height)
        finally:
            browser.close()
    return seen


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}px" for w, _ in SIZES])
def test_nothing_is_cut_off(walk: Walk, size: tuple[int, int]) -> None:
    cut = {name: found for name, found in walk.cut[size].items() if found}
    assert not cut, f"cut off at {size[0]} px ([test id, how, text, needed px, shown px]): {cut}"


def test_column_widths_hold_the_grid_font(walk: Walk) -> None:
    """attnmem.pages.ui.tables.fit_widths sizes a column from CHAR_WIDTHS: no character may be wider in
    the font the grid draws with than listed there, or a cell that was given its width would
    be cut off (the grid draws on a canvas, so test_nothing_is_cut_off cannot see it)."""
    font = walk.grid_font
    assert font is not None, "no page drew an st.dataframe grid"
    assert font["loaded"], f"the grid's font is not loaded (a fallback font is wider): {font['fonts']}"
    wider = {ch: (round(px, 2), CHAR_WIDTHS[ch]) for ch, px in font["widths"].items()
             if px > CHAR_WIDTHS[ch] + 1e-6}
    assert not wider, f"wider in {font['fonts']} than attnmem.pages.ui.tables.CHAR_WIDTHS ([measured, listed] px): {wider}"


def test_no_page_requests_another_host(walk: Walk) -> None:
    """Every page loaded (expanders opened); none of the requests the browser made may leave
    127.0.0.1 (tests/browser/test_offline.py: why, and what the check counts as off-machine)."""
    assert walk.loopback_requests > len(pages())  # the recorder saw the app's own requests
    assert not walk.external, f"requests that left the machine, by page: {walk.external}"


@pytest.mark.parametrize("name", [name for _, name in pages()])
def test_the_headline_answer_is_above_the_fold(walk: Walk, name: str) -> None:
    """Issue 45, item 2: at 1280x800, as a page opens, its first number (fits or not, the peak,
    the longest context) is on screen without scrolling. Every page, none excused: each draws
    its answer in a container under the title's paragraph, before its inputs."""
    assert SIZES[0] == (1280, 800)
    found = walk.headline[name]
    assert found is not None, f"{name}: no headline number (st.metric) in the main area"
    label, bottom, window = found
    assert bottom <= window, f"{name}: {label!r} ends at {bottom} px, below the {window} px window"


@pytest.mark.parametrize("url", [
    "https://fonts.gstatic.com/s/i/short-term/x/24px.svg", "http://10.0.0.1:8501/",
    "http://127.0.0.1.example.com/", "https://localhost.example.com:8501/x",
    "http://127.0.0.1:8501/static/media/MaterialSymbols.woff2", "http://127.0.0.1/",
    "ws://localhost:8501/_stcore/stream", "http://[::1]:8501/", "http://localhost",
    "data:image/svg+xml,<svg/>", "blob:http://127.0.0.1:8501/1234"])
def test_the_route_pattern_is_off_machine(url: str) -> None:
    """The walk refuses with OFF_MACHINE_RE what test_offline's off_machine calls off-machine."""
    assert bool(OFF_MACHINE_RE.search(url)) == off_machine(url), url
