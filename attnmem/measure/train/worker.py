"""The training steps' child process and the runner that feeds it.

``run_train`` measures a list of configurations in one child process (``python -m
attnmem.measure.train.worker``: ``worker_main``, JSON lines on stdin/stdout, the parent side
being ``attnmem.measure.child.WorkerProcess``) under the GPU lock (``attnmem.measure.child
.gpu_lock``): torch, transformers and Triton compilation are paid once, each configuration
starts from an emptied allocator, and a worker that still holds more than
``LEFTOVER_RESTART_BYTES`` after cleaning up (paged optimizer state included: bitsandbytes
never frees its unified memory, ``recipes.paged_held_bytes``) exits so that a fresh one takes
the next. A
configuration past its time limit kills the child (``timeout``), a dead child is
``crashed``, and a fresh child takes the next one. An OOM skips the longer lengths of its
series; a time budget skips whatever has not started when it is spent (rows with status
``skipped``). No torch or transformers at import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import IO

from attnmem.measure.model_common import now_utc, serve
from attnmem.measure.run_common import ConfigChild, RunSummary, run_configs, serve_configs
from attnmem.measure.train.config import TrainConfig, TrainResult
from attnmem.measure.train.procedure import measure_train_step
from attnmem.measure.train.recipes import paged_held_bytes

#: The worker's module (``python -m <this>``).
WORKER_MODULE = "attnmem.measure.train.worker"


def worker_main(stdin: IO[str], proto: IO[str]) -> None:
    """Serve {"cfg": {...}} lines until EOF or {"cmd": "exit"}; answer {"result": row}."""
    serve_configs(stdin, proto, parse=TrainConfig.from_dict, measure=measure_train_step,
                  error_row=lambda cfg, message: _row_for(cfg, "error", message),
                  name="train", outside=paged_held_bytes)


class _TrainChild(ConfigChild):
    """One ``python -m attnmem.measure.train.worker`` process."""

    def __init__(self, env: dict[str, str] | None) -> None:
        super().__init__([WORKER_MODULE], env)


def _row_for(cfg: TrainConfig, status: str, message: str) -> TrainResult:
    return TrainResult(**cfg.row_identity(), status=status, message=message,
                       timestamp=now_utc())


#: A run's rows, its time and the child processes it started (run_common.RunSummary).
TrainRunSummary = RunSummary


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
    return run_configs(configs, new_child=lambda e: _TrainChild(e), result=TrainResult,
                       row_for=_row_for, length="seq_len", length_label="s=",
                       on_result=on_result, timeout_s=timeout_s, startup_s=startup_s,
                       budget_s=budget_s, skip_longer_after_oom=skip_longer_after_oom,
                       gpu_index=gpu_index, lock_wait_s=lock_wait_s, lock_dir=lock_dir,
                       env=env)


if __name__ == "__main__":
    serve(worker_main)
