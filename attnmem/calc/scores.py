"""The score matrix of standard attention: the s x s matrix that FlashAttention never stores.

Vaswani et al., "Attention Is All You Need" (arXiv 1706.03762), eq. 1: softmax(Q K^T / sqrt(d)) V.
Q K^T has one score per (query, key) pair, for every batch element and head, so one layer holds
B * H * s_q * s_k scores; at e bytes per score that is B * H * s^2 * e bytes when s_q = s_k = s.
"""

from __future__ import annotations

from attnmem.calc.units import (
    MAX_BATCH,
    MAX_HEADS,
    MAX_SEQ_LEN,
    ceil_bytes,
    check_bytes_per_element,
    check_int,
)


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
