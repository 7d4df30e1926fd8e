"""Split-KV attention for decode and chunked prefill: a few new queries against a long cache.

The idea is flash-decoding (Tri Dao, Daniel Haziza, Francisco Massa, Grigory Sizov,
"Flash-Decoding for long-context inference", 2023): at decode time a sequence has one to a
handful of new queries, so the forward's grid of (query blocks x heads) programs is a few
dozen programs against 132 SMs, each walking the whole cache alone. Instead the cache is
cut into chunks along the keys; each chunk is an independent program that writes its
partial output (normalised) and the log-sum-exp of its scores, and the chunks are combined
exactly: with lse_c the log2-sum-exp of chunk c and O_c its normalised
output, O = sum_c 2^(lse_c - m) O_c / sum_c 2^(lse_c - m), m = max_c lse_c.

What this file adds to that idea, in our words:

- GQA rows together. One program owns the rows of one (batch, key/value head): every query
  head of its group times every new query, R = (H / H_kv)·s_q rows (row r is query head
  h_kv·G + r // s_q, new query r % s_q). Each K/V tile is then read from memory once for
  the whole group instead of once per query head, and R rows (4-128 for G = 4-16 and 1-8
  queries) fill a tensor-core tile that one query alone would leave 1/16 full.
- The split rule (`attnmem.calc.decode_split.decode_plan`, one copy that attnmem.calc.peak
  reads too): with P = row blocks x B x H_kv programs unsplit, S = floor(132 / P) chunks (at
  least 1, at most one per 2 key tiles, at most 256): the split grid is at most one wave of
  one program per SM (one program fills an SM's shared memory at the default tiles), and a
  grid of P >= 67 programs runs unsplit. The chunk length is a multiple of the key tile
  (128 keys at d <= 128, 64 above). One chunk writes O directly and nothing is combined.
- The combine, where the plan has S > 1 chunks, one of two ways
  (`attnmem.calc.decode_split.fused_combine`). Fused, at 2-4 chunks (tiles up to 32 x 128):
  each chunk writes its partials, then takes a ticket from an int32 counter of its (row
  block, batch, key/value head) (a CTA barrier, then one thread's acq_rel atomic at GPU
  scope); the program with the last ticket reads the other chunks' partials past L1 and
  writes O. The counters are zeroed per call (P int32 behind the log2-sum-exps, one
  allocation). From 5 chunks `decode_combine_kernel` (one program per output row) combines
  in a second launch: there the last program's serial tail of S partial reads costs more
  than that launch (measured on an H100: 1.0-5.8 µs lost at 16 chunks, from 0.8 µs lost
  to 1.4 µs gained at 4; the derivation is attnmem.calc.decode_split's). ``combine`` forces either
  (the A/B, attnmem.kernels.dev.ab_decode).
- Causal with the queries at the end of the cache (bottom-right): new query i of s_q sits at
  position kv_len - s_q + i and sees keys 0 .. kv_len - s_q + i. That is a KV cache's mask
  (transformers' causal mask with a query offset) and the mask of chunked prefill, which is
  the same kernel with more rows (s_q > 8: more row blocks, fewer or no splits).
- Valid lengths: the cache tensors may be longer than what is valid (a static cache's
  max_cache_len), as one number or one int32 per sequence on the device; keys at or past a
  sequence's valid length are never read. A chunk wholly past it writes lse = -inf (weight
  0 in the combine).

Work and memory per call: reads q, each valid K/V row once per row block (one block at
decode), writes O (B·H·s_q·d·e) and, with S > 1 chunks, the fp32 partials B·H·s_q·S·(d + 1)·4
bytes, which the combine reads once, and where fused P int32 counters. Buffers: `decode_buffers`, counted by
`attnmem.calc.peak.decode_peak_bytes`. No backward: this path serves inference (no_grad).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from attnmem.calc.decode_split import (
    DECODE_WAVES,
    DecodePlan,
    decode_counters,
    decode_plan,
    fused_combine,
)
from attnmem.kernels.flash import common
from attnmem.kernels.flash.common import LOG2E, block_d, launch, mm, mma

__all__ = ["decode_attention", "decode_buffers", "decode_combine_kernel", "decode_split_kernel",
           "plan_for"]

#: Splits per combine step of the combine kernel (a (COMBINE_S, d) fp32 tile of partial
#: outputs at a time).
COMBINE_S = 16
#: Chunks per unrolled step of the fused combine at most: (BLOCK_M, d) fp32 tiles of up to
#: 64 registers a thread in all (`_combine_step`).
COMBINE_S_FUSED = 4


def _combine_step(block_m: int, block_d: int, warps: int) -> int:
    """Chunks per unrolled step of the fused combine: as many (block_m, block_d) fp32 tiles
    as fit 64 registers a thread (4 at BLOCK_M = 16, d = 128, 4 warps; 1 from BLOCK_M = 64),
    at most COMBINE_S_FUSED. Compiled for sm_90 (attnmem.kernels.dev.compile_decode) this
    keeps the split kernel without spills where it had none."""
    per_tile = block_m * block_d // (32 * warps)
    return max(1, min(COMBINE_S_FUSED, 64 // per_tile))


@triton.jit
def _decode_keys(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                 offs_d, lim, lo, hi, kv_len, qk_scale, HEAD_DIM,
                 BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr,
                 IEEE: tl.constexpr):
    """The online softmax over keys [lo, hi) for a tile of rows. ``lim`` (BLOCK_M,): each row
    sees keys below its value (its causal limit, at most the valid length). MASKED: some row
    of this range does not see some key (the causal diagonal, the valid length's tail)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)  # chunks start on whole tiles
        cols = start_n + offs_n
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd
        k, v = common.load_pair(k_ptrs, v_ptrs, cols, kv_len, offs_d, HEAD_DIM, MASKED, EVEN_D)
        qk = mm(q, tl.trans(k), IEEE)  # (BLOCK_M, BLOCK_N)
        if MASKED:
            qk = tl.where(cols[None, :] < lim[:, None], qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # a row that has seen no key yet keeps m = -inf: shift it by 0 so that its p and
            # alpha are 2^-inf = 0, not 2^(-inf - -inf) = NaN
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(qk - m_sub[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_sub = m_new
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["s_q", "kv_len_all", "s_cache", "split_len", "n_splits"])
def decode_split_kernel(
    Q, K, V,  # (B, H, s_q, d), (B, H_kv, S_cache, d), (B, H_kv, S_cache, d); any strides
    Out,  # PARTIAL off: (B, H, s_q, d) through its strides, written in full
    O_PART,  # PARTIAL: (B, H, s_q, n_splits, HEAD_DIM) fp32, contiguous
    LSE_PART,  # PARTIAL: (B, H, s_q, n_splits) fp32, contiguous: log2-sum-exp per chunk
    COUNTERS,  # FUSED: int32 (row blocks x B x H_kv), zero before the launch: chunks done
    KV_LENS,  # PER_SEQ: int32 (B,) valid keys per sequence; else unused
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, H_kv, GROUP,  # query heads, key/value heads, H // H_kv
    s_q,  # new queries per sequence
    kv_len_all,  # valid keys of every sequence (PER_SEQ off)
    s_cache,  # the cache tensors' length: no key at or past it is read
    split_len,  # keys per chunk, a multiple of BLOCK_N
    n_splits,  # chunks (grid axis 0 is row blocks x n_splits)
    qk_scale,  # softmax scale * log2(e)
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,  # bottom-right: query i sees keys <= kv_len - s_q + i
    PER_SEQ: tl.constexpr,  # valid lengths from KV_LENS
    PARTIAL: tl.constexpr,  # write the chunk's partials (n_splits > 1), else O itself
    FUSED: tl.constexpr,  # PARTIAL: the last chunk of each row block to finish combines
    COMBINE_S: tl.constexpr,  # FUSED: chunks read per combine step
    IEEE: tl.constexpr,
):
    split = tl.program_id(0) % n_splits
    row_block = tl.program_id(0) // n_splits
    bh = tl.program_id(1)  # b * H_kv + h_kv
    b = bh // H_kv
    h_kv = bh % H_kv
    if PER_SEQ:
        kv_len = tl.load(KV_LENS + b)
    else:
        kv_len = kv_len_all
    kv_len = tl.minimum(kv_len, s_cache)

    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP * s_q
    hq = h_kv * GROUP + rows // s_q  # query head of each row
    qi = rows % s_q  # new query of each row
    offs_d = tl.arange(0, BLOCK_D)
    b64 = b.to(tl.int64)
    hq64 = hq.to(tl.int64)

    # ---- the rows' query vectors, gathered over (head, query): BLOCK_M x d ------------------
    q_ptrs = (Q + b64 * stride_qb + hq64[:, None] * stride_qh + qi[:, None] * stride_qm
              + offs_d[None, :] * stride_qd)
    q_mask = row_ok[:, None]
    if not EVEN_D:
        q_mask = q_mask & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptrs, mask=q_mask, other=0.0)

    # ---- each row's last visible key + 1; padded rows take the valid length -----------------
    if CAUSAL:
        lim = tl.minimum(tl.maximum(kv_len - s_q + qi + 1, 0), kv_len)
    else:
        lim = tl.zeros([BLOCK_M], dtype=tl.int32) + kv_len
    lim = tl.where(row_ok, lim, kv_len)
    lo = split * split_len
    end = lo + split_len
    hi = tl.minimum(end, tl.max(lim, 0))  # keys any row of this chunk sees
    every = tl.minimum(end, tl.min(lim, 0))  # keys below this every row sees
    full_hi = lo + tl.maximum(every - lo, 0) // BLOCK_N * BLOCK_N

    k_base = K + b64 * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + h_kv.to(tl.int64) * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, m_i, l_i = _decode_keys(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd,
                                 stride_vn, stride_vd, offs_d, lim, lo, full_hi, kv_len,
                                 qk_scale, HEAD_DIM, BLOCK_N, EVEN_D, False, IEEE)
    acc, m_i, l_i = _decode_keys(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd,
                                 stride_vn, stride_vd, offs_d, lim, full_hi, hi, kv_len,
                                 qk_scale, HEAD_DIM, BLOCK_N, EVEN_D, True, IEEE)

    # ---- epilogue: a row that saw no key of this chunk has l = 0: O_c = 0, lse_c = -inf -----
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    d_mask = row_ok[:, None]
    if not EVEN_D:
        d_mask = d_mask & (offs_d[None, :] < HEAD_DIM)
    if PARTIAL:
        lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(l_safe))
        row0 = ((b64 * H + hq64) * s_q + qi) * n_splits  # (B, H, s_q, S) index of chunk 0
        tl.store(LSE_PART + row0 + split, lse, mask=row_ok)
        tl.store(O_PART + (row0 + split)[:, None] * HEAD_DIM + offs_d[None, :], o, mask=d_mask)
        if FUSED:
            # Every thread's partial stores come before the barrier; the counter's atomic
            # (one thread, acq_rel at GPU scope) releases them to the program that takes the
            # last ticket and acquires the others' (the pattern of CUTLASS's semaphore:
            # barrier, then one thread's release at GPU scope).
            tl.debug_barrier()
            row_blocks = tl.num_programs(0) // n_splits
            ticket = tl.atomic_add(COUNTERS + bh * row_blocks + row_block, 1, sem="acq_rel",
                                   scope="gpu")
            if ticket == n_splits - 1:
                tl.debug_barrier()  # no thread reads the partials before the acquire
                out = _combine_rows(O_PART, LSE_PART, row0, n_splits, row_ok, d_mask, offs_d,
                                    HEAD_DIM, BLOCK_M, BLOCK_D, COMBINE_S)
                # the pointers formed here, not before the combine: a (BLOCK_M, d) tile of
                # 64-bit addresses kept live across it spilled at BLOCK_M >= 64
                o_ptrs = (Out + b64 * stride_ob + hq64[:, None] * stride_oh
                          + qi[:, None] * stride_om + offs_d[None, :] * stride_od)
                tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=d_mask)
    else:
        o_ptrs = (Out + b64 * stride_ob + hq64[:, None] * stride_oh + qi[:, None] * stride_om
                  + offs_d[None, :] * stride_od)
        tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=d_mask)


