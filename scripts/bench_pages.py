"""How long a page script takes to re-run when a slider or number box moves (budget: 100 ms).

Each page runs headless in streamlit.testing.v1.AppTest; after a warm-up run, one input is set
to a NEW value each time (so cached sweeps miss, the worst case for a user dragging a slider)
and `.run()` is timed. AppTest's own bookkeeping (message parsing, element tree) is included,
so a real server's script time is a little lower; page compilation is not (see _SHARED_CACHE). Prints the median and 90th percentile per page.

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

BUDGET_MS = 100.0

# page file -> (what moves, how to move it to the i-th new value)
MOVES: dict[str, tuple[str, Callable[[AppTest, int], None]]] = {
    "score_matrix.py": ("s (number box)", lambda at, i: at.number_input(key="s").set_value(4096 + 7 * i)),
    "score_matrix.py ": ("s (log slider)", lambda at, i: at.select_slider(key="_s_pow2").set_value(1 << (7 + i % 18))),
    "model_memory.py": ("context s", lambda at, i: at.number_input(key="s").set_value(8192 + 13 * i)),
    "scaling.py": ("heads H", lambda at, i: at.number_input(key="h").set_value(8 + i)),
    "flash_explainer.py": ("step slider", lambda at, i: at.slider(key="step").set_value(i % 10)),
    "flash_explainer.py ": ("sequence s", lambda at, i: at.number_input(key="s").set_value(4096 + 64 * i)),
}


def bench(page: str, move: Callable[[AppTest, int], None], runs: int) -> list[float]:
    at = AppTest.from_file(str(ROOT / "pages" / page.strip()), default_timeout=120)
    at.run()
    for i in range(3):  # warm-up: imports, first figures
        move(at, 1000 + i)
        at.run()
    times = []
    for i in range(runs):
        move(at, i)
        t0 = time.perf_counter()
        at.run()
        times.append((time.perf_counter() - t0) * 1000)
        if at.exception:
            raise SystemExit(f"{page}: {at.exception[0].value}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed re-runs per page (default 30)")
    args = parser.parse_args()
    print(f"page script re-run after an input moves (new value each time), {args.runs} runs")
    print(f"{'page':<22}{'input moved':<18}{'median ms':>10}{'p90 ms':>9}  budget {BUDGET_MS:.0f} ms")
    worst = 0.0
    for page, (what, move) in MOVES.items():
        times = sorted(bench(page, move, args.runs))
        med = statistics.median(times)
        p90 = times[int(0.9 * (len(times) - 1))]
        worst = max(worst, med)
        flag = "ok" if med < BUDGET_MS else "OVER"
        print(f"{page.strip():<22}{what:<18}{med:>10.1f}{p90:>9.1f}  {flag}")
    print(f"worst median: {worst:.1f} ms")


if __name__ == "__main__":
    main()
