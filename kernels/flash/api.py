"""The bundled Triton FlashAttention: input checks, the autograd Function, the public call.

The kernels live one job per file: ``fwd.py`` (the portable forward), ``fwd_sm90.py`` (the
forward hand-scheduled for Hopper, in Gluon) and ``bwd.py`` (the backward); ``common.py`` holds
what they share, ``config.py`` the call's choices (`KernelConfig`) and the process settings,
``tuned.py`` the stored tiles. This module only checks inputs and wires the two directions into
autograd. Importing it imports triton and torch but touches no GPU driver: nothing runs until
the first call.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from kernels.flash.bwd import atomic_by_default, attention_backward, kv_split
from kernels.flash.config import KernelConfig, Tiles
from kernels.flash.fwd import attention_forward, fwd_kernel

__all__ = ["KernelConfig", "Tiles", "flash_attention", "forward_backward_bytes",
           "forward_bytes", "interpreting"]

HEAD_DIM_MIN = 16
HEAD_DIM_MAX = 256
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The interpreter runs one small tile (a config's other choices are kept), and the two-kernel
# backward unless a config asks for the atomic one.
INTERPRETER_TILES = Tiles(32, 32, 4, 1)


def interpreting() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1 set
    before triton was imported): then CPU tensors are accepted."""
    return type(fwd_kernel).__name__ == "InterpretedFunction"


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-d (batch, heads, seq_len, head_dim), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(
                f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k, v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k, v must be on one device, got q {q.device}, k {k.device}, v {v.device}")
    B, H, s_q, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got k {tuple(k.shape)}, v {tuple(v.shape)}")
    Bk, H_kv, s_k, d_k = k.shape
    if Bk != B:
        raise ValueError(f"q and k must have one batch size, got q {B}, k {Bk}")
    if d_k != d:
        raise ValueError(f"q and k/v must have one head dim, got q {d}, k/v {d_k}")
    if not HEAD_DIM_MIN <= d <= HEAD_DIM_MAX:
        raise ValueError(
            f"head_dim must be from {HEAD_DIM_MIN} to {HEAD_DIM_MAX}, got {d}")
    if H_kv == 0 or H % H_kv != 0:
        raise ValueError(
            f"query heads must be a multiple of key/value heads (GQA), got H={H}, H_kv={H_kv}")
    if s_q == 0 or s_k == 0 or B == 0 or H == 0:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number or None, got {scale}")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"q, k, v must be CUDA tensors (got device {q.device}); CPU tensors are accepted "
            "only under Triton's interpreter (TRITON_INTERPRET=1 set before importing triton)")


