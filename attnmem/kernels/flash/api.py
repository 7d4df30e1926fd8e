"""The bundled Triton FlashAttention: input checks, the autograd Function, the public call.

A call goes `flash_attention` (here: input checks, autograd) -> ``route.py`` (which kernel
runs, forward and backward: `route.forward_route`, `route.backward_route`) -> the kernel files,
one job each: ``fwd.py`` (the portable forward), ``fwd_sm90.py`` (the forward hand-scheduled
for Hopper, in Gluon), ``bwd.py`` (the portable backward), ``bwd_sm90.py`` (the Hopper
backward); ``common.py`` holds what they share, ``config.py`` the call's choices
(`KernelConfig`) and the process settings, ``tuned.py`` the stored tiles. Importing it
imports triton and torch but touches no GPU driver: nothing runs until the first call.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import replace

import torch

from attnmem.calc import dispatch
from attnmem.kernels.flash.common import Packed
from attnmem.kernels.flash.config import KernelConfig, Tiles
from attnmem.kernels.flash.fwd import fwd_kernel
from attnmem.kernels.flash.route import (
    atomic_by_default,
    attention_backward,
    attention_forward,
    check_window,
    kv_split,
)

__all__ = ["KernelConfig", "Tiles", "flash_attention", "forward_backward_bytes",
           "forward_bytes", "interpreting", "varlen_bytes"]

HEAD_DIM_MIN = dispatch.HEAD_DIM_MIN  # one copy, which attnmem.calc.peak refuses the others by
HEAD_DIM_MAX = dispatch.HEAD_DIM_MAX
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


class FlashAttentionFunction(torch.autograd.Function):
    """Forward saves q, k, v (the caller's own tensors), O and lse2; backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, config: KernelConfig | None,
                window: int | None = None, packed: Packed | None = None):
        o, lse2 = attention_forward(q, k, v, causal, scale, config, window, packed)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale, ctx.config, ctx.window = causal, scale, config, window
        ctx.packed = packed  # int32 offsets and host ints: nothing autograd differentiates
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse2 = ctx.saved_tensors
        dq, dk, dv = attention_backward(do, q, k, v, o, lse2, ctx.causal, ctx.scale, ctx.config,
                                        ctx.window, ctx.packed)
        return dq, dk, dv, None, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    config: KernelConfig | None = None,
    window: int | None = None,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
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
                          buffer: by default for fp16/bf16 at d = 64 and 128 in the Hopper
                          region (`attnmem.calc.dispatch.sm90_region`, where Hopper runs the
                          Gluon backward), or where max(s_q, s_k) and the dK/dV programs
                          B*H_kv*S*ceil(s_k/BLOCK_N) reach `attnmem.calc.dispatch`'s
                          ATOMIC_MIN_LEN and ATOMIC_MIN_PROGRAMS (BLOCK_N = d;
                          `attnmem.calc.dispatch.atomic_dq`, route.py's `atomic_by_default`),
                          unless torch.use_deterministic_algorithms(True) is in force (the
                          atomic adds make dQ nondeterministic in its last bits)
                          + 2*B*H_kv*S*s_k*d*e with GQA where the backward splits each group
                          over S programs (partial dK, dV sums; outside the Hopper region,
                          S > 1 when B*H_kv*ceil(s_k/128) is below
                          `attnmem.calc.dispatch.KV_SPLIT_MIN_PROGRAMS`: `route.kv_split`)
    Under torch.no_grad() the forward still writes the log-sum-exp (the same kernel runs).

    ``config``: a `KernelConfig` (every field None by default: the kernels' own rules) to
    force a choice: ``tiles`` for the Triton kernels (bypasses the autotuner; tests and the
    interpreter use it, and the interpreter always runs a fixed small tile), ``use_desc`` for
    the forward's K/V loads through tensor descriptors, ``atomic_dq`` for the backward that
    adds dQ into an fp32 buffer with atomic adds (5 tile products instead of 7,
    nondeterministic dQ, B*H*s_q*d*4 bytes more; the default for long sequences, see Memory)
    or the two-kernel one, ``kv_split`` = S (a divisor of H / H_kv) to split each GQA group
    over S dK/dV programs instead of the default `route.kv_split` (see Memory). A bad value
    raises ValueError naming the field when the KernelConfig is built; anything but a
    KernelConfig or None raises ValueError here. Which kernel runs the call, forward and
    backward, is decided in one place: `route.forward_route`, `route.backward_route`.

    On a Hopper GPU (compute capability 9.x, Triton with Gluon), fp16/bf16 run the
    hand-scheduled forward of ``fwd_sm90`` (same outputs, faster; see its docstring) at
    d = 128, and at d = 64 when s_q and s_k both reach ``fwd_sm90.THREE_WG_MIN_LEN`` for the
    causal flag (with three consumer warpgroups: 192 query rows per program).
    ``KernelConfig(sm90=False)`` turns it off; ``KernelConfig(sm90=True)`` selects it for
    d = 64 at any length,
    ``KernelConfig(sm90=True, sm90_consumers=3, sm90_stages=2)`` with three warpgroups,
    ``sm90=False`` the portable Triton forward. Elsewhere, on a Hopper GPU (Triton >= 3.4)
    the Triton forward reads K and V through tensor descriptors (the TMA copy engine) for
    16-bit inputs whose keys reach the length bucket ``route.DESC_MIN_BUCKET`` and whose
    (batch, head, seq) flatten into rows (the contiguous layout), and through pointers
    otherwise (``KernelConfig(use_desc=...)`` forces either).
    No environment variable changes any of this: `KernelConfig` is the only way to choose.

    Packed sequences (variable length, ``cu_seqlens``): several sequences concatenated along
    the sequence axis, attention (with ``causal`` and ``window``) running inside each one
    only, as FlashAttention-2's ``flash_attn_varlen_func`` does and as transformers'
    padding-free training (DataCollatorWithFlattening) needs. ``cu_seqlens`` is an int32
    tensor on q's device of n + 1 cumulative starts: 0, then strictly increasing (no empty
    sequence), last = the total number of query rows; sequence i is rows cu_seqlens[i] ..
    cu_seqlens[i+1] - 1. ``cu_seqlens_k`` gives the keys' starts when they differ from the
    queries' (same n; default: ``cu_seqlens``); causal stays top-left per sequence (query i
    of a sequence sees its keys 0..i). Layouts: q (1, H, total_q, d) and k, v (1, H_kv,
    total_k, d), as transformers' attention interface passes a packed batch (any strides), or
    FlashAttention's varlen layout q (total_q, H, d), k, v (total_k, H_kv, d); the output
    has q's layout. The longest sequence, which sizes the grid, is read from cu_seqlens on
    the host (one device-to-host copy per cu_seqlens tensor: the lengths are remembered while
    that tensor lives and is not modified, so the layers of one model step pay it once). On
    a Hopper GPU the forward of a packed call without a window runs the Gluon kernel's packed
    form where the dense rule above would run it for the longest sequence (d = 128; d = 64
    from ``fwd_sm90.THREE_WG_MIN_LEN`` keys and queries; ``KernelConfig(sm90=...)`` forces
    either way; `fwd_sm90.attention_forward_sm90_packed`), else the portable Triton forward.
    The backward of a packed call without a window is the Gluon backward's packed form on a
    Hopper GPU
    (fp16/bf16, d = 64 or 128, `attnmem.calc.dispatch.sm90_packed`; ``KernelConfig(sm90_bwd=...)``
    forces either way; `bwd_sm90.attention_backward_sm90_packed`), else the portable
    two-kernel one; neither splits a GQA group. Its memory, beyond q, k, v (and dO), whichever
    forward runs (`varlen_bytes`; `attnmem.calc.peak.varlen_peak_bytes` counts the allocator's blocks):
      forward:            H*total_q*(d*e + 4)
      forward + backward: 2*H*total_q*d*e + 2*H_kv*total_k*d*e + 8*H*total_q (portable), or
                          2*H*total_q*d*e + 2*H_kv*total_k*d*e + 4*H*total_q
                          + H*P*(d + 2)*4 (Hopper: P padded rows, `bwd_sm90.packed_pad_rows`).
    """
    config = KernelConfig.of(config)
    if cu_seqlens is not None or cu_seqlens_k is not None:
        return _packed_call(q, k, v, bool(causal), scale, config, window, cu_seqlens,
                            cu_seqlens_k)
    _check_inputs(q, k, v, scale)
    window = check_window(window, bool(causal), q.shape[2])
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
    (`route.atomic_by_default`, and not in deterministic mode); plus, with GQA where
    the backward splits each group over S programs (`route.kv_split`, S > 1), the
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


# Host copies of cu_seqlens tensors, by id, while the tensor lives (a weak reference drops the
# entry when it is freed) and until it is modified in place (its version counter moves).
_HOST_STARTS: dict[int, tuple[weakref.ref, int, tuple[int, ...]]] = {}


def _host_starts(cu: torch.Tensor) -> tuple[int, ...]:
    """cu's values on the host: read once per tensor (a device sync on CUDA), then reused."""
    key = id(cu)
    hit = _HOST_STARTS.get(key)
    if hit is not None and hit[0]() is cu and hit[1] == cu._version:
        return hit[2]
    values = tuple(cu.tolist())
    ref = weakref.ref(cu, lambda _r, key=key: _HOST_STARTS.pop(key, None))
    _HOST_STARTS[key] = (ref, cu._version, values)
    return values


def _check_starts(name: str, cu, total: int, device: torch.device) -> tuple[int, ...]:
    """The checked cumulative starts of one side (ValueError naming ``name`` and the rule)."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 cumulative sequence starts, "
                        f"got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise ValueError(f"{name} must be int32 (as FlashAttention's varlen interface and "
                         f"transformers' cu_seq_lens), got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must be 1-d with n + 1 >= 2 entries (n sequences), got shape "
                         f"{tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} must be on the inputs' device {device}, got {cu.device}")
    starts = _host_starts(cu)
    if starts[0] != 0:
        raise ValueError(f"{name} must start at 0, got {starts[0]}")
    bad = next((i for i in range(1, len(starts)) if starts[i] <= starts[i - 1]), None)
    if bad is not None:
        raise ValueError(f"{name} must be strictly increasing (every sequence at least one "
                         f"token), got {name}[{bad - 1}] = {starts[bad - 1]}, "
                         f"{name}[{bad}] = {starts[bad]}")
    if starts[-1] != total:
        raise ValueError(f"{name} must end at the packed total of rows, {total}, got "
                         f"{starts[-1]}")
    return starts


def _packed_inputs(q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(1, H, total, d) views of packed q, k, v given as (1, H, total, d) or (total, H, d);
    True when they came as (total, H, d)."""
    dims = {t.dim() if isinstance(t, torch.Tensor) else None for t in (q, k, v)}
    if dims == {3}:
        return (*(t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)), True)
    if dims == {4}:
        if q.shape[0] != 1 or k.shape[0] != 1:
            raise ValueError("packed sequences (cu_seqlens) take q, k, v of batch 1, "
                             f"(1, heads, total, head_dim), got q {tuple(q.shape)}, "
                             f"k {tuple(k.shape)}: pack the batch along the sequence axis")
        return q, k, v, False
    shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
              for t in (q, k, v)]
    raise ValueError("packed sequences (cu_seqlens) take q, k, v as (1, heads, total, "
                     f"head_dim) or (total, heads, head_dim), all alike; got {shapes}")


