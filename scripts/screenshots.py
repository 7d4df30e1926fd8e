"""Screenshots of every page at a laptop's and a desktop's width (issue 32, item 4).

Starts the app on a free port of 127.0.0.1 (or uses --url) and opens every page app.py lists
in Debian's headless Chromium through Playwright (the flags of scripts/load_test.py: no
sandbox, no GPU, background networking off), once per width: 1280×800 and 1920×1080. After the
page has settled (scripts/settle_times.settle: nothing changed for --quiet-ms, nothing running
or loading), the viewport is made as tall as the page (Streamlit scrolls inside stMain; capped
at MAX_HEIGHT px), the page settles again (charts redraw on a resize), and the whole page is
saved as docs/screenshots/<page file>_<width>.png, reduced to a 256-colour palette (Pillow's
quantize: flat UI colours and text survive it; a 1920 px page stays a few hundred kB).

With --expanders every expander is opened first (their content is drawn when opened), to look
at the tables and charts inside them.

Usage: .venv/bin/python scripts/screenshots.py [--pages score_matrix ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import load_test  # noqa: E402  (the app server, shared with the load test)
import settle_times  # noqa: E402  (when a page has settled)

SIZES = ((1280, 800), (1920, 1080))
MAX_HEIGHT = 8000
OUT = ROOT / "docs" / "screenshots"

#: The page's full height: Streamlit scrolls inside stMain, so the window's own height is not it.
HEIGHT_JS = """() => { const m = document.querySelector('[data-testid="stMain"]');
  const inner = m.querySelector('[data-testid="stMainBlockContainer"]');
  return Math.ceil(Math.max(m.scrollHeight, inner ? inner.getBoundingClientRect().bottom : 0)); }"""

OPEN_EXPANDERS_JS = """() => document.querySelectorAll(
    '[data-testid="stExpander"] details:not([open]) > summary').forEach(s => s.click())"""


def pages() -> list[tuple[str, str]]:
    """(URL path, page file name) of every page app.py registers, in the sidebar's order."""
    import re

    found = re.findall(r'st\.Page\(\s*"attnmem/pages/(\w+)\.py"[^)]*url_path="([^"]+)"(, default=True)?',
                       (ROOT / "app.py").read_text())
    if not found:
        raise SystemExit("app.py lists no st.Page with a url_path")
    return [("/" if default else f"/{path}", name) for name, path, default in found]


def save_small(png: bytes, path: Path) -> int:
    """Write a screenshot as a 256-colour PNG; its size in bytes."""
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path.stat().st_size


def shoot(b, url: str, name: str, width: int, height: int, out: Path, quiet_ms: int,
          expanders: bool) -> Path:
    """One page at one width, whole, after it settled; the file written."""
    ctx = settle_times.watched_context(b, width, height)
    try:
        page = ctx.new_page()
        in_flight = settle_times.track_requests(page)
        page.goto(url, wait_until="commit")
        settle_times.settle(page, in_flight, quiet_ms)
        if expanders:
            page.evaluate(OPEN_EXPANDERS_JS)
            page.wait_for_timeout(200)
            settle_times.settle(page, in_flight, quiet_ms)
        shown = height
        for _ in range(4):  # a taller window can lay the page out anew: until the height holds
            tall = min(max(page.evaluate(HEIGHT_JS), height), MAX_HEIGHT)
            if tall == shown:
                break
            shown = tall
            page.set_viewport_size({"width": width, "height": shown})
            settle_times.settle(page, in_flight, quiet_ms)
        path = out / f"{name}_{width}.png"
        size = save_small(page.screenshot(), path)
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
              f"{width}×{shown}, {size / 1e3:,.0f} kB")
        return path
    finally:
        ctx.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="a running app (default: start one)")
    ap.add_argument("--pages", nargs="*", default=None,
                    help="page file names (e.g. score_matrix; default: every page of app.py)")
    ap.add_argument("--out", type=Path, default=OUT, help="folder (default docs/screenshots)")
    ap.add_argument("--expanders", action="store_true", help="open every expander first")
    ap.add_argument("--quiet-ms", type=int, default=700,
                    help="how long nothing may change before a shot (default %(default)s ms)")
    a = ap.parse_args(argv)
    known = pages()
    names = {name for _, name in known}
    unknown = sorted(set(a.pages or ()) - names)
    if unknown:
        raise SystemExit(f"--pages: no page named {', '.join(unknown)}; "
                         f"the pages are {', '.join(sorted(names))}")
    todo = [(path, name) for path, name in known if not a.pages or name in a.pages]
    a.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        url = a.url or stack.enter_context(load_test.app_server(
            extra_args=("--client.toolbarMode", "minimal")))[0]
        b = stack.enter_context(settle_times.browser())
        for path, name in todo:
            for width, height in SIZES:
                shoot(b, url + path, name, width, height, a.out, a.quiet_ms, a.expanders)
    return 0


if __name__ == "__main__":
    sys.exit(main())
