"""FlashAttention forward for Hopper (sm_90), written in Gluon: the algorithm of ``fwd.py``,
with the schedule spelled out by hand.

Why a second forward
--------------------
``fwd.py`` states the algorithm (online softmax in base 2, tiling, causal block skipping) and
leaves the schedule to Triton's compiler, which leaves the tensor cores idle while the exp2s of
the softmax run: each step's softmax needs that step's scores, and the next product needs the
softmax. FlashAttention-3 (Shah et al., arXiv 2407.08608, section 3.2, "intra-warpgroup
overlapping") breaks the chain by keeping two key blocks in flight: while the warps run the
softmax of block j+1, the tensor cores are still busy with block j's P.V product. Plain Triton
gives no control over when an asynchronous product is waited for; Gluon (Triton's lower-level
dialect: explicit layouts, shared memory, barriers, warpgroup MMA) does. (attnmem/kernels/flash/NOTES.md,
steps 5 to 7, has the timings against the Triton kernel and cuDNN.)

The roles of one program (BLOCK_M = 128 query rows), split by ``gl.warp_specialize``:

* a loader warp issues every copy through the copy engine (TMA): each consumer's 64 query
  rows, then K_0, V_0, K_1, V_1, ... into rings of STAGES slots each; a slot is refilled as
  soon as both consumers have released it (an "empty" mbarrier with two arrivals), and each
  copy lands on its own "ready" mbarrier;
* two consumer warpgroups (4 warps each) own 64 query rows each, share the K/V slots, and run

      S_0 = Q K_0^T; P_0 = softmax step of S_0; release K_0
      for j = 0 .. n-2:
          issue  S_{j+1} = Q K_{j+1}^T          (tensor cores, asynchronous)
          issue  O += P_j V_j                   (tensor cores, asynchronous, P from registers)
          wait for S_{j+1} only                 (O's product may still run); release K_{j+1}
          softmax step of S_{j+1} -> P_{j+1}, row max m, row sum l, rescale factor alpha
                                                (exp2 units, overlapping O += P_j V_j)
          wait for O; release V_j; O *= alpha
      O += P_{n-1} V_{n-1}; O /= l; store O (TMA) and lse2 = m + log2(l)

The copies stay in their own warp: issued from the compute warps, each copy costs CTA-wide
barriers that hold the two warpgroups in lockstep.

O is rescaled after its product lands, not before the product is issued: the rescale of step
j+1 needs the max of block j+1, which is only known after that softmax, so the product of
step j accumulates under the old max and O *= alpha_{j+1} follows. The arithmetic is the one of
``fwd._fwd_key_loop``; the outputs (O, lse2 in log2 units) are the same, so the Triton
backward consumes them unchanged.

Tiles come through rank-4 tensor descriptors over (B, H, s, d) with tiles [1, 1, BLOCK, d]:
rows past the end of a head's sequence are out of bounds of that descriptor, so the copy
engine fills them with zeros on loads and drops them on stores. A ragged tail never reads a
neighbouring head, and any layout whose last stride is 1 (and whose strides are 16-byte
multiples) works without a copy.

Key blocks that every row of the query tile sees whole run without a mask; the diagonal
block(s) of causal attention and the ragged tail run with one (two loops with the same body).

At d = 64 a third consumer warpgroup fits (CONSUMERS = 3, BLOCK_M = 192, FlashAttention-3's
tile there): three warpgroups of 160 registers and the loader share the register file, and
each K/V block loaded serves 192 query rows instead of 128. ``flash_attention`` runs it by
default at d = 64 once both lengths reach `THREE_WG_MIN_LEN` (`default_schedule`);
``KernelConfig(sm90=True, sm90_consumers=3)`` selects it at any length.

Computing part of each step's probabilities by a polynomial on the FMA units instead of the
exp2 unit (FA4's Blackwell exp2 emulation) measured 0.93-0.98x this forward with a quarter of
them, 0.78-0.92x with half, on the H200, and is gone (attnmem/kernels/flash/NOTES.md, "EXP2_EMU in
the forward" and "DQ_FLAT kept, the others deleted").

Scope: compute capability 9.x, fp16/bf16, d in {64, 128}; with ``SETTINGS.sm90_padded_dims``
also 80 and 96 in 128-wide tiles (`tile_d`), and then only when forced
(``KernelConfig(sm90=True)``): not yet run on a GPU (``flash_attention`` picks it by
default at d = 128, and at d = 64 for long sequences; packed calls by the same rule on their
longest sequence). Everything else (and every other GPU)
uses ``fwd.py``. So does a causal sliding window (``flash_attention(..., window=W)``): this
kernel's loader streams key blocks from 0 and its consumers mask only the diagonal and the
tail; skipping the blocks below the window and masking its edge would change the loader's
ring indexing and add a third consumer loop, which has not been run on a GPU, so
`route.forward_route` sends windowed calls to the Triton forward (which skips them).

Packed sequences (``flash_attention(..., cu_seqlens=...)``) run a sibling kernel,
``attn_fwd_sm90_varlen_kernel``, over the same partitions (FlashAttention-3's varlen forward,
Shah et al., arXiv 2407.08608, and its ``hopper/`` code, has this structure): the grid is
(query tiles of the longest sequence, sequences x heads), as the portable varlen kernels'; a
program reads its sequence's first rows and lengths from cu_seqlens and returns at once past
its end. The descriptors cover the whole packed (1, H, total, d) tensors, so a tile running
past its sequence's end reads the next sequence's rows: its keys are masked as the ragged
tail's are (columns past the sequence's s_k score -inf, so those V rows get weight 0), its
queries' rows are computed and never stored. A consumer whose 64 rows all lie inside the
sequence stores O with one bulk copy, as above; the half where the sequence ends stores its
rows with masked register stores (a bulk copy would overwrite the next sequence's rows,
which another program owns), and lse2 is stored per row under a mask. The outputs (O
(1, H, total_q, d), lse2 (1, H, total_q)) are those of ``fwd.packed_forward``, which
``bwd.packed_backward`` reads.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from attnmem.calc import dispatch
from attnmem.kernels.flash import common
from attnmem.kernels.flash.config import SETTINGS
from attnmem.kernels.flash.launcher import DirectLauncher

# The copy-engine calls were renamed after Triton 3.6 (async_copy_global_to_shared ->
# async_load, async_copy_shared_to_global -> async_store); the old names now raise.
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global

HEAD_DIMS = (64, 128)  # what the kernel runs
# ... and, with config.SETTINGS.sm90_padded_dims on, these in 128-wide tiles (`tile_d`)
PADDED_HEAD_DIMS = (80, 96)
# ... and where flash_attention picks it at every length without being asked; at d = 64 the
# three-warpgroup form is the default for long sequences only (`default_schedule`).
DEFAULT_HEAD_DIMS = (128,)
BLOCK_M = 128  # query rows per program: two consumer warpgroups of 64 rows
HALF_M = BLOCK_M // 2
NUM_WARPS = 4  # the default partition (first consumer); + 4 (second consumer) + 1 (loader)
CONSUMER_REGS = gl.constexpr(224)  # registers per thread asked for the second consumer
LOADER_REGS = gl.constexpr(24)  # ... and for the loader warp
# With three consumers (BLOCK_M = 192, FlashAttention-3's tile at d = 64) 12 warps of
# consumers and the loader share the 64 K registers of an SM: (65536 - 32 * 24) / 384 = 168,
# so 160 (a multiple of 8, as setmaxnreg requires).
CONSUMER3_REGS = gl.constexpr(160)
# (BLOCK_N, STAGES) per head dim: STAGES slots of K and of V each. Shared memory at d = 128:
# Q 32 KiB + STAGES * (32 + 32) KiB, 160 KiB with 2 stages (3 fit too: 224 of the 227 KiB a
# block may use, and are no faster; neither is BLOCK_N = 64: attnmem/kernels/flash/
# NOTES.md, "a hand-scheduled Hopper forward in Gluon").
TILES = {64: (128, 3), 128: (128, 2)}
# Consumer warpgroups per head dim when a config forces this kernel without saying how many.
CONSUMERS = {64: 2, 128: 2}
# Where flash_attention runs this kernel at d = 64 without being asked: with three consumer
# warpgroups and two stages once both lengths reach these (the 4,096 bucket without a causal
# mask, the 8,192 bucket with one); shorter calls are as fast or faster on the Triton kernel,
# which keeps them (attnmem/kernels/flash/NOTES.md, "three warpgroups by default at d = 64").
THREE_WG_MIN_LEN = {False: 2049, True: 4097}  # by causal
THREE_WG_SCHEDULE = (3, 2)  # (consumer warpgroups, stages)


def tile_d(d: int) -> int:
    """The head dim of the kernel's tiles for head dim d: d at 64 and 128; 128 at 80 and 96.
    Gluon's register tensors have power-of-two shapes, so an 80- or 96-wide head runs in
    128-wide tiles: the copy engine fills the columns past d with zeros on loads (they add
    nothing to Q K^T, and P V's extra columns are zeros) and drops them on stores, as the
    portable forward pads d to `common.block_d`. The padding costs 128/d of the products'
    work (1.33x at d = 96, 1.6x at d = 80)."""
    return common.block_d(d)


def default_schedule(d: int, s_q: int, s_k: int, causal: bool) -> tuple[int, int] | None:
    """(consumer warpgroups, stages) of this kernel where the forward picks it by default for
    head dim d, lengths s_q, s_k and the causal flag; None where the Triton kernel is the
    default."""
    if d in DEFAULT_HEAD_DIMS:
        return CONSUMERS[d], TILES[d][1]
    if d == 64 and min(s_q, s_k) >= THREE_WG_MIN_LEN[bool(causal)]:
        return THREE_WG_SCHEDULE
    return None


@gluon.jit
def _tile(smem, block, STAGES: gl.constexpr):
    """The 2-d (BLOCK_N, d) view of the ring slot that holds key/value block ``block``."""
    t = smem.index(block % STAGES)
    return t.reshape([t.shape[2], t.shape[3]])


@gluon.jit
def _ring_load(desc, smem, ready, empty, b, h_kv, k0, block, STAGES: gl.constexpr):
    """Copy key (or value) block ``block`` into its ring slot, once both consumers have
    released what the slot held before (block - STAGES). ``k0``: the row of key 0 in the
    descriptor's sequence axis (0, or a packed sequence's first key row)."""
    slot = block % STAGES
    # The slot's "empty" barrier completes one phase per release; the first pass needs none.
    mbarrier.wait(empty.index(slot), ((block // STAGES) + 1) & 1, pred=block >= STAGES)
    bar = ready.index(slot)
    mbarrier.expect(bar, desc.block_type.nbytes)
    _tma_load(desc, [b, h_kv, k0 + block * desc.block_type.shape[2], 0], bar, smem.index(slot))


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty,
            v_empty, b, h, h_kv, start_m, n_blocks, q0, k0, STAGES: gl.constexpr,
            CONSUMERS: gl.constexpr):
    """The producer warp: each consumer's 64 query rows, then K_0, V_0, K_1, V_1, ... through
    the rings. ``q0``, ``k0``: the rows of query 0 and key 0 in the descriptors' sequence
    axis (0, or a packed sequence's first rows: a tile running past its sequence's end reads
    the next sequence's rows, which the consumers mask or do not store)."""
    HALF: gl.constexpr = q_desc.block_type.shape[2]
    for i in gl.static_range(CONSUMERS):
        mbarrier.expect(q_bars.index(i), q_desc.block_type.nbytes)
        _tma_load(q_desc, [b, h, q0 + start_m + i * HALF, 0], q_bars.index(i), q_smem.index(i))
    for blk in range(n_blocks):
        _ring_load(k_desc, k_smem, k_ready, k_empty, b, h_kv, k0, blk, STAGES)
        _ring_load(v_desc, v_smem, v_ready, v_empty, b, h_kv, k0, blk, STAGES)


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, rows, cols, s_k, p_layout: gl.constexpr,
                  DTYPE: gl.constexpr, MASKED: gl.constexpr, CAUSAL: gl.constexpr):
    """One online-softmax step on raw scores s (rows, BLOCK_N) of key columns ``cols``.

    Returns P (input dtype, in the register layout the P.V product reads), the new row max,
    the new row sum and alpha = 2^(m_old - m_new), the factor for what O accumulated so far.
    The same arithmetic as fwd._fwd_key_loop (base 2, log2(e) folded in qk_scale).
    """
    if MASKED:
        visible = gl.expand_dims(cols, 0) < s_k
        if CAUSAL:  # top-left alignment: query row i sees keys j <= i
            visible = visible & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1))
        s = gl.where(visible, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - gl.expand_dims(m_new, 1))
    else:
        # max(scale * x) == scale * max(x) for scale > 0; scale * x - m is one FMA per score
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return gl.convert_layout(p.to(DTYPE), p_layout), m_new, l_i, alpha