def _packed_call(q, k, v, causal: bool, scale, config, window, cu_seqlens, cu_seqlens_k):
    """`flash_attention` with ``cu_seqlens`` (its docstring): checks, then the kernels."""
    if cu_seqlens is None:
        raise ValueError("cu_seqlens_k was given without cu_seqlens (the queries' starts)")
    q, k, v, flat = _packed_inputs(q, k, v)
    _check_inputs(q, k, v, scale)
    starts_q = _check_starts("cu_seqlens", cu_seqlens, q.shape[2], q.device)
    if cu_seqlens_k is None:
        cu_seqlens_k, starts_k = cu_seqlens, starts_q
        if k.shape[2] != q.shape[2]:
            raise ValueError(f"k, v have {k.shape[2]} packed rows and q {q.shape[2]}: pass "
                             "cu_seqlens_k for the keys' starts")
    else:
        starts_k = _check_starts("cu_seqlens_k", cu_seqlens_k, k.shape[2], q.device)
        if len(starts_k) != len(starts_q):
            raise ValueError(f"cu_seqlens and cu_seqlens_k must count the same sequences, got "
                             f"{len(starts_q) - 1} and {len(starts_k) - 1}")
    max_q = max(b - a for a, b in zip(starts_q[:-1], starts_q[1:], strict=True))
    max_k = max(b - a for a, b in zip(starts_k[:-1], starts_k[1:], strict=True))
    window = check_window(window, causal, max_q)  # a window of the longest sequence: none
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if interpreting() and (config is None or config.tiles is None):
        config = replace(config or KernelConfig(), tiles=INTERPRETER_TILES)
    packed = Packed(cu_seqlens, cu_seqlens_k, max_q, max_k)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        o = attention_forward(q, k, v, causal, float(scale), config, window, packed)[0]
    else:
        o = FlashAttentionFunction.apply(q, k, v, causal, float(scale), config, window, packed)
    return o[0].transpose(0, 1) if flat else o


def varlen_bytes(H: int, H_kv: int, total_q: int, total_k: int, d: int, e: int,
                 backward: bool = False, pad_rows: int | None = None) -> int:
    """Extra bytes of one packed call (``cu_seqlens``), tensor bytes without the allocator's
    rounding: forward O and lse2, H*total_q*(d*e + 4); forward + backward also dQ, dK, dV and
    either delta (`bwd.packed_backward`, ``pad_rows`` None: no fp32 dQ buffer, no partial sums)
    or, where the Hopper backward runs (`bwd_sm90.attention_backward_sm90_packed`), its lse2
    and delta copies and fp32 dQ buffer over ``pad_rows`` padded rows per head
    (`bwd_sm90.packed_pad_rows`): 2*H*pad_rows*4 + H*pad_rows*d*4."""
    fwd = H * total_q * (d * e + 4)
    if not backward:
        return fwd
    grads = 2 * H * total_q * d * e + 2 * H_kv * total_k * d * e + 4 * H * total_q
    if pad_rows is None:
        return grads + 4 * H * total_q
    return grads + 2 * H * pad_rows * 4 + H * pad_rows * d * 4
