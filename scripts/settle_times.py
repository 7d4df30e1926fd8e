"""How long each page takes to settle after a direct load in Chromium (issue 32: within 2 s).

Starts the app on a free port of 127.0.0.1 (or uses --url), then for every page app.py lists,
--repeat times: a fresh browser context opens the page's URL and the clock runs from the
navigation until (a) the first metric value is drawn ("first number") and (b) the page has
settled: Streamlit's running indicator (stStatusWidget) gone and every plotly chart drawn, with
nothing running for --quiet-ms. Prints the median of each per page and the worst median.
Debian's chromium through Playwright, headless, loopback only; a measurement, not a test.

Usage: .venv/bin/python scripts/settle_times.py [--repeat 3] [--url http://127.0.0.1:8501]
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"


def page_paths() -> list[str]:
    """The URL path of every page app.py registers (a page file NAME.py is served at /NAME);
    the default page (default=True) is "/"."""
    text = (ROOT / "app.py").read_text()
    paths = []
    for m in re.finditer(r'st\.Page\(\s*"pages/(\w+)\.py"([^)]*)\)', text):
        paths.append("/" if "default=True" in m.group(2) else f"/{m.group(1)}")
    return paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, deadline_s: float) -> None:
    import urllib.request

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"the app did not answer at {url} within {deadline_s:.0f} s")


def measure(url: str, paths: list[str], repeat: int, quiet_ms: int) -> dict[str, list[tuple]]:
    from playwright.sync_api import sync_playwright

    out: dict[str, list[tuple]] = {p: [] for p in paths}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking"])
        for path in paths:
            for _ in range(repeat):
                ctx = browser.new_context(viewport={"width": 1280, "height": 900})
                page = ctx.new_page()
                t0 = time.perf_counter()
                page.goto(url + path, wait_until="commit")
                page.wait_for_selector('[data-testid="stMetricValue"], [data-testid="stAlert"]',
                                       timeout=60_000)
                first = time.perf_counter() - t0
                quiet_since = None
                while time.perf_counter() - t0 < 60:
                    busy = page.evaluate(
                        "() => !!document.querySelector('[data-testid=\"stStatusWidget\"]') || "
                        "[...document.querySelectorAll('[data-testid=\"stPlotlyChart\"]')]"
                        ".some(c => !c.querySelector('.main-svg'))")
                    now = time.perf_counter()
                    if busy:
                        quiet_since = None
                    elif quiet_since is None:
                        quiet_since = now
                    elif (now - quiet_since) * 1000 >= quiet_ms:
                        break
                    page.wait_for_timeout(50)
                settled = (quiet_since or time.perf_counter()) - t0
                out[path].append((first, settled))
                ctx.close()
        browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="loads per page (default %(default)s)")
    ap.add_argument("--url", default=None, help="a running app (default: start one)")
    ap.add_argument("--quiet-ms", type=int, default=500,
                    help="how long nothing may run for the page to count as settled "
                         "(default %(default)s ms)")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        raise SystemExit(f"--repeat must be at least 1, got {a.repeat}")
    proc = None
    url = a.url
    if url is None:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"),
             "--server.port", str(port), "--server.headless", "true"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(url, 60)
        paths = page_paths()
        measure(url, paths[:1], 1, a.quiet_ms)  # the server's first imports are not a page's
        res = measure(url, paths, a.repeat, a.quiet_ms)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=20)
    print(f"{'page':<22} {'first number (s)':>17} {'settled (s)':>12}   (median of {a.repeat})")
    worst = 0.0
    for path, runs in res.items():
        first = statistics.median(r[0] for r in runs)
        settled = statistics.median(r[1] for r in runs)
        worst = max(worst, settled)
        print(f"{path:<22} {first:>17.2f} {settled:>12.2f}")
    print(f"worst median settle: {worst:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
