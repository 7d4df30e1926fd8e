"""The training steps' child process and the runner that feeds it.

``run_train`` measures a list of configurations in one child process (``python -m
kernels.measure.train.worker``: ``worker_main``, JSON lines on stdin/stdout, the parent side
being ``kernels.measure.child.WorkerProcess``) under the GPU lock (``kernels.measure.child
.gpu_lock``): torch, transformers and Triton compilation are paid once, each configuration
starts from an emptied allocator, and a worker that still holds more than
``LEFTOVER_RESTART_BYTES`` after cleaning up exits so that a fresh one takes the next. A
configuration past its time limit kills the child (``timeout``), a dead child is
``crashed``, and a fresh child takes the next one. An OOM skips the longer lengths of its
series; a time budget skips whatever has not started when it is spent (rows with status
``skipped``). No torch or transformers at import time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

from kernels.measure.child import WorkerProcess
from kernels.measure.model_common import (
    LEFTOVER_RESTART_BYTES,
    allocated_now,
    next_message,
    now_utc,
    serve,
    short_error,
)
from kernels.measure.train.config import TrainConfig, TrainResult
from kernels.measure.train.procedure import measure_train_step

#: The worker's module (``python -m <this>``).
WORKER_MODULE = "kernels.measure.train.worker"


def worker_main(stdin: IO[str], proto: IO[str]) -> None:
    """Serve {"cfg": {...}} lines until EOF or {"cmd": "exit"}; answer {"result": row}."""
    for line in stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        if msg.get("cmd") == "exit":
            break
        cfg = TrainConfig.from_dict(msg["cfg"])
        try:
            res = measure_train_step(cfg)
        except Exception as exc:  # noqa: BLE001 - keep serving; the row says what broke
            res = TrainResult(**cfg.row_identity(), status="error", message=short_error(exc),
                              timestamp=now_utc())
        left = allocated_now()
        restart = left > LEFTOVER_RESTART_BYTES
        proto.write(json.dumps({"result": res.to_row(), "restart": restart}) + "\n")
        proto.flush()
        if restart:  # something kept GPU memory alive: the next configuration gets a fresh child
            print(f"train worker: {left} bytes still allocated after {cfg.label()}; exiting",
                  file=sys.stderr, flush=True)
            break


class _TrainChild(WorkerProcess):
    """One ``python -m kernels.measure.train.worker`` process."""

    def __init__(self, env: dict[str, str] | None) -> None:
        super().__init__([WORKER_MODULE], env)
        self.done = 0


def _row_for(cfg: TrainConfig, status: str, message: str) -> TrainResult:
    return TrainResult(**cfg.row_identity(), status=status, message=message,
                       timestamp=now_utc())


@dataclass
class TrainRunSummary:
    results: list[TrainResult] = field(default_factory=list)
    wall_s: float = 0.0
    children_started: int = 0


def run_train(configs: Sequence[TrainConfig], *,
              on_result: Callable[[TrainResult, int, int], None] | None = None,
              timeout_s: float = 180.0, startup_s: float = 90.0,
              budget_s: float | None = None, skip_longer_after_oom: bool = True,
              gpu_index: int = 0, lock_wait_s: float = 0.0,
              lock_dir: str | os.PathLike[str] | None = None,
              env: dict[str, str] | None = None) -> TrainRunSummary:
    """Measure ``configs`` one by one in a child process, holding the GPU lock.

    ``budget_s``: configurations not started within that many seconds of the start are
    recorded as ``skipped`` (the run finishes at most one configuration's time later).
    ``timeout_s`` limits each configuration (plus ``startup_s`` for a fresh child's first).
    """
    from kernels.measure.child import gpu_lock

    summary = TrainRunSummary()
    t0 = time.monotonic()
    oom_at: dict[tuple, int] = {}
    with gpu_lock(gpu_index, wait_s=lock_wait_s, lock_dir=lock_dir):
        child: _TrainChild | None = None
        try:
            for i, cfg in enumerate(configs):
                series = cfg.series()
                if budget_s is not None and time.monotonic() - t0 > budget_s:
                    res = _row_for(cfg, "skipped",
                                   f"not run: the run's time budget of {budget_s:g} s was spent")
                elif skip_longer_after_oom and series in oom_at and cfg.seq_len >= oom_at[series]:
                    res = _row_for(cfg, "skipped", f"not run: s={oom_at[series]} of the same "
                                   "series already ran out of memory")
                else:
                    if child is None or child.proc.poll() is not None:
                        if child is not None:
                            child.kill()
                        child = _TrainChild(env)
                        summary.children_started += 1
                    limit = timeout_s + (startup_s if child.done == 0 else 0.0)
                    child.send({"cfg": cfg.to_dict()})
                    msg = next_message(child, limit)
                    if msg == "timeout":
                        child.kill()
                        child = None
                        res = _row_for(cfg, "timeout", f"no result within {limit:.0f} s: the "
                                       "child was killed and a fresh one takes the next")
                    elif not isinstance(msg, dict) or "result" not in msg:
                        code = child.proc.wait(timeout=10) if child.proc.poll() is None else child.proc.returncode
                        tail = child.stderr_tail()
                        child.kill()
                        child = None
                        res = _row_for(cfg, "crashed", f"the child process died (exit code "
                                       f"{code}); stderr ends: {tail[-300:]}")
                    else:
                        res = TrainResult(**msg["result"])
                        child.done += 1
                        if msg.get("restart"):
                            child.close()
                            child = None
                if res.status == "oom":
                    oom_at[series] = min(cfg.seq_len, oom_at.get(series, cfg.seq_len))
                summary.results.append(res)
                if on_result is not None:
                    on_result(res, i, len(configs))
        finally:
            if child is not None:
                if sys.exc_info()[0] is not None:
                    child.kill()
                else:
                    child.close()
    summary.wall_s = time.monotonic() - t0
    return summary



if __name__ == "__main__":
    serve(worker_main)