@gluon.jit
def _key_step(j, q, s, p, acc, m_i, l_i, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
              qk_scale, rows, cols, s_k, o_row: gl.constexpr, p_layout: gl.constexpr,
              DTYPE: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr,
              CAUSAL: gl.constexpr):
    """Step j of a consumer's key loop: S_{j+1} and O += P_j V_j in flight together."""
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    nxt = j + 1
    mbarrier.wait(k_ready.index(nxt % STAGES), (nxt // STAGES) & 1)
    mbarrier.wait(v_ready.index(j % STAGES), (j // STAGES) & 1)
    s = warpgroup_mma(q, _tile(k_smem, nxt, STAGES).permute((1, 0)), s, use_acc=False,
                      is_async=True)
    acc = warpgroup_mma(p, _tile(v_smem, j, STAGES), acc, is_async=True)
    # wgmma groups complete in order: one outstanding group left means S_{j+1} has landed
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    mbarrier.arrive(k_empty.index(nxt % STAGES), count=1)  # this warpgroup is done with K_{j+1}
    p_next, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, nxt * BLOCK_N + cols,
                                            s_k, p_layout, DTYPE, MASKED, CAUSAL)
    acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
    mbarrier.arrive(v_empty.index(j % STAGES), count=1)  # ... and with V_j
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row), 1)
    return s, p_next, acc, m_i, l_i


@gluon.jit
def _consumer(HALF_ID: gl.constexpr, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty,
              v_empty, o_desc, O, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, q0, row_base,
              qk_scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr, VARLEN: gl.constexpr,
              D: gl.constexpr):
    """One warpgroup: 64 query rows of the program's tile, over the key blocks the loader
    brings (module docstring). Stores its rows of O and lse2.

    VARLEN (packed sequences): s_q and s_k are this sequence's lengths, ``q0`` its first query
    row in o_desc's sequence axis and ``row_base`` (int64) the row of its query 0 in O and
    LSE2 seen as (rows, d) and (rows,). Rows past s_q belong to the next sequence, whose
    program writes them: a half that runs past s_q stores its rows with masked register
    stores instead of one bulk copy. ``D``: the head dim of O in memory; the tiles' HEAD_D is
    D or, at d = 80 and 96, 128 (`tile_d`: zero columns the copy engine fills and drops)."""
    HALF: gl.constexpr = q_smem.shape[3]
    HEAD_D: gl.constexpr = q_smem.shape[4]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    DTYPE: gl.constexpr = q_smem.dtype
    # Warpgroup-MMA register layouts over 4 warps: warp w owns rows 16w .. 16w+15, so the
    # scores, O and the row statistics of one row all live in one warp.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_col: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)

    row0 = start_m + HALF_ID * HALF
    # Keys [0, n_full * BLOCK_N) are visible to every row of this half: no mask there. The
    # blocks from n_full to n_blocks (the loader's count, for the whole tile) get one.
    if CAUSAL:
        n_full = gl.minimum(s_k // BLOCK_N, row0 // BLOCK_N)
    else:
        n_full = s_k // BLOCK_N

    rows = row0 + gl.arange(0, HALF, s_row)
    cols = gl.arange(0, BLOCK_N, s_col)
    m_i = gl.full([HALF], float("-inf"), gl.float32, s_row)
    l_i = gl.zeros([HALF], gl.float32, s_row)
    acc = gl.zeros([HALF, HEAD_D], gl.float32, o_layout)
    s = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)

    q_tile = q_smem.index(HALF_ID)
    q = q_tile.reshape([HALF, HEAD_D])
    mbarrier.wait(q_bars.index(HALF_ID), 0)

    # ---- key block 0: its scores and softmax step; O is still zero ----------------------------
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q, _tile(k_smem, 0, STAGES).permute((1, 0)), s, use_acc=False,
                      is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    mbarrier.arrive(k_empty.index(0), count=1)
    if n_full > 0:
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, s_k, p_layout,
                                           DTYPE, False, CAUSAL)
    else:
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, s_k, p_layout,
                                           DTYPE, True, CAUSAL)

    # ---- steps 0 .. n-2: unmasked next blocks first, then the diagonal / tail ones -------------
    for j in range(0, n_full - 1):
        s, p, acc, m_i, l_i = _key_step(
            j, q, s, p, acc, m_i, l_i, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
            qk_scale, rows, cols, s_k, o_row, p_layout, DTYPE, STAGES, False, CAUSAL)
    for j in range(gl.maximum(n_full - 1, 0), n_blocks - 1):
        s, p, acc, m_i, l_i = _key_step(
            j, q, s, p, acc, m_i, l_i, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
            qk_scale, rows, cols, s_k, o_row, p_layout, DTYPE, STAGES, True, CAUSAL)

    # ---- the last block's P.V, then normalise and store ----------------------------------------
    last = n_blocks - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    acc = warpgroup_mma(p, _tile(v_smem, last, STAGES), acc, is_async=True)
    acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))

    acc = acc / gl.expand_dims(gl.convert_layout(l_i, o_row), 1)
    if VARLEN:
        gl.store(LSE2 + row_base + rows, m_i + gl.log2(l_i), mask=rows < s_q)
        if row0 + HALF <= s_q:  # every row is this sequence's: one bulk copy, as below
            q.store(acc.to(DTYPE))
            fence_async_shared()
            _tma_store(o_desc, [b, h, q0 + row0, 0], q_tile)
            tma.store_wait(pendings=0)
        else:  # the sequence ends inside this half: its rows only, from registers
            o_col: gl.constexpr = gl.SliceLayout(0, o_layout)
            rows_o = row0 + gl.arange(0, HALF, o_row)
            cols_o = gl.arange(0, HEAD_D, o_col)
            # one 64-bit base, 32-bit offsets inside the sequence (s_q * d < 2^31)
            offs = gl.expand_dims(rows_o, 1) * D + gl.expand_dims(cols_o, 0)
            keep = (gl.expand_dims(rows_o, 1) < s_q) & (gl.expand_dims(cols_o, 0) < D)
            gl.store(O + row_base * D + offs, acc.to(DTYPE), mask=keep)
    else:
        gl.store(LSE2 + bh.to(gl.int64) * s_q + rows, m_i + gl.log2(l_i), mask=rows < s_q)
        # O leaves through this half's Q buffer (its last reader, S_{n-1}, has completed).
        # Rows past s_q are outside o_desc: the copy engine does not write them.
        q.store(acc.to(DTYPE))
        fence_async_shared()
        _tma_store(o_desc, [b, h, row0, 0], q_tile)
        tma.store_wait(pendings=0)


