"""One rank of a ring, simulated on one device: no process group, no second GPU.

`SimulatedRing` stands in for `ring.P2PRing`: where the real ring receives the previous
rank's key/value block into fresh buffers (torch.empty_like), it allocates the same buffers
and copies into them the block that rank ``rank`` would receive at that hop, from blocks
allocated before the call (so they count as inputs, like the other ranks' memory). The dK,
dV that would arrive are zeros (their values only matter for the other ranks' gradients).
What the rank allocates is therefore exactly what it allocates in a real ring (the
communication library's own buffers aside), and the local work of every step is the real
work; only the link is missing. With ``timing`` the local work of each step is timed with
CUDA events (`step_ms`).
"""

from __future__ import annotations

import torch


class SimulatedRing:
    def __init__(self, rank: int, size: int, kv_blocks, timing: bool = False):
        if not 0 <= rank < size:
            raise ValueError(f"rank must be from 0 to {size - 1}, got {rank}")
        if len(kv_blocks) != size:
            raise ValueError(f"kv_blocks must hold one (k, v) pair per rank ({size}), got "
                             f"{len(kv_blocks)}")
        self.rank, self.size = rank, size
        self._blocks = kv_blocks
        self._hops = 0
        self._timing = timing
        self._events: dict[tuple[str, int], list] = {}

    def begin(self, phase: str) -> None:
        self._hops = 0

    def mark(self, phase: str, step: int, where: str) -> None:
        if not self._timing:
            return
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self._events.setdefault((phase, step), []).append(ev)

    def start(self, tensors, kind: str):
        recvs = tuple(torch.empty_like(t) for t in tensors)
        if kind == "kv":
            self._hops += 1
            src = self._blocks[(self.rank - self._hops) % self.size]
            for buf, block in zip(recvs, src, strict=True):
                buf.copy_(block)
        else:
            for buf in recvs:
                buf.zero_()
        return tensors, recvs

    def wait(self, handle):
        return handle[1]

    def step_ms(self) -> dict[tuple[str, int], float]:
        """Milliseconds of each step's local work, {(phase, step): ms} (synchronises)."""
        torch.cuda.synchronize()
        return {key: evs[0].elapsed_time(evs[1]) for key, evs in self._events.items()
                if len(evs) == 2}

    def clear_timing(self) -> None:
        self._events.clear()
