"""The score matrix of standard attention: the s x s matrix that FlashAttention never stores.

Vaswani et al., "Attention Is All You Need" (arXiv 1706.03762), eq. 1: softmax(Q K^T / sqrt(d)) V.
Q K^T has one score per (query, key) pair, for every batch element and head, so one layer holds
B * H * s_q * s_k scores; at e bytes per score that is B * H * s^2 * e bytes when s_q = s_k = s.
The Score matrix page draws it against s (`score_curve`) and at s/2, s, 2s, 4s
(`score_doublings`: twice the length, four times the memory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where a table is built: a bare calc import skips it
    import pandas as pd

from attnmem.calc.units import (
    MAX_BATCH,
    MAX_HEADS,
    MAX_SEQ_LEN,
    ceil_bytes,
    check_bytes_per_element,
    check_int,
)

#: The lengths of the Score matrix page's line: powers of two, 128 .. 16,777,216.
CURVE_LENS = tuple(1 << p for p in range(7, 25))


def score_matrix_bytes(
    batch: int, heads: int, seq_len: int, bytes_per_element: float | str
) -> int:
    """Bytes of one layer's attention score matrix: B * H * s^2 * e.

    batch, heads, seq_len: whole numbers (B, H, s); bytes_per_element: e in bytes (2 for
    16-bit, 0.5 for int4) or a dtype name such as 'fp16'. Returns whole bytes (exact; half
    bytes round up). Worked example: B=1, H=32, s=4096, e=2 -> 1,073,741,824 bytes (1.07 GB,
    exactly 1 GiB). Source: Vaswani et al. 2017, eq. 1 (the s x s matrix Q K^T).
    """
    b = check_int("batch", batch, 1, MAX_BATCH)
    h = check_int("heads", heads, 1, MAX_HEADS)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    e = check_bytes_per_element(bytes_per_element)
    return ceil_bytes(b * h * s * s * e)


def score_curve(batch: int, heads: int, bytes_per_element: float | str,
                lens: tuple[int, ...] = CURVE_LENS) -> pd.DataFrame:
    """Score-matrix bytes at the lengths `lens` (the chart's line): columns seq_len, bytes."""
    import pandas as pd
    return pd.DataFrame({"seq_len": lens, "bytes": [
        score_matrix_bytes(batch, heads, s, bytes_per_element) for s in lens]})


def score_doublings(batch: int, heads: int, seq_len: int,
                    bytes_per_element: float | str) -> pd.DataFrame:
    """The score matrix at s/2, s, 2s and 4s, where that length is a whole number of tokens
    within MAX_SEQ_LEN: columns seq_len, bytes, GB (10^9 B), GiB (2^30 B), and "× memory" (over
    the bytes at s: x4 per doubling, s being squared)."""
    import pandas as pd
    n_bytes = score_matrix_bytes(batch, heads, seq_len, bytes_per_element)
    rows = []
    for factor in (0.5, 1, 2, 4):
        s = int(seq_len * factor)
        if 1 <= s <= MAX_SEQ_LEN and s * 2 == int(seq_len * factor * 2):
            b = score_matrix_bytes(batch, heads, s, bytes_per_element)
            rows.append({"seq_len": s, "bytes": b, "GB": b / 1e9, "GiB": b / 2**30,
                         "× memory": b / n_bytes})
    return pd.DataFrame(rows)
