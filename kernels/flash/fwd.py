"""FlashAttention forward in Triton: one pass over the keys, no s x s matrix in memory.

The algorithm, in our words
---------------------------
Attention for one (batch, head) is ``O = softmax(scale * Q K^T) V`` with Q of shape (s_q, d)
and K, V of shape (s_k, d). Written plainly it materialises the (s_q, s_k) score matrix. Here
each program owns BLOCK_M query rows and walks over the keys BLOCK_N at a time, keeping three
running quantities per row in registers:

* ``m``   the largest score seen so far (the softmax's shift, for numerical safety),
* ``l``   the sum of exp(score - m) over the keys seen so far,
* ``acc`` the sum of exp(score - m) * v over the keys seen so far, shape (BLOCK_M, d).

When a new block raises the maximum from m to m', everything accumulated so far was scaled
by exp(-m) and must be rescaled by exp(m - m'): one multiply per row for ``l`` and per row of
``acc``. After the last block, ``O = acc / l``. This is the "online softmax": the exact
softmax, computed in one streaming pass.

Base 2 instead of base e. The exponential unit computes 2^x; exp(x) costs an extra multiply
by log2(e). We fold log2(e) into the softmax scale once (``qk_scale = scale * log2(e)``), so
that every score is in log2 units and the inner loop calls ``exp2`` only. The row statistic
that we save for the backward is ``lse2 = m + log2(l)``, the log-sum-exp in those same units:
with it the backward recomputes any probability as ``exp2(qk * qk_scale - lse2)`` without
redoing the softmax's normalisation.

Causal masking (aligned as PyTorch's SDPA ``is_causal``: top-left, query i sees keys j <= i,
also when s_q != s_k) and the ragged tail of the key sequence are the only places that need
a mask. So the key loop is split in two: the blocks that lie fully inside the visible region
run without any mask (the bulk of the work), and the few blocks that straddle the diagonal or
the end of the keys run with one. Blocks entirely above the diagonal are never visited: that
is where causal attention saves half of the work.

Memory traffic per (batch, head): read Q once (s_q * d), read K and V once per query block
(2 * s_k * d * ceil(s_q / BLOCK_M)), write O once (s_q * d) and one fp32 lse2 per row. No
other s-sized buffer is allocated: the extra memory of the forward is exactly
``B * H * s_q * (d * e + 4)`` bytes (O and lse2).

Head dims that are not a power of two (80, 96, ...) are padded to the next power of two
inside the kernel: the padded columns are loaded as zeros, which leave every dot product
unchanged, and are never stored.
"""

from __future__ import annotations

import inspect
import os

import torch
import triton
import triton.language as tl

from kernels.flash.launcher import DirectLauncher

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)


# ---------------------------------------------------------------------------------------------
# Tuning space. Each entry is (BLOCK_M, BLOCK_N, num_warps, num_stages). On Hopper the known
# good region for the forward is BLOCK_M = 128 with 8 warps (two warpgroups share the query
# tile) and 3-4 pipeline stages for the K/V loads; smaller tiles serve short sequences and the
# large head dims, where shared memory runs out first. The autotuner's key is (length bucket,
# head dim, causal, dtypes): causal and non-causal never share an entry.
# ---------------------------------------------------------------------------------------------
FWD_SPACE = [
    (128, 128, 8, 3),
    (128, 128, 8, 2),
    (128, 64, 8, 3),
    (128, 64, 8, 4),
    (64, 64, 4, 3),
]
SMEM_BYTES = 220 * 1024  # usable shared memory per block on H100/H200 is 227 KiB


def _pow2_at_least(n: int) -> int:
    """Smallest power of two >= n (n >= 1), in plain integer arithmetic: triton's own helper
    goes through its constexpr wrapper, about 4 us of host time per call on the launch path."""
    return 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive integers (grid sizes), without triton's constexpr wrapper."""
    return -(-a // b)


def block_d(d: int) -> int:
    """Head dim padded to the next power of two (at least 16, the smallest dot size)."""
    return max(16, _pow2_at_least(d))


def seq_bucket(s: int) -> int:
    """Length bucket for the autotuner's key: powers of two from 256 up to 16384."""
    return min(16384, max(256, _pow2_at_least(s)))


def _configs(space: list[tuple[int, int, int, int]]) -> list[triton.Config]:
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
        for bm, bn, w, st in space
    ]


