"""How long the meta-device trace of generate() takes (issue 42's speed targets).

For each config: the first answer in a fresh process (`attnmem memory` from the command line:
imports, reading the config, building the model on meta, the trace), then, in one process with
the model built, what a page's slider costs: the first move (a length model built once) and
later moves (replays). Prints a table; run it on an idle machine.

    .venv/bin/python scripts/trace_speed.py CONFIG.json [CONFIG.json ...]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def first_answer(path: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "attnmem", "memory", "--model", path, "--seq-len",
                    "4096", "--gpu", "H100 80GB", "--json"], check=True, capture_output=True)
    return time.perf_counter() - t0


def per_change(path: str, changes: int = 8) -> tuple[float, list[float]]:
    """What a page's slider costs (attnmem.trace.lengths.trace_at, as the pages call it): the
    first move near a traced length builds a length model (five traces, once); the later
    moves inside its span are replays. Returns (first move, later moves) in seconds."""
    from attnmem.trace.lengths import trace_at

    d = json.loads(Path(path).read_text())
    trace_at(d, 1, 4096, 1)  # the first answer (built and traced)
    t0 = time.perf_counter()
    trace_at(d, 1, 4500, 1)
    first = time.perf_counter() - t0
    times = []
    for i in range(changes):
        t0 = time.perf_counter()
        trace_at(d, 1, 2100 + 731 * i, 1)
        times.append(time.perf_counter() - t0)
    return first, times


def main(paths: list[str]) -> None:
    print(f"{'config':34s} {'first answer s':>15s} {'first move s':>13s} "
          f"{'later moves s (median, max)':>28s}")
    for p in paths:
        first = first_answer(p)
        move, later = per_change(p)
        print(f"{Path(p).name[:34]:34s} {first:15.2f} {move:13.2f} "
              f"{statistics.median(later):14.3f} {max(later):13.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
