"""The longest sequence that fits a memory budget, found exactly by integer search.

Every memory function here is non-decreasing in s, so the largest fitting s is pinned down by
a bracket: a length that fits and one that does not, narrowed until they are adjacent. No
floating-point root of a quadratic is taken as the answer (it would be off by one near the
boundary): every length is decided by evaluating the cost there.

The probes are placed by interpolation with a bisection safeguard, as in Dekker's method
(T. J. Dekker, "Finding a zero by means of successive linear interpolation", 1969; R. P.
Brent, Algorithms for Minimization without Derivatives, 1973, ch. 4), on integers: while no
length is known not to fit, the next probe extrapolates the last two fitting probes (at least
doubling, at most GROW times the last); once bracketed, it interpolates the last two probes,
and halves the bracket (geometrically while it spans more than a factor of 4) whenever two
probes have not halved it. The memory curves are close to linear or quadratic away from the
allocator's rounding steps, so this takes 2-6x fewer cost evaluations than doubling from 1 and
bisecting (tests/calc/test_fit_search.py counts them), with the same answer: the bracket only
ever moves to a probe's decided side, so for a non-decreasing cost it ends at the one s with
cost(s) <= budget < cost(s + 1), wherever the probes fell.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real

from attnmem.calc.peak import AttentionCall, attention_peak_bytes, call_of
from attnmem.calc.units import MAX_SEQ_LEN, check_int

#: Largest growth of one probe over the last fitting one before a bracket is found: an
#: extrapolation from a nearly flat start (weights dominate below a few thousand tokens) would
#: otherwise jump to `hi` and leave a bracket of many orders of magnitude.
GROW = 64


def _toward(s0: int, c0: float, s1: int, c1: float, budget: float) -> float | None:
    """Where the line through (s0, c0) and (s1, c1) reaches `budget`; None where it does not
    say (a flat or infinite segment, a value past float range)."""
    try:
        if c1 == c0 or not (math.isfinite(c0) and math.isfinite(c1)):
            return None
        x = s1 + (budget - c1) * (s1 - s0) / (c1 - c0)
    except (OverflowError, ZeroDivisionError, TypeError):
        return None
    return x if math.isfinite(x) else None


def largest_fitting(cost: Callable[[int], int], budget_bytes: int, hi: int = MAX_SEQ_LEN, *,
                    start: int | None = None) -> int:
    """Largest s in [1, hi] with cost(s) <= budget_bytes, or 0 if cost(1) already exceeds it.

    cost must be non-decreasing in s. Exact: cost(result) fits and cost(result + 1) does not
    (unless result == hi). `start`, a length in [1, hi] the caller expects near the answer
    (a bound known from a neighbouring search), is probed first: it only places that probe,
    so a wrong one costs a few evaluations, never the answer.
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, Real):
        raise ValueError(f"budget_bytes must be a number of bytes, got {budget_bytes!r}")
    if budget_bytes != budget_bytes:  # NaN
        raise ValueError("budget_bytes must be a number of bytes, got NaN")
    hi = check_int("hi", hi, 1, MAX_SEQ_LEN)
    if start is not None:
        start = check_int("start", start, 1, hi)
    budget = budget_bytes
    first = cost(1)
    if first > budget:
        return 0
    probes = [(1, first)]  # every (s, cost) evaluated, in order
    lo, top = 1, hi + 1  # lo fits; top does not, or is past hi (not evaluated)
    if start is not None and start > 1:
        c = cost(start)
        probes.append((start, c))
        if c <= budget:
            lo = start
        else:
            top = start
    # No length known not to fit yet: grow from the largest fitting length, at least doubling,
    # by extrapolating the last two fitting probes (past their line by 1%, so a near-linear
    # cost is bracketed with the next probe), at most GROW times.
    while top == hi + 1:
        if lo == hi:
            return hi
        nxt = 2 * lo
        fit_probes = [p for p in probes if p[1] <= budget]
        if len(fit_probes) >= 2:
            (s0, c0), (s1, c1) = fit_probes[-2:]
            x = _toward(s0, c0, s1, c1, budget)
            nxt = max(nxt, GROW * lo if x is None else min(math.ceil(x * 1.01) + 1, GROW * lo))
        p = min(nxt, hi)
        c = cost(p)
        probes.append((p, c))
        if c <= budget:
            lo = p
        else:
            top = p
    # Bracketed: lo fits, top does not. Interpolate the last two probes (clamped inside the
    # bracket), or halve the bracket when two probes have not halved it.
    widths = [top - lo]
    while top - lo > 1:
        m = None
        if len(widths) < 3 or 2 * widths[-1] <= widths[-3]:
            (s0, c0), (s1, c1) = probes[-2:]
            x = _toward(s0, c0, s1, c1, budget)
            if x is not None:
                m = min(max(math.floor(x), lo + 1), top - 1)
        if m is None:  # geometric middle over a wide bracket, else the arithmetic one
            m = math.isqrt(lo * top) if top > 4 * lo else (lo + top) // 2
            m = min(max(m, lo + 1), top - 1)
        c = cost(m)
        probes.append((m, c))
        if c <= budget:
            lo = m
        else:
            top = m
        widths.append(top - lo)
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