# Configs chosen on an H200 on 2026-11-30 (backward: kernels.bench.tune_bwd, every candidate timed,
# for buckets up to 8192, the autotuner in kernels.bench.speed at 16384; forward: kernels.bench.tune_fwd,
# every candidate timed, tensor descriptors from the 2048 bucket up; fp16,
# shared with bf16, B=1, H=32; kernels/NOTES.md steps 1, 3 and 6), keyed by
# (kernel, element bytes, BLOCK_D, causal, length bucket) -> (BLOCK_M, BLOCK_N, warps, stages);
# element bytes 2 covers fp16 and bf16.
# On a Hopper GPU a hit here skips tuning, so a fresh process starts at full speed; set
# FLASH_ATTN_TUNE=1 to tune anyway. Other GPUs always tune (and keep the result on disk).
TUNED_H200: dict[tuple[str, int, int, bool, int], tuple[int, int, int, int]] = {
    ("fwd", 2, 64, False, 1024): (128, 64, 8, 5),
    ("fwd", 2, 64, False, 2048): (128, 64, 8, 3),
    ("fwd", 2, 64, False, 4096): (128, 64, 4, 3),
    ("fwd", 2, 64, False, 8192): (128, 64, 4, 3),
    ("fwd", 2, 64, False, 16384): (128, 64, 8, 3),
    ("fwd", 2, 64, True, 1024): (64, 64, 4, 3),
    ("fwd", 2, 64, True, 2048): (64, 64, 4, 3),
    ("fwd", 2, 64, True, 4096): (64, 128, 4, 3),
    ("fwd", 2, 64, True, 8192): (128, 64, 8, 4),
    ("fwd", 2, 64, True, 16384): (128, 64, 8, 3),
    ("fwd", 2, 128, False, 1024): (128, 64, 8, 3),
    ("fwd", 2, 128, False, 2048): (64, 64, 4, 3),
    ("fwd", 2, 128, False, 4096): (128, 128, 8, 3),
    ("fwd", 2, 128, False, 8192): (128, 128, 8, 3),
    ("fwd", 2, 128, False, 16384): (128, 128, 8, 3),
    ("fwd", 2, 128, True, 1024): (64, 64, 4, 3),
    ("fwd", 2, 128, True, 2048): (64, 64, 4, 3),
    ("fwd", 2, 128, True, 4096): (128, 128, 8, 3),
    ("fwd", 2, 128, True, 8192): (128, 128, 8, 3),
    ("fwd", 2, 128, True, 16384): (128, 128, 8, 3),
    ("dkdv", 2, 64, False, 1024): (32, 128, 4, 3),
    ("dkdv", 2, 64, False, 2048): (32, 128, 4, 3),
    ("dkdv", 2, 64, False, 4096): (32, 128, 4, 3),
    ("dkdv", 2, 64, False, 8192): (32, 128, 4, 3),
    ("dkdv", 2, 64, False, 16384): (32, 64, 4, 3),
    ("dkdv", 2, 64, True, 1024): (64, 64, 4, 3),
    ("dkdv", 2, 64, True, 2048): (64, 64, 4, 3),
    ("dkdv", 2, 64, True, 4096): (64, 64, 4, 3),
    ("dkdv", 2, 64, True, 8192): (64, 128, 8, 3),
    ("dkdv", 2, 64, True, 16384): (64, 128, 8, 3),
    ("dkdv", 2, 128, False, 1024): (64, 128, 8, 3),
    ("dkdv", 2, 128, False, 2048): (64, 128, 8, 3),
    ("dkdv", 2, 128, False, 4096): (64, 128, 8, 3),
    ("dkdv", 2, 128, False, 8192): (64, 128, 8, 3),
    ("dkdv", 2, 128, False, 16384): (64, 128, 8, 3),
    ("dkdv", 2, 128, True, 1024): (32, 64, 4, 4),
    ("dkdv", 2, 128, True, 2048): (32, 64, 4, 4),
    ("dkdv", 2, 128, True, 4096): (64, 128, 8, 3),
    ("dkdv", 2, 128, True, 8192): (64, 128, 8, 3),
    ("dkdv", 2, 128, True, 16384): (64, 128, 8, 3),
    ("dq", 2, 64, False, 1024): (128, 32, 4, 3),
    ("dq", 2, 64, False, 2048): (64, 64, 4, 3),
    ("dq", 2, 64, False, 4096): (64, 64, 4, 3),
    ("dq", 2, 64, False, 8192): (64, 64, 4, 3),
    ("dq", 2, 64, False, 16384): (64, 64, 4, 3),
    ("dq", 2, 64, True, 1024): (64, 64, 4, 3),
    ("dq", 2, 64, True, 2048): (64, 64, 4, 3),
    ("dq", 2, 64, True, 4096): (64, 64, 4, 3),
    ("dq", 2, 64, True, 8192): (64, 64, 4, 3),
    ("dq", 2, 64, True, 16384): (64, 64, 4, 3),
    ("dq", 2, 128, False, 1024): (128, 64, 8, 3),
    ("dq", 2, 128, False, 2048): (128, 64, 8, 3),
    ("dq", 2, 128, False, 4096): (128, 64, 8, 3),
    ("dq", 2, 128, False, 8192): (128, 64, 8, 2),
    ("dq", 2, 128, False, 16384): (128, 64, 8, 3),
    ("dq", 2, 128, True, 1024): (128, 64, 8, 3),
    ("dq", 2, 128, True, 2048): (128, 64, 8, 3),
    ("dq", 2, 128, True, 4096): (128, 64, 8, 3),
    ("dq", 2, 128, True, 8192): (128, 64, 8, 3),
    ("dq", 2, 128, True, 16384): (128, 64, 8, 3),
}


