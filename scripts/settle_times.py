"""How long each page takes to settle after a direct load in Chromium (issue 32: within 2 s).

Starts the app on a free port of 127.0.0.1 (or uses --url), then loads every page app.py lists
--repeat times, each load a new tab (a new document: the page's JavaScript starts from nothing).
Two kinds of browser, reported side by side:

- cold: a fresh browser profile per load (empty HTTP cache, no compiled-code cache): a first
  visit to the app;
- warm: one profile kept across the loads, after one visit to Score matrix (whose chart and
  table load Streamlit's plotly and data-grid bundles once): what a returning user has. The
  bundles are content-hashed and served "immutable, max-age=1 year" by Streamlit's static
  route, so a real browser does not fetch them again.

The clock is the page's own (performance.now(), 0 at the navigation). A script injected before
the page's own records the last change to the page (a DOM mutation, observed by a
MutationObserver) and the end of the last long task (PerformanceObserver "longtask": a main
thread busy for 50 ms or more, e.g. evaluating a bundle or drawing a chart). The page has
settled at the last such moment once a number or message is on the page, Streamlit's running
indicator (stStatusWidget) is gone, no request is in flight and nothing has changed for
--quiet-ms. Also reported: the first number (the first metric value or message drawn).
Debian's chromium through Playwright, headless, loopback only; a measurement, not a test.

With --in-app, each page is also reached the way a user moves through the app: in a new tab,
Score matrix (Scaling, when Score matrix is the page measured) is loaded and left to settle,
then the page's link in the sidebar is clicked. Streamlit switches pages inside the same
document (the script checks it), so plotly.js and the data grid's bundle, which the first
page evaluated, are not evaluated again. Reported: seconds from the click until the page has
settled by the rule above, for the cold and the warm browser.

With --floor, the same is measured for one-file apps served alike (FLOOR_APPS), in the same run
and so at the same load: what Streamlit itself costs a direct load with the app's sidebar (a
title and one number), then that plus an HTML table, a data grid (its bundle evaluated, its
canvas drawn), one plotly chart (plotly.js evaluated and the chart drawn: the cost every page
with a chart pays), a chart and a table, a chart and a grid. A page cannot settle sooner than
the floor of the element kinds it draws.

With --compare DIR, a second copy of the app (a checkout of another commit) is served beside
this one and every load is made from both in turn, so a before/after pair shares the load.

Usage: .venv/bin/python scripts/settle_times.py [--repeat 3] [--in-app] [--floor] [--compare DIR] [--url http://127.0.0.1:8501]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import load_test  # noqa: E402  (the app server and Chromium's flags, shared with the load test)

FIRST = '[data-testid="stMetricValue"], [data-testid="stAlert"]'

#: Injected before the page's scripts: when the page last changed or its main thread was busy.
WATCH_JS = r"""
window.__settle = {last: 0, first: null};
new PerformanceObserver(list => {
  for (const e of list.getEntries())
    window.__settle.last = Math.max(window.__settle.last, e.startTime + e.duration);
}).observe({type: 'longtask', buffered: true});
const watch = () => new MutationObserver(() => {
  const now = performance.now();
  window.__settle.last = Math.max(window.__settle.last, now);
  if (window.__settle.first === null && document.querySelector('FIRST')) window.__settle.first = now;
}).observe(document.documentElement, {subtree: true, childList: true, attributes: true,
                                      characterData: true});
if (document.documentElement) watch(); else document.addEventListener('readystatechange', watch, {once: true});
""".replace("FIRST", FIRST.replace("'", "\\'"))

#: (the page's time now, its last change, its first number, whether Streamlit shows it running).
STATE_JS = """() => [performance.now(), window.__settle.last, window.__settle.first,
                     !!document.querySelector('[data-testid="stStatusWidget"]')]"""


#: The floor apps (--floor): the app's sidebar (a unit switch and a caption, as app.py draws it)
#: and a title and one number; then, each added to that alone, a data grid of 20 rows
#: (st.dataframe: its canvas bundle), the same rows as an HTML table (st.table), one plotly
#: chart as the pages draw theirs (a dict of four lines of 18 points, log x, Streamlit's theme,
#: the pages' toolbar options); then the chart with the HTML table, and with the grid. A page
#: pays the floor of the element kinds it draws. Names sort in that order.
FLOOR_HEAD = """
import streamlit as st
st.set_page_config(page_title="floor", layout="wide")
with st.sidebar:
    st.radio("Memory unit", ["GB", "GiB"], horizontal=True)
    st.caption("The sidebar of the app, without its page links.")
