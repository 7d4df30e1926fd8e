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

Causal sliding window (``window`` = W, `api.flash_attention`): query i also needs i - j < W,
i.e. it sees keys i - W + 1 .. i (transformers' ``sliding_window_overlay``: kv_idx > q_idx -
sliding_window, on top of the causal mask), in the same top-left alignment. A query tile then
visits only the key blocks from its first row's window start on (`common.window_key_range`):
O(BLOCK_M + W) keys per tile, O(s * W) work in all. The key loop splits in three: the
window's lower edge (masked), the blocks every row sees whole (unmasked), the diagonal and
tail (masked). A row can see nothing in a block of the lower edge, and, when s_q >= s_k + W,
nothing at all (its window lies past the last key): the masked loop keeps such rows at
m = -inf without forming -inf - (-inf), and a row that saw no key gets O = 0 and lse2 = +inf
(FlashAttention-2's convention for an empty row: its probabilities exp2(s - lse2) are 0, so
the backward gives it zero gradients). The window is a constexpr switch (``WINDOW``): without
it the kernel is compiled exactly as before.

Memory traffic per (batch, head): read Q once (s_q * d), read K and V once per query block
(2 * s_k * d * ceil(s_q / BLOCK_M)), write O once (s_q * d) and one fp32 lse2 per row. No
other s-sized buffer is allocated: the extra memory of the forward is exactly
``B * H * s_q * (d * e + 4)`` bytes (O and lse2).

Head dims that are not a power of two (80, 96, ...) are padded to the next power of two
inside the kernel: the padded columns are loaded as zeros, which leave every dot product
unchanged, and are never stored.

On Hopper the unmasked K/V tiles can come through tensor descriptors (the copy engine, TMA)
instead of pointer loads; for fp16/bf16 at d = 128 (and d = 64 on long sequences) the
hand-scheduled Gluon kernel of ``fwd_sm90.py`` runs instead, with the same O and lse2. Both
choices are `route.forward_route`'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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
    triton_configs,
    varlen_rows,
    window_key_range,
)
from attnmem.kernels.flash.tuned import FWD_SPACE, TUNED_H200

__all__ = ["LOG2E", "SMEM_BYTES", "TUNED_H200", "fwd_kernel", "fwd_kernel_tuned",
           "packed_forward", "rows_view", "seq_bucket", "triton_forward"]

