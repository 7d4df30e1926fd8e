"""One torchrun rank of attnmem.measure.ring.multi with an out-of-memory error injected, for
tests/kernels/test_ring_multi.py: without a GPU nothing runs out of memory, so this rank
script makes one rank's calls of at least FROM tokens fail where step STEP of its PHASE (fwd
or bwd) begins, with the error CUDA's allocator raises, and then runs measure_multi as it is.
The drain of the ring and the longest-context search are then exercised on gloo processes.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/kernels/ring_oom_rank.py RANK:PHASE:STEP:FROM <measure_multi arguments>
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def inject(rank: int, phase: str, step: int, from_len: int) -> None:
    """Patch measure_multi in this process: the call's length is noted when a call starts, and
    the ring's communicator raises torch.cuda.OutOfMemoryError at the chosen step's start."""
    import torch

    from attnmem.measure.ring import multi as mm

    seen = {"s": 0}
    real_call, real_ring_class = mm.Caller.call, mm._p2p_ring_class

    def call(self, *args):
        seen["s"] = self.s
        return real_call(self, *args)

    def ring_class():
        class FailingRing(real_ring_class()):
            def mark(self, ph: str, st: int, where: str) -> None:
                if (where == "begin" and seen["s"] >= from_len
                        and (self.rank, ph, st) == (rank, phase, step)):
                    raise torch.cuda.OutOfMemoryError(
                        f"injected out of memory (rank {self.rank}, {ph} step {st})")
                super().mark(ph, st, where)

        return FailingRing

    mm.Caller.call = call
    mm._p2p_ring_class = ring_class


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    where = sys.argv[1].split(":")
    inject(int(where[0]), where[1], int(where[2]), int(where[3]))
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from _interp import quick_interpreter

        quick_interpreter()  # tests/_interp.py: the interpreter without two redundant costs
    from attnmem.measure import torchrun
    from attnmem.measure.ring import multi as measure_multi

    torchrun.exit_rank(measure_multi.main(sys.argv[2:]))
