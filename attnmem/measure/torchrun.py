"""What the multi-process measurement commands share about torchrun: reading the ranks it
sets, and starting the ranks when the command was run as a plain ``python -m`` (so that a bad
argument is one clean message from this process, not a traceback from every rank).

Used by attnmem.measure.train_dist (sharded training steps) and attnmem.measure.ring.multi
(ring attention on several GPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence


def env_int(name: str) -> int | None:
    """The integer in environment variable ``name``, or None (unset or not a number)."""
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def ranks() -> tuple[int, int, int] | None:
    """(RANK, WORLD_SIZE, LOCAL_RANK) as torchrun sets them, or None outside torchrun."""
    rank, world, local = env_int("RANK"), env_int("WORLD_SIZE"), env_int("LOCAL_RANK")
    if rank is None or world is None or local is None:
        return None
    return rank, world, local


def start_ranks(argv: Sequence[str], nproc: int | None, module: str, check, usage: str) -> int:
    """Outside torchrun: check the arguments for ``nproc`` ranks (``check(nproc)`` raises
    ValueError naming the bad value) and start them (`launch`); an exit code, 2 with one
    line on stderr when there is no --nproc-per-node or the arguments are refused. ``usage``:
    how to run ``module`` under torchrun, for that line."""
    if nproc is None:
        print(f"error: no torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK); run it as "
              f"{usage}", file=sys.stderr)
        return 2
    try:
        check(nproc)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return launch(argv, nproc, module)


def launch(argv: Sequence[str], nproc: int, module: str) -> int:
    """Start ``nproc`` ranks of ``module`` with ``argv`` (without --nproc-per-node) through
    torchrun --standalone (a free port on this host); its exit code."""
    rest = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc-per-node":
            skip = True
        elif not a.startswith("--nproc-per-node="):
            rest.append(a)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), "-m", module, *rest]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


def init_process_group(timeout_s: float, local_rank: int) -> None:
    """The process group of a torchrun rank: NCCL on CUDA, on GPU ``local_rank``, with NVLink
    multicast off (NCCL_NVLS_ENABLE=0, set before NCCL starts: the multi-GPU machines require
    it); gloo on CPU. ValueError (naming the value and what is accepted) when the machine has
    fewer GPUs than ranks."""
    import datetime

    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if torch.cuda.is_available():
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        n = torch.cuda.device_count()
        if local_rank >= n:
            raise ValueError(f"LOCAL_RANK {local_rank} but this machine has {n} GPU(s); "
                             f"accepted: --nproc-per-node <= {n}")
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", timeout=timeout,
                                device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo", timeout=timeout)


def exit_rank(code: int) -> None:
    """End this process with ``code`` once its work is written, skipping the interpreter's
    teardown: C++ threads that torch's process-group and autograd machinery leave behind can
    make that teardown abort (SIGABRT, "terminate called without an active exception", seen
    now and then on 2 gloo ranks after every row was written), which would turn a finished
    run into a failed one."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
