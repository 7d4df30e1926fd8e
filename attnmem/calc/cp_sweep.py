"""Context parallelism over GPU counts: the sweeps the Many GPUs page draws.

Each point is one call of attnmem.calc.context_parallel: the per-GPU memory of one attention
call (`context_parallel_memory`, the worst rank's local inputs plus its extra peak) for
c = 1 to ``MAX_C``, and the longest trainable context and longest attention call on c GPUs
(`max_context_parallel_seq_len`, `max_context_parallel_attention_seq_len`, exact searches).
A point the model refuses (ValueError) is left out, or None.

Zigzag sharding cuts s into 2c equal chunks (Llama 3, Dubey et al. 2024, arXiv 2407.21783,
sec. 3.3.2), so a context is first rounded down to a multiple of 2c (`round_for`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where a table is built: a bare calc import skips it
    import pandas as pd

from attnmem.calc.context_parallel import (
    context_parallel_memory,
    max_context_parallel_attention_seq_len,
    max_context_parallel_seq_len,
)
from attnmem.calc.models import ModelConfig

#: The largest ring of the per-GPU sweep and the page's GPU-count input.
MAX_C = 64
#: GPU counts of the longest-context chart (each point is an exact search: a few ms each)
C_POINTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def round_for(s: int, world: int) -> int:
    """The longest context <= s that zigzag splits over `world` GPUs (a multiple of 2c)."""
    unit = 2 * world if world > 1 else 1
    return s // unit * unit


def per_gpu_sweep(impl: str, heads: int, kv_heads: int, head_dim: int, dtype: str, s: int,
                  backward: bool) -> pd.DataFrame:
    """One causal call of batch 1 over about s tokens on c = 1 to MAX_C GPUs (s rounded for
    each c): columns GPUs, seq_len, inputs_bytes, extra_peak_bytes, per_gpu_bytes, worst_rank."""
    import pandas as pd
    rows = []
    for world in range(1, MAX_C + 1):
        sw = round_for(s, world)
        if sw == 0:
            continue
        try:
            m = context_parallel_memory(impl, 1, heads, sw, head_dim, dtype, True, backward,
                                        world, kv_heads)
        except ValueError:
            continue
        rows.append({"GPUs": world, "seq_len": sw, "inputs_bytes": m.inputs_bytes,
                     "extra_peak_bytes": m.peak_extra_bytes, "per_gpu_bytes": m.total_bytes,
                     "worst_rank": m.rank})
    return pd.DataFrame(rows)


def longest_at(model: ModelConfig, gpu_bytes: int, impl: str, dtype: str, ckpt: bool,
               shard: bool, heads: int, kv_heads: int, head_dim: int, world: int) -> dict:
    """Longest trainable context and longest attention call on `world` GPUs (None: refused)."""
    row: dict = {"GPUs": world}
    try:
        row["training_seq_len"] = max_context_parallel_seq_len(
            model, gpu_bytes, world, impl=impl, checkpointing=ckpt,
            shard_states=shard)
    except ValueError:
        row["training_seq_len"] = None
    try:
        row["attention_seq_len"] = max_context_parallel_attention_seq_len(
            impl, gpu_bytes, 1, heads, head_dim, dtype, True, True, world, kv_heads)
    except ValueError:
        row["attention_seq_len"] = None
    return row


def longest_sweep(at: Callable[[int], dict], selected: int) -> pd.DataFrame:
    """`at(world)` (a `longest_at` with every other argument bound, which a caller may cache
    point by point) over C_POINTS and the selected GPU count, in increasing c."""
    import pandas as pd
    return pd.DataFrame([at(world) for world in sorted({*C_POINTS, selected})])