@gluon.jit(do_not_specialize=["s_q", "s_k"])
def attn_fwd_sm90_kernel(
    q_desc, k_desc, v_desc, o_desc,  # rank-4 descriptors over (B, H, s, d), tiles [1, 1, rows, d]
    LSE2,  # (B, H, s_q) fp32, contiguous: m + log2(l) per row, log2 units
    H, GROUP,  # query heads; query heads per key/value head (GQA)
    s_q, s_k,
    qk_scale,  # softmax scale * log2(e)
    CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,  # K and V buffers each
    num_warps: gl.constexpr,  # 4: the default partition is the first consumer warpgroup
    CONSUMERS: gl.constexpr = 2,  # consumer warpgroups of 64 query rows (2, or 3 at d = 64)
    D: gl.constexpr = 128,  # the head dim in memory (the tiles': `tile_d`)
):
    gl.static_assert(CONSUMERS == 2 or CONSUMERS == 3)
    HALF: gl.constexpr = q_desc.block_type.shape[2]
    pid = gl.program_id(0)
    if CAUSAL:  # the last query tiles see the most keys: start them first
        pid = gl.num_programs(0) - 1 - pid
    start_m = pid * (CONSUMERS * HALF)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    _one_tile(q_desc, k_desc, v_desc, o_desc, LSE2, LSE2, bh, b, h, h // GROUP, start_m, s_q,
              s_k, 0, 0, 0, qk_scale, CAUSAL, STAGES, CONSUMERS, False, D)