def pretuned(kernel: str, named_args: dict, kwargs: dict) -> triton.Config | None:
    """The stored H200 choice for this call, if there is one and the GPU is a Hopper part."""
    if os.environ.get("FLASH_ATTN_TUNE") == "1":
        return None
    try:
        q = named_args["Q"]
        if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device) != (9, 0):
            return None
        key = (kernel, q.element_size(), kwargs["BLOCK_D"], bool(kwargs["CAUSAL"]),
               int(named_args["seq_bucket"]))
    except (KeyError, AttributeError, RuntimeError):  # anything unexpected: just tune
        return None
    hit = TUNED_H200.get(key)
    return None if hit is None else _configs([hit])[0]


def _prune_fwd(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Drop configs whose pipelined K/V tiles cannot fit in shared memory, or whose query tile
    is far longer than the sequence (they would only compute padding)."""
    hit = pretuned("fwd", named_args, kwargs)
    if hit is not None:
        hit.pre_hook = _set_tiles  # a new Config: it needs the descriptors' tile hook too
        return [hit]
    d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
    elem = named_args["Q"].element_size()
    s_q = named_args["s_q"]
    kept = []
    for c in configs:
        bm, bn, st = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages
        # K/V tiles in flight: (stages - 1) buffers of both, plus the resident Q tile.
        smem = (st - 1) * 2 * bn * d * elem + bm * d * elem
        if smem > SMEM_BYTES or (bm > 64 and s_q <= 64):
            continue
        if d >= 256 and (bn > 64 or st > 2):
            continue
        kept.append(c)
    if not kept:
        kept = [triton.Config(dict(BLOCK_M=64, BLOCK_N=32), num_warps=4, num_stages=1)]
    for c in kept:
        c.pre_hook = _set_tiles
    return kept


def _autotune_options() -> dict:
    """Options of triton.autotune that exist in this Triton: keep the timings on disk
    (cache_results, in TRITON_CACHE_DIR), where this Triton has the option."""
    params = inspect.signature(triton.autotune).parameters
    opts = {}
    if "cache_results" in params:
        opts["cache_results"] = True
    return opts


@triton.jit
def _mm(a, b, IEEE: tl.constexpr):
    """a @ b with fp32 accumulation; exact fp32 products when the inputs are fp32 (IEEE)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _mma(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b, accumulated by the tensor cores into acc itself.

    Writing ``acc + _mm(a, b)`` instead makes the compiler hold a second fp32 tile of acc's
    size for the product and then add the two: one more (BLOCK, d) fp32 tile of live registers
    and BLOCK * d extra adds per step, which is what the forward's inner loop cannot afford.
    """
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def tile_mask(rows, n_rows, offs_d, HEAD_DIM, EVEN_D: tl.constexpr):
    """(len(rows), BLOCK_D) mask of a tile: rows below n_rows, and where d was padded to a
    power of two, columns below HEAD_DIM."""
    mask = rows[:, None] < n_rows
    if not EVEN_D:
        mask = mask & (offs_d[None, :] < HEAD_DIM)
    return mask


@triton.jit
def load_pair(a_ptrs, b_ptrs, rows, n_rows, offs_d, HEAD_DIM,
              MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """Two tiles over the same rows (K and V, or Q and dO), read as zero past the last row
    (only checked when MASKED: unmasked blocks lie wholly inside) and in the padded columns."""
    if MASKED:
        mask = tile_mask(rows, n_rows, offs_d, HEAD_DIM, EVEN_D)
        a = tl.load(a_ptrs, mask=mask, other=0.0)
        b = tl.load(b_ptrs, mask=mask, other=0.0)
    elif EVEN_D:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        d_mask = offs_d[None, :] < HEAD_DIM
        a = tl.load(a_ptrs, mask=d_mask, other=0.0)
        b = tl.load(b_ptrs, mask=d_mask, other=0.0)
    return a, b


@triton.jit
def _fwd_key_loop(
    acc, m_i, l_i,  # running state: (BLOCK_M, BLOCK_D) fp32, (BLOCK_M,) fp32, (BLOCK_M,) fp32
    q,  # (BLOCK_M, BLOCK_D) query tile, input dtype, already in registers
    k_ptrs, v_ptrs,  # pointers to the (BLOCK_N, BLOCK_D) key / value tile at key 0
    stride_kn, stride_vn,  # how far one key row moves the pointers
    desc_k, desc_v,  # tensor descriptors of K and V seen as (rows, d), or None (USE_DESC off)
    kv_row0,  # row of key 0 of this (batch, kv head) in the descriptors' (rows, d) view
    offs_m,  # (BLOCK_M,) absolute query row indices of this program
    offs_d,  # (BLOCK_D,) column indices, padded to a power of two
    lo, hi,  # key range [lo, hi) visited by this loop; lo and hi are multiples of BLOCK_N or s_k
    s_k, qk_scale, HEAD_DIM,
    BLOCK_N: tl.constexpr,
    EVEN_D: tl.constexpr,  # HEAD_DIM == BLOCK_D: no column mask needed
    MASKED: tl.constexpr,  # this range straddles the diagonal or the end of the keys
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    USE_DESC: tl.constexpr,  # unmasked tiles come through the tensor-memory copy engine (TMA)
):
    offs_n = tl.arange(0, BLOCK_N)
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n  # (BLOCK_N,) absolute key indices
        # ---- load one key and one value tile: 2 * BLOCK_N * d elements --------------------
        if MASKED:
            k, v = load_pair(k_ptrs, v_ptrs, cols, s_k, offs_d, HEAD_DIM, True, EVEN_D)
        elif USE_DESC:
            # One bulk copy per tile, issued by one thread, landing in shared memory without
            # passing through registers; the loop's pipelining keeps stages-1 of them in flight.
            # Unmasked blocks lie wholly inside this head's keys, so the (rows, d) view never
            # reads a neighbouring head here.
            k = desc_k.load([kv_row0 + start_n, 0])
            v = desc_v.load([kv_row0 + start_n, 0])
            # The tile is the descriptor's block shape, fixed when the kernel is compiled: a
            # descriptor left with another shape would silently skip keys. Refuse to compile.
            tl.static_assert(k.shape[0] == BLOCK_N and v.shape[0] == BLOCK_N)
        else:
            k, v = load_pair(k_ptrs, v_ptrs, cols, s_k, offs_d, HEAD_DIM, False, EVEN_D)
        # ---- scores in log2 units: (BLOCK_M, BLOCK_N) ---------------------------------------
        qk = _mm(q, tl.trans(k), IEEE)
        # ---- online softmax update ------------------------------------------------------------
        # Every row has seen at least one visible key before or in this block (key 0 is
        # visible to every row), so m_new is finite and no NaN can appear.
        if MASKED:
            visible = cols[None, :] < s_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None])
            qk = tl.where(visible, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_new[:, None])
        else:
            # max(scale * x) == scale * max(x) for scale > 0 (checked by the caller), and
            # scale * x - m is one fused multiply-add per score.
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)  # rescales what was accumulated under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, m_i, l_i


@triton.jit
def query_tile(H, GROUP, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """This program's query block and head: (first row, batch * H + query head, batch, query
    head, key/value head).

    Causal: the last query blocks do the most work (they see the most keys), so they are
    handed out first; the short ones then fill the gaps at the end of the grid. Grid axis 1
    runs over batch x query heads; query head h reads key/value head h // GROUP (GQA)."""
    if CAUSAL:
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    h = bh % H
    return start_m, bh, bh // H, h, h // GROUP


@triton.jit
def key_range(start_m, s_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(full_hi, hi) for the query tile starting at row start_m.

    full_hi: end of the key blocks that every row of the tile sees entirely (no mask needed);
    hi:      end of the keys that any row of the tile sees (top-left causal alignment).
    Keys [full_hi, hi) are the diagonal and ragged-tail blocks that need a mask. The forward
    and the dQ kernel split their key loops the same way with it.
    """
    s_k_full = (s_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        full_hi = tl.minimum(s_k_full, (start_m // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(s_k, start_m + BLOCK_M)
    else:
        full_hi = s_k_full
        hi = s_k
    return full_hi, hi


@triton.jit
def _online_update(acc, m_i, l_i, qk, v, qk_scale):
    """One unmasked online-softmax step of the experimental loops below: fold the raw scores
    qk of one key block (and its value tile v) into (acc, m, l). Same arithmetic as the
    unmasked branch of `_fwd_key_loop`."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _fwd_key_loop_ahead(
    acc, m_i, l_i, q, desc_k, desc_v, kv_row0, lo, hi, qk_scale,
    BLOCK_N: tl.constexpr,
):
    """The unmasked key loop, with the next block's scores issued before this block's softmax.

    Same arithmetic as `_fwd_key_loop` (unmasked, descriptor loads), reordered: iteration j
    starts the tensor-core product Q K_{j+1}^T and only then spends its exp2s on block j, so
    that the compiler may wait for that product as late as the next iteration (the overlap
    FlashAttention-3 gets by hand, arXiv 2407.08608, section 3.2). Costs one more
    (BLOCK_M, BLOCK_N) fp32 score tile of registers. Needs hi - lo >= BLOCK_N.
    """
    k = desc_k.load([kv_row0 + lo, 0])
    tl.static_assert(k.shape[0] == BLOCK_N)  # the descriptor's tile must be (BLOCK_N, d)
    qk = tl.dot(q, tl.trans(k))
    for start_n in tl.range(lo + BLOCK_N, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        qk_next = tl.dot(q, tl.trans(desc_k.load([kv_row0 + start_n, 0])))
        v = desc_v.load([kv_row0 + start_n - BLOCK_N, 0])
        acc, m_i, l_i = _online_update(acc, m_i, l_i, qk, v, qk_scale)
        qk = qk_next
    v = desc_v.load([kv_row0 + hi - BLOCK_N, 0])
    return _online_update(acc, m_i, l_i, qk, v, qk_scale)


@triton.jit
def _fwd_key_loop_ws(
    acc, m_i, l_i, q, desc_k, desc_v, kv_row0, lo, hi, qk_scale,
    BLOCK_N: tl.constexpr,
):
    """The unmasked key loop under Triton's warp specialisation (tl.range(warp_specialize)):
    the compiler gives the descriptor loads to a producer warp and the products and softmax to
    consumer warps. Experimental: whether this Triton does it on Hopper is for tune_fwd to say.
    """
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=True):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([kv_row0 + start_n, 0])
        tl.static_assert(k.shape[0] == BLOCK_N)  # the descriptor's tile must be (BLOCK_N, d)
        v = desc_v.load([kv_row0 + start_n, 0])
        acc, m_i, l_i = _online_update(acc, m_i, l_i, tl.dot(q, tl.trans(k)), v, qk_scale)
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["s_q", "s_k", "seq_bucket"])
def _fwd_kernel(
    Q, K, V,  # inputs: (B, H, s_q, d), (B, H_kv, s_k, d), (B, H_kv, s_k, d); any strides
    Out,  # output: (B, H, s_q, d), written in full
    LSE2,  # output: (B, H, s_q) fp32, contiguous: log2-sum-exp of the scaled scores per row
    desc_k, desc_v,  # K and V as (B * H_kv * s_k, d) tensor descriptors, or None
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, GROUP,  # query heads; query heads per key/value head (GQA; 1 for plain MHA)
    s_q, s_k,  # sequence lengths (any value >= 1)
    qk_scale,  # softmax scale * log2(e)
    seq_bucket,  # only read by the autotuner's key: tuned configs are kept per length bucket
    HEAD_DIM: tl.constexpr,  # the real head dim d
    BLOCK_D: tl.constexpr,  # d padded to a power of two (>= 16)
    EVEN_D: tl.constexpr,  # HEAD_DIM == BLOCK_D: no column masks anywhere
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,  # fp32 inputs: exact fp32 products instead of tf32
    USE_DESC: tl.constexpr,  # load unmasked K/V tiles through desc_k / desc_v (TMA)
    BLOCK_M: tl.constexpr,  # query rows per program
    BLOCK_N: tl.constexpr,  # keys per inner step
    AHEAD: tl.constexpr = False,  # experimental: issue the next scores before the softmax
    WS: tl.constexpr = False,  # experimental: Triton's warp specialisation of the key loop
):
    start_m, bh, b, h, h_kv = query_tile(H, GROUP, BLOCK_M, CAUSAL)  # longest first if causal
    # 64-bit offsets for batch and head: B * H * s * d can exceed 2^31 elements.
    q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base = K + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
    o_base = Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    lse_base = LSE2 + bh.to(tl.int64) * s_q

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    # ---- the query tile stays in registers for the whole key loop: BLOCK_M * d reads ------
    q_ptrs = q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    row_mask = offs_m[:, None] < s_q
    if EVEN_D:
        q = tl.load(q_ptrs, mask=row_mask, other=0.0)
    else:
        q = tl.load(q_ptrs, mask=row_mask & (offs_d[None, :] < HEAD_DIM), other=0.0)
    k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # ---- which key blocks need a mask: [0, full_hi) none, [full_hi, hi) the diagonal/tail ----
    full_hi, hi = key_range(start_m, s_k, BLOCK_M, BLOCK_N, CAUSAL)
    kv_row0 = (b * (H // GROUP) + h_kv) * s_k
    if AHEAD and USE_DESC and not IEEE:
        if full_hi > 0:
            acc, m_i, l_i = _fwd_key_loop_ahead(
                acc, m_i, l_i, q, desc_k, desc_v, kv_row0, 0, full_hi, qk_scale, BLOCK_N)
    elif WS and USE_DESC and not IEEE:
        acc, m_i, l_i = _fwd_key_loop_ws(
            acc, m_i, l_i, q, desc_k, desc_v, kv_row0, 0, full_hi, qk_scale, BLOCK_N)
    else:
        acc, m_i, l_i = _fwd_key_loop(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, kv_row0,
            offs_m, offs_d, 0, full_hi, s_k, qk_scale, HEAD_DIM,
            BLOCK_N, EVEN_D, False, CAUSAL, IEEE, USE_DESC,
        )
    acc, m_i, l_i = _fwd_key_loop(
        acc, m_i, l_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, kv_row0,
        offs_m, offs_d, full_hi, hi, s_k, qk_scale, HEAD_DIM,
        BLOCK_N, EVEN_D, True, CAUSAL, IEEE, False,
    )

    # ---- epilogue: normalise, write O (BLOCK_M * d) and lse2 (BLOCK_M fp32) ------------------
    acc = acc / l_i[:, None]
    tl.store(lse_base + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < s_q)
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    if EVEN_D:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_mask)
    else:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_mask & (offs_d[None, :] < HEAD_DIM))