def prune_fwd(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Autotuner hook: the stored H200 choice where there is one; else drop configs whose
    pipelined K/V tiles cannot fit in shared memory, or whose query tile is far longer than
    the sequence (they would only compute padding)."""
    hit = pretuned("fwd", named_args, kwargs)
    if hit is not None:
        hit.pre_hook = set_tiles  # a new Config: it needs the descriptors' tile hook too
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
        c.pre_hook = set_tiles
    return kept


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
    window,  # WINDOW: keys per query's causal sliding window (query i sees i - window < j <= i)
    BLOCK_N: tl.constexpr,
    EVEN_D: tl.constexpr,  # HEAD_DIM == BLOCK_D: no column mask needed
    MASKED: tl.constexpr,  # this range straddles the diagonal, the window's edge or the end
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    USE_DESC: tl.constexpr,  # unmasked tiles come through the tensor-memory copy engine (TMA)
    WINDOW: tl.constexpr = False,  # a causal sliding window applies (masked ranges only)
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
        qk = mm(q, tl.trans(k), IEEE)
        # ---- online softmax update ------------------------------------------------------------
        # Without a window every row has seen at least one visible key before or in this
        # block (key 0 is visible to every row), so m_new is finite and no NaN can appear.
        if MASKED:
            visible = cols[None, :] < s_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None])
            if WINDOW:
                visible = visible & (offs_m[:, None] - cols[None, :] < window)
            qk = tl.where(visible, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = m_new
            if WINDOW:
                # A row may have seen no key yet (its window starts in a later block, or lies
                # past the keys): shift it by 0 instead of m_new = -inf, so that its p and
                # alpha are exp2(-inf) = 0 rather than exp2(-inf - (-inf)) = NaN; its m stays
                # -inf until it sees a key.
                m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(qk - m_sub[:, None])
        else:
            # max(scale * x) == scale * max(x) for scale > 0 (checked by the caller), and
            # scale * x - m is one fused multiply-add per score.
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_sub = m_new
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_sub)  # rescales what was accumulated under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["s_q", "s_k", "window", "seq_bucket"])
def fwd_kernel(
    Q, K, V,  # inputs: (B, H, s_q, d), (B, H_kv, s_k, d), (B, H_kv, s_k, d); any strides
    Out,  # output: (B, H, s_q, d), written in full
    LSE2,  # output: (B, H, s_q) fp32, contiguous: log2-sum-exp of the scaled scores per row
    desc_k, desc_v,  # K and V as (B * H_kv * s_k, d) tensor descriptors, or None
    CU_Q, CU_K,  # VARLEN: int32 (n_seq + 1,) starts of the packed sequences' query / key rows
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, GROUP,  # query heads; query heads per key/value head (GQA; 1 for plain MHA)
    s_q, s_k,  # sequence lengths (any value >= 1); VARLEN: the packed totals of rows
    qk_scale,  # softmax scale * log2(e)
    window,  # WINDOW: the causal sliding window in keys (1 <= window < s_q); else unused
    seq_bucket,  # only read by the autotuner's key: tuned configs are kept per length bucket
    HEAD_DIM: tl.constexpr,  # the real head dim d
    BLOCK_D: tl.constexpr,  # d padded to a power of two (>= 16)
    EVEN_D: tl.constexpr,  # HEAD_DIM == BLOCK_D: no column masks anywhere
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,  # fp32 inputs: exact fp32 products instead of tf32
    USE_DESC: tl.constexpr,  # load unmasked K/V tiles through desc_k / desc_v (TMA)
    BLOCK_M: tl.constexpr,  # query rows per program
    BLOCK_N: tl.constexpr,  # keys per inner step
    WINDOW: tl.constexpr = False,  # causal sliding window of `window` keys (CAUSAL too)
    VARLEN: tl.constexpr = False,  # packed sequences (`varlen_rows`): b is the sequence
):
    start_m, bh, b, h, h_kv = query_tile(H, GROUP, BLOCK_M, CAUSAL)  # longest first if causal
    if VARLEN:
        # sequence b owns rows [q0, q0 + s_q) of the packed queries (and [k0, k0 + s_k) of
        # the keys); the grid is sized for the longest sequence, so shorter ones end here
        q0, s_q, k0, s_k, row0 = varlen_rows(CU_Q, CU_K, b, h, s_q)
        if start_m >= s_q:
            return
        lse_base = LSE2 + row0
        q_base = Q + h.to(tl.int64) * stride_qh + q0 * stride_qm
        k_base = K + h_kv.to(tl.int64) * stride_kh + k0 * stride_kn
        v_base = V + h_kv.to(tl.int64) * stride_vh + k0 * stride_vn
        o_base = Out + h.to(tl.int64) * stride_oh + q0 * stride_om
    else:
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

    kv_row0 = (b * (H // GROUP) + h_kv) * s_k
    if WINDOW:
        # ---- [lo, full_lo) the window's lower edge, [full_lo, full_hi) whole blocks, -------
        # ---- [full_hi, hi) the diagonal/tail; keys below lo are never read -------------------
        lo, full_lo, full_hi, hi = window_key_range(start_m, s_k, window, BLOCK_M, BLOCK_N)
        acc, m_i, l_i = _fwd_key_loop(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, kv_row0,
            offs_m, offs_d, full_lo, full_hi, s_k, qk_scale, HEAD_DIM, window,
            BLOCK_N, EVEN_D, False, CAUSAL, IEEE, USE_DESC, False,
        )
        acc, m_i, l_i = _fwd_key_loop(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, kv_row0,
            offs_m, offs_d, lo, full_lo, s_k, qk_scale, HEAD_DIM, window,
            BLOCK_N, EVEN_D, True, CAUSAL, IEEE, False, True,
        )
        acc, m_i, l_i = _fwd_key_loop(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, kv_row0,
            offs_m, offs_d, full_hi, hi, s_k, qk_scale, HEAD_DIM, window,
            BLOCK_N, EVEN_D, True, CAUSAL, IEEE, False, True,
        )
        # a row that saw no key (s_q >= s_k + window): O = 0, lse2 = +inf
        empty_row = l_i == 0.0
        l_i = tl.where(empty_row, 1.0, l_i)
        lse2 = tl.where(empty_row, float("inf"), m_i + tl.math.log2(l_i))
    else:
        # ---- which key blocks need a mask: [0, full_hi) none, [full_hi, hi) the diagonal/tail
        full_hi, hi = key_range(start_m, s_k, BLOCK_M, BLOCK_N, CAUSAL)
        acc, m_i, l_i = _fwd_key_loop(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, kv_row0,
            offs_m, offs_d, 0, full_hi, s_k, qk_scale, HEAD_DIM, window,
            BLOCK_N, EVEN_D, False, CAUSAL, IEEE, USE_DESC,
        )
        acc, m_i, l_i = _fwd_key_loop(
            acc, m_i, l_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, kv_row0,
            offs_m, offs_d, full_hi, hi, s_k, qk_scale, HEAD_DIM, window,
            BLOCK_N, EVEN_D, True, CAUSAL, IEEE, False,
        )
        lse2 = m_i + tl.math.log2(l_i)

    # ---- epilogue: normalise, write O (BLOCK_M * d) and lse2 (BLOCK_M fp32) ------------------
    acc = acc / l_i[:, None]
    tl.store(lse_base + offs_m, lse2, mask=offs_m < s_q)
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    if EVEN_D:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_mask)
    else:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_mask & (offs_d[None, :] < HEAD_DIM))


fwd_kernel_tuned = triton.autotune(
    configs=triton_configs(FWD_SPACE),
    key=["seq_bucket", "HEAD_DIM", "CAUSAL", "USE_DESC", "WINDOW", "VARLEN"],  # + the dtypes, by Triton
    prune_configs_by={"early_config_prune": prune_fwd},
    **autotune_options(),
)(fwd_kernel)
# attnmem.measure.bench.speed reads the autotuner's cache under this older name
_fwd_kernel_tuned = fwd_kernel_tuned


# ---- tensor descriptors (TMA) for K and V ---------------------------------------------------
# A descriptor names a 2-d view of K (or V): rows = B * H_kv * s_k, columns = d, row stride =
# the tensors' seq stride. That view exists when (batch, head, seq) flatten into one row index
# (the usual contiguous layout); other layouts, and GPUs or Triton builds without descriptors,
# use the pointer loads, which the kernel always keeps for the masked blocks.
def rows_view(t: torch.Tensor) -> tuple[int, int] | None:
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


def _make_descriptors(k: torch.Tensor, v: torch.Tensor, d: int):
    (rows_k, sk), (rows_v, sv) = rows_view(k), rows_view(v)
    # block_shape is a placeholder: set from the chosen BLOCK_N before any launch.
    return (TensorDescriptor(k, [rows_k, d], [sk, 1], [16, d]),
            TensorDescriptor(v, [rows_v, d], [sv, 1], [16, d]))


def set_tiles(nargs: dict) -> None:
    """Autotuner pre_hook (and direct-launch step): descriptor tiles are (BLOCK_N, BLOCK_D)."""
    for name in ("desc_k", "desc_v"):
        desc = nargs.get(name)
        if desc is not None:
            desc.block_shape = [nargs["BLOCK_N"], nargs["BLOCK_D"]]


for _c in fwd_kernel_tuned.configs:
    _c.pre_hook = set_tiles


def triton_forward(
    q: torch.Tensor,  # (B, H, s_q, d)
    k: torch.Tensor,  # (B, H_kv, s_k, d)
    v: torch.Tensor,  # (B, H_kv, s_k, d)
    causal: bool,
    scale: float,
    tiles: dict | None,
    use_desc: bool,
    window: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel above; returns O (B, H, s_q, d) in q's dtype and lse2 (B, H, s_q)
    fp32. Which forward runs, and with what, is `route.forward_route`'s decision.

    ``tiles`` (`config.Tiles.meta()`) skip the autotuner (the interpreter and the tests give
    them); ``use_desc`` loads the unmasked K/V tiles through tensor descriptors (the route
    checked that the layout allows it). Inputs are read through their strides: nothing is
    copied. ``window``: a causal sliding window of that many keys, 1 <= window < s_q
    (`route.check_window`), or None; rows that see no key (s_q >= s_k + window) get O = 0
    and lse2 = +inf.
    """
    B, H, s_q, d = q.shape
    H_kv, s_k = k.shape[1], k.shape[2]
    windowed = window is not None
    desc_k, desc_v = _make_descriptors(k, v, d) if use_desc else (None, None)
    o = common.empty(q, (B, H, s_q, d))  # (B, H, s_q, d), contiguous
    lse2 = common.empty(q, (B, H, s_q), torch.float32)  # (B, H, s_q)
    sq, sk, sv, so = q.stride(), k.stride(), v.stride(), o.stride()  # each read once
    args = (
        q, k, v, o, lse2, desc_k, desc_v, None, None, *sq, *sk, *sv, *so,
        H, H // H_kv, s_q, s_k, scale * LOG2E, int(window) if windowed else 0,
        seq_bucket(max(s_q, s_k)),
    )
    bd = block_d(d)
    meta = dict(
        HEAD_DIM=d, BLOCK_D=bd, EVEN_D=bd == d, CAUSAL=bool(causal),
        IEEE=q.dtype == torch.float32, USE_DESC=use_desc, WINDOW=windowed,
    )

    def prepare(c: dict) -> None:
        set_tiles({"desc_k": desc_k, "desc_v": desc_v, "BLOCK_N": c["BLOCK_N"], "BLOCK_D": bd})

    # What the JIT specialises on beyond meta and the tiles: dtypes, strides (1, multiple of
    # 16), the head counts, the inputs' 16-byte alignment (o and lse2 are fresh allocations);
    # the descriptors' types are the dtype and the tile.
    spec = (q.dtype, sq, sk, sv, so, H, H_kv, q.data_ptr() % 16, k.data_ptr() % 16,
            v.data_ptr() % 16)
    launch(fwd_kernel_tuned, fwd_kernel, "fwd", meta, args[-1], tiles, args,
           lambda c: (cdiv(s_q, c["BLOCK_M"]), B * H), prepare if use_desc else None, spec)
    return o, lse2


def packed_forward(q, k, v, causal: bool, scale: float, tiles: dict | None,
                   window: int | None, packed: Packed) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward of packed sequences (`common.Packed`, checked by `api.flash_attention`): q
    is (1, H, total_q, d), k and v (1, H_kv, total_k, d), sequence i owning query rows
    cu_q[i] .. cu_q[i+1] - 1 and key rows cu_k[i] .. cu_k[i+1] - 1; attention (causal, window)
    runs within each sequence. The kernel above with VARLEN and pointer loads (the
    descriptors' row view would run into the next sequence), one program per BLOCK_M query
    rows of one sequence and head, grid (ceil(max_q / BLOCK_M), n_seq * H): programs past a
    shorter sequence's end return at once, as FlashAttention-2's varlen kernels do. O is
    (1, H, total_q, d), lse2 (1, H, total_q)."""
    _, H, total_q, d = q.shape
    H_kv, total_k = k.shape[1], k.shape[2]
    windowed = window is not None
    o = common.empty(q, (1, H, total_q, d))  # (1, H, total_q, d), contiguous
    lse2 = common.empty(q, (1, H, total_q), torch.float32)  # (1, H, total_q)
    sq, sk, sv, so = q.stride(), k.stride(), v.stride(), o.stride()
    bucket = seq_bucket(max(packed.max_q, packed.max_k))
    args = (
        q, k, v, o, lse2, None, None, packed.cu_q, packed.cu_k, *sq, *sk, *sv, *so,
        H, H // H_kv, total_q, total_k, scale * LOG2E, int(window) if windowed else 0, bucket,
    )
    bd = block_d(d)
    meta = dict(HEAD_DIM=d, BLOCK_D=bd, EVEN_D=bd == d, CAUSAL=bool(causal),
                IEEE=q.dtype == torch.float32, USE_DESC=False, WINDOW=windowed, VARLEN=True)
    spec = (q.dtype, sq, sk, sv, so, H, H_kv, q.data_ptr() % 16, k.data_ptr() % 16,
            v.data_ptr() % 16, packed.cu_q.data_ptr() % 16, packed.cu_k.data_ptr() % 16)
    n_seq = packed.n_seq
    launch(fwd_kernel_tuned, fwd_kernel, "fwd_varlen", meta, bucket, tiles, args,
           lambda c: (cdiv(packed.max_q, c["BLOCK_M"]), n_seq * H), None, spec)
    return o, lse2
