"""FlashAttention backward in Triton: gradients from O and one log-sum-exp per row.

What has to be computed
-----------------------
With S = scale * Q K^T, P = softmax(S) row-wise and O = P V, the gradients for an upstream
gradient dO are (for one batch and head):

    dV = P^T dO                        (s_k, d)
    dP = dO V^T                        (s_q, s_k)
    dS = P * (dP - delta[:, None])     (s_q, s_k),  delta = rowsum(dO * O)   (s_q,)
    dQ = scale * dS K                  (s_q, d)
    dK = scale * dS^T Q                (s_k, d)

(delta is rowsum(P * dP), the softmax's correction term; rowsum(dO * O) is the same number,
cheaper to get.) P is never stored: the forward kept lse2 = log2-sum-exp of the scores in
log2 units, and every tile of P is recomputed exactly as ``exp2(q k^T * scale * log2(e) - lse2)``.

Two ways to get dQ
------------------
Short sequences: two launches, no atomics.

1. ``bwd_dq_kernel``: one program per block of BLOCK_M query rows. It first computes
   delta = rowsum(dO * O) for its rows in fp32 (O and dO are read once, here) and stores it
   for the second launch, then walks over the key blocks and accumulates dQ on chip, written
   once.
2. ``bwd_dkdv_kernel``: one program per block of BLOCK_N keys of one key/value head. It keeps
   its K and V tiles and fp32 dK, dV accumulators on chip and walks over every query block of
   every query head that shares this key/value head (GQA), so dK and dV are complete when the
   program ends and each is written exactly once, in the input dtype, with no reduction over
   heads afterwards and no extra buffer.

Splitting dQ from dK/dV costs two extra tile products (the dQ pass recomputes Q K^T and
dO V^T: 7 products of s_q * s_k * d instead of 5), but needs neither atomic adds nor an fp32
dQ buffer, and the result is deterministic.

Longer sequences (`route.atomic_by_default`, the rule of `attnmem.calc.dispatch.atomic_dq`:
16-bit, d = 64 or 128, its ATOMIC_MIN_LEN and ATOMIC_MIN_PROGRAMS, or its Hopper region,
`sm90_region`, where a Hopper GPU runs the Gluon backward, bwd_sm90.py, instead;
``KernelConfig.atomic_dq`` True/False forces either): a small
kernel computes delta first, and the dK/dV programs also add their share scale * dS K of every
query block's dQ into a zeroed fp32 buffer, which is cast to the inputs' dtype at the end.
That is 5 tile products instead of 7, for a nondeterministic dQ (the adds land in any order,
as in FlashAttention-2 and cuDNN), an fp32 buffer of B * H * s_q * d * 4 bytes beside dQ, and
two more small launches (delta, the cast) plus the buffer's zeroing. On Hopper each dQ tile is
added with one bulk reduce-add of the copy engine (a tensor descriptor's ``atomic_add``;
FlashAttention-3, Shah et al. 2024, arXiv 2407.08608, accumulates its dQ the same way);
element-wise ``atomic_add`` elsewhere. The bulk adds are what make this backward the faster
one on long sequences; element-wise adds lose to the two-kernel backward (timings:
attnmem/kernels/flash/NOTES.md, "the atomic-dQ backward, timed").

Masks, as in the forward: causal attention is aligned top-left like PyTorch's SDPA (query i
sees keys j <= i). Tiles that lie fully below the diagonal run with no mask; only tiles that
cross the diagonal or the end of a sequence do. Rows past the end of the queries need no
arithmetic mask at all: their lse2 is loaded as +inf, so their probabilities are exp2(-inf)
= 0 and they contribute nothing.

Causal sliding window (``window`` = W; see fwd.py): query i sees keys i - W + 1 .. i. The dQ
kernel splits its key range as the forward does (`common.window_key_range`: the window's lower
edge and the diagonal masked, the blocks in between unmasked). A dK/dV program of keys
[start_n, start_n + BLOCK_N) needs only the query rows [start_n, start_n + BLOCK_N - 1 + W):
the diagonal band (masked), the rows that see the whole key block (unmasked: from the end of
the band up to the last block whose last row still sees key start_n), and the window's upper
edge with the ragged end of the queries (masked). Blocks outside are never read: O(s * W)
work, as in the forward. A row that saw no key in the forward has lse2 = +inf, so its
probabilities, and its gradients, are 0. The window changes no buffer: the same tensors are
allocated, chosen by the same shape rules (`attnmem.calc.dispatch`), whatever W is.

Extra memory of the backward: delta (B * H * s_q * 4 bytes) and the three gradients, in the
inputs' dtype: dQ (B * H * s_q * d * e), dK and dV (B * H_kv * s_k * d * e each); with atomic
dQ also the fp32 buffer (B * H * s_q * d * 4), alive until the cast to dQ; with a GQA group
split over S dK/dV programs (`route.kv_split`, small grids) also the partial dK, dV sums
(2 * S * B * H_kv * s_k * d * e), alive until they are summed into dK, dV.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnmem.calc import dispatch
from attnmem.kernels.flash import common
from attnmem.kernels.flash.common import (
    LOG2E,
    SMEM_BYTES,
    Packed,
    TensorDescriptor,
    autotune_options,
    block_d,
    cdiv,
    key_range,
    launch,
    load_pair,
    mm,
    mma,
    pretuned,
    query_tile,
    seq_bucket,
    tile_mask,
    triton_configs,
    varlen_rows,
    window_key_range,
)
from attnmem.kernels.flash.launcher import DirectLauncher
from attnmem.kernels.flash.tuned import ATOMIC_TILES, DKDV_SPACE, DQ_SPACE

__all__ = ["ATOMIC_TILES", "atomic_tiles", "bwd_dkdv_kernel", "bwd_dq_kernel", "dkdv_tuned",
           "dq_tuned", "packed_backward", "triton_backward"]


def prune_bwd(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Autotuner hook: the stored H200 choice where there is one; else drop configs whose
    pipelined tiles cannot fit in shared memory, and keep small tiles for the largest head
    dims, where the fp32 accumulators would otherwise spill."""
    is_dkdv = "DK" in named_args
    hit = pretuned("dkdv" if is_dkdv else "dq", named_args, kwargs)
    if hit is not None:
        return [hit]
    d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
    elem = named_args["Q"].element_size()
    kept = []
    for c in configs:
        bm, bn, st = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages
        streamed, resident = (bm, bn) if is_dkdv else (bn, bm)
        smem = (st - 1) * 2 * streamed * d * elem + 2 * resident * d * elem
        if smem > SMEM_BYTES:
            continue
        if d >= 256 and (max(bm, bn) > 64 or st > 2):
            continue
        kept.append(c)
    return kept or [triton.Config(dict(BLOCK_M=32, BLOCK_N=32), num_warps=4, num_stages=1)]