_fwd_kernel_tuned = triton.autotune(
    configs=_configs(FWD_SPACE),
    key=["seq_bucket", "HEAD_DIM", "CAUSAL", "USE_DESC"],  # + the dtypes, by Triton
    prune_configs_by={"early_config_prune": _prune_fwd},
    **_autotune_options(),
)(_fwd_kernel)


# The config chosen per (kernel, element size, head dim, causal, bucket[, TMA]) in this process,
# with the keyword arguments of a launch under it. After the first call of a key the kernel is
# launched with it directly: the autotuner's own dispatch costs tens of microseconds of Python
# per launch, which short sequences would feel.
# fp16 and bf16 share one entry: same tile sizes, same tensor-core rate, same shared memory, so
# a choice tuned on one serves the other (and the second dtype compiles one config, not all).
_CHOSEN: dict[tuple, tuple[dict, dict, tuple]] = {}
_LAUNCHERS: dict[str, DirectLauncher] = {}  # one per kernel name ("fwd", "dq", "dkdv")


def launch(tuned, plain, name: str, meta: dict, bucket: int, config: dict | None, args: tuple,
           grid, prepare=None, spec: tuple | None = None) -> None:
    """Launch `plain` with `config`, or with the autotuner's choice for this key.

    ``prepare(config)``, when given, runs before a direct launch (the autotuner runs the
    configs' own pre_hook): the forward uses it to give its tensor descriptors their tiles.
    ``spec``, when given, determines everything the JIT specialises on in ``args`` other
    than what ``meta`` and the config fix (dtypes, strides, alignment, head counts): the
    compiled kernel is then launched without the JIT's dispatch (kernels/direct.py).
    """
    launcher = _LAUNCHERS.get(name)  # by name: hashing a JITFunction costs ~3 us per lookup
    if launcher is None:
        launcher = _LAUNCHERS[name] = DirectLauncher(plain)
    if config is not None:
        if prepare is not None:
            prepare(config)
        key = None if spec is None else (name, spec, tuple(meta.items()),
                                         tuple(config.items()))
        launcher(grid(config), key, args, {**meta, **config})
        return
    ckey = (name, args[0].element_size(), meta["HEAD_DIM"], meta["CAUSAL"], bucket,
            meta.get("USE_DESC", False))
    chosen = _CHOSEN.get(ckey)
    if chosen is not None:
        cfg, kwargs, cfg_key = chosen
        if prepare is not None:
            prepare(cfg)
        launcher(grid(cfg), None if spec is None else (ckey, spec, cfg_key), args, kwargs)
        return
    tuned[grid](*args, **meta)
    best = getattr(tuned, "best_config", None)
    if best is not None:
        cfg = best.all_kwargs()
        _CHOSEN[ckey] = (cfg, {**meta, **cfg}, tuple(cfg.items()))


