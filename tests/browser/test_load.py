"""Load: concurrent browser sessions against a locally started server (scripts/load_test.py).

- In CI (quick): the caches of every page are bounded (so memory cannot grow with use), the
  load script's measuring helpers are right, and a 3-session x 5 s smoke run of the real
  script passes (one Chromium page, two protocol clients: no error, right numbers).
- `RUN_LOAD=1` (marker `load`): 5 sessions x 15 s with the latency budget.
- The full run the README/ROBUSTNESS figures come from is the script itself:
  `.venv/bin/python scripts/load_test.py --sessions 20 --seconds 60`.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.robustness

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import load_test  # noqa: E402

CACHE_DECORATORS = {"cache_data", "cache_resource", "cached"}


def _decorator_name(node: ast.expr) -> tuple[str, ast.Call | None]:
    call = node if isinstance(node, ast.Call) else None
    target = call.func if call else node
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name, call


def test_every_cache_with_arguments_is_bounded() -> None:
    """st.cache_data/cache_resource keep one entry per distinct argument tuple: without
    max_entries, sessions moving sliders through new values grow the server forever.
    (attnmem.pages.ui.state.cached has a default bound; a function without arguments has one entry.)"""
    unbounded = []
    for path in [ROOT / "app.py", *sorted((ROOT / "attnmem" / "pages").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            takes_args = bool(node.args.args or node.args.kwonlyargs or node.args.vararg)
            for dec in node.decorator_list:
                name, call = _decorator_name(dec)
                if name not in CACHE_DECORATORS or name == "cached" or not takes_args:
                    continue
                kws = {k.arg for k in (call.keywords if call else [])}
                if "max_entries" not in kws:
                    unbounded.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not unbounded, f"caches without max_entries: {unbounded}"


def test_cached_helper_is_bounded() -> None:
    tree = ast.parse((ROOT / "attnmem" / "pages" / "ui" / "state.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "cached")
    assert "max_entries" in ast.unparse(fn), "attnmem.pages.ui.state.cached must pass max_entries"


def test_helpers() -> None:
    assert load_test.percentile([1, 2, 3, 4], 50) == 2.5
    assert load_test.percentile([5.0], 95) == 5.0
    assert load_test.percentile(list(range(101)), 95) == 95
    assert load_test.expected_text(1, 32, 4096) == "1.07 GB"  # the worked example
    assert load_test.expected_text(1, 32, 8192) == "4.29 GB"
    assert load_test.rss_bytes(os.getpid()) > 10 * 2**20
    assert load_test.rss_bytes(2**22 + 12345) == 0  # no such process
    assert load_test.cpu_seconds(os.getpid()) > 0
    assert [load_test.short_len(n) for n in (128, 4096, 1 << 20)] == ["128", "4K", "1M"]
    assert [load_test.parse_short_len(t) for t in ("128", "4K", "1M")] == [128, 4096, 1 << 20]
    assert load_test.nearest_pow2(5000) == 4096 and load_test.nearest_pow2(6000) == 8192
    assert load_test.is_loopback("http://127.0.0.1:8501/x")
    assert not load_test.is_loopback("https://fonts.gstatic.com/x.svg")


def test_script_refuses_non_loopback_targets_and_silly_sizes() -> None:
    with pytest.raises(SystemExit):
        load_test.main(["--url", "http://example.com", "--sessions", "1", "--seconds", "1"])
    with pytest.raises(SystemExit):
        load_test.main(["--sessions", "1000"])


def _browser_reason() -> str | None:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed"
    if not (Path(load_test.CHROMIUM).exists() or shutil.which("chromium")):
        return f"{load_test.CHROMIUM} is missing (apt-get install chromium)"
    return None


needs_browser = pytest.mark.skipif(_browser_reason() is not None,
                                   reason=f"load test skipped: {_browser_reason()}")


@pytest.mark.slow
@pytest.mark.browser
@needs_browser
def test_load_smoke_three_sessions(tmp_path: Path) -> None:
    """One Chromium page and two protocol clients for 5 s: no error, numbers right."""
    rep = load_test.run(sessions=3, seconds=5, timeout_s=30, budget_ms=5000,
                        max_growth_mb=64, log_path=tmp_path / "server.log", browsers=1)
    assert rep.errors == 0, load_test.summary(rep)
    assert rep.actions >= 3, load_test.summary(rep)
    assert rep.ok, load_test.summary(rep)


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.load
@needs_browser
@pytest.mark.skipif(os.environ.get("RUN_LOAD") != "1",
                    reason="the load test runs with RUN_LOAD=1 (or scripts/load_test.py)")
def test_load_five_sessions_fifteen_seconds(tmp_path: Path) -> None:
    rep = load_test.run(sessions=5, seconds=15, timeout_s=30, budget_ms=1000,
                        max_growth_mb=64, log_path=tmp_path / "server.log", browsers=2)
    print(load_test.summary(rep))
    assert rep.ok, load_test.summary(rep)


@pytest.mark.slow
def test_every_page_smoke() -> None:
    """--every-page: two protocol sessions walk the pages for 8 s: no error, several pages run,
    and each page's figures are reported."""
    rows, _ = load_test.every_page(sessions=2, seconds=8, timeout_s=60, think_s=0.2)
    assert list(rows) == load_test.every_page_paths() and len(rows) == 11
    assert not [(p, r["error_samples"]) for p, r in rows.items() if r["errors"]]
    assert sum(1 for r in rows.values() if r["runs"]) >= 3, rows
    assert "median" in load_test.every_page_summary(rows, 2, 8)