st.title("Floor")
st.markdown("A title, a sentence and one number: what every page draws first.")
st.metric("a number", "17.18 GB")
"""
FLOOR_CHART = """
xs = [128 * 2 ** i for i in range(18)]
traces = [dict(type="scatter", mode="lines+markers", name=f"line {k}", x=xs,
               y=[(k + 1) * x * 1e-6 for x in xs]) for k in range(4)]
st.plotly_chart({"data": traces, "layout": {"height": 430, "xaxis": {"type": "log"}}},
                theme="streamlit", config={"displaylogo": False})
"""
FLOOR_ROWS = """
import pandas as pd
rows = pd.DataFrame({"s": range(20), "bytes": [2 ** i for i in range(20)]})
"""
FLOOR_GRID = FLOOR_ROWS + "st.dataframe(rows)\n"
FLOOR_TABLE = FLOOR_ROWS + "st.table(rows, hide_index=True)\n"
FLOOR_APPS = {
    "floor_1_number.py": FLOOR_HEAD,
    "floor_2_table.py": FLOOR_HEAD + FLOOR_TABLE,
    "floor_3_grid.py": FLOOR_HEAD + FLOOR_GRID,
    "floor_4_chart.py": FLOOR_HEAD + FLOOR_CHART,
    "floor_5_chart_table.py": FLOOR_HEAD + FLOOR_CHART + FLOOR_TABLE,
    "floor_6_chart_grid.py": FLOOR_HEAD + FLOOR_CHART + FLOOR_GRID,
}


def measure_floors(folder: Path, repeat: int, quiet_ms: int, kinds: list[str]
                   ) -> dict[str, dict[str, list]]:
    """FLOOR_APPS written to `folder`, each served alone and loaded as the pages are:
    {app name: {kind: [(first number, settled), ...]}}."""
    out: dict[str, dict[str, list]] = {}
    for name, source in FLOOR_APPS.items():
        script = folder / name
        script.write_text(source)
        with load_test.app_server(script=script) as (url, _):
            measure(url, ["/"], 1, quiet_ms, warm=False)  # the server's first imports
            out[name] = {kind: measure(url, ["/"], repeat, quiet_ms, kind == "warm")["/"]
                         for kind in kinds}
    return out


def page_paths() -> list[str]:
    """The URL path of every page app.py registers: "/" for the default page (default=True),
    else "/" + its url_path."""
    found = re.findall(r'st\.Page\(\s*"attnmem/pages/\w+\.py"[^)]*url_path="([^"]+)"(, default=True)?',
                       (ROOT / "app.py").read_text())
    if not found:
        raise SystemExit("app.py lists no st.Page with a url_path")
    return ["/" if default else f"/{path}" for path, default in found]


def track_requests(page) -> set:
    """The page's requests in flight (a set kept up to date by the page's events)."""
    in_flight: set = set()
    page.on("request", lambda r: in_flight.add(r))
    page.on("requestfinished", lambda r: in_flight.discard(r))
    page.on("requestfailed", lambda r: in_flight.discard(r))
    return in_flight


def settle(page, in_flight: set, quiet_ms: int, timeout_s: float = 60) -> tuple[float, float]:
    """Wait until a page opened in a context with WATCH_JS has settled (module docstring);
    (first number, settled) in seconds of the page's clock from the navigation's start."""
    page.wait_for_selector(FIRST, timeout=timeout_s * 1000)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        now, last, first, running = page.evaluate(STATE_JS)
        # the session's websocket stays open: it is not a load in flight
        busy = running or any(r.resource_type != "websocket" for r in in_flight)
        if not busy and first is not None and now - last >= quiet_ms:
            return first / 1000, last / 1000
        page.wait_for_timeout(50)
    raise RuntimeError(f"{page.url} did not settle within {timeout_s:.0f} s")


def load_once(context, url: str, quiet_ms: int) -> tuple[float, float]:
    """Open url in a new tab of `context`; (first number, settled) as `settle` gives them."""
    page = context.new_page()
    in_flight = track_requests(page)
    try:
        page.goto(url, wait_until="commit")
        return settle(page, in_flight, quiet_ms)
    finally:
        page.close()


@contextlib.contextmanager
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=load_test.CHROMIUM, args=load_test.LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()


def watched_context(b, width: int = 1280, height: int = 900):
    """A browser context whose pages carry WATCH_JS."""
    ctx = b.new_context(viewport={"width": width, "height": height})
    ctx.add_init_script(WATCH_JS)
    return ctx


#: In-app navigation starts on this page (its plotly chart and data grid have evaluated both
#: bundles in the document), or on NAV_FROM_ELSE when it is the page measured.
NAV_FROM, NAV_FROM_ELSE = "/score_matrix", "/scaling"

#: The sidebar's link to a URL path (app.py's pages: "/" is the default page), clicked.
CLICK_LINK_JS = """(path) => {
  const a = [...document.querySelectorAll('[data-testid="stSidebarNav"] a')]
    .find(a => new URL(a.href).pathname.replace(/\\/$/, '') === path.replace(/\\/$/, ''));
  if (!a) return false;
  a.click();
  return true;
}"""

#: The main area's title, which tells one page from another.
TITLE_JS = """() => { const h = document.querySelector('[data-testid="stMain"] h1');
  return h ? h.innerText : ''; }"""


def navigate_once(context, url: str, path: str, quiet_ms: int) -> float:
    """Open NAV_FROM (or NAV_FROM_ELSE) in a new tab of `context`, let it settle, then click the
    sidebar's link to `path`: seconds from the click until the page has settled (`settle`'s
    rule), in the same document (checked: a marker set before the click is still there)."""
    start = NAV_FROM_ELSE if path == NAV_FROM else NAV_FROM
    page = context.new_page()
    in_flight = track_requests(page)
    try:
        page.goto(url + start, wait_until="commit")
        settle(page, in_flight, quiet_ms)
        title = page.evaluate(TITLE_JS)
        clicked = page.evaluate("""() => { window.__sameDocument = true; return performance.now(); }""")
        if not page.evaluate(CLICK_LINK_JS, path):
            raise RuntimeError(f"no sidebar link to {path} on {start}")
        page.wait_for_function(f"(old) => ({TITLE_JS})() && ({TITLE_JS})() !== old", arg=title,
                               timeout=60_000)
        _, last = settle(page, in_flight, quiet_ms)
        if not page.evaluate("() => window.__sameDocument === true"):
            raise RuntimeError(f"clicking {path} on {start} loaded a new document")
        return last - clicked / 1000
    finally:
        page.close()


def measure(url: str | list[str], paths: list[str], repeat: int, quiet_ms: int,
            warm: bool, in_app: bool = False) -> dict:
    """Per page path, per load: (first number, settled) of a direct load, or with in_app the
    seconds from a sidebar click to settled (navigate_once). With several urls (--compare),
    each load of a page from the first app is followed by one from each other (interleaved,
    so they share the machine's load); then {url: {path: [...]}}."""
    urls = [url] if isinstance(url, str) else list(url)
    out: dict[str, dict[str, list]] = {u: {p: [] for p in paths} for u in urls}
    with browser() as b:
        shared = watched_context(b) if warm else None
        if shared is not None:  # a returning user: the bundles are in the cache already
            for u in urls:
                load_once(shared, u + "/score_matrix", quiet_ms)
        for path in paths:
            for _ in range(repeat):
                for u in urls:
                    ctx = shared or watched_context(b)
                    out[u][path].append(navigate_once(ctx, u, path, quiet_ms) if in_app else
                                        load_once(ctx, u + path, quiet_ms))
                    if shared is None:
                        ctx.close()
    return out[url] if isinstance(url, str) else out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="loads per page (default %(default)s)")
    ap.add_argument("--url", default=None, help="a running app (default: start one)")
    ap.add_argument("--quiet-ms", type=int, default=500,
                    help="how long nothing may change for the page to count as settled "
                         "(default %(default)s ms)")
    ap.add_argument("--only", choices=("cold", "warm"), default=None,
                    help="measure one kind of browser only (default: both)")
    ap.add_argument("--pages", nargs="*", default=None,
                    help="URL paths to measure (default: every page of app.py)")
    ap.add_argument("--floor", action="store_true",
                    help="also measure the one-file floor apps (FLOOR_APPS: the sidebar and a "
                         "number; plus an HTML table, a data grid, a plotly chart, a chart and "
                         "a table, a chart and a grid), served and loaded alike, in the same run")
    ap.add_argument("--in-app", action="store_true",
                    help="also measure each page reached by a click in the sidebar from "
                         f"{NAV_FROM} (from {NAV_FROM_ELSE} for itself): the same document, "
                         "plotly and the data grid already evaluated; seconds from the click")
    ap.add_argument("--compare", type=Path, default=None, metavar="DIR",
                    help="another copy of the app (a checkout of another commit: its app.py "
                         "and attnmem/), served beside this one; every load of a page from "
                         "this app is followed by the same load from that one, and both are "
                         "reported (before/after at the same load)")
    a = ap.parse_args(argv)
    if a.compare is not None and not (a.compare / "app.py").is_file():
        raise SystemExit(f"--compare {a.compare}: no app.py there")
    if a.repeat < 1:
        raise SystemExit(f"--repeat must be at least 1, got {a.repeat}")
    if a.quiet_ms < 100:
        raise SystemExit(f"--quiet-ms must be at least 100 (the poll is every 50 ms), got {a.quiet_ms}")
    paths = a.pages or page_paths()
    kinds = [a.only] if a.only else ["cold", "warm"]
    with contextlib.ExitStack() as stack:
        url = a.url or stack.enter_context(load_test.app_server())[0]
        other = (stack.enter_context(load_test.app_server(script=a.compare.resolve() / "app.py"))[0]
                 if a.compare is not None else None)
        urls = [url] if other is None else [url, other]
        measure(urls, paths[:1], 1, a.quiet_ms, warm=False)  # the servers' first imports
        load_start = os.getloadavg()
        both = {kind: measure(urls, paths, a.repeat, a.quiet_ms, kind == "warm") for kind in kinds}
        nav_both = {kind: measure(urls, paths, a.repeat, a.quiet_ms, kind == "warm", in_app=True)
                    for kind in kinds} if a.in_app else {}
        res = {kind: got[url] for kind, got in both.items()}
        nav = {kind: got[url] for kind, got in nav_both.items()}
        res_other = {kind: got[other] for kind, got in both.items()} if other else {}
        nav_other = {kind: got[other] for kind, got in nav_both.items()} if other else {}
        floors = (measure_floors(Path(stack.enter_context(tempfile.TemporaryDirectory())),
                                 a.repeat, a.quiet_ms, kinds) if a.floor else {})
    load = os.getloadavg()
    head = "".join(f" {k + ' first':>11} {k + ' settled':>13}" for k in kinds)
    head += "".join(f" {'in-app ' + k:>13}" for k in nav)
    print(f"{'page':<18}{head}   (seconds, median of {a.repeat}; {time.strftime('%Y-%m-%d %H:%M %Z')}; "
          f"load average {'/'.join(f'{x:.1f}' for x in load_start)} at the start, "
          f"{'/'.join(f'{x:.1f}' for x in load)} at the end, {os.cpu_count()} CPUs)")
    worst = dict.fromkeys([*kinds, *(f"in-app {k}" for k in nav)], 0.0)
    rows = [("", res, nav, worst)]
    if res_other:
        rows.append((f" ({a.compare.name})", res_other, nav_other,
                     dict.fromkeys(worst, 0.0)))
    for path in paths:
        for tag, got_res, got_nav, top in rows:
            cells = ""
            for kind in kinds:
                first = statistics.median(r[0] for r in got_res[kind][path])
                settled = statistics.median(r[1] for r in got_res[kind][path])
                top[kind] = max(top[kind], settled)
                cells += f" {first:>11.2f} {settled:>13.2f}"
            for kind, got in got_nav.items():
                settled = statistics.median(got[path])
                top[f"in-app {kind}"] = max(top[f"in-app {kind}"], settled)
                cells += f" {settled:>13.2f}"
            print(f"{path + tag:<18}{cells}")
    for name, got in floors.items():
        cells = "".join(f" {statistics.median(r[0] for r in got[k]):>11.2f}"
                        f" {statistics.median(r[1] for r in got[k]):>13.2f}" for k in kinds)
        print(f"{name.removesuffix('.py'):<18}{cells}")
    for tag, _, _, top in rows:
        print(f"worst median settle{tag}: " + ", ".join(f"{k} {v:.2f} s" for k, v in top.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