# ---- tensor descriptors (TMA) for K and V ---------------------------------------------------
# A descriptor names a 2-d view of K (or V): rows = B * H_kv * s_k, columns = d, row stride =
# the tensors' seq stride. That view exists when (batch, head, seq) flatten into one row index
# (the usual contiguous layout); other layouts, and GPUs or Triton builds without descriptors,
# use the pointer loads, which the kernel always keeps for the masked blocks.
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton < 3.4
    TensorDescriptor = None


def _rows_view(t: torch.Tensor) -> tuple[int, int] | None:
    """(rows, row stride) when t (B, H, s, d) is a (B*H*s, d) matrix in memory, else None."""
    B, H, s, d = t.shape
    sb, sh, sn, sd = t.stride()
    if sd != 1 and d > 1:
        return None
    if H > 1 and sh != s * sn:
        return None
    if B > 1 and sb != H * s * sn:
        return None
    elem = t.element_size()
    if (sn * elem) % 16 or t.data_ptr() % 16:
        return None
    rows = B * H * s
    return (rows, sn) if rows < 2**31 else None


# Keys of a config dict that only the forward understands; the backward drops them.
FWD_ONLY_KEYS = ("USE_DESC", "AHEAD", "WS", "SM90", "SM90_STAGES", "SM90_BLOCK_N",
                 "SM90_PINGPONG", "SM90_CONSUMERS", "SM90_PERSISTENT")
