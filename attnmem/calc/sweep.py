"""Sweeps of the analytic model as pandas DataFrames, ready for plotting.

Each row is one (implementation, x) point with the predicted extra peak of attnmem.calc.peak and, for
reference, the score-matrix size B·H·s²·e of attnmem.calc.scores. Beside them, the tables the
Scaling and GPU measurement pages draw from the same model: where each implementation runs
out of memory on each GPU (`oom_table`, attnmem.calc.fit.max_seq_len), one call's peak split
into the allocator's blocks and its reserved growth (`call_detail`), and the model's curves
under measured points (`predicted_curves`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where a table is built: a bare calc import skips it
    import pandas as pd

from attnmem.calc.fit import max_seq_len
from attnmem.calc.gpus import GPUS
from attnmem.calc.peak import (
    IMPL_KIND,
    IMPLEMENTATIONS,
    AttentionCall,
    attention_peak_breakdown,
    attention_peak_bytes,
    attention_reserved_bytes,
    call_of,
    check_impl,
)
from attnmem.calc.scores import score_matrix_bytes
from attnmem.calc.units import MAX_BATCH, MAX_HEADS, MAX_SEQ_LEN, check_int

SWEEP_PARAMS = ("batch", "heads")
MAX_SWEEP_POINTS = 10_000


def _impl_list(impls: object) -> list[str]:
    """A list of implementation names, refusing a bare string (it would iterate letters)."""
    if isinstance(impls, str) or not isinstance(impls, Iterable):
        raise ValueError(f"impls must be a list of implementation names, got {impls!r:.80}")
    return [check_impl(i) for i in impls]


def _int_list(name: str, values: object, hi: int) -> list[int]:
    """A list of whole numbers from 1 to hi, at most MAX_SWEEP_POINTS of them."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list of whole numbers, got {values!r:.80}")
    out = []
    for v in values:
        out.append(check_int(name, v, 1, hi))
        if len(out) > MAX_SWEEP_POINTS:
            raise ValueError(f"{name} may hold at most {MAX_SWEEP_POINTS:,} values")
    return out


def _calls(impls: list[str], *shape: object) -> list[AttentionCall]:
    """One AttentionCall per implementation with the shape arguments; with no implementation
    the shape is still checked (as the eager one's, which runs every attention dtype)."""
    calls = [call_of(impl, *shape) for impl in impls]
    if not calls:
        call_of("naive", *shape)
    return calls


def default_seq_lens(lo: int = 128, hi: int = 1_048_576) -> list[int]:
    """Powers of two from lo to hi inclusive (lo rounded up, hi down to a power of two)."""
    lo = check_int("lo", lo, 1, MAX_SEQ_LEN)
    hi = check_int("hi", hi, lo, MAX_SEQ_LEN)
    out, s = [], 1
    while s <= hi:
        if s >= lo:
            out.append(s)
        s *= 2
    return out


def sweep_seq_len(
    impls: Iterable[str],
    seq_lens: Sequence[int],
    batch: int,
    heads: int,
    head_dim: int,
    dtype: str,
    causal: bool = False,
    backward: bool = False,
    kv_heads: int | None = None,
) -> pd.DataFrame:
    """Predicted peak against sequence length: columns impl, kind, seq_len, peak_bytes,
    score_bytes (one row per implementation and length)."""
    import pandas as pd
    impls = _impl_list(impls)
    seq_lens = _int_list("seq_lens", seq_lens, MAX_SEQ_LEN)
    # One call per implementation, checked once (even when a list is empty), then moved
    # along the lengths.
    calls = _calls(impls, batch, heads, 1, head_dim, dtype, causal, backward, kv_heads)
    rows = []
    for s in seq_lens:
        scores = score_matrix_bytes(batch, heads, s, dtype)
        for call in calls:
            peak = attention_peak_bytes(call.with_seq_len(s))
            rows.append((call.impl, IMPL_KIND[call.impl], int(s), peak, scores))
    return pd.DataFrame(rows, columns=["impl", "kind", "seq_len", "peak_bytes", "score_bytes"])


