"""How long the meta-device trace of generate() takes (issue 42's speed targets).

For each config: the first answer in a fresh process (`attnmem memory` from the command line:
imports, reading the config, building the model on meta, the trace), then, in one process with
the model built, an answer per input change (a new prompt length and batch each time: every
one is a new trace, the lru cache never hits). Prints a table; run it on an idle machine.

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


def per_change(path: str, changes: int = 6) -> list[float]:
    from attnmem.trace.inference import trace_inference

    d = json.loads(Path(path).read_text())
    trace_inference(d, 1, 1000, 1)  # builds the model once
    times = []
    for i in range(changes):
        t0 = time.perf_counter()
        trace_inference(d, 1 + i % 2, 2000 + 517 * i, 1)
        times.append(time.perf_counter() - t0)
    return times


def main(paths: list[str]) -> None:
    print(f"{'config':40s} {'first answer s':>15s} {'per change s (median, max)':>28s}")
    for p in paths:
        first = first_answer(p)
        ch = per_change(p)
        print(f"{Path(p).name[:40]:40s} {first:15.2f} {statistics.median(ch):14.2f} "
              f"{max(ch):13.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