# ... and the backward's own (kernels/flash_attn_bwd.py); the forward drops them.
BWD_ONLY_KEYS = ("BWD_ATOMIC_DQ", "BWD_DQ_TMA", "BWD_KV_SPLIT")

# Below this length bucket the forward loads K/V with pointers even where descriptors work:
# at s = 1024 the host time of encoding two tensor maps per launch cost more than the copy
# engine saved (tune_fwd on the H200: d=128 323 vs 355 TFLOP/s, d=64 168 vs 291), and from
# 2048 up descriptors won in every measured key (kernels/NOTES.md, step 3).
DESC_MIN_BUCKET = 2048


def descriptors_usable(k: torch.Tensor, v: torch.Tensor, d: int, force: bool | None) -> bool:
    """Whether the forward may load K/V through tensor descriptors.

    ``force`` True/False overrides the choice (tests, tuning); otherwise descriptors are used
    on GPUs with a tensor-memory copy engine (compute capability 9.0 and newer) unless
    FLASH_ATTN_DESC=0, for 16-bit inputs and key lengths of DESC_MIN_BUCKET and more. Either
    way the layout must allow the (rows, d) view.
    """
    if TensorDescriptor is None or force is False or d != block_d(d) or d * k.element_size() < 16:
        return False
    if force is None:
        if os.environ.get("FLASH_ATTN_DESC") == "0" or k.device.type != "cuda":
            return False
        if seq_bucket(k.shape[2]) < DESC_MIN_BUCKET:
            return False
        if k.element_size() != 2:  # fp32 (the exact, slow path) keeps the pointer loads that
            return False  # its GPU tests cover; descriptors were tuned and tested on 16-bit
        if torch.cuda.get_device_capability(k.device)[0] < 9:
            return False
    return _rows_view(k) is not None and _rows_view(v) is not None