@triton.jit
def _dkdv_query_loop(
    dk, dv,  # (BLOCK_N, BLOCK_D) fp32 accumulators
    k, v,  # (BLOCK_N, BLOCK_D) this program's key and value tiles
    q_ptrs, do_ptrs,  # pointers to the (BLOCK_M, BLOCK_D) tiles of query row 0 of this head
    lse_ptr, delta_ptr,  # this head's (s_q,) lse2 and delta
    stride_qm, stride_dom,
    offs_n,  # (BLOCK_N,) absolute key indices of this program
    offs_d,  # (BLOCK_D,)
    lo, hi,  # query rows [lo, hi) visited by this loop, lo a multiple of BLOCK_M
    s_q, qk_scale, HEAD_DIM,
    dq_ptrs,  # ATOMIC_DQ: the fp32 dQ buffer's (BLOCK_M, BLOCK_D) tile of query row 0; else None
    dq_desc, bh,  # DQ_TMA: the buffer as a (B * H, s_q, d) descriptor, and this (batch, head)
    sm_scale,
    window,  # WINDOW: the causal sliding window in keys
    BLOCK_M: tl.constexpr,
    EVEN_D: tl.constexpr,
    MASKED: tl.constexpr,  # rows cross the diagonal, the window's edge or the end of the queries
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    DQ_TMA: tl.constexpr,  # add each dQ tile with one bulk reduce of the copy engine
    WINDOW: tl.constexpr = False,  # mask rows that lie window or more past a key (MASKED only)
):
    offs_m0 = tl.arange(0, BLOCK_M)
    q_ptrs += lo * stride_qm
    do_ptrs += lo * stride_dom
    if ATOMIC_DQ:
        dq_ptrs += lo * HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m0  # (BLOCK_M,)
        # ---- load a query tile, its dO tile, lse2 and delta: 2 * BLOCK_M * d + 2 * BLOCK_M -----
        q, do = load_pair(q_ptrs, do_ptrs, rows, s_q, offs_d, HEAD_DIM, MASKED, EVEN_D)
        if MASKED:
            lse = tl.load(lse_ptr + rows, mask=rows < s_q, other=float("inf"))
            delta = tl.load(delta_ptr + rows, mask=rows < s_q, other=0.0)
        else:
            lse = tl.load(lse_ptr + rows)
            delta = tl.load(delta_ptr + rows)
        # ---- P^T for this tile, recomputed from lse2: (BLOCK_N, BLOCK_M) -----------------------
        qk_t = mm(k, tl.trans(q), IEEE)
        p_t = tl.math.exp2(qk_t * qk_scale - lse[None, :])
        if MASKED and CAUSAL:
            if WINDOW:
                dist = rows[None, :] - offs_n[:, None]  # (BLOCK_N, BLOCK_M): i - j
                p_t = tl.where((dist >= 0) & (dist < window), p_t, 0.0)
            else:
                p_t = tl.where(rows[None, :] >= offs_n[:, None], p_t, 0.0)
        # ---- dV += P^T dO ------------------------------------------------------------------------
        dv = mma(p_t.to(do.dtype), do, dv, IEEE)
        # ---- dS^T = P^T * (V dO^T - delta), dK += dS^T Q ------------------------------------------
        dp_t = mm(v, tl.trans(do), IEEE)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = mma(ds_t.to(q.dtype), q, dk, IEEE)
        if ATOMIC_DQ:
            # ---- this key block's share of dQ: scale * dS K, added into the fp32 buffer -------
            dq_part = mm(tl.trans(ds_t.to(k.dtype)), k, IEEE) * sm_scale  # (BLOCK_M, BLOCK_D)
            if DQ_TMA:
                # one reduce-add of the whole tile, done by the copy engine in L2 (rows past
                # s_q lie outside the descriptor's head and are dropped)
                dq_desc.atomic_add([bh, start_m, 0],
                                   tl.reshape(dq_part, [1, BLOCK_M, dq_part.shape[1]]))
            else:
                tl.atomic_add(dq_ptrs, dq_part,
                              mask=tile_mask(rows, s_q, offs_d, HEAD_DIM, EVEN_D), sem="relaxed")
                dq_ptrs += BLOCK_M * HEAD_DIM
        q_ptrs += BLOCK_M * stride_qm
        do_ptrs += BLOCK_M * stride_dom
    return dk, dv


