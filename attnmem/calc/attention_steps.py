"""Each attention implementation's allocation sequence: the tensors one call makes and frees,
in order, read from the code that allocates them.

A sequence is a list of steps: `_a(label, *sizes, key=...)` allocates tensors (bytes) and
`_F(key)` frees those allocated under that key. attnmem.calc.peak replays a sequence through
attnmem.calc.allocator after the call's inputs (`_inputs`: q, k, v, and dO with backward) and
reads the peak and the tensors alive then. `_MODELS` maps each implementation of
attnmem.calc.attention_call.IMPLEMENTATIONS to its sequence; `_triton_varlen` is our kernel on
packed sequences. Notation: attnmem/calc/attention_call.py; each function names the source
file it follows.

Sources for the algorithms: eager attention, Vaswani et al. 2017 (arXiv 1706.03762) eq. 1;
FlashAttention keeps O and the log-sum-exp only, Dao et al. 2022 (arXiv 2205.14135) sec. 3.1;
FlashAttention-2's backward with an fp32 dq accumulator, Dao 2023 (arXiv 2307.08691) sec. 3.2;
memory-efficient attention, Rabe & Staats 2021 (arXiv 2112.05682), as in xFormers/PyTorch; the
padded rows of the packed Hopper backward, FlashAttention-3's padded offsets (Shah et al. 2024,
arXiv 2407.08608).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from attnmem.calc import dispatch
from attnmem.calc.attention_call import AttentionCall
from attnmem.calc.units import ceil_bytes, dtype_bytes


@dataclass(frozen=True)
class _A:
    """Allocate tensors (one step of an implementation's allocation sequence)."""

    label: str
    sizes: tuple[int, ...]
    key: str = ""  # a name, to free the tensors later; "" = alive until the end of the call


@dataclass(frozen=True)
class _F:
    """Free the tensors allocated under `key`."""

    key: str


Step = _A | _F


def _a(label: str, *sizes: int, key: str = "") -> _A:
    return _A(label, tuple(int(x) for x in sizes), key)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _inputs(sh: AttentionCall) -> list[int]:
    """What exists before the call (the harness's procedure): q, k, v; with backward also dO."""
    sizes = [sh.out_bytes(), sh.kv_bytes(), sh.kv_bytes()]
    return sizes + ([sh.out_bytes()] if sh.backward else [])


def _naive(sh: AttentionCall, inplace: bool = False) -> list[Step]:
    """attnmem.measure.registry._naive, step by step: (q @ kᵀ) * scale allocates the product
    and then the scaled scores (the product is freed); masked_fill copies the scores (the old
    ones freed), masked_fill_ does not; softmax; probs @ v."""
    steps: list[Step] = []
    if sh.gqa:
        steps.append(_a("k expanded to H heads (repeat_interleave)", sh.out_bytes(), key="kx"))
        steps.append(_a("v expanded to H heads (repeat_interleave)", sh.out_bytes(), key="vx"))
    steps += [_a("Q·Kᵀ before the scale (s×s, freed once scaled)", sh.sxs(), key="qk"),
              _a("scores Q·Kᵀ·scale (s×s, input dtype)", sh.sxs(), key="scores"), _F("qk")]
    if sh.causal:
        steps.append(_a("causal mask (bool s×s, shared by batch and heads)", sh.s * sh.s))
        if not inplace:
            steps += [_a("masked scores (masked_fill's copy, s×s)", sh.sxs(), key="masked"),
                      _F("scores")]
    steps.append(_a("softmax probabilities (s×s, input dtype)" if not sh.backward else
                    "probabilities P kept for backward (s×s)", sh.sxs()))
    steps.append(_a("output", sh.out_bytes()))
    if not sh.backward:
        return steps
    # The forward's scores are not saved (softmax saves its output): freed when it returns.
    steps.append(_F("masked" if sh.causal and not inplace else "scores"))
    # Backward peak (softmax backward): saved probabilities P, dP = dO·Vᵀ, dS and the scaled
    # copy that feeds dQ = dS·K: four s×s tensors. Alive beside them (measured on an H200
    # with dO allocated before the call, data/attention_calls_h200.csv): the output (held by
    # the caller), dV = Pᵀ·dO (already computed, H heads) and, for GQA, the expanded K that
    # the matmul keeps for dQ (expanded V is freed once dV exists).
    steps.append(_a("dP = dO·Vᵀ (s×s)", sh.sxs()))
    steps.append(_a("dV = Pᵀ·dO (H heads)", sh.out_bytes()))
    if sh.gqa:
        steps.append(_F("vx"))
    steps.append(_a("dS, softmax backward (s×s)", sh.sxs()))
    steps.append(_a("dS scaled (s×s)", sh.sxs()))
    return steps


def _math(sh: AttentionCall) -> list[Step]:
    c = 4  # the math backend computes in fp32 (16-bit inputs are upcast)
    if sh.backward:
        # Measured: four fp32 s×s tensors and 14 bytes per q element beyond dO in 16-bit:
        # fp32 q, k, v (saved for the backward) and the 16-bit output held by the caller.
        return [_a("fp32 q, k, v saved for the backward", *[sh.out_bytes(c)] * 3),
                _a("output", ceil_bytes(sh.rows * sh.d * 2)),
                _a("four fp32 s×s tensors (P, dP, dS and a temporary)", *[sh.sxs(c)] * 4)]
    steps: list[Step] = [_a("fp32 copy of q", sh.out_bytes(c))]
    if sh.gqa:
        # Measured (bf16, d=64, H=32, H_kv=8): +2·B·H_kv·s·d·4 bytes: k and v are cast to
        # fp32 before enable_gqa's repeat to H heads, and those copies are still alive.
        steps.append(_a("fp32 k, v before expansion to H heads (GQA)", *[sh.kv_bytes(c)] * 2))
    steps.append(_a("fp32 k, v" + (" expanded to H heads" if sh.gqa else ""),
                    *[sh.out_bytes(c)] * 2))
    if sh.causal:
        steps.append(_a("causal mask as fp32 additive bias (s×s)", sh.s * sh.s * 4))
    steps += [_a("fp32 scores (s×s)", sh.sxs(c)),
              _a("bool 'row all -inf' test of safe softmax (s×s)", sh.n),
              # Measured on every reference row: + B·H·s + 512 bytes (a bool per row, the
              # reduction of the test above over each row, and a scalar).
              _a("bool per row of safe softmax (any over the row)", sh.rows),
              _a("a scalar of safe softmax (512 B block)", 1),
              _a("fp32 softmax (s×s)", sh.sxs(c)),
              _a("fp32 output", sh.out_bytes(c))]
    return steps


def _efficient(sh: AttentionCall) -> list[Step]:
    """PyTorch's memory-efficient backend (aten/src/ATen/native/transformers/cuda/
    attention.cu, attention_backward.cu): the output in (B, s, H, d); with grad the forward
    also writes the log-sum-exp, padded to a multiple of 32 rows (kAlignLSE); the backward
    makes the gradients, the row sums of dO·O, an fp32 dQ accumulator and (measured) a
    contiguous copy of dO. torch 2.11 has no enable_gqa path here: GQA runs on k, v
    expanded to H heads (repeat_interleave), so the kernel sees H heads everywhere."""
    steps: list[Step] = []
    if sh.gqa:
        steps.append(_a("k, v expanded to H heads (no enable_gqa path in this backend)",
                        sh.out_bytes(), sh.out_bytes()))
    steps.append(_a("output" if not sh.backward else "output (saved for backward)",
                    sh.out_bytes()))
    if not sh.backward:
        return steps
    steps.append(_a("log-sum-exp (fp32, rows padded to 32)",
                    sh.b * sh.h * _round_up(sh.s, 32) * 4))
    # Measured: +B·H·s·d·e at every s (900.1 vs 772 MiB at s=16384, fp16, d=128): the
    # backward copies dO into the kernel's (B, s, H, d) layout.
    steps.append(_a("dO copied to the kernel's layout", sh.out_bytes()))
    kvb = sh.out_bytes() if sh.gqa else sh.kv_bytes()
    steps.append(_a("dq", sh.out_bytes()))
    steps.append(_a("dk, dv" + (" of the expanded k, v (H heads)" if sh.gqa else ""), kvb, kvb))
    steps.append(_a("row sums of dO·O (fp32, one per row)", sh.rows * 4))
    # One fp32 workspace (attention_backward.cu: at::empty({p.workspace_size()}); kernel_backward.h
    # workspace_elements_gq: per (batch, head) ceil(s / kBlockSizeI) blocks of
    # GradQTempStorage, the block's dQ accumulator plus 4 floats): s padded to the block,
    # kBlockSizeI = 64 at d <= 64, 128 above (measured on every reference row: 16 B per block).
    bi = 64 if sh.d <= 64 else 128
    nblk = -(-sh.s // bi)
    steps.append(_a(f"fp32 workspace: dq accumulator, s rounded up to {bi}, + 16 B per block",
                    sh.b * sh.h * nblk * (bi * sh.d + 4) * 4))
    return steps


def _cudnn(sh: AttentionCall) -> list[Step]:
    """cuDNN fused attention (aten/src/ATen/native/cudnn/MHA.cpp): the output; with grad the
    forward keeps the fp32 softmax statistics (one per row); the backward the gradients and
    cuDNN's workspace (an fp32 dQ accumulator and the row sums of dO·O); with GQA dk, dv per
    query head before the group sum (measured)."""
    tiny = _a("three tiny CUDA tensors (measured: 3 blocks of 512 B on every reference row)",
              1, 1, 1)
    if not sh.backward:
        return [_a("output", sh.out_bytes()), tiny]
    steps: list[Step] = [
        _a("output (saved for backward)", sh.out_bytes()),
        _a("log-sum-exp (fp32, one per row)", sh.rows * 4),
        tiny,
        _a("dq", sh.out_bytes()),
        _a("dk, dv", sh.kv_bytes(), sh.kv_bytes()),
    ]
    if sh.gqa:
        steps.append(_a("dk, dv per query head before the sum over each group (GQA)",
                        sh.out_bytes(), sh.out_bytes()))
    steps.append(_a("row sums of dO·O (fp32, one per row)", sh.rows * 4))
    steps.append(_a("fp32 dq accumulator", sh.out_bytes(4)))
    return steps


#: Streaming multiprocessors of an H100/H200 SXM (cudaDeviceProp.multiProcessorCount), which
#: FlashAttention-2's split-KV heuristic reads.
FA2_NUM_SMS = 132


def fa2_num_splits(b: int, h: int, s_q: int, s_k: int, d: int, num_sms: int = FA2_NUM_SMS) -> int:
    """How many key/value splits FlashAttention-2's forward takes (flash_api.cpp
    set_params_splitkv, num_splits_heuristic): splits only when B·H·⌈s_q/64⌉ < 0.8 × 2 ×
    SMs; then the smallest eligible split count within 85% of the best wave efficiency."""
    block_n = 256 if d <= 64 else (128 if d <= 128 else 64)
    n_blocks = -(-s_k // block_n)
    bnm = b * h * -(-s_q // 64)
    sms = 2 * num_sms
    if bnm >= 0.8 * sms:
        return 1
    max_splits = min(128, sms, n_blocks)

    def eligible(n: int) -> bool:
        return n == 1 or -(-n_blocks // n) != -(-n_blocks // (n - 1))

    eff = []
    for n in range(1, max_splits + 1):
        if not eligible(n):
            eff.append(0.0)
            continue
        waves = bnm * n / sms
        eff.append(waves / math.ceil(waves))
    best = max(eff) if eff else 0.0
    for n in range(1, max_splits + 1):
        if eligible(n) and eff[n - 1] >= 0.85 * best:
            return n
    return 1


def _flash(sh: AttentionCall) -> list[Step]:
    """FlashAttention-2 as PyTorch ships it (aten/src/ATen/native/transformers/cuda/
    flash_attn/flash_api.cpp mha_fwd, mha_bwd; attention_backward.cu
    _flash_attention_backward): the forward makes out, softmax_lse (B, H, s) fp32 and two
    tiny CUDA tensors (rng_state, _unused: one 512 B block each); the backward makes
    contiguous copies of dO and of out (both are transposed views), dq, dk, dv,
    softmax_d (B, H, s rounded up to 128) fp32, dq_accum (B, s rounded up to 128, H, d
    rounded up to 32) fp32 and, with GQA, dk_expanded, dv_expanded (B, s, H, d) before the
    group sum."""
    steps: list[Step] = [
        _a("output" if not sh.backward else "output (saved for backward)", sh.out_bytes()),
        _a("log-sum-exp (fp32, one per row)", sh.rows * 4),
    ]
    splits = fa2_num_splits(sh.b, sh.h, sh.s, sh.s, sh.d)
    if splits > 1:
        d32 = _round_up(sh.d, 32)
        steps.append(_a(f"split-KV partial log-sum-exp and output ({splits} splits, fp32; "
                        "freed after the forward)", splits * sh.rows * 4,
                        splits * sh.rows * d32 * 4, key="splitkv"))
    steps.append(_a("rng_state and _unused (tiny CUDA tensors)", 16, 8))
    if splits > 1:
        steps.append(_F("splitkv"))
    if not sh.backward:
        return steps
    s128, d32 = _round_up(sh.s, 128), _round_up(sh.d, 32)
    steps += [
        _a("contiguous copies of dO and of the output (transposed views)",
           sh.out_bytes(), sh.out_bytes()),
        _a("dq", sh.out_bytes()),
        _a("dk, dv", sh.kv_bytes(), sh.kv_bytes()),
        _a("softmax_d: row sums of dO·O (fp32, s rounded up to 128)", sh.b * sh.h * s128 * 4),
        _a("dq_accum (fp32, s rounded up to 128, d to 32)", sh.b * s128 * sh.h * d32 * 4),
    ]
    if sh.gqa:
        steps.append(_a("dk, dv per query head before the sum over each group (GQA)",
                        sh.out_bytes(), sh.out_bytes()))
    return steps


def _triton(sh: AttentionCall) -> list[Step]:
    """Our kernel (attnmem/kernels/flash/fwd.py attention_forward, bwd.py attention_backward), in its
    allocation order: o, lse2; delta, dk, dv, the split's partial dk, dv, the fp32 dQ buffer
    (or dq), and dq cast from the buffer."""
    steps: list[Step] = [
        _a("output" if not sh.backward else "output (saved for backward)", sh.out_bytes()),
        _a("log-sum-exp (fp32, one per row)", sh.rows * 4),
    ]
    if not sh.backward:
        return steps
    steps += [_a("row sums of dO·O (fp32, one per row)", sh.rows * 4),
              _a("dk, dv", sh.kv_bytes(), sh.kv_bytes())]
    split = dispatch.kv_split(sh.b, sh.h, sh.h_kv, sh.s, sh.s, sh.d, dtype_bytes(sh.dtype))
    if split > 1:
        steps.append(_a(f"partial dk, dv of the GQA group split over {split} programs "
                        "(B·H_kv·⌈s/128⌉ < 1,024)", split * sh.kv_bytes(), split * sh.kv_bytes()))
    e = dtype_bytes(sh.dtype)
    if dispatch.sm90_region(sh.b, sh.h_kv, sh.s, sh.s, sh.d, e):
        rows = dispatch.sm90_dq_rows(sh.s, sh.d)
        steps.append(_a(f"fp32 dq buffer of the Hopper backward (s rounded up to "
                        f"{dispatch.SM90_QUERY_BLOCK[sh.d]}: s ≥ 4,096 with B·H_kv·⌈s/128⌉ ≥ 256)",
                        ceil_bytes(sh.b * sh.h * rows * sh.d * 4)))
    elif dispatch.atomic_dq(sh.b, sh.h, sh.h_kv, sh.s, sh.s, sh.d, e):
        steps.append(_a("fp32 dq buffer of the atomic-dQ backward (d = 64 or 128: s > 2,048 "
                        "with B·H_kv·S·⌈s/d⌉ ≥ 2,048)", sh.out_bytes(4)))
    steps.append(_a("dq", sh.out_bytes()))
    return steps


def fa4_tiles_sm90(head_dim: int, causal: bool) -> tuple[int, int]:
    """FlashAttention-4's backward tile (m_block_size, n_block_size) on Hopper:
    flash_attn/cute/interface.py `_tile_size_bwd_sm90` (non-local attention)."""
    if head_dim <= 64:
        return 128, 128
    if head_dim <= 96:
        return 64, 128
    if head_dim <= 128:
        return (64 if causal else 80), 128
    if head_dim <= 192:
        return 64, 96
    return 64, 64


def _fa4(sh: AttentionCall) -> list[Step]:
    """FlashAttention-4 (flash_attn/cute/interface.py, `_flash_attn_fwd`, `_flash_attn_bwd`,
    on sm90): the forward makes out (B, s, H, d) and, only when a gradient is needed, lse
    (B, H, s) fp32; the backward makes dq, dk, dv (empty_like), dq_accum (B, H, s_q rounded
    up to m_block_size times d rounded up to 32) fp32, dpsum and lse_log2 (B, H, s_q
    rounded) fp32 and, with GQA, dk_accum, dv_accum (B, H_kv, s_k rounded up to
    n_block_size times d rounded up to 32) fp32 (zeros)."""
    if not sh.backward:
        return [_a("output", sh.out_bytes())]
    m_blk, n_blk = fa4_tiles_sm90(sh.d, sh.causal)
    sq, sk, d32 = _round_up(sh.s, m_blk), _round_up(sh.s, n_blk), _round_up(sh.d, 32)
    steps: list[Step] = [
        _a("output (saved for backward)", sh.out_bytes()),
        _a("log-sum-exp (fp32, one per row)", sh.rows * 4),
        _a("dq", sh.out_bytes()),
        _a("dk, dv", sh.kv_bytes(), sh.kv_bytes()),
        _a(f"dq_accum (fp32, s rounded up to {m_blk}, d to 32)", sh.b * sh.h * sq * d32 * 4),
        _a(f"dpsum and lse_log2 (fp32, s rounded up to {m_blk})",
           sh.b * sh.h * sq * 4, sh.b * sh.h * sq * 4),
    ]
    if sh.gqa:
        steps.append(_a(f"dk_accum, dv_accum of the GQA groups (fp32, s rounded up to {n_blk})",
                        sh.b * sh.h_kv * sk * d32 * 4, sh.b * sh.h_kv * sk * d32 * 4))
    return steps


_MODELS: dict[str, Callable[[AttentionCall], list[Step]]] = {
    "naive": _naive,
    "naive_inplace": lambda sh: _naive(sh, inplace=True),
    "sdpa_math": _math,
    "sdpa_efficient": _efficient,
    "sdpa_flash": _flash,
    "sdpa_cudnn": _cudnn,
    "triton": _triton,
    "fa4": _fa4,
}


def _triton_varlen(sh: AttentionCall, lens: list[int], window: int | None) -> list[Step]:
    """Our kernel on packed sequences, in allocation order: o, lse2 (attnmem/kernels/flash/fwd.py
    packed_forward, fwd_sm90.py attention_forward_sm90_packed: the same outputs); then the
    backward: where attnmem.calc.dispatch.sm90_packed picks the Hopper one (attnmem/kernels/flash/bwd_sm90.py,
    attention_backward_sm90_packed), lse2 and delta copied into padded rows (2·H·P fp32, P =
    attnmem.calc.dispatch.sm90_packed_pad_rows), dk, dv, the fp32 dq buffer of the padded rows
    (H·P·d fp32) and dq; else the portable two-kernel one (bwd.py packed_backward): delta,
    dk, dv, dq. No GQA partial sums on either."""
    steps: list[Step] = [
        _a("output" if not sh.backward else "output (saved for backward)", sh.out_bytes()),
        _a("log-sum-exp (fp32, one per packed row)", sh.rows * 4),
    ]
    if not sh.backward:
        return steps
    n = len(lens)
    if dispatch.sm90_packed(n, sh.h, sh.h_kv, max(lens), sh.s, sh.d, dtype_bytes(sh.dtype),
                            window):
        rows = dispatch.sm90_packed_pad_rows(sh.s, n, sh.d)
        bm = dispatch.SM90_QUERY_BLOCK[sh.d]
        pad = f"T + {n}·{bm} rounded up to {bm}: {rows:,}"
        steps += [_a(f"row sums of dO·O and log-sum-exp copied into padded rows "
                     f"(fp32, 2·H·({pad}))", 2 * sh.h * rows * 4),
                  _a("dk, dv", sh.kv_bytes(), sh.kv_bytes()),
                  _a(f"fp32 dq buffer of the Hopper backward (padded rows: {pad})",
                     sh.h * rows * sh.d * 4),
                  _a("dq", sh.out_bytes())]
    else:
        steps += [_a("row sums of dO·O (fp32, one per packed row)", sh.rows * 4),
                  _a("dk, dv", sh.kv_bytes(), sh.kv_bytes()),
                  _a("dq", sh.out_bytes())]
    return steps



def steps_of(call: AttentionCall) -> list[Step]:
    """The allocation sequence of one call of `call.impl` (the steps above, in order): what
    attnmem.trace allocates for a fused attention call that the meta device cannot run."""
    return _MODELS[call.impl](call)


def decode_inputs(b: int, h: int, h_kv: int, new_tokens: int, cache_len: int, d: int,
                  dtype: str) -> list[int]:
    """What exists before a decode call: q (B, H, s_q, d) and the cache's k, v (B, H_kv,
    cache_len, d) tensors (their allocated length, a static cache's max_cache_len)."""
    e = dtype_bytes(dtype)
    return [ceil_bytes(b * h * new_tokens * d * e), ceil_bytes(b * h_kv * cache_len * d * e),
            ceil_bytes(b * h_kv * cache_len * d * e)]


def triton_decode_steps(b: int, h: int, h_kv: int, new_tokens: int, kv_len: int, d: int,
                        dtype: str) -> list[Step]:
    """Our split-KV decode path (attnmem/kernels/flash/decode.py decode_attention), in its
    allocation order: the output (one (B, s_q, H, d) tensor), then, where
    attnmem.calc.decode_split.decode_plan cuts the keys into S > 1 chunks, the chunks' fp32
    partial outputs (B·H·s_q·S·d) and one buffer of their fp32 log2-sum-exps (B·H·s_q·S)
    followed, where the split kernel combines its own chunks (2-4 chunks, tiles up to
    32 x 128: `attnmem.calc.decode_split.fused_combine`), by its int32 counters (one per row
    block, batch and key/value head, `decode_counters`), both freed once the output is
    written (`decode_buffer_bytes`). Flash-decoding: Dao, Haziza, Massa, Sizov 2023."""
    from attnmem.calc.decode_split import decode_buffer_bytes, decode_plan

    out, part, lse = decode_buffer_bytes(b, h, h_kv, new_tokens, kv_len, d, dtype_bytes(dtype))
    steps: list[Step] = [_a("output", ceil_bytes(out))]
    if part:
        plan = decode_plan(b, h, h_kv, new_tokens, kv_len, d)
        steps.append(_a(f"partial outputs, log2-sum-exps and counters of {plan.splits} key "
                        f"chunks of {plan.split_len:,} keys (freed after the combine)",
                        part, lse, key="chunks"))
        steps.append(_F("chunks"))
    return steps
