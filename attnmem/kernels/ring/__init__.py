"""Context parallelism: ring attention over the bundled FlashAttention kernel
(``attnmem.kernels.ring.ring``), its one-device simulator (``simulate``) and the one-rank
measurement (``python -m attnmem.measure.ring.one_rank``). Importing this package imports
torch, not triton: the kernel is imported on the first call."""

from attnmem.kernels.ring.ring import (
    P2PRing,
    ring_attention,
    ring_attention_with,
    shard,
    step_kind,
    unshard,
    zigzag_shard,
    zigzag_unshard,
)

__all__ = ["P2PRing", "ring_attention", "ring_attention_with", "shard", "step_kind", "unshard",
           "zigzag_shard", "zigzag_unshard"]