@triton.jit
def _combine_rows(O_PART, LSE_PART, row0, n_splits, row_ok, d_mask, offs_d, HEAD_DIM,
                  BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, COMBINE_S: tl.constexpr):
    """O of this program's rows from every chunk's (O_c, lse_c): sum_c 2^(lse_c - m) O_c /
    sum_c 2^(lse_c - m) with a running maximum m, as the forward's online softmax merges key
    tiles. The partials are read past L1 (.cg: written by other SMs), this program's own
    too (one more tile than taking them from registers, but then every tile has the loads'
    layout: compiled for sm_90, mixing in the registers' tensor-core layout put a shared-
    memory conversion and its barriers on every chunk). COMBINE_S chunks per unrolled step:
    their loads do not depend on each other's arithmetic, so a step costs about one L2 round
    trip, not COMBINE_S; 2-D (rows, d) tiles (a 3-D (rows, chunks, d) tile spilled at
    BLOCK_M >= 64)."""
    m_run = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    den = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for c0 in range(0, n_splits, COMBINE_S):
        for j in tl.static_range(COMBINE_S):
            c = c0 + j
            # the bound as a (BLOCK_M,) comparison: Triton's interpreter turns int1 & a
            # scalar comparison into an int32 mask, which its loads refuse
            ok = row_ok & (tl.zeros([BLOCK_M], dtype=tl.int32) + c < n_splits)
            lse_c = tl.load(LSE_PART + row0 + c, mask=ok, other=float("-inf"),
                            cache_modifier=".cg")
            o_c = tl.load(O_PART + (row0 + c)[:, None] * HEAD_DIM + offs_d[None, :],
                          mask=ok[:, None] & d_mask, other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m_run, lse_c)
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # no chunk yet saw a key
            alpha = tl.math.exp2(m_run - m_sub)
            w = tl.math.exp2(lse_c - m_sub)
            acc = acc * alpha[:, None] + w[:, None] * o_c
            den = den * alpha + w
            m_run = m_new
    return acc / tl.where(den == 0.0, 1.0, den)[:, None]