def sweep_param(
    name: str,
    values: Sequence[int],
    impls: Iterable[str],
    seq_len: int,
    batch: int,
    heads: int,
    head_dim: int,
    dtype: str,
    causal: bool = False,
    backward: bool = False,
) -> pd.DataFrame:
    """Predicted peak against batch or heads (linear in both): columns impl, kind, <name>,
    peak_bytes."""
    import pandas as pd
    if name not in SWEEP_PARAMS:
        raise ValueError(f"name must be one of {', '.join(SWEEP_PARAMS)}, got {name!r}")
    impls = _impl_list(impls)
    values = _int_list(name, values, MAX_BATCH if name == "batch" else MAX_HEADS)
    calls = _calls(impls, batch, heads, seq_len, head_dim, dtype, causal, backward, None)
    rows = []
    for v in values:
        for call in calls:
            peak = attention_peak_bytes(replace(call, **{name: v}))
            rows.append((call.impl, IMPL_KIND[call.impl], int(v), peak))
    return pd.DataFrame(rows, columns=["impl", "kind", name, "peak_bytes"])


def param_values(by: str) -> list[int]:
    """The batch (or heads) values of a linear sweep: linear in both, so a dozen points draw
    the same lines as a hundred (and cost 10x less); heads go on to 128."""
    values = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
    return values if by == "batch" else [*values, 80, 96, 112, 128]


def oom_table(impls: Iterable[str], gpus: Iterable[str], b: int, h: int, d: int, dtype: str,
              causal: bool, bwd: bool, gpu_bytes: Mapping[str, int] = GPUS) -> pd.DataFrame:
    """Longest s that fits each GPU (attnmem.calc.fit.max_seq_len, an exact integer search), per
    implementation, and the peak there (0 where nothing fits): columns gpu, impl, max_seq_len,
    peak_bytes_at_max."""
    import pandas as pd
    rows = []
    for gpu in gpus:
        for impl in impls:
            s_max = max_seq_len(impl, gpu_bytes[gpu], b, h, d, dtype, causal, bwd)
            peak = attention_peak_bytes(impl, b, h, s_max, d, dtype, causal, bwd) if s_max else 0
            rows.append((gpu, impl, s_max, peak))
    return pd.DataFrame(rows, columns=["gpu", "impl", "max_seq_len", "peak_bytes_at_max"])


def call_detail(impls: Iterable[str], s: int, b: int, h: int, d: int, dtype: str, causal: bool,
                bwd: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per implementation at one s: the peak as max_memory_allocated() counts it, the tensor
    bytes inside it, the allocator's rounding, the reserved growth
    (attnmem.calc.peak.attention_reserved_bytes; None where not predicted); and every term
    (attnmem.calc.peak.attention_peak_breakdown)."""
    import pandas as pd
    summary, terms = [], []
    for impl in impls:
        parts = attention_peak_breakdown(impl, b, h, s, d, dtype, causal, bwd)
        reserved = attention_reserved_bytes(impl, b, h, s, d, dtype, causal, bwd)
        summary.append((impl, sum(t.counted_bytes for t in parts),
                        sum(t.tensor_bytes for t in parts), sum(t.rounding_bytes for t in parts),
                        reserved))
        terms += [(impl, t.label, t.tensors, t.tensor_bytes, t.counted_bytes, t.rounding_bytes)
                  for t in parts]
    return (pd.DataFrame(summary, columns=["impl", "allocated_peak_bytes", "tensor_bytes",
                                           "rounding_bytes", "reserved_growth_bytes"]),
            pd.DataFrame(terms, columns=["impl", "term", "tensors", "tensor_bytes",
                                         "counted_bytes", "rounding_bytes"]))


def curve_seq_lens(lo: int, hi: int) -> list[int]:
    """Powers of two from lo and the halfway points (1.5 x each) within [lo, hi]: a smooth
    line on log axes."""
    lens, s = [], lo
    while s <= hi:
        lens += [s, int(s * 1.5)]
        s *= 2
    return sorted({x for x in lens if lo <= x <= hi})


def predicted_curves(impls: Iterable[str], lo: int, hi: int, b: int, h: int, d: int, dtype: str,
                     causal: bool, bwd: bool, hkv: int | None) -> pd.DataFrame:
    """`sweep_seq_len` over `curve_seq_lens(lo, hi)` for the implementations the model knows (a
    name it does not model gets measured points and no curve); where one implementation refuses
    the shape, the others' curves."""
    import pandas as pd
    impls = tuple(i for i in impls if i in IMPLEMENTATIONS)
    lens = curve_seq_lens(lo, hi)
    try:
        return sweep_seq_len(impls, lens, b, h, d, dtype, causal, bwd, kv_heads=hkv)
    except ValueError:  # one model refuses this shape: draw the others' curves
        parts = []
        for impl in impls:
            try:
                parts.append(sweep_seq_len((impl,), lens, b, h, d, dtype, causal, bwd, kv_heads=hkv))
            except ValueError:
                continue
        return pd.concat(parts, ignore_index=True) if parts else sweep_seq_len((), lens, b, h, d,
                                                                              dtype, causal, bwd)