@triton.jit(do_not_specialize=["s_q", "s_k", "window", "seq_bucket"])
def bwd_dkdv_kernel(
    Q, K, V, DO,  # (B, H, s_q, d), (B, H_kv, s_k, d) x 2, (B, H, s_q, d); any strides
    LSE2, DELTA,  # (B, H, s_q) fp32, contiguous
    DK, DV,  # outputs (B, H_kv * SPLIT, s_k, d), written in full (partial sums when SPLIT > 1)
    DQ_ACC,  # ATOMIC_DQ: zeroed fp32 (B, H, dq_rows, d) contiguous, dQ is added into its first
    #          s_q rows; else None
    DQ_DESC,  # DQ_TMA: DQ_ACC as a (B * H, s_q, d) tensor descriptor, tiles [1, BLOCK_M, d]
    CU_Q, CU_K,  # VARLEN: int32 (n_seq + 1,) starts of the packed sequences' query / key rows
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H, H_kv, GROUP,
    SPLIT,  # programs per key block and key/value head, each over GROUP // SPLIT query heads
    s_q, s_k,
    dq_rows,  # ATOMIC_DQ: rows per (batch, head) of DQ_ACC (>= s_q); else unused
    qk_scale,  # scale * log2(e)
    sm_scale,  # scale (dK = scale * dS^T Q)
    window,  # WINDOW: the causal sliding window in keys (1 <= window < s_q); else unused
    seq_bucket,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    CAUSAL: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ATOMIC_DQ: tl.constexpr = False,  # also add scale * dS K into DQ_ACC (see the docstring)
    DQ_TMA: tl.constexpr = False,  # ... through DQ_DESC, one bulk reduce-add per tile
    WINDOW: tl.constexpr = False,  # causal sliding window of `window` keys (CAUSAL too)
    VARLEN: tl.constexpr = False,  # packed sequences (`common.varlen_rows`): b is the sequence
):
    start_n = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1)  # (batch, key/value head)
    b = bhk // H_kv
    h_kv = bhk % H_kv
    sp = tl.program_id(2)  # which share of the GQA group's query heads (0 when SPLIT = 1)
    heads = GROUP // SPLIT
    if VARLEN:
        # sequence b: query rows [q0, q0 + s_q), key rows [k0, k0 + s_k) of the packed
        # tensors, which become the bases below (of a batch of one: b = 0)
        total_q = s_q
        q0, s_q, k0, s_k, _ = varlen_rows(CU_Q, CU_K, b, h_kv, total_q)
        if start_n >= s_k:
            return
        tl.static_assert(not ATOMIC_DQ, "packed sequences run the two-kernel backward")
        Q, DO = Q + q0 * stride_qm, DO + q0 * stride_dom
        K, V = K + k0 * stride_kn, V + k0 * stride_vn
        DK, DV = DK + k0 * stride_dkn, DV + k0 * stride_dvn
        b = b * 0
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    # ---- this program's K and V tiles stay on chip: 2 * BLOCK_N * d reads ----------------------
    kv_mask = tile_mask(offs_n, s_k, offs_d, HEAD_DIM, EVEN_D)
    k_base = K + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
    k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=kv_mask, other=0.0)
    v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # ---- which query blocks need a mask ---------------------------------------------------------
    # Causal: rows below start_n see none of these keys; rows in [lo, mid) see some of them
    # (the diagonal); rows from mid on see all of them.
    s_q_full = (s_q // BLOCK_M) * BLOCK_M
    s_q_end = tl.cdiv(s_q, BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
        mid = tl.minimum(lo + tl.cdiv(start_n + BLOCK_N - lo, BLOCK_M) * BLOCK_M, s_q_end)
        full_hi = tl.maximum(mid, s_q_full)
    else:
        lo = 0
        mid = 0
        full_hi = s_q_full
    if WINDOW:
        # Row i sees key j only while i - j < window: rows from start_n + window on see none
        # of the first key, so the unmasked rows end at the last whole block below that
        # (full_hi), and rows from start_n + BLOCK_N - 1 + window on see none of these keys
        # (hi, the end of the masked upper edge, which also covers the ragged end of s_q).
        full_hi = tl.maximum(mid, tl.minimum(s_q_full, ((start_n + window) // BLOCK_M) * BLOCK_M))
        hi = tl.maximum(full_hi, tl.minimum(
            s_q_end, tl.cdiv(start_n + BLOCK_N - 1 + window, BLOCK_M) * BLOCK_M))
        unmasked_hi = full_hi
    else:
        hi = s_q_end
        unmasked_hi = s_q_full

    for g in range(sp * heads, sp * heads + heads):  # the query heads that read this K/V head
        h = h_kv * GROUP + g
        bh = b * H + h
        q_ptrs = (Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
                  + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd)
        do_ptrs = (DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
                   + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod)
        if VARLEN:  # this head's rows of the (1, H, total_q) vectors, from the sequence's first
            lse_ptr = LSE2 + (h.to(tl.int64) * total_q + q0)
            delta_ptr = DELTA + (h.to(tl.int64) * total_q + q0)
        else:
            lse_ptr = LSE2 + bh.to(tl.int64) * s_q
            delta_ptr = DELTA + bh.to(tl.int64) * s_q
        if ATOMIC_DQ:
            dq_ptrs = (DQ_ACC + bh.to(tl.int64) * dq_rows * HEAD_DIM
                       + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
        else:
            dq_ptrs = DQ_ACC  # None
        if CAUSAL:  # the diagonal band
            dk, dv = _dkdv_query_loop(
                dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, stride_qm, stride_dom,
                offs_n, offs_d, lo, mid, s_q, qk_scale, HEAD_DIM, dq_ptrs, DQ_DESC, bh,
                sm_scale, window, BLOCK_M, EVEN_D, True, CAUSAL, IEEE, ATOMIC_DQ, DQ_TMA,
                WINDOW)
        # rows that see every key of the tile, then the ragged end of the queries (with a
        # window: the window's upper edge, which ends there or before)
        dk, dv = _dkdv_query_loop(
            dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, stride_qm, stride_dom,
            offs_n, offs_d, mid, unmasked_hi, s_q, qk_scale, HEAD_DIM, dq_ptrs, DQ_DESC, bh,
            sm_scale, window, BLOCK_M, EVEN_D, False, CAUSAL, IEEE, ATOMIC_DQ, DQ_TMA)
        dk, dv = _dkdv_query_loop(
            dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, stride_qm, stride_dom,
            offs_n, offs_d, full_hi, hi, s_q, qk_scale, HEAD_DIM, dq_ptrs, DQ_DESC, bh,
            sm_scale, window, BLOCK_M, EVEN_D, True, WINDOW, IEEE, ATOMIC_DQ, DQ_TMA,
            WINDOW)

    # ---- write dK and dV once: 2 * BLOCK_N * d elements -------------------------------------------
    # (with SPLIT > 1, this share's partial sums, at head h_kv * SPLIT + sp; summed on the host)
    dk = dk * sm_scale
    h_out = (h_kv * SPLIT + sp).to(tl.int64)
    dk_ptrs = (DK + b.to(tl.int64) * stride_dkb + h_out * stride_dkh
               + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd)
    dv_ptrs = (DV + b.to(tl.int64) * stride_dvb + h_out * stride_dvh
               + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd)
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_key_loop(
    dq,  # (BLOCK_M, BLOCK_D) fp32 accumulator
    q, do,  # (BLOCK_M, BLOCK_D) tiles in registers
    lse, delta,  # (BLOCK_M,) fp32
    k_ptrs, v_ptrs,  # pointers to the (BLOCK_N, BLOCK_D) tiles of key 0 of this head
    stride_kn, stride_vn,
    offs_m, offs_d,
    lo, hi,  # keys [lo, hi)
    s_k, qk_scale, HEAD_DIM,
    window,  # WINDOW: the causal sliding window in keys
    BLOCK_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    WINDOW: tl.constexpr = False,  # mask keys window or more before the row (MASKED only)
):
    offs_n0 = tl.arange(0, BLOCK_N)
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n0
        k, v = load_pair(k_ptrs, v_ptrs, cols, s_k, offs_d, HEAD_DIM, MASKED, EVEN_D)
        # ---- P, dP and dS for this tile: (BLOCK_M, BLOCK_N) ---------------------------------------
        p = tl.math.exp2(mm(q, tl.trans(k), IEEE) * qk_scale - lse[:, None])
        if MASKED:
            visible = cols[None, :] < s_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None])
            if WINDOW:
                visible = visible & (offs_m[:, None] - cols[None, :] < window)
            p = tl.where(visible, p, 0.0)
        dp = mm(do, tl.trans(v), IEEE)
        ds = p * (dp - delta[:, None])
        # ---- dQ += dS K -----------------------------------------------------------------------------
        dq = mma(ds.to(k.dtype), k, dq, IEEE)
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return dq


@triton.jit(do_not_specialize=["s_q", "s_k", "window", "seq_bucket"])
def bwd_dq_kernel(
    Q, K, V, Out, DO,  # (B, H, s_q, d), (B, H_kv, s_k, d) x 2, (B, H, s_q, d) x 2; any strides
    LSE2,  # (B, H, s_q) fp32 from the forward
    DELTA,  # output (B, H, s_q) fp32: rowsum(dO * O), written here for the dK/dV launch
    DQ,  # output (B, H, s_q, d), written in full
    CU_Q, CU_K,  # VARLEN: int32 (n_seq + 1,) starts of the packed sequences' query / key rows
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H, GROUP,
    s_q, s_k,
    qk_scale, sm_scale,
    window,  # WINDOW: the causal sliding window in keys (1 <= window < s_q); else unused
    seq_bucket,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    CAUSAL: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    WINDOW: tl.constexpr = False,  # causal sliding window of `window` keys (CAUSAL too)
    VARLEN: tl.constexpr = False,  # packed sequences (`common.varlen_rows`): b is the sequence
):
    start_m, bh, b, h, h_kv = query_tile(H, GROUP, BLOCK_M, CAUSAL)  # longest first if causal
    if VARLEN:
        # sequence b: query rows [q0, q0 + s_q), key rows [k0, k0 + s_k) of the packed
        # tensors, which become the bases below (of a batch of one: b = 0), and its first
        # row of this head in the (1, H, total_q) vectors (rows = row0 + i)
        q0, s_q, k0, s_k, rows0 = varlen_rows(CU_Q, CU_K, b, h, s_q)
        if start_m >= s_q:
            return
        Q, DO, Out, DQ = (Q + q0 * stride_qm, DO + q0 * stride_dom, Out + q0 * stride_om,
                          DQ + q0 * stride_dqm)
        K, V = K + k0 * stride_kn, V + k0 * stride_vn
        LSE2, DELTA = LSE2 + rows0, DELTA + rows0
        b = b * 0
        bh = bh * 0
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    # ---- this program's Q and dO tiles, lse2 and delta stay on chip ----------------------------
    row_mask = tile_mask(offs_m, s_q, offs_d, HEAD_DIM, EVEN_D)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
                + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=row_mask, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
                 + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=row_mask, other=0.0)
    lse = tl.load(LSE2 + bh.to(tl.int64) * s_q + offs_m, mask=offs_m < s_q, other=float("inf"))
    # delta = rowsum(dO * O) in fp32: BLOCK_M * d more reads (O), BLOCK_M fp32 writes.
    o = tl.load(Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
                + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=row_mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * s_q + offs_m, delta, mask=offs_m < s_q)
    k_ptrs = (K + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
              + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd)
    v_ptrs = (V + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
              + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # ---- the same split of the key range as the forward ----------------------------------------
    if WINDOW:
        lo, full_lo, full_hi, hi = window_key_range(start_m, s_k, window, BLOCK_M, BLOCK_N)
        dq = _dq_key_loop(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m,
                          offs_d, full_lo, full_hi, s_k, qk_scale, HEAD_DIM, window,
                          BLOCK_N, EVEN_D, False, CAUSAL, IEEE, False)
        dq = _dq_key_loop(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m,
                          offs_d, lo, full_lo, s_k, qk_scale, HEAD_DIM, window,
                          BLOCK_N, EVEN_D, True, CAUSAL, IEEE, True)
        dq = _dq_key_loop(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m,
                          offs_d, full_hi, hi, s_k, qk_scale, HEAD_DIM, window,
                          BLOCK_N, EVEN_D, True, CAUSAL, IEEE, True)
    else:
        full_hi, hi = key_range(start_m, s_k, BLOCK_M, BLOCK_N, CAUSAL)
        dq = _dq_key_loop(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m,
                          offs_d, 0, full_hi, s_k, qk_scale, HEAD_DIM, window,
                          BLOCK_N, EVEN_D, False, CAUSAL, IEEE)
        dq = _dq_key_loop(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m,
                          offs_d, full_hi, hi, s_k, qk_scale, HEAD_DIM, window,
                          BLOCK_N, EVEN_D, True, CAUSAL, IEEE)

    # ---- write dQ once: BLOCK_M * d elements ---------------------------------------------------
    dq = dq * sm_scale
    tl.store(DQ + b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
             + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=row_mask)


@triton.jit(do_not_specialize=["s_q"])
def bwd_delta_kernel(
    Out, DO,  # (B, H, s_q, d), any strides
    DELTA,  # output (B, H, s_q) fp32: rowsum(dO * O)
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    H, s_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """delta for BLOCK_M rows of one (batch, head), before the dK/dV launch of the atomic-dQ
    backward (the default backward computes it inside its dQ kernel instead)."""
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = tile_mask(offs_m, s_q, offs_d, HEAD_DIM, EVEN_D)
    o = tl.load(Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
                + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=mask, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
                 + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * s_q + offs_m, delta, mask=offs_m < s_q)


dkdv_tuned = triton.autotune(
    configs=triton_configs(DKDV_SPACE),
    key=["seq_bucket", "HEAD_DIM", "CAUSAL", "WINDOW", "VARLEN"],
    prune_configs_by={"early_config_prune": prune_bwd},
    **autotune_options(),
)(bwd_dkdv_kernel)

dq_tuned = triton.autotune(
    configs=triton_configs(DQ_SPACE),
    key=["seq_bucket", "HEAD_DIM", "CAUSAL", "WINDOW", "VARLEN"],
    prune_configs_by={"early_config_prune": prune_bwd},
    **autotune_options(),
)(bwd_dq_kernel)
# attnmem.measure.bench.speed reads the autotuners' caches under these older names
_dkdv_tuned, _dq_tuned = dkdv_tuned, dq_tuned


def atomic_tiles(d: int) -> dict:
    """The atomic-dQ backward's dK/dV tiles for head dim d when none are given."""
    return ATOMIC_TILES[max(64, block_d(d))]


DELTA_ROWS = 64
DELTA_LAUNCHER = DirectLauncher(bwd_delta_kernel)


def triton_backward(
    do: torch.Tensor,  # (B, H, s_q, d) upstream gradient, any strides
    q: torch.Tensor,  # (B, H, s_q, d)
    k: torch.Tensor,  # (B, H_kv, s_k, d)
    v: torch.Tensor,  # (B, H_kv, s_k, d)
    o: torch.Tensor,  # (B, H, s_q, d) the forward's output
    lse2: torch.Tensor,  # (B, H, s_q) fp32
    causal: bool,
    scale: float,
    atomic: bool,
    split: int,
    dq_tiles: dict | None,
    dkdv_tiles: dict | None,
    dq_tma: bool,
    window: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) in the inputs' dtype and shapes, from the kernels above; which
    backward runs, and with what, is `route.backward_route`'s decision.

    ``atomic``: the atomic-dQ backward (module docstring: delta kernel, dK/dV kernel adding dQ
    into a zeroed fp32 buffer, cast; with ``dq_tma`` each tile added by the copy engine's bulk
    reduce-add) instead of the two-kernel one (deterministic). ``split``: dK/dV programs per
    GQA group (a divisor of H / H_kv). ``dq_tiles`` / ``dkdv_tiles`` (`config.Tiles.meta()`):
    the launches' tiles, None for the stored or autotuned choice (the atomic backward:
    `atomic_tiles`). ``window``: the forward's causal sliding window (1 <= window < s_q, or
    None); it changes which tiles are visited, never what is allocated.

    Allocates delta (B, H, s_q) fp32 and the three gradients (contiguous); the atomic-dQ
    backward also the fp32 buffer (B * H * rows * d * 4 bytes: rows = s_q, or in calc's
    Hopper region attnmem.calc.dispatch.sm90_dq_rows as the Gluon backward holds), alive until dQ is
    cast; with
    ``split`` S > 1 also the partial dK, dV sums, (B, H_kv * S, s_k, d) each, summed into dK,
    dV.
    """
    B, H, s_q, d = q.shape
    H_kv, s_k = k.shape[1], k.shape[2]
    group = H // H_kv
    bd = block_d(d)
    delta = common.empty(q, (B, H, s_q), torch.float32)  # (B, H, s_q)
    dk = common.empty(k, k.shape)  # (B, H_kv, s_k, d), contiguous
    dv = common.empty(v, v.shape)  # (B, H_kv, s_k, d), contiguous
    if split > 1:  # what the dK/dV programs write: partial sums, (B, H_kv * split, s_k, d)
        dk_out = common.empty(k, (B, H_kv * split, s_k, d))
        dv_out = common.empty(v, (B, H_kv * split, s_k, d))
    else:
        dk_out, dv_out = dk, dv
    rows = s_q
    if atomic:
        # the buffer dQ is added into: in calc's Hopper region as many rows as the Gluon
        # backward's (s_q rounded up to its query block), so the bytes are the same wherever
        # this kernel runs instead (other GPUs, s_q % 4 != 0, a window)
        if dispatch.sm90_region(B, H_kv, s_q, s_k, d, q.element_size()):
            rows = dispatch.sm90_dq_rows(s_q, d)
        dq = q.new_zeros((B, H, rows, d), dtype=torch.float32)
    else:
        dq = common.empty(q, q.shape)  # (B, H, s_q, d), contiguous
    windowed = window is not None
    win = int(window) if windowed else 0
    meta = dict(HEAD_DIM=d, BLOCK_D=bd, EVEN_D=bd == d, CAUSAL=bool(causal),
                IEEE=q.dtype == torch.float32, WINDOW=windowed)
    bucket = seq_bucket(max(s_q, s_k))
    # Each stride tuple read once (.stride() builds a new tuple on every call).
    sq, sk, sv, sdo, so, sdq, sdk = (q.stride(), k.stride(), v.stride(), do.stride(), o.stride(),
                                     dq.stride(), dk_out.stride())
    dq_desc = None  # the fp32 buffer as a tensor descriptor, for bulk reduce-adds
    if atomic:
        dkdv_tiles = dkdv_tiles or atomic_tiles(d)
        if dq_tma:
            # seen per (batch, head): a tile never reaches the next head's rows
            dq_desc = TensorDescriptor(dq, [B * H, s_q, d], [rows * d, d, 1],
                                       [1, dkdv_tiles["BLOCK_M"], d])
    dkdv_args = (
        q, k, v, do, lse2, delta, dk_out, dv_out, dq if atomic else None, dq_desc, None, None,
        *sq, *sk, *sv, *sdo, *sdk, *sdk,  # dv is allocated as dk is: same strides
        H, H_kv, group, split, s_q, s_k, rows, scale * LOG2E, scale, win, bucket,
    )
    # What the JIT specialises on beyond meta and the tiles (launcher.DirectLauncher): dtypes,
    # strides, head counts, the 16-byte alignment of the tensors not allocated here (dv has
    # dk's shape and strides; delta, dq, dk, dv are fresh allocations).
    spec = (q.dtype, do.dtype, sq, sk, sv, sdo, so, sdq, sdk, H, H_kv, split, q.data_ptr() % 16,
            k.data_ptr() % 16, v.data_ptr() % 16, do.data_ptr() % 16, o.data_ptr() % 16,
            lse2.data_ptr() % 16)
    if atomic:
        DELTA_LAUNCHER((cdiv(s_q, DELTA_ROWS), B * H), ("delta", spec, d, bd),
                       (o, do, delta, *so, *sdo, H, s_q),
                       dict(HEAD_DIM=d, BLOCK_D=bd, EVEN_D=bd == d, BLOCK_M=DELTA_ROWS,
                            num_warps=4))
        # launched with explicit tiles only: the autotuner would run the kernel once per
        # candidate, and every run adds into the same dQ buffer
        launch(dkdv_tuned, bwd_dkdv_kernel, "dkdv_atomic",
               dict(meta, ATOMIC_DQ=True, DQ_TMA=dq_desc is not None), bucket, dkdv_tiles,
               dkdv_args, lambda c: (cdiv(s_k, c["BLOCK_N"]), B * H_kv, split), spec=spec)
        dq = dq[:, :, :s_q].to(q.dtype)  # before the sums: the memory formula counts the buffer, dQ and
        _sum_split(dk_out, dv_out, dk, dv, split)  # the partial sums alive together
        return dq, dk, dv
    dq_args = (
        q, k, v, o, do, lse2, delta, dq, None, None,
        *sq, *sk, *sv, *so, *sdo, *sdq,
        H, group, s_q, s_k, scale * LOG2E, scale, win, bucket,
    )
    # dQ first: it writes delta, which the dK/dV launch reads.
    launch(dq_tuned, bwd_dq_kernel, "dq", meta, bucket, dq_tiles, dq_args,
           lambda c: (cdiv(s_q, c["BLOCK_M"]), B * H), spec=spec)
    launch(dkdv_tuned, bwd_dkdv_kernel, "dkdv", meta, bucket, dkdv_tiles, dkdv_args,
           lambda c: (cdiv(s_k, c["BLOCK_N"]), B * H_kv, split), spec=spec)
    _sum_split(dk_out, dv_out, dk, dv, split)
    return dq, dk, dv


def packed_backward(do, q, k, v, o, lse2, causal: bool, scale: float, dq_tiles: dict | None,
                    dkdv_tiles: dict | None, window: int | None,
                    packed: Packed) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of packed sequences (`fwd.packed_forward`'s): the two-kernel backward (dQ
    kernel, which also writes delta, then the dK/dV kernel) with VARLEN, grids (ceil(max_q /
    BLOCK_M), n_seq * H) and (ceil(max_k / BLOCK_N), n_seq * H_kv), no GQA split: each dK/dV
    program walks every query head of its group. It allocates delta (1, H, total_q) fp32, dQ,
    dK and dV, nothing else, whatever the lengths (`attnmem.calc.peak.varlen_peak_bytes`). On Hopper
    the route runs `bwd_sm90.attention_backward_sm90_packed` instead where
    `attnmem.calc.dispatch.sm90_packed` says (route.backward_route)."""
    _, H, total_q, d = q.shape
    H_kv, total_k = k.shape[1], k.shape[2]
    bd = block_d(d)
    delta = common.empty(q, (1, H, total_q), torch.float32)  # (1, H, total_q)
    dk = common.empty(k, k.shape)  # (1, H_kv, total_k, d), contiguous
    dv = common.empty(v, v.shape)
    dq = common.empty(q, q.shape)  # (1, H, total_q, d), contiguous
    windowed = window is not None
    win = int(window) if windowed else 0
    meta = dict(HEAD_DIM=d, BLOCK_D=bd, EVEN_D=bd == d, CAUSAL=bool(causal),
                IEEE=q.dtype == torch.float32, WINDOW=windowed, VARLEN=True)
    bucket = seq_bucket(max(packed.max_q, packed.max_k))
    sq, sk, sv, sdo, so, sdq, sdk = (q.stride(), k.stride(), v.stride(), do.stride(), o.stride(),
                                     dq.stride(), dk.stride())
    cu_q, cu_k, n_seq = packed.cu_q, packed.cu_k, packed.n_seq
    spec = (q.dtype, do.dtype, sq, sk, sv, sdo, so, sdq, sdk, H, H_kv, 1, q.data_ptr() % 16,
            k.data_ptr() % 16, v.data_ptr() % 16, do.data_ptr() % 16, o.data_ptr() % 16,
            lse2.data_ptr() % 16, cu_q.data_ptr() % 16, cu_k.data_ptr() % 16)
    dq_args = (q, k, v, o, do, lse2, delta, dq, cu_q, cu_k, *sq, *sk, *sv, *so, *sdo, *sdq,
               H, H // H_kv, total_q, total_k, scale * LOG2E, scale, win, bucket)
    launch(dq_tuned, bwd_dq_kernel, "dq_varlen", meta, bucket, dq_tiles, dq_args,
           lambda c: (cdiv(packed.max_q, c["BLOCK_M"]), n_seq * H), spec=spec)
    dkdv_args = (q, k, v, do, lse2, delta, dk, dv, None, None, cu_q, cu_k,
                 *sq, *sk, *sv, *sdo, *sdk, *sdk,
                 H, H_kv, H // H_kv, 1, total_q, total_k, total_q, scale * LOG2E, scale, win,
                 bucket)
    launch(dkdv_tuned, bwd_dkdv_kernel, "dkdv_varlen", meta, bucket, dkdv_tiles, dkdv_args,
           lambda c: (cdiv(packed.max_k, c["BLOCK_N"]), n_seq * H_kv, 1), spec=spec)
    return dq, dk, dv


def _sum_split(dk_out: torch.Tensor, dv_out: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
               split: int) -> None:
    """dK, dV = the sums of the split's partial dK, dV over the split (a no-op without one).
    PyTorch's sum of 16-bit tensors accumulates in fp32."""
    if split == 1:
        return
    B, H_kv, s_k, d = dk.shape
    torch.sum(dk_out.view(B, H_kv, split, s_k, d), dim=2, out=dk)
    torch.sum(dv_out.view(B, H_kv, split, s_k, d), dim=2, out=dv)