@triton.jit(do_not_specialize=["s_q", "n_splits"])
def decode_combine_kernel(
    O_PART, LSE_PART,  # (B, H, s_q, n_splits, HEAD_DIM) fp32, (B, H, s_q, n_splits) fp32
    Out,  # (B, H, s_q, d) through its strides
    stride_ob, stride_oh, stride_om, stride_od,
    H, s_q, n_splits,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """One program per output row: O = sum_c 2^(lse_c - m) O_c / sum_c 2^(lse_c - m)."""
    row = tl.program_id(0).to(tl.int64)  # (b * H + h) * s_q + i
    i = row % s_q
    bh = row // s_q
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    lse_row = LSE_PART + row * n_splits
    m_vec = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        lse = tl.load(lse_row + s0 + offs_s, mask=s0 + offs_s < n_splits, other=float("-inf"))
        m_vec = tl.maximum(m_vec, lse)
    m = tl.max(m_vec, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # no chunk saw a key: every weight is 0
    acc = tl.zeros([BLOCK_S, BLOCK_D], dtype=tl.float32)
    den = tl.zeros([BLOCK_S], dtype=tl.float32)
    d_ok = offs_d[None, :] < HEAD_DIM
    for s0 in range(0, n_splits, BLOCK_S):
        s_ok = s0 + offs_s < n_splits
        lse = tl.load(lse_row + s0 + offs_s, mask=s_ok, other=float("-inf"))
        w = tl.math.exp2(lse - m)
        o = tl.load(O_PART + (row * n_splits + s0 + offs_s)[:, None] * HEAD_DIM
                    + offs_d[None, :], mask=s_ok[:, None] & d_ok, other=0.0)
        acc += w[:, None] * o
        den += w
    total = tl.sum(den, 0)
    out = tl.sum(acc, 0) / tl.where(total == 0.0, 1.0, total)
    b = bh // H
    h = bh % H
    tl.store(Out + b * stride_ob + h * stride_oh + i * stride_om + offs_d * stride_od,
             out.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)


def _int_class(x: int) -> tuple[bool, bool, bool]:
    """How Triton's JIT specialises an int argument: equal to 1, divisible by 16, and
    whether it fits in 32 bits (else it is passed as int64)."""
    return x == 1, x % 16 == 0, -(2**31) <= x < 2**31


def plan_for(B: int, H: int, H_kv: int, s_q: int, s_k: int, d: int,
             block_n: int | None = None, splits: int | None = None, *,
             waves: int = DECODE_WAVES, combine: str | None = None) -> DecodePlan:
    """The call's `DecodePlan` (`attnmem.calc.decode_split.decode_plan`), with ``splits``
    forcing the number of chunks (tests, the A/B probe; the chunk length is then whole key
    tiles again), ``waves`` another target grid (the probe's first rule: 4) and ``combine``
    the combine ("fused": in the split kernel wherever S > 1, at any chunk count and tile;
    "kernel": a second launch; None: the plan's rule, `attnmem.calc.decode_split.
    fused_combine`: fused at 2-4 chunks and tiles up to 32 x 128)."""
    if combine not in (None, "fused", "kernel"):
        raise ValueError(f"combine must be 'fused', 'kernel' or None, got {combine!r}")
    plan = decode_plan(B, H, H_kv, s_q, s_k, d, block_n, waves=waves)
    if splits is not None:
        if type(splits) is not int or splits < 1:
            raise ValueError(f"splits must be an int >= 1 or None, got {splits!r}")
        tiles = -(-s_k // plan.block_n)
        split_len = -(-tiles // min(splits, tiles)) * plan.block_n
        n = -(-s_k // split_len)
        plan = plan._replace(splits=n, split_len=split_len,
                             fused=fused_combine(n, plan.block_m, d))
    if combine is not None:
        plan = plan._replace(fused=plan.partial and combine == "fused")
    return plan


def decode_buffers(plan: DecodePlan, B: int, H: int, H_kv: int, s_q: int, d: int, elem: int
                   ) -> list[tuple[str, int]]:
    """The tensors one call allocates, in order (label, bytes): O, then with S > 1 chunks the
    fp32 partial outputs and one buffer of the fp32 log2-sum-exps followed, where the split
    kernel combines (``plan.fused``), by the int32 counters
    (`attnmem.calc.decode_split.decode_counters`), freed at the end."""
    rows = B * H * s_q
    out = [("output", rows * d * elem)]
    if plan.partial:
        out += [("partial outputs", rows * plan.splits * d * 4),
                ("partial log2-sum-exps and counters",
                 (rows * plan.splits + decode_counters(B, H_kv, plan)) * 4)]
    return out


#: True under Triton's CPU interpreter (TRITON_INTERPRET=1 before triton was imported):
#: then CPU tensors are accepted.
_INTERPRETED = type(decode_split_kernel).__name__ == "InterpretedFunction"


@functools.lru_cache(maxsize=512)
def _prepared(B: int, H: int, H_kv: int, s_q: int, d: int, plan_len: int, s_cache: int,
              dtype: torch.dtype, causal: bool, per_seq: bool, block_n: int | None,
              splits: int | None, combine: str | None, waves: int, strides: tuple) -> tuple:
    """What a call's launch depends on besides the tensors' addresses, cached by shape (the
    layers of one decode step repeat it): the plan, the split kernel's scalar arguments,
    constexprs, tiles, grid and the JIT's specialisation of the strides (`_int_class`)."""
    plan = plan_for(B, H, H_kv, s_q, plan_len, d, block_n, splits, waves=waves,
                    combine=combine)
    partial = plan.partial
    bd = block_d(d)
    warps = 4 if plan.block_m * bd <= 64 * 128 else 8
    # 3 stages hold two K/V tiles in flight: 139 KiB at 16-bit, d = 128, 128 keys; in fp32
    # that is 272 KiB, over an H100's 227 KiB a block, so 2 stages there (and above d = 128)
    stages = 2 if d > 128 or (dtype == torch.float32 and d > 64) else 3
    scalars = (H, H_kv, H // H_kv, s_q, plan_len if not per_seq else 0, s_cache,
               plan.split_len, plan.splits)
    meta = dict(HEAD_DIM=d, BLOCK_D=bd, EVEN_D=bd == d, CAUSAL=causal, PER_SEQ=per_seq,
                PARTIAL=partial, FUSED=plan.fused,
                COMBINE_S=_combine_step(plan.block_m, bd, warps),
                IEEE=dtype == torch.float32)
    tiles = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, num_warps=warps,
                 num_stages=stages)
    grid = (plan.row_blocks * plan.splits, B * H_kv)
    rows = B * H * s_q
    n_lse = rows * plan.splits
    n_counters = decode_counters(B, H_kv, plan)
    # what the JIT specialises on beyond meta and tiles: dtypes, each stride's class (1, a
    # multiple of 16, 32-bit: the JIT's own classes, so a dynamic cache whose strides grow
    # every step keeps one compiled kernel and the direct launch), head counts (the
    # addresses' 16-byte alignment is added per call)
    spec = (dtype, *(_int_class(x) for x in strides), H, H_kv)
    return plan, scalars, meta, tiles, grid, n_lse, n_counters, spec


def _check(q, k, v, kv_len, scale):
    """Shapes, dtypes, devices and the valid length; returns (host length for the plan,
    per-sequence tensor or None)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor (batch, heads, seq, head_dim), got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16,
                                                             torch.float32):
        raise TypeError(f"q, k, v must share one dtype of float16, bfloat16, float32; got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, s_q, d = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != d:
        raise ValueError(f"k and v must be (B={B}, H_kv, S, d={d}) alike, got k "
                         f"{tuple(k.shape)}, v {tuple(v.shape)}")
    H_kv, s_cache = k.shape[1], k.shape[2]
    if H_kv == 0 or H % H_kv:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({H_kv})")
    if not 16 <= d <= 256:
        raise ValueError(f"head_dim must be from 16 to 256, got {d}")
    if min(B, H, s_q, s_cache) == 0:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number or None, got {scale}")
    if q.device.type != "cuda" and not _INTERPRETED:
        raise ValueError(f"q, k, v must be CUDA tensors (got {q.device}); CPU tensors only "
                         "under Triton's interpreter (TRITON_INTERPRET=1)")
    if kv_len is None:
        return s_cache, None
    if isinstance(kv_len, torch.Tensor):
        if kv_len.dtype != torch.int32 or kv_len.shape != (B,) or kv_len.device != q.device:
            raise ValueError(f"kv_len as a tensor must be int32 of shape ({B},) on {q.device}, "
                             f"got {kv_len.dtype} {tuple(kv_len.shape)} on {kv_len.device}")
        return s_cache, kv_len
    if type(kv_len) is not int or not 1 <= kv_len <= s_cache:
        raise ValueError(f"kv_len must be an int from 1 to the cache length {s_cache}, an "
                         f"int32 tensor of shape ({B},), or None; got {kv_len!r}")
    return kv_len, None


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     kv_len: int | torch.Tensor | None = None, causal: bool = True,
                     scale: float | None = None, *, splits: int | None = None,
                     block_n: int | None = None, combine: str | None = None,
                     waves: int | None = None) -> torch.Tensor:
    """Attention of s_q new queries per sequence against a KV cache (module docstring).

    q (B, H, s_q, d); k, v (B, H_kv, S, d) with H % H_kv == 0, any strides (the cache's own
    tensors: nothing is copied). ``kv_len``: the valid keys, None (all S), an int (every
    sequence), or an int32 tensor (B,) on q's device (values above S are read as S; with
    ``causal`` a value below s_q leaves the first rows with no key: they get 0). ``causal``:
    query i sees keys 0 .. kv_len - s_q + i (the queries are the last s_q positions of the
    valid length); else every valid key. fp16, bf16 (fp32 accumulation) or fp32; d 16-256.

    Returns (B, H, s_q, d) in q's dtype: a transposed view of a contiguous (B, s_q, H, d)
    tensor, transformers' attention-output layout, so its ``transpose(1, 2).contiguous()``
    copies nothing. ``splits`` forces the number of key chunks and ``block_n`` the key tile
    (tests); by default `attnmem.calc.decode_split.decode_plan` decides; ``waves`` gives its
    rule another target grid (the A/B probe's first rule: 4). ``combine``: how
    split chunks are combined, "fused" (the last chunk program of each row block, one
    launch, any chunk count) or "kernel" (a second launch); None takes the plan's rule
    (`attnmem.calc.decode_split.fused_combine`: fused at 2-4 chunks, the combine kernel from
    5), the path calc's peak counts. Not
    differentiable: a call that would need a gradient raises ValueError.
    """
    if combine not in (None, "fused", "kernel"):
        raise ValueError(f"combine must be 'fused', 'kernel' or None, got {combine!r}")
    plan_len, per_seq = _check(q, k, v, kv_len, scale)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise ValueError("decode_attention has no backward (inference only): call it under "
                         "torch.no_grad(), or use flash_attention for training")
    B, H, s_q, d = q.shape
    H_kv, s_cache = k.shape[1], k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    out = common.empty(q, (B, s_q, H, d)).transpose(1, 2)  # (B, H, s_q, d) view
    sq, sk, sv, so = q.stride(), k.stride(), v.stride(), out.stride()
    plan, scalars, meta, tiles, grid, n_lse, n_counters, spec = _prepared(
        B, H, H_kv, s_q, d, plan_len, s_cache, q.dtype, bool(causal), per_seq is not None,
        block_n, splits, combine, DECODE_WAVES if waves is None else waves,
        (*sq, *sk, *sv, *so))
    if plan.partial:
        o_part = common.empty(q, (B, H, s_q, plan.splits, d), torch.float32)
        # the log2-sum-exps (B, H, s_q, S) and, behind them, the counters: one allocation
        lse_buf = common.empty(q, (n_lse + n_counters,), torch.float32)
        lse_part = lse_buf
        counters = out  # unused pointer
        if n_counters:
            counters = lse_buf[n_lse:].view(torch.int32).zero_()
    else:
        o_part = lse_part = counters = out  # unused pointers
    args = (q, k, v, out, o_part, lse_part, counters, per_seq, *sq, *sk, *sv, *so, *scalars,
            float(scale) * LOG2E)
    key = (*spec, q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16,
           counters.data_ptr() % 16, None if per_seq is None else per_seq.data_ptr() % 16)
    launch(None, decode_split_kernel, "decode", meta, 0, tiles, args, lambda c: grid, None,
           key)
    if plan.partial and not plan.fused:
        cargs = (o_part, lse_part, out, *so, H, s_q, plan.splits)
        launch(None, decode_combine_kernel, "decode_combine",
               dict(HEAD_DIM=d, BLOCK_D=meta["BLOCK_D"]), 0,
               dict(BLOCK_S=COMBINE_S, num_warps=4, num_stages=1), cargs,
               lambda c: (B * H * s_q,), None, (q.dtype, so, H))
    return out
