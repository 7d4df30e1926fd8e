"""The plain eager attention reference: the correctness oracle for every fast kernel.

It materialises the full score matrix, so it is only for checking, never for speed. It runs
on any device (CPU included) and in any floating dtype; to get an accurate reference, call it
on fp32 (or fp64) copies of low-precision inputs.
"""

from __future__ import annotations

import math

import torch


def attention_reference(
    q: torch.Tensor,  # (B, H, s_q, d)
    k: torch.Tensor,  # (B, H_kv, s_k, d), H % H_kv == 0
    v: torch.Tensor,  # (B, H_kv, s_k, d)
    causal: bool = False,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """softmax(scale * q k^T [+ causal mask]) v, computed plainly in the inputs' dtype.

    Returns (B, H, s_q, d). ``scale`` defaults to 1/sqrt(d).

    Grouped-query attention: when k and v have fewer heads than q, each key/value head serves
    H // H_kv consecutive query heads (query head h reads key/value head h // (H // H_kv)),
    as ``repeat_interleave`` along the head axis expresses it.

    Causal alignment is PyTorch SDPA's ``is_causal=True``: the mask is
    ``torch.ones(s_q, s_k).tril(diagonal=0)``, aligned at the TOP LEFT, so query i sees keys
    0..i also when s_q != s_k (source: torch.nn.functional.scaled_dot_product_attention's
    documentation, reference implementation). Every row sees at least key 0, so no row is
    fully masked.

    ``window=W`` (causal only) also hides key j from query i when i - j >= W: query i sees
    keys i - W + 1 .. i, transformers' ``sliding_window_overlay`` (kv_idx > q_idx -
    sliding_window) on the same top-left causal mask. With s_q > s_k a row can then see no
    key (i >= s_k + W - 1); its output is 0, as FlashAttention-2 returns for an empty row
    (the plain softmax would give NaN), and no gradient flows through it.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be 4-d (B, H, s, d), got {q.dim()}-d, {k.dim()}-d, {v.dim()}-d")
    H, H_kv = q.shape[1], k.shape[1]
    if H % H_kv != 0:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({H_kv})")
    if H_kv != H:
        k = k.repeat_interleave(H // H_kv, dim=1)  # (B, H, s_k, d)
        v = v.repeat_interleave(H // H_kv, dim=1)  # (B, H, s_k, d)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, s_q, s_k)
    if window is not None and not causal:
        raise ValueError(f"window={window} needs causal=True")
    if causal:
        s_q, s_k = q.shape[-2], k.shape[-2]
        visible = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(diagonal=0)
        if window is not None:
            visible = visible & ~visible.tril(diagonal=-int(window))  # drop i - j >= window
        scores = scores.masked_fill(~visible, float("-inf"))
        if window is not None:
            seen = visible.any(dim=-1, keepdim=True)  # (s_q, 1): rows with a visible key
            probs = torch.softmax(scores.masked_fill(~seen, 0.0), dim=-1)
            return (probs * seen) @ v  # empty rows: 0
    probs = torch.softmax(scores, dim=-1)  # (B, H, s_q, s_k)
    return probs @ v  # (B, H, s_q, d)
