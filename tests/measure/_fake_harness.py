"""A stand-in for ``python -m attnmem.measure --infer|--train`` in the tests of
attnmem.measure.on_this_gpu: the same arguments (read by the harness's own parser, so a
configuration the runner builds must be one the harness takes), the same outputs (the GPU lock
held while it works, a worker started in a session of its own as the real harness starts its
worker, a "[1/1 ...]" progress line on stderr, the row written to --out in the harness's
columns), and no torch and no GPU.

FAKE_HARNESS_MODE: ok (one row, status ok, after FAKE_HARNESS_SLEEP seconds), oom (one row,
status oom), hang (holds the lock and its worker until killed; SIGINT ends it as
KeyboardInterrupt, as the harness), stubborn (hang, ignoring SIGINT), busy (exit 2 with the
harness's busy message), fail (exit 1 with an error line). FAKE_HARNESS_PIDS: a file that gets
"<own pid> <worker pid>".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attnmem.measure.child import gpu_lock  # noqa: E402
from attnmem.measure.run_common import csv_writer, write_cells  # noqa: E402

#: What the fake measures: the peak, and the prediction 1% above it.
PEAK = 3_000_000_000
PREDICTED = 3_030_000_000


def main(argv: list[str]) -> int:
    kind = argv[0].lstrip("-")
    args = argv[1:]
    if kind == "infer":
        from attnmem.measure.infer import cli
        from attnmem.measure.infer.config import INFER_COLUMNS as COLUMNS
        from attnmem.measure.infer.config import InferResult as Result
    else:
        from attnmem.measure.train import cli  # type: ignore[no-redef]
        from attnmem.measure.train.config import TRAIN_COLUMNS as COLUMNS  # type: ignore[no-redef]
        from attnmem.measure.train.config import TrainResult as Result  # type: ignore[no-redef]
    parsed = cli.build_parser().parse_args(args)
    (cfg,) = cli.configs_from_args(parsed)
    mode = os.environ.get("FAKE_HARNESS_MODE", "ok")
    if mode == "busy":
        print("error: GPU 0 is busy: a measurement is already running (pid 1). Only one runs "
              "at a time per GPU", file=sys.stderr)
        return 2
    if mode == "fail":
        print("error: could not save a result to somewhere: boom", file=sys.stderr)
        return 1
    if mode == "stubborn":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    with gpu_lock(0):
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                  start_new_session=True)
        pids = os.environ.get("FAKE_HARNESS_PIDS")
        if pids:
            Path(pids).write_text(f"{os.getpid()} {worker.pid}")
        try:
            if mode in ("hang", "stubborn"):
                time.sleep(600)
            time.sleep(float(os.environ.get("FAKE_HARNESS_SLEEP", "0.5")))
        finally:
            worker.kill()  # as the harness's run loop kills its worker on the way out
            worker.wait()
        measured = {"peak_bytes": PEAK, "predicted_peak_bytes": PREDICTED,
                    "peak_rel_error": (PREDICTED - PEAK) / PEAK, "gpu": "Fake GPU",
                    "torch": "0", "transformers": "0"}
        if kind == "infer":
            measured |= {"prefill_peak_bytes": PEAK - 10**8, "weights_bytes": 2 * 10**9,
                         "cache_bytes": 10**8, "predicted_prefill_peak_bytes": PEAK - 10**8,
                         "predicted_cache_bytes": 10**8, "before_bytes": 2 * 10**9}
        else:
            measured |= {"before_step_bytes": 2 * 10**9, "predicted_before_bytes": 2 * 10**9,
                         "step_ms": 12.5}
        status = "oom" if mode == "oom" else "ok"
        row = Result(**cfg.row_identity(), status=status,
                     message="CUDA out of memory (fake)" if status == "oom" else "",
                     **(measured if status == "ok" else {"gpu": "Fake GPU"})).to_row()
        with open(parsed.out, "w", newline="") as fh:
            w = csv_writer(fh)
            w.writerow(COLUMNS)
            write_cells(w, row, COLUMNS)
        print(f"[1/1    0.5s] {cfg.label()}: {status}", file=sys.stderr, flush=True)
    print(f"1 configurations; rows in {parsed.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
