"""Sweeps of the analytic model as pandas DataFrames, ready for plotting.

Each row is one (implementation, x) point with the predicted extra peak of attnmem.calc.peak and, for
reference, the score-matrix size B·H·s²·e of attnmem.calc.scores.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import pandas as pd

from attnmem.calc.peak import IMPL_KIND, AttentionCall, attention_peak_bytes, call_of, check_impl
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