@gluon.jit(do_not_specialize=["total_q"])
def attn_fwd_sm90_varlen_kernel(
    q_desc, k_desc, v_desc, o_desc,  # rank-4 descriptors over (1, H, total, d), tiles [1, 1, rows, d]
    O,  # (1, H, total_q, d), contiguous: the same memory as o_desc, for masked stores
    LSE2,  # (1, H, total_q) fp32, contiguous
    CU_Q, CU_K,  # int32 (n_seq + 1,) starts of the packed sequences' query / key rows
    H, GROUP,  # query heads; query heads per key/value head (GQA)
    total_q,  # packed query rows
    qk_scale,  # softmax scale * log2(e)
    CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
    CONSUMERS: gl.constexpr = 2,
    D: gl.constexpr = 128,
):
    """Packed sequences (`attention_forward_sm90_packed`): grid (query tiles of the longest
    sequence, sequences x heads), as FlashAttention-2's varlen kernels and `fwd.fwd_kernel`
    with VARLEN. A program reads its sequence's start and length and returns at once past its
    end; inside, it is the dense program on one sequence, its tiles addressed at the
    sequence's first rows (`common.varlen_rows` does the same in the portable kernels)."""
    gl.static_assert(CONSUMERS == 2 or CONSUMERS == 3)
    HALF: gl.constexpr = q_desc.block_type.shape[2]
    pid = gl.program_id(0)
    if CAUSAL:  # longest first, as the dense kernel
        pid = gl.num_programs(0) - 1 - pid
    start_m = pid * (CONSUMERS * HALF)
    sh = gl.program_id(1)
    seq = sh // H
    h = sh % H
    q0 = gl.load(CU_Q + seq)
    s_q = gl.load(CU_Q + seq + 1) - q0
    k0 = gl.load(CU_K + seq)
    s_k = gl.load(CU_K + seq + 1) - k0
    if start_m < s_q:  # the grid is sized for the longest sequence: shorter ones stop here
        row_base = h.to(gl.int64) * total_q + q0  # query 0's row in O and LSE2
        _one_tile(q_desc, k_desc, v_desc, o_desc, O, LSE2, sh, 0, h, h // GROUP, start_m, s_q,
                  s_k, q0, k0, row_base, qk_scale, CAUSAL, STAGES, CONSUMERS, True, D)