def _make_descriptors(k: torch.Tensor, v: torch.Tensor, d: int):
    (rows_k, sk), (rows_v, sv) = _rows_view(k), _rows_view(v)
    # block_shape is a placeholder: set from the chosen BLOCK_N before any launch.
    return (TensorDescriptor(k, [rows_k, d], [sk, 1], [16, d]),
            TensorDescriptor(v, [rows_v, d], [sv, 1], [16, d]))


def _set_tiles(nargs: dict) -> None:
    """Autotuner pre_hook (and direct-launch step): descriptor tiles are (BLOCK_N, BLOCK_D)."""
    for name in ("desc_k", "desc_v"):
        desc = nargs.get(name)
        if desc is not None:
            desc.block_shape = [nargs["BLOCK_N"], nargs["BLOCK_D"]]


for _c in _fwd_kernel_tuned.configs:
    _c.pre_hook = _set_tiles


# ---- the hand-scheduled Hopper forward (Gluon) -----------------------------------------------
try:
    from kernels.flash import fwd_sm90 as _sm90
except Exception:  # Triton without Gluon's Hopper API (or an API this code does not know)
    _sm90 = None


def _use_sm90(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: dict | None,
              causal: bool = False) -> bool:
    """Whether the forward runs `flash_attn_fwd_sm90` instead of the Triton kernel below.

    By default: on compute capability 9.x, for fp16/bf16 with d = 128 at any length and
    d = 64 when both lengths exceed 2,048 (4,096 when causal;
    `flash_attn_fwd_sm90.default_schedule`: three consumer warpgroups there; shorter d = 64
    calls measured as fast or faster on the Triton kernel),
    and layouts the copy engine can read, unless FLASH_ATTN_SM90=0. ``config["SM90"]``
    True/False forces the choice (True raises where the kernel cannot run); any other config
    selects the Triton kernel.
    """
    forced = None if config is None else config.get("SM90")
    if forced is False or (config is not None and forced is None):
        return False
    ok = _sm90 is not None and _sm90.usable(q, k, v)  # CUDA tensors only: never interpreted
    if forced and not ok:
        raise ValueError("SM90=True was asked for, but the Hopper forward cannot run here (it "
                         "needs Triton with Gluon, a compute capability 9.x GPU, fp16/bf16, "
                         f"head dim in {_sm90.HEAD_DIMS if _sm90 else (64, 128)} and "
                         "16-byte aligned strides with unit last stride)")
    if forced:
        return True
    return (ok and _sm90.default_schedule(q.shape[3], q.shape[2], k.shape[2], causal) is not None
            and os.environ.get("FLASH_ATTN_SM90") != "0")