def _check_window(window, causal: bool, s_q: int) -> int | None:
    """The window to run: None (no window) or an int from 1 to s_q - 1.

    A window must be a positive int (not a bool) and needs causal=True; a window of s_q keys
    or more hides no key from any query (query i sees at most i + 1 <= s_q keys), so it is
    dropped and the call takes the unwindowed path exactly."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int (keys each query sees, itself "
                         f"included) or None, got {window!r}")
    if not causal:
        raise ValueError(f"window={window} was given with causal=False; the sliding window is "
                         "causal only (query i sees keys i - window + 1 .. i): pass "
                         "causal=True, or window=None for full attention")
    return None if window >= s_q else int(window)


class FlashAttentionFunction(torch.autograd.Function):
    """Forward saves q, k, v (the caller's own tensors), O and lse2; backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, config: KernelConfig | None,
                window: int | None = None):
        o, lse2 = attention_forward(q, k, v, causal, scale, config, window)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale, ctx.config, ctx.window = causal, scale, config, window
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse2 = ctx.saved_tensors
        dq, dk, dv = attention_backward(do, q, k, v, o, lse2, ctx.causal, ctx.scale, ctx.config,
                                        ctx.window)
        return dq, dk, dv, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    config: KernelConfig | dict | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Exact attention softmax(scale * q k^T) v without materialising the s x s matrix.

    Shapes: q (B, H, s_q, d); k and v (B, H_kv, s_k, d) with H % H_kv == 0 (grouped-query
    attention: query head h reads key/value head h // (H // H_kv)); returns (B, H, s_q, d)
    in q's dtype. dtype float16 or bfloat16 (float32 accumulation inside), or float32
    (exact fp32 products, slower). d from 16 to 256, any value (padded to a power of two
    inside the kernel); any s_q, s_k >= 1. Differentiable with respect to q, k and v.

    ``causal=True`` uses PyTorch SDPA's ``is_causal`` alignment: TOP LEFT, query i sees keys
    0..i also when s_q != s_k (mask = ones(s_q, s_k).tril(0)). ``scale`` defaults to
    1/sqrt(d) and must be positive.

    ``window=W`` (with ``causal=True`` only; a positive int) is a causal sliding window: query
    i sees key j iff j <= i and i - j < W, i.e. the W keys i - W + 1 .. i, itself included, in
    the same top-left alignment as the causal mask. That is transformers'
    ``sliding_window_overlay`` on its causal mask (masking_utils: a key is visible when
    kv_idx > q_idx - sliding_window) and Mistral's window (Jiang et al. 2023, arXiv
    2310.06825, section 2). The kernels skip every key/query tile outside the window and mask
    the tiles at its edge, so the work is O(s_q * W) instead of O(s_q * s_k). W >= s_q hides
    nothing and runs the unwindowed path exactly (for s_q == s_k: W >= s_k). With
    s_q > s_k, query rows from s_k + W - 1 on see no key at all: their output is 0 and their
    gradients are 0 (FlashAttention-2's convention for an empty row). A windowed call runs
    the portable Triton forward also on Hopper (the Gluon forward has no window). The window
    changes no allocation: Memory below holds for every W.

    Strides: inputs and the upstream gradient are read through their strides as they are
    (no copy is made); O and the gradients are allocated contiguous.

    Memory (e = bytes per element of the dtype), beyond q, k, v (and dO):
      forward:            B*H*s_q*(d*e + 4)            O and one fp32 log-sum-exp per row
      forward + backward: 2*B*H*s_q*d*e + 2*B*H_kv*s_k*d*e + 8*B*H*s_q
                          (O, dQ; dK, dV; the log-sum-exp and delta = rowsum(dO*O), fp32)
                          + 4*B*H*s_q*d where the backward adds dQ with atomics into an fp32
                          buffer: by default for fp16/bf16 at d = 64 and 128 once
                          s_q >= 4,096 and B*H_kv*ceil(s_k/128) >= 256 (the Hopper region,
                          `calc.dispatch.sm90_region`, where Hopper runs the Gluon backward),
                          or max(s_q, s_k) > 2,048 and B*H_kv*S*ceil(s_k/BLOCK_N) >= 2,048
                          (BLOCK_N = d; kernels/flash/bwd.py, `atomic_by_default`),
                          unless torch.use_deterministic_algorithms(True) is in force (the
                          atomic adds make dQ nondeterministic in its last bits)
                          + 2*B*H_kv*S*s_k*d*e with GQA where the backward splits each group
                          over S programs (partial dK, dV sums; outside the Hopper region,
                          S > 1 when B*H_kv*ceil(s_k/128) < 1,024: `bwd.kv_split`)
    Under torch.no_grad() the forward still writes the log-sum-exp (the same kernel runs).

    ``config``: a `KernelConfig` (every field None by default: the kernels' own rules) to
    force a choice: ``tiles`` for the Triton kernels (bypasses the autotuner; tests and the
    interpreter use it, and the interpreter always runs a fixed small tile), ``use_desc`` for
    the forward's K/V loads through tensor descriptors, ``atomic_dq`` for the backward that
    adds dQ into an fp32 buffer with atomic adds (5 tile products instead of 7,
    nondeterministic dQ, B*H*s_q*d*4 bytes more; the default for long sequences, see Memory)
    or the two-kernel one, ``kv_split`` = S (a divisor of H / H_kv) to split each GQA group
    over S dK/dV programs instead of the default `bwd.kv_split` (see Memory). A dict of the
    older keys ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "USE_DESC", "SM90",
    "SM90_STAGES", "SM90_BLOCK_N", "SM90_CONSUMERS", "BWD_ATOMIC_DQ", "BWD_DQ_TMA",
    "BWD_KV_SPLIT") is accepted and converted once (`KernelConfig.from_dict`, which says what
    a missing key means); an unknown key or a bad value raises ValueError naming it.

    On a Hopper GPU (compute capability 9.x, Triton with Gluon), fp16/bf16 run the
    hand-scheduled forward of ``fwd_sm90`` (same outputs, faster; see its docstring) at
    d = 128, and at d = 64 when s_q and s_k both exceed 2,048 (4,096 when causal; with three
    consumer warpgroups: 192 query rows per program). FLASH_ATTN_SM90=0 turns it off;
    ``KernelConfig(sm90=True)`` selects it for d = 64 at any length,
    ``KernelConfig(sm90=True, sm90_consumers=3, sm90_stages=2)`` with three warpgroups,
    ``sm90=False`` the portable Triton forward. Elsewhere, on a Hopper GPU (Triton >= 3.4)
    the Triton forward reads K and V through tensor descriptors (the TMA copy engine) for
    16-bit inputs with s_k > 1024 whose (batch, head, seq) flatten into rows (the contiguous
    layout), and through pointers otherwise; FLASH_ATTN_DESC=0 turns the descriptors off,
    FLASH_ATTN_TUNE=1 re-tunes instead of using the stored H200 choices. The environment is
    read once, at import (`config.SETTINGS`).
    """
    config = KernelConfig.of(config)
    _check_inputs(q, k, v, scale)
    window = _check_window(window, bool(causal), q.shape[2])
    if window is not None and config is not None and config.sm90:
        raise ValueError(f"config sm90=True was given with window={window}; the Hopper Gluon "
                         "forward has no sliding window (windowed calls run the portable "
                         "Triton forward): leave sm90 unset or False")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if interpreting() and (config is None or config.tiles is None):
        config = config or KernelConfig()
        config = replace(config, tiles=INTERPRETER_TILES, atomic_dq=bool(config.atomic_dq))
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        # No gradient can be asked for: skip autograd's bookkeeping (host time that short
        # sequences feel) and save nothing for a backward.
        return attention_forward(q, k, v, bool(causal), float(scale), config, window)[0]
    return FlashAttentionFunction.apply(q, k, v, bool(causal), float(scale), config, window)


def forward_bytes(B: int, H: int, s_q: int, d: int, e: int) -> int:
    """Extra bytes of one forward call: O plus one fp32 log-sum-exp per row."""
    return B * H * s_q * (d * e + 4)


def forward_backward_bytes(B: int, H: int, H_kv: int, s_q: int, s_k: int, d: int, e: int,
                           atomic: bool | None = None, split: int | None = None) -> int:
    """Peak extra bytes of forward + backward with q, k, v and dO allocated before the call:
    O + lse2 + delta + dQ + dK + dV, all alive at once at the end of the backward, plus the
    atomic-dQ backward's fp32 buffer (B*H*s_q*d*4, alive while dQ is cast from it) when that
    backward runs: ``atomic`` None means where it runs by default
    (`bwd.atomic_by_default`, and not in deterministic mode); plus, with GQA where
    the backward splits each group over S programs (`bwd.kv_split`, S > 1), the
    partial dK, dV sums 2*B*H_kv*S*s_k*d*e, alive until they are summed into dK, dV (``split``
    None means the default split; a config's ``kv_split`` gives another)."""
    if atomic is None:
        atomic = atomic_by_default(B, H, H_kv, s_q, s_k, d, e)
    buffer = 4 * B * H * s_q * d if atomic else 0
    if split is None:
        split = kv_split(B, H, H_kv, s_q, s_k, d, e)
    partial = 2 * B * H_kv * split * s_k * d * e if split > 1 else 0
    return (2 * B * H * s_q * d * e + 2 * B * H_kv * s_k * d * e + 8 * B * H * s_q + buffer
            + partial)
