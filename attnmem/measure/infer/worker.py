"""The inference measurement's child process and the runner that feeds it.

``run_infer`` measures a list of configurations in one child process (``python -m
attnmem.measure.infer.worker``: ``worker_main``, JSON lines on stdin/stdout, the parent side
being ``attnmem.measure.child.WorkerProcess``) under the GPU lock (``attnmem.measure.child
.gpu_lock``). The child keeps the built model for the next configuration of the same build
key (``InferConfig.build_key``), and a child that holds more than ``LEFTOVER_RESTART_BYTES``
beyond the kept model after cleaning up exits so that a fresh one takes the next. A
configuration past its time limit kills the child (``timeout``), a dead child is
``crashed``, and a fresh child takes the next one. An OOM skips the longer prompts of its
series; a time budget skips whatever has not started when it is spent (rows with status
``skipped``). No torch or transformers at import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import IO

from attnmem.measure.infer.config import InferConfig, InferResult
from attnmem.measure.infer.procedure import held_baseline, measure_infer, release_model
from attnmem.measure.model_common import LEFTOVER_RESTART_BYTES, now_utc, serve
from attnmem.measure.run_common import ConfigChild, RunSummary, run_configs, serve_configs

__all__ = ["LEFTOVER_RESTART_BYTES", "WORKER_MODULE", "InferRunSummary", "run_infer",
           "worker_main"]

#: The worker's module (``python -m <this>``).
WORKER_MODULE = "attnmem.measure.infer.worker"


def _row_for(cfg: InferConfig, status: str, message: str) -> InferResult:
    return InferResult(**cfg.row_identity(), status=status, message=message,
                       timestamp=now_utc())


def worker_main(stdin: IO[str], proto: IO[str]) -> None:
    """Serve {"cfg": {...}} lines until EOF or {"cmd": "exit"}; answer {"result": row,
    "restart": bool}. The built model is kept for the next configuration of the same build
    key; memory held beyond it after cleanup (> LEFTOVER_RESTART_BYTES) ends this worker."""
    serve_configs(stdin, proto, parse=InferConfig.from_dict,
                  measure=lambda cfg: measure_infer(cfg, keep_model=True),
                  error_row=lambda cfg, message: _row_for(cfg, "error", message),
                  name="infer", held="allocated beyond the kept model",
                  baseline=held_baseline, on_error=release_model)


class _InferChild(ConfigChild):
    """One ``python -m attnmem.measure.infer.worker`` process."""

    def __init__(self, env: dict[str, str] | None) -> None:
        super().__init__([WORKER_MODULE], env)


#: A run's rows, its time and the child processes it started (run_common.RunSummary).
InferRunSummary = RunSummary


def run_infer(configs: Sequence[InferConfig], *,
              on_result: Callable[[InferResult, int, int], None] | None = None,
              timeout_s: float = 300.0, startup_s: float = 90.0,
              budget_s: float | None = None, skip_longer_after_oom: bool = True,
              gpu_index: int = 0, lock_wait_s: float = 0.0,
              lock_dir: str | os.PathLike[str] | None = None,
              env: dict[str, str] | None = None) -> InferRunSummary:
    """Measure ``configs`` one by one in a child process, holding the GPU lock.

    ``budget_s``: configurations not started within that many seconds of the start are
    recorded as ``skipped``. ``timeout_s`` limits each configuration (plus ``startup_s`` for a
    fresh child's first). An OOM skips the longer prompts of the same series.
    """
    return run_configs(configs, new_child=lambda e: _InferChild(e), result=InferResult,
                       row_for=_row_for, length="prompt_len", length_label="prompt ",
                       on_result=on_result, timeout_s=timeout_s, startup_s=startup_s,
                       budget_s=budget_s, skip_longer_after_oom=skip_longer_after_oom,
                       gpu_index=gpu_index, lock_wait_s=lock_wait_s, lock_dir=lock_dir,
                       env=env)


if __name__ == "__main__":
    serve(worker_main)
