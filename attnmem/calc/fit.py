"""The longest sequence that fits a memory budget, found exactly by integer search.

Every memory function here is non-decreasing in s, so the largest fitting s is found by
doubling until the budget is exceeded, then bisecting: O(log s) exact evaluations, no
floating-point root of a quadratic (which would be off by one near the boundary).
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Real

from attnmem.calc.peak import AttentionCall, attention_peak_bytes, call_of
from attnmem.calc.units import MAX_SEQ_LEN, check_int


def largest_fitting(cost: Callable[[int], int], budget_bytes: int, hi: int = MAX_SEQ_LEN) -> int:
    """Largest s in [1, hi] with cost(s) <= budget_bytes, or 0 if cost(1) already exceeds it.

    cost must be non-decreasing in s. Exact: cost(result) fits and cost(result + 1) does not
    (unless result == hi).
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, Real):
        raise ValueError(f"budget_bytes must be a number of bytes, got {budget_bytes!r}")
    if budget_bytes != budget_bytes:  # NaN
        raise ValueError("budget_bytes must be a number of bytes, got NaN")
    hi = check_int("hi", hi, 1, MAX_SEQ_LEN)
    if cost(1) > budget_bytes:
        return 0
    lo = 1  # fits
    step = 2
    while step <= hi and cost(step) <= budget_bytes:
        lo = step
        step *= 2
    top = min(step, hi + 1)  # does not fit (or is past hi)
    while top - lo > 1:
        mid = (lo + top) // 2
        if cost(mid) <= budget_bytes:
            lo = mid
        else:
            top = mid
    return lo


def max_seq_len(
    impl: str | AttentionCall,
    budget_bytes: int,
    batch: int | None = None,
    heads: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    causal: bool = False,
    backward: bool = False,
    kv_heads: int | None = None,
) -> int:
    """Longest s whose predicted attention peak (attnmem.calc.peak.attention_peak_bytes) fits
    budget_bytes; 0 when not even s = 1 fits. Exact integer search (see largest_fitting).
    `impl` may be an AttentionCall given alone (its seq_len is what is searched): the call
    is checked once, and each step of the search checks only the new length."""
    seq_len = None if isinstance(impl, AttentionCall) else 1  # a given call brings its own
    call = call_of(impl, batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads)
    return largest_fitting(lambda s: attention_peak_bytes(call.with_seq_len(s)), budget_bytes)