@gluon.jit
def _one_tile(q_desc, k_desc, v_desc, o_desc, O, LSE2, bh, b, h, h_kv, start_m, s_q, s_k, q0,
              k0, row_base, qk_scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
              CONSUMERS: gl.constexpr, VARLEN: gl.constexpr, D: gl.constexpr):
    """One program: the query tile from row ``start_m`` of (batch b or sequence, head h),
    key/value head h_kv; the shared memory, the barriers, and the warp-specialised
    partitions. ``q0``, ``k0``, ``row_base``: where a packed sequence lies (VARLEN, see
    `_consumer`); 0 otherwise."""
    BLOCK_M: gl.constexpr = CONSUMERS * q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    DTYPE: gl.constexpr = q_desc.dtype

    if CAUSAL:
        hi = gl.minimum(s_k, start_m + BLOCK_M)
    else:
        hi = s_k
    n_blocks = (hi + BLOCK_N - 1) // BLOCK_N  # key blocks any row of the tile sees

    q_smem = gl.allocate_shared_memory(DTYPE, [CONSUMERS] + q_desc.block_type.shape,
                                       q_desc.layout)
    k_smem = gl.allocate_shared_memory(DTYPE, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(DTYPE, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)  # one arrival per consumer
        mbarrier.init(v_empty.index(i), count=CONSUMERS)

    # (constexprs go into each argument list literally: a tuple built beforehand loses them)
    if CONSUMERS == 2:
        gl.warp_specialize(
            [(_consumer, (0, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                          o_desc, O, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, q0, row_base,
                          qk_scale, CAUSAL, STAGES, VARLEN, D)),
             (_consumer, (1, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                          o_desc, O, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, q0, row_base,
                          qk_scale, CAUSAL, STAGES, VARLEN, D)),
             (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready,
                        v_ready, k_empty, v_empty, b, h, h_kv, start_m, n_blocks, q0, k0,
                        STAGES, CONSUMERS))],
            [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:  # three warpgroups share the register file: at most 160 each next to the loader
        gl.warp_specialize(
            [(_consumer, (0, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                          o_desc, O, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, q0, row_base,
                          qk_scale, CAUSAL, STAGES, VARLEN, D)),
             (_consumer, (1, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                          o_desc, O, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, q0, row_base,
                          qk_scale, CAUSAL, STAGES, VARLEN, D)),
             (_consumer, (2, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                          o_desc, O, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, q0, row_base,
                          qk_scale, CAUSAL, STAGES, VARLEN, D)),
             (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready,
                        v_ready, k_empty, v_empty, b, h, h_kv, start_m, n_blocks, q0, k0,
                        STAGES, CONSUMERS))],
            [4, 4, 1], [CONSUMER3_REGS, CONSUMER3_REGS, LOADER_REGS])


# ---- host side ------------------------------------------------------------------------------

_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
_LAYOUTS: dict = {}


def _layout(dtype: torch.dtype, rows: int, d: int):
    key = (dtype, rows, d)
    lay = _LAYOUTS.get(key)
    if lay is None:
        lay = _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for([1, 1, rows, d],
                                                                   _GL_DTYPES[dtype])
    return lay


def _strides(t: torch.Tensor) -> list[int]:
    """t's strides, with those of size-1 dims (which address nothing) replaced by the packed
    value, so that a view's arbitrary stride there cannot upset the descriptor's encoding."""
    st = list(t.stride())
    for i in (2, 1, 0):
        if t.shape[i] == 1:
            st[i] = st[i + 1] * t.shape[i + 1]
    return st


def _descriptor_ok(t: torch.Tensor, st: list[int]) -> bool:
    """The copy engine needs a unit last stride and positive strides that are multiples of 16
    bytes (cuTensorMapEncodeTiled's rules; the base's alignment is checked per call). ``st``:
    `_strides(t)`."""
    e = t.element_size()
    return (st[3] == 1 and st[0] > 0 and st[1] > 0 and st[2] > 0
            and (st[0] * e) % 16 == 0 and (st[1] * e) % 16 == 0 and (st[2] * e) % 16 == 0)


_USABLE: dict[tuple, bool] = {}  # layout verdicts, keyed by what they depend on


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether this kernel can run these inputs (the caller has validated shapes and dtypes)."""
    if q.device.type != "cuda":
        return False
    key = (q.dtype, q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.device.index,
           SETTINGS.sm90_padded_dims)
    ok = _USABLE.get(key)
    if ok is None:
        if len(_USABLE) > 4096:  # many distinct shapes: start over rather than grow
            _USABLE.clear()
        ok = _USABLE[key] = _layout_usable(q, k, v)
    # the base addresses change from call to call: 16-byte alignment is checked every time
    return ok and not (q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16)


def _layout_usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    d = q.shape[3]
    if q.dtype not in _GL_DTYPES or not (
            d in HEAD_DIMS or (d in PADDED_HEAD_DIMS and SETTINGS.sm90_padded_dims)):
        return False
    if q.shape[1] * q.shape[0] > dispatch.GRID_Y_MAX:  # grid's second dimension: B * H
        return False
    idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if torch.cuda.get_device_capability(idx)[0] != 9:
        return False
    return (_descriptor_ok(q, _strides(q)) and _descriptor_ok(k, _strides(k))
            and _descriptor_ok(v, _strides(v)))


def _descriptor(t: torch.Tensor, rows: int, layout) -> TensorDescriptor:
    """A rank-4 descriptor of t with tiles [1, 1, rows, d]. Built without the dataclass's
    checks, which are slow on the launch path: `usable` made the same checks
    (alignment, strides) once for q, k and v, and O is allocated contiguous here."""
    desc = TensorDescriptor.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides = t, list(t.shape), _strides(t)
    desc.block_shape, desc.layout, desc.padding = [1, 1, rows, tile_d(t.shape[3])], layout, "zero"
    return desc


# ---- launching without the JIT's dispatch (launcher.DirectLauncher) -------------------------
# The key holds every property the JIT specialises on for these arguments: dtype, head dim
# and tiles (the descriptors' types), the constexprs, and H and GROUP being 1 or multiples of
# 16 (integer specialisation); s_q and s_k are not specialised, LSE2 is always 16-byte aligned
# (fresh allocation), qk_scale is an fp32.
# The four descriptors are passed as (tensor, rows, layout) and built by `_descriptor` only
# where an object is needed; on Triton 3.6 a repeated call on the same tensors reuses their
# encoded tensor maps (launcher.DirectLauncher).
LAUNCHER = DirectLauncher(attn_fwd_sm90_kernel, descriptor=_descriptor)


def _int_spec(x: int) -> tuple[bool, bool]:
    return x == 1, x % 16 == 0


def _schedule(d: int, stages: int | None, block_n: int | None,
              consumers: int | None) -> tuple[int, int, int]:
    """(BLOCK_N, stages, consumer warpgroups): the given values, else `TILES` and
    `CONSUMERS` for head dim d; ValueError for a consumer count the kernel has not."""
    bn, st = TILES[tile_d(d)]
    nc = CONSUMERS[tile_d(d)] if consumers is None else consumers
    if nc not in (2, 3) or (nc == 3 and d != 64):
        raise ValueError(f"sm90_consumers must be 2, or 3 at d = 64; got {nc} at d = {d}")
    return block_n or bn, stages or st, nc


def attention_forward_sm90(q, k, v, causal: bool, qk_scale: float, stages: int | None = None,
                           block_n: int | None = None, consumers: int | None = None):
    """O (B, H, s_q, d) and lse2 (B, H, s_q) fp32, as fwd.triton_forward returns them.
    ``qk_scale`` is the softmax scale times log2(e). Check `usable` first. ``stages`` and
    ``block_n`` default to `TILES`; ``consumers``: 2 (default, `CONSUMERS`) or 3 consumer
    warpgroups of 64 query rows (3 only at d = 64)."""
    B, H, s_q, d = q.shape
    H_kv, s_k = k.shape[1], k.shape[2]
    bn, st, nc = _schedule(d, stages, block_n, consumers)
    o = common.empty(q, (B, H, s_q, d))  # q's dtype and device, contiguous
    lse2 = common.empty(q, (B, H, s_q), torch.float32)
    lay_m, lay_n = _layout(q.dtype, HALF_M, tile_d(d)), _layout(q.dtype, bn, tile_d(d))
    group = H // H_kv
    args = ((q, HALF_M, lay_m), (k, bn, lay_n), (v, bn, lay_n), (o, HALF_M, lay_m), lse2,
            H, group, s_q, s_k, qk_scale)
    consts = {"CAUSAL": bool(causal), "STAGES": st, "num_warps": NUM_WARPS, "CONSUMERS": nc,
              "D": d}
    key = (q.dtype, d, bn, st, bool(causal), nc, _int_spec(H), _int_spec(group))
    LAUNCHER((-(-s_q // (nc * HALF_M)), B * H), key, args, consts)
    return o, lse2


# The packed-sequence kernel's launches: the key holds, beyond the dense key's fields, the
# alignment of the two cu_seqlens tensors (pointer arguments the JIT specialises on);
# total_q is not specialised, O and LSE2 are fresh allocations (16-byte aligned).
LAUNCHER_VARLEN = DirectLauncher(attn_fwd_sm90_varlen_kernel, descriptor=_descriptor)


def attention_forward_sm90_packed(q, k, v, causal: bool, qk_scale: float, packed,
                                  stages: int | None = None, block_n: int | None = None,
                                  consumers: int | None = None):
    """The forward of packed sequences (`common.Packed`, checked by `api.flash_attention`) on
    this kernel: q (1, H, total_q, d), k and v (1, H_kv, total_k, d), any strides `usable`
    accepts (a (total, H, d) tensor's transposed view among them). Returns O (1, H, total_q,
    d), contiguous, and lse2 (1, H, total_q) fp32: the outputs and layout of
    `fwd.packed_forward`, which `bwd.packed_backward` reads. Grid (ceil(max_q / BLOCK_M),
    n_seq * H); tiles and schedule as `attention_forward_sm90`."""
    _, H, total_q, d = q.shape
    H_kv = k.shape[1]
    bn, st, nc = _schedule(d, stages, block_n, consumers)
    o = common.empty(q, (1, H, total_q, d))
    lse2 = common.empty(q, (1, H, total_q), torch.float32)
    lay_m, lay_n = _layout(q.dtype, HALF_M, tile_d(d)), _layout(q.dtype, bn, tile_d(d))
    group = H // H_kv
    cu_q, cu_k = packed.cu_q, packed.cu_k
    args = ((q, HALF_M, lay_m), (k, bn, lay_n), (v, bn, lay_n), (o, HALF_M, lay_m), o, lse2,
            cu_q, cu_k, H, group, total_q, qk_scale)
    consts = {"CAUSAL": bool(causal), "STAGES": st, "num_warps": NUM_WARPS, "CONSUMERS": nc,
              "D": d}
    key = (q.dtype, d, bn, st, bool(causal), nc, _int_spec(H), _int_spec(group),
           cu_q.data_ptr() % 16 == 0, cu_k.data_ptr() % 16 == 0)
    LAUNCHER_VARLEN((-(-packed.max_q // (nc * HALF_M)), packed.n_seq * H), key, args, consts)
    return o, lse2
