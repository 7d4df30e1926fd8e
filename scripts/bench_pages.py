"""How long a page script takes to re-run when a slider or number box moves (budget: 100 ms).

Each page runs headless in streamlit.testing.v1.AppTest; after a warm-up run, one input is set
to a NEW value each time (so cached sweeps miss, the worst case for a user dragging a slider)
and two times are taken: the script run as Streamlit's ScriptRunner executes it (what a server
spends per slider move; the budget applies to it) and AppTest's whole round trip (adds its
polling and element-tree parsing). Page compilation is excluded, as on a server (_SHARED_CACHE). Prints the median and 90th percentile per page.

Usage: .venv/bin/python scripts/bench_pages.py [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamlit.runtime.scriptrunner import script_runner as _script_runner  # noqa: E402
from streamlit.runtime.scriptrunner.script_cache import ScriptCache  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402
from streamlit.testing.v1 import app_test as _app_test  # noqa: E402
from streamlit.testing.v1 import local_script_runner as _runner  # noqa: E402

# A server keeps one ScriptCache (compiled page bytecode) for its lifetime; AppTest makes a new
# one per run and so recompiles the page every time (~30-50 ms of AST work that a user never
# waits for). Share one cache so the figure measures what a slider move costs on a server.
_SHARED_CACHE = ScriptCache()
_app_test.ScriptCache = lambda: _SHARED_CACHE  # type: ignore[assignment, misc]
_runner.ScriptCache = lambda: _SHARED_CACHE  # type: ignore[assignment, misc]

# The script run itself, as a server's ScriptRunner executes it (widget states in, the page's
# code, deltas out), without AppTest's polling and element-tree parsing around it.
_SCRIPT_MS: list[float] = []
_orig_run_script = _script_runner.ScriptRunner._run_script


def _timed_run_script(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    try:
        return _orig_run_script(self, *args, **kwargs)
    finally:
        _SCRIPT_MS.append((time.perf_counter() - t0) * 1000)


_script_runner.ScriptRunner._run_script = _timed_run_script  # type: ignore[method-assign]

BUDGET_MS = 100.0

# page file -> (what moves, how to move it to the i-th new value)
MOVES: dict[str, tuple[str, Callable[[AppTest, int], None]]] = {
    "score_matrix.py": ("s (number box)", lambda at, i: at.number_input(key="s").set_value(4096 + 7 * i)),
    "score_matrix.py ": ("s (log slider)", lambda at, i: at.select_slider(key="_s_pow2").set_value(1 << (7 + i % 18))),
    "model_memory.py": ("context s", lambda at, i: at.number_input(key="s").set_value(8192 + 13 * i)),
    "scaling.py": ("heads H", lambda at, i: at.number_input(key="h").set_value(8 + i)),
    "flash_explainer.py": ("step slider", lambda at, i: at.slider(key="step").set_value(i % 10)),
    "flash_explainer.py ": ("sequence s", lambda at, i: at.number_input(key="s").set_value(4096 + 64 * i)),
    "kernel_speed.py": ("head dim d", lambda at, i: at.radio(key="kd").set_value(("64", "128")[i % 2])),
}


def bench(page: str, move: Callable[[AppTest, int], None], runs: int) -> tuple[list[float], list[float]]:
    """(script-run ms, AppTest round-trip ms) for `runs` moves of one input."""
    at = AppTest.from_file(str(ROOT / "attnmem" / "pages" / page.strip()), default_timeout=120)
    at.run()
    for i in range(3):  # warm-up: imports, first figures
        move(at, 1000 + i)
        at.run()
    script, total = [], []
    for i in range(runs):
        move(at, i)
        _SCRIPT_MS.clear()
        t0 = time.perf_counter()
        at.run()
        total.append((time.perf_counter() - t0) * 1000)
        script.append(sum(_SCRIPT_MS))
        if at.exception:
            raise SystemExit(f"{page}: {at.exception[0].value}")
    return script, total


def _p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[int(0.9 * (len(xs) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed re-runs per page (default 30)")
    args = parser.parse_args()
    print(f"page script re-run after an input moves (new value each time), {args.runs} runs")
    print(f"{'page':<20}{'input moved':<17}{'script median':>14}{'p90':>7}{'AppTest median':>16}{'p90':>7}"
          f"  budget {BUDGET_MS:.0f} ms")
    worst = 0.0
    for page, (what, move) in MOVES.items():
        script, total = bench(page, move, args.runs)
        med = statistics.median(script)
        worst = max(worst, med)
        flag = "ok" if med < BUDGET_MS else "OVER"
        print(f"{page.strip():<20}{what:<17}{med:>11.1f} ms{_p90(script):>7.1f}"
              f"{statistics.median(total):>13.1f} ms{_p90(total):>7.1f}  {flag}")
    print(f"worst script median: {worst:.1f} ms (budget {BUDGET_MS:.0f} ms); machine load: {_load()}")


def _load() -> str:
    try:
        return ", ".join(f"{x:.1f}" for x in __import__("os").getloadavg()) + " (1/5/15 min)"
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