def attention_forward(
    q: torch.Tensor,  # (B, H, s_q, d)
    k: torch.Tensor,  # (B, H_kv, s_k, d)
    v: torch.Tensor,  # (B, H_kv, s_k, d)
    causal: bool,
    scale: float,
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel; returns O (B, H, s_q, d) in q's dtype and lse2 (B, H, s_q) fp32.

    ``config`` (BLOCK_M, BLOCK_N, num_warps, num_stages, and optionally USE_DESC True/False)
    skips the autotuner; the interpreter and the tests use it. Inputs are read through their
    strides: nothing is copied.
    """
    if config is not None and any(key in config for key in BWD_ONLY_KEYS):
        config = {key: val for key, val in config.items() if key not in BWD_ONLY_KEYS} or None
    if _use_sm90(q, k, v, config, causal):
        if config is None:  # the default schedule for this head dim and these lengths
            nc, st = _sm90.default_schedule(q.shape[3], q.shape[2], k.shape[2], causal)
            return _sm90.attention_forward_sm90(q, k, v, causal, scale * LOG2E, st, None, None,
                                                nc)
        return _sm90.attention_forward_sm90(q, k, v, causal, scale * LOG2E,
                                            config.get("SM90_STAGES"), config.get("SM90_BLOCK_N"),
                                            config.get("SM90_PINGPONG"),
                                            config.get("SM90_CONSUMERS"),
                                            config.get("SM90_PERSISTENT"))
    if config is not None and "SM90" in config:
        config = {key: val for key, val in config.items() if not key.startswith("SM90")} or None
    B, H, s_q, d = q.shape
    H_kv, s_k = k.shape[1], k.shape[2]
    force = None
    if config is not None and "USE_DESC" in config:
        config = dict(config)
        force = bool(config.pop("USE_DESC"))
    use_desc = descriptors_usable(k, v, d, force)
    if force and not use_desc:
        raise ValueError("USE_DESC=True was asked for, but tensor descriptors are not usable "
                         "here (Triton without them, d not a power of two, or a K/V layout "
                         "whose (batch, head, seq) do not flatten into rows)")
    desc_k, desc_v = _make_descriptors(k, v, d) if use_desc else (None, None)
    # new_empty: q's device and dtype without parsing them (~2 us less each than torch.empty)
    o = q.new_empty((B, H, s_q, d))  # (B, H, s_q, d), contiguous
    lse2 = q.new_empty((B, H, s_q), dtype=torch.float32)  # (B, H, s_q)
    sq, sk, sv, so = q.stride(), k.stride(), v.stride(), o.stride()  # each read once
    args = (
        q, k, v, o, lse2, desc_k, desc_v, *sq, *sk, *sv, *so,
        H, H // H_kv, s_q, s_k, scale * LOG2E, seq_bucket(max(s_q, s_k)),
    )
    bd = block_d(d)
    meta = dict(
        HEAD_DIM=d, BLOCK_D=bd, EVEN_D=bd == d, CAUSAL=bool(causal),
        IEEE=q.dtype == torch.float32, USE_DESC=use_desc,
    )

    def prepare(c: dict) -> None:
        _set_tiles({"desc_k": desc_k, "desc_v": desc_v, "BLOCK_N": c["BLOCK_N"], "BLOCK_D": bd})

    # What the JIT specialises on beyond meta and the config: dtypes, strides (1, multiple of
    # 16), the head counts, the inputs' 16-byte alignment (o and lse2 are fresh allocations);
    # the descriptors' types are the dtype and the config's tile.
    spec = (q.dtype, sq, sk, sv, so, H, H_kv, q.data_ptr() % 16, k.data_ptr() % 16,
            v.data_ptr() % 16)
    launch(_fwd_kernel_tuned, _fwd_kernel, "fwd", meta, args[-1], config, args,
           lambda c: (cdiv(s_q, c["BLOCK_M"]), B * H), prepare if use_desc else None, spec)
    return o, lse2
