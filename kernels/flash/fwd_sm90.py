"""FlashAttention forward for Hopper (sm_90), written in Gluon: the algorithm of
``flash_attn_fwd.py``, with the schedule spelled out by hand.

Why a second forward
--------------------
``flash_attn_fwd.py`` states the algorithm (online softmax in base 2, tiling, causal block
skipping) and leaves the schedule to Triton's compiler. On an H200 that reaches about 0.85-0.96x
cuDNN at d = 128 (kernels/NOTES.md; this kernel: 1.00-1.09x from s = 4,096 up, session 5):
the tensor cores sit idle while the exp2s of the softmax run, because each step's softmax
needs that step's scores and the next product needs the softmax. FlashAttention-3 (Shah et al., arXiv 2407.08608, section 3.2, "intra-warpgroup
overlapping") breaks the chain by keeping two key blocks in flight: while the warps run the
softmax of block j+1, the tensor cores are still busy with block j's P.V product.
Plain Triton gives no control over when an asynchronous product is waited for; Gluon (Triton's
lower-level dialect: explicit layouts, shared memory, barriers, warpgroup MMA) does.

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

Keeping the copies in their own warp matters: issued from the compute warps, each copy costs
CTA-wide barriers that hold the two warpgroups in lockstep (kernels/NOTES.md, step 5a). An
optional ping-pong (PINGPONG, FlashAttention-3 section 3.1: the warpgroups take turns issuing
their products) is implemented and tested but off: it measured 1-3% slower (step 5c).

O is rescaled after its product lands, not before the product is issued: the rescale of step
j+1 needs the max of block j+1, which is only known after that softmax, so the product of
step j accumulates under the old max and O *= alpha_{j+1} follows. The arithmetic is the one of
``flash_attn_fwd._fwd_key_loop``; the outputs (O, lse2 in log2 units) are the same, so the
Triton backward consumes them unchanged.

Tiles come through rank-4 tensor descriptors over (B, H, s, d) with tiles [1, 1, BLOCK, d]:
rows past the end of a head's sequence are out of bounds of that descriptor, so the copy
engine fills them with zeros on loads and drops them on stores. A ragged tail never reads a
neighbouring head, and any layout whose last stride is 1 (and whose strides are 16-byte
multiples) works without a copy.

Key blocks that every row of the query tile sees whole run without a mask; the diagonal
block(s) of causal attention and the ragged tail run with one (two loops with the same body).

A persistent form (config {"SM90_PERSISTENT": True}, `_persistent`; off by default) launches at
most one program per SM and walks the tiles in a loop, ring slots and barrier phases carrying on
from one tile to the next. On the H200 it passed its GPU tests and measured 1-18% slower than
the one-tile default at d = 128, s = 4,096 to 16,384 (kernels/NOTES.md step 9a: O leaves
through the Q buffer, so the next tile's Q waits for the epilogue, and the static causal order
balances worse than the hardware's block scheduler).

At d = 64 a third consumer warpgroup fits (CONSUMERS = 3, BLOCK_M = 192, FlashAttention-3's
tile there): three warpgroups of 160 registers and the loader share the register file, and
each K/V block loaded serves 192 query rows instead of 128. ``flash_attention`` runs it by
default at d = 64 once both lengths exceed 2,048 (4,096 causal; `default_schedule`), where it
measured 1.01-1.14x cuDNN from s = 8,192 up against the Triton kernel's 0.86-0.98x (NOTES
steps 6f and 7a); config {"SM90": True, "SM90_CONSUMERS": 3} selects it at any length.

Scope: compute capability 9.x, fp16/bf16, d in {64, 128} (``flash_attention`` picks it by
default at d = 128, and at d = 64 for long sequences). Everything else (and every other GPU)
uses ``flash_attn_fwd``.
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

from kernels.flash.launcher import DirectLauncher

# The copy-engine calls were renamed after Triton 3.6 (async_copy_global_to_shared ->
# async_load, async_copy_shared_to_global -> async_store); the old names now raise.
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
# ... and the CTA-wide barrier: thread_barrier (3.6) -> barrier (3.9).
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier

HEAD_DIMS = (64, 128)  # what the kernel runs (tested on the H200 for both)
# ... and where flash_attention picks it at every length without being asked. At d = 64 the
# two-warpgroup kernel was as fast as the Triton kernel or 1-5% slower (kernels/NOTES.md,
# step 5); the three-warpgroup one is the default there for long sequences only
# (`default_schedule`); config {"SM90": True} selects the kernel at any length.
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
PINGPONG = False  # consumer warpgroups take turns issuing products (kernels/NOTES.md)
# (BLOCK_N, STAGES) per head dim: STAGES slots of K and of V each. Shared memory at d = 128:
# Q 32 KiB + STAGES * (32 + 32) KiB, 160 KiB with 2 stages (3 fit too: 224 of the 227 KiB a
# block may use, and measured the same or 1-2% slower; BLOCK_N = 64 lost 10%: NOTES step 5b).
TILES = {64: (128, 3), 128: (128, 2)}
# Consumer warpgroups per head dim when a config forces this kernel. Three (BLOCK_M = 192,
# FlashAttention-3's choice at d = 64) is implemented for d = 64: config {"SM90_CONSUMERS": 3}.
CONSUMERS = {64: 2, 128: 2}
# Where flash_attention runs this kernel at d = 64 without being asked: with three consumer
# warpgroups and two stages once both lengths reach these (the 4,096 bucket without a causal
# mask, the 8,192 bucket with one). In GPU time there (session-5 bench) it measured
# 1.01-1.13x cuDNN from s = 8,192 up, where the Triton kernel is 0.86-0.98x, and +3% over it
# at 4,096 without a mask; causal at 4,096 and everything shorter ran 0-25% slower than the
# Triton kernel, which keeps them (kernels/NOTES.md, steps 6f and 7a).
THREE_WG_MIN_LEN = {False: 2049, True: 4097}  # by causal
THREE_WG_SCHEDULE = (3, 2)  # (consumer warpgroups, stages)


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
def _ring_load(desc, smem, ready, empty, b, h_kv, block, seq, STAGES: gl.constexpr):
    """Copy key (or value) block ``block`` into the ring slot of copy number ``seq`` (the
    program's running count of ring copies: ``block`` itself, unless the program is
    persistent), once both consumers have released what the slot held before (seq - STAGES)."""
    slot = seq % STAGES
    # The slot's "empty" barrier completes one phase per release; the first pass needs none.
    mbarrier.wait(empty.index(slot), ((seq // STAGES) + 1) & 1, pred=seq >= STAGES)
    bar = ready.index(slot)
    mbarrier.expect(bar, desc.block_type.nbytes)
    _tma_load(desc, [b, h_kv, block * desc.block_type.shape[2], 0], bar, smem.index(slot))


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty,
            v_empty, b, h, h_kv, start_m, n_blocks, STAGES: gl.constexpr,
            CONSUMERS: gl.constexpr):
    """The producer warp: each consumer's 64 query rows, then K_0, V_0, K_1, V_1, ... through
    the rings."""
    HALF: gl.constexpr = q_desc.block_type.shape[2]
    for i in gl.static_range(CONSUMERS):
        mbarrier.expect(q_bars.index(i), q_desc.block_type.nbytes)
        _tma_load(q_desc, [b, h, start_m + i * HALF, 0], q_bars.index(i), q_smem.index(i))
    for blk in range(n_blocks):
        _ring_load(k_desc, k_smem, k_ready, k_empty, b, h_kv, blk, blk, STAGES)
        _ring_load(v_desc, v_smem, v_ready, v_empty, b, h_kv, blk, blk, STAGES)


@gluon.jit
def _tile_coords(tile, n_m, BH, H, GROUP, s_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 CAUSAL: gl.constexpr):
    """(start_m, bh, b, h, h_kv, n_blocks) of work item ``tile`` of a persistent program.
    Without a mask, tile t is query block t % n_m of (batch, head) t // n_m: programs running
    side by side share K and V in L2. With the causal mask the longest query blocks (the last
    ones) of every head come first, so that the short ones fill the end."""
    if CAUSAL:
        m = n_m - 1 - tile // BH
        bh = tile % BH
    else:
        m = tile % n_m
        bh = tile // n_m
    start_m = m * BLOCK_M
    h = bh % H
    if CAUSAL:
        hi = gl.minimum(s_k, start_m + BLOCK_M)
    else:
        hi = s_k
    return start_m, bh, bh // H, h, h // GROUP, (hi + BLOCK_N - 1) // BLOCK_N


@gluon.jit
def _loader_persistent(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty,
                       k_ready, v_ready, k_empty, v_empty, n_m, BH, H, GROUP, s_k,
                       CAUSAL: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """The producer warp of a persistent program: for each of its tiles, the first K/V blocks,
    each consumer's query rows (once that consumer has stored the previous tile's O from the
    same buffer), then the tile's other K/V blocks, all through the rings and counted across
    tiles so that slots and barrier phases carry on from one tile to the next."""
    HALF: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_M: gl.constexpr = CONSUMERS * HALF
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    seq = 0  # ring copies issued so far, over all tiles
    ti = 0  # tiles done so far
    for tile in range(gl.program_id(0), n_m * BH, gl.num_programs(0)):
        start_m, bh, b, h, h_kv, n_blocks = _tile_coords(tile, n_m, BH, H, GROUP, s_k, BLOCK_M,
                                                         BLOCK_N, CAUSAL)
        # The tile's first K and V blocks go first: their slots free up while the consumers
        # still finish the previous tile, whose O must leave before its Q buffers refill.
        _ring_load(k_desc, k_smem, k_ready, k_empty, b, h_kv, 0, seq, STAGES)
        _ring_load(v_desc, v_smem, v_ready, v_empty, b, h_kv, 0, seq, STAGES)
        for i in gl.static_range(CONSUMERS):
            # completion number ti of q_empty[i]: consumer i's O of tile ti - 1 has left
            mbarrier.wait(q_empty.index(i), (ti + 1) & 1, pred=ti > 0)
            mbarrier.expect(q_bars.index(i), q_desc.block_type.nbytes)
            _tma_load(q_desc, [b, h, start_m + i * HALF, 0], q_bars.index(i), q_smem.index(i))
        for blk in range(1, n_blocks):
            _ring_load(k_desc, k_smem, k_ready, k_empty, b, h_kv, blk, seq + blk, STAGES)
            _ring_load(v_desc, v_smem, v_ready, v_empty, b, h_kv, blk, seq + blk, STAGES)
        seq += n_blocks
        ti += 1


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, rows, cols, s_k, p_layout: gl.constexpr,
                  DTYPE: gl.constexpr, MASKED: gl.constexpr, CAUSAL: gl.constexpr):
    """One online-softmax step on raw scores s (rows, BLOCK_N) of key columns ``cols``.

    Returns P (input dtype, in the register layout the P.V product reads), the new row max,
    the new row sum and alpha = 2^(m_old - m_new), the factor for what O accumulated so far.
    The same arithmetic as flash_attn_fwd._fwd_key_loop (base 2, log2(e) folded in qk_scale).
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
def _wait_turn(turn, HALF_ID: gl.constexpr, event, PINGPONG: gl.constexpr):
    """Ping-pong (FlashAttention-3, section 3.1): the two consumer warpgroups take turns to
    issue their products, so that one runs its softmax while the other's products use the
    tensor cores. Turn ``event`` of warpgroup 1 starts once warpgroup 0 has issued its turn
    ``event``; turn ``event`` of warpgroup 0 once warpgroup 1 has issued turn ``event - 1``
    (the kernel's prologue gives warpgroup 0 its turn 0). Both take n_blocks + 1 turns."""
    if PINGPONG:
        mbarrier.wait(turn.index(HALF_ID), event & 1)


@gluon.jit
def _pass_turn(turn, HALF_ID: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - HALF_ID), count=1)


@gluon.jit
def _key_step(j, base, q, s, p, acc, m_i, l_i, k_smem, v_smem, k_ready, v_ready, k_empty,
              v_empty, turn, HALF_ID: gl.constexpr, qk_scale, rows, cols, s_k,
              o_row: gl.constexpr, p_layout: gl.constexpr, DTYPE: gl.constexpr,
              STAGES: gl.constexpr, MASKED: gl.constexpr, CAUSAL: gl.constexpr,
              PINGPONG: gl.constexpr):
    """Step j of a consumer's key loop: S_{j+1} and O += P_j V_j in flight together. Block j
    sits in ring copy base + j (base: the copies of the program's earlier tiles, 0 unless
    persistent)."""
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    nxt = j + 1
    rn = base + nxt  # ring copy of K_{j+1}
    rj = base + j  # ... and of V_j
    mbarrier.wait(k_ready.index(rn % STAGES), (rn // STAGES) & 1)
    mbarrier.wait(v_ready.index(rj % STAGES), (rj // STAGES) & 1)
    _wait_turn(turn, HALF_ID, nxt, PINGPONG)
    s = warpgroup_mma(q, _tile(k_smem, rn, STAGES).permute((1, 0)), s, use_acc=False,
                      is_async=True)
    acc = warpgroup_mma(p, _tile(v_smem, rj, STAGES), acc, is_async=True)
    _pass_turn(turn, HALF_ID, PINGPONG)
    # wgmma groups complete in order: one outstanding group left means S_{j+1} has landed
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    mbarrier.arrive(k_empty.index(rn % STAGES), count=1)  # this warpgroup is done with K_{j+1}
    p_next, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, nxt * BLOCK_N + cols,
                                            s_k, p_layout, DTYPE, MASKED, CAUSAL)
    acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
    mbarrier.arrive(v_empty.index(rj % STAGES), count=1)  # ... and with V_j
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row), 1)
    return s, p_next, acc, m_i, l_i


@gluon.jit
def _consumer(HALF_ID: gl.constexpr, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty,
              v_empty, turn, o_desc, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, qk_scale,
              CAUSAL: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr):
    """One warpgroup: 64 query rows of the program's tile, over the key blocks the loader
    brings (module docstring). Stores its rows of O and lse2."""
    _consumer_tile(HALF_ID, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                   turn, o_desc, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, qk_scale, 0, 0,
                   CAUSAL, STAGES, PINGPONG, False)


@gluon.jit
def _consumer_persistent(HALF_ID: gl.constexpr, q_smem, k_smem, v_smem, q_bars, q_empty,
                         k_ready, v_ready, k_empty, v_empty, turn, o_desc, LSE2, n_m, BH, H,
                         GROUP, s_q, s_k, qk_scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                         CONSUMERS: gl.constexpr):
    """One warpgroup of a persistent program: the tiles `_loader_persistent` walks, in the
    same order; after each tile's O has left its Q buffer, the buffer is handed back."""
    HALF: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    seq = 0  # ring copies consumed so far, over all tiles (as the loader counts them)
    ti = 0
    for tile in range(gl.program_id(0), n_m * BH, gl.num_programs(0)):
        start_m, bh, b, h, h_kv, n_blocks = _tile_coords(tile, n_m, BH, H, GROUP, s_k,
                                                         CONSUMERS * HALF, BLOCK_N, CAUSAL)
        _consumer_tile(HALF_ID, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty,
                       v_empty, turn, o_desc, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k,
                       qk_scale, seq, ti & 1, CAUSAL, STAGES, False, True)
        mbarrier.arrive(q_empty.index(HALF_ID), count=1)  # the loader may refill this Q buffer
        seq += n_blocks
        ti += 1


@gluon.jit
def _consumer_tile(HALF_ID: gl.constexpr, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready,
                   k_empty, v_empty, turn, o_desc, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k,
                   qk_scale, base, q_phase, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                   PINGPONG: gl.constexpr, RELEASE_LAST: gl.constexpr):
    """One warpgroup's 64 rows of one tile. Its key blocks sit in ring copies base, base + 1,
    ...; its Q buffer's fill is phase ``q_phase`` of its barrier. RELEASE_LAST: also hand the
    last V slot back (a persistent program's loader reuses it; a one-tile program never does)."""
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
    mbarrier.wait(q_bars.index(HALF_ID), q_phase)

    # ---- key block 0: its scores and softmax step; O is still zero ----------------------------
    mbarrier.wait(k_ready.index(base % STAGES), (base // STAGES) & 1)
    _wait_turn(turn, HALF_ID, 0, PINGPONG)
    s = warpgroup_mma(q, _tile(k_smem, base, STAGES).permute((1, 0)), s, use_acc=False,
                      is_async=True)
    _pass_turn(turn, HALF_ID, PINGPONG)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    mbarrier.arrive(k_empty.index(base % STAGES), count=1)
    if n_full > 0:
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, s_k, p_layout,
                                           DTYPE, False, CAUSAL)
    else:
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, rows, cols, s_k, p_layout,
                                           DTYPE, True, CAUSAL)

    # ---- steps 0 .. n-2: unmasked next blocks first, then the diagonal / tail ones -------------
    for j in range(0, n_full - 1):
        s, p, acc, m_i, l_i = _key_step(
            j, base, q, s, p, acc, m_i, l_i, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
            turn, HALF_ID, qk_scale, rows, cols, s_k, o_row, p_layout, DTYPE, STAGES, False,
            CAUSAL, PINGPONG)
    for j in range(gl.maximum(n_full - 1, 0), n_blocks - 1):
        s, p, acc, m_i, l_i = _key_step(
            j, base, q, s, p, acc, m_i, l_i, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
            turn, HALF_ID, qk_scale, rows, cols, s_k, o_row, p_layout, DTYPE, STAGES, True,
            CAUSAL, PINGPONG)

    # ---- the last block's P.V, then normalise and store ----------------------------------------
    last = base + n_blocks - 1  # its ring copy
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    _wait_turn(turn, HALF_ID, n_blocks, PINGPONG)
    acc = warpgroup_mma(p, _tile(v_smem, last, STAGES), acc, is_async=True)
    _pass_turn(turn, HALF_ID, PINGPONG)
    acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
    if RELEASE_LAST:
        mbarrier.arrive(v_empty.index(last % STAGES), count=1)

    acc = acc / gl.expand_dims(gl.convert_layout(l_i, o_row), 1)
    gl.store(LSE2 + bh.to(gl.int64) * s_q + rows, m_i + gl.log2(l_i), mask=rows < s_q)
    # O leaves through this half's Q buffer (its last reader, S_{n-1}, has completed). Rows
    # past s_q are outside o_desc: the copy engine does not write them.
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
    BH,  # PERSISTENT: batch * query heads (the grid no longer says it); else 1, unused
    CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,  # K and V buffers each
    PINGPONG: gl.constexpr,  # the consumer warpgroups take turns on the tensor cores
    num_warps: gl.constexpr,  # 4: the default partition is the first consumer warpgroup
    CONSUMERS: gl.constexpr = 2,  # consumer warpgroups of 64 query rows (2, or 3 at d = 64)
    PERSISTENT: gl.constexpr = False,  # one program per SM, looping over tiles (see below)
):
    gl.static_assert(CONSUMERS == 2 or (CONSUMERS == 3 and not PINGPONG))
    gl.static_assert(not PERSISTENT or (CONSUMERS == 2 and not PINGPONG))
    if PERSISTENT:
        _persistent(q_desc, k_desc, v_desc, o_desc, LSE2, H, GROUP, BH, s_q, s_k, qk_scale,
                    CAUSAL, STAGES)
    else:
        _one_tile(q_desc, k_desc, v_desc, o_desc, LSE2, H, GROUP, s_q, s_k, qk_scale, CAUSAL,
                  STAGES, PINGPONG, CONSUMERS)


@gluon.jit
def _one_tile(q_desc, k_desc, v_desc, o_desc, LSE2, H, GROUP, s_q, s_k, qk_scale,
              CAUSAL: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
              CONSUMERS: gl.constexpr):
    """The default form: one program per (query tile, batch, head), the grid's two dims."""
    HALF: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_M: gl.constexpr = CONSUMERS * HALF
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    DTYPE: gl.constexpr = q_desc.dtype

    pid = gl.program_id(0)
    if CAUSAL:  # the last query tiles see the most keys: start them first
        pid = gl.num_programs(0) - 1 - pid
    start_m = pid * BLOCK_M
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    h_kv = h // GROUP
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
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    if PINGPONG:
        mbarrier.arrive(turn.index(0), count=1)  # warpgroup 0 takes the first turn

    # (constexprs go into each argument list literally: a tuple built beforehand loses them)
    if CONSUMERS == 2:
        gl.warp_specialize(
            [(_consumer, (0, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                          turn, o_desc, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, qk_scale,
                          CAUSAL, STAGES, PINGPONG)),
             (_consumer, (1, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                          turn, o_desc, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, qk_scale,
                          CAUSAL, STAGES, PINGPONG)),
             (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready,
                        v_ready, k_empty, v_empty, b, h, h_kv, start_m, n_blocks, STAGES,
                        CONSUMERS))],
            [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:  # three warpgroups share the register file: at most 160 each next to the loader
        gl.warp_specialize(
            [(_consumer, (0, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                          turn, o_desc, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, qk_scale,
                          CAUSAL, STAGES, False)),
             (_consumer, (1, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                          turn, o_desc, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, qk_scale,
                          CAUSAL, STAGES, False)),
             (_consumer, (2, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                          turn, o_desc, LSE2, bh, b, h, start_m, n_blocks, s_q, s_k, qk_scale,
                          CAUSAL, STAGES, False)),
             (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready,
                        v_ready, k_empty, v_empty, b, h, h_kv, start_m, n_blocks, STAGES,
                        CONSUMERS))],
            [4, 4, 1], [CONSUMER3_REGS, CONSUMER3_REGS, LOADER_REGS])


@gluon.jit
def _persistent(q_desc, k_desc, v_desc, o_desc, LSE2, H, GROUP, BH, s_q, s_k, qk_scale,
                CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """The persistent form (config {"SM90_PERSISTENT": True}; not the default: 1-18% slower
    than `_one_tile` on the H200, kernels/NOTES.md step 9a): a grid of at most one program per SM, each walking the
    tiles pid, pid + nprog, ... (`_tile_coords`), with two consumer warpgroups. A tile grid is
    rarely a whole number of waves (d = 128, s = 4,096, H = 32: 1,024 tiles on 132 SMs, 7.76
    waves); a persistent program also lets its loader fetch the next tile's Q, K and V while
    its consumers finish the current one. Ring slots and barrier phases run on across tiles;
    each consumer hands its Q buffer back (q_empty) once its O has left through it."""
    HALF: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_M: gl.constexpr = 2 * HALF
    DTYPE: gl.constexpr = q_desc.dtype
    n_m = (s_q + BLOCK_M - 1) // BLOCK_M
    q_smem = gl.allocate_shared_memory(DTYPE, [2] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(DTYPE, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(DTYPE, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # unused
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrival per consumer
        mbarrier.init(v_empty.index(i), count=2)
    gl.warp_specialize(
        [(_consumer_persistent, (0, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready,
                                 k_empty, v_empty, turn, o_desc, LSE2, n_m, BH, H, GROUP, s_q,
                                 s_k, qk_scale, CAUSAL, STAGES, 2)),
         (_consumer_persistent, (1, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready,
                                 k_empty, v_empty, turn, o_desc, LSE2, n_m, BH, H, GROUP, s_q,
                                 s_k, qk_scale, CAUSAL, STAGES, 2)),
         (_loader_persistent, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty,
                               k_ready, v_ready, k_empty, v_empty, n_m, BH, H, GROUP, s_k,
                               CAUSAL, STAGES, 2))],
        [4, 1], [CONSUMER_REGS, LOADER_REGS])


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
    key = (q.dtype, q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.device.index)
    ok = _USABLE.get(key)
    if ok is None:
        if len(_USABLE) > 4096:  # many distinct shapes: start over rather than grow
            _USABLE.clear()
        ok = _USABLE[key] = _layout_usable(q, k, v)
    # the base addresses change from call to call: 16-byte alignment is checked every time
    return ok and not (q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16)


def _layout_usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    if q.dtype not in _GL_DTYPES or q.shape[3] not in HEAD_DIMS:
        return False
    if q.shape[1] * q.shape[0] >= 65536:  # grid's second dimension: B * H
        return False
    idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if torch.cuda.get_device_capability(idx)[0] != 9:
        return False
    return (_descriptor_ok(q, _strides(q)) and _descriptor_ok(k, _strides(k))
            and _descriptor_ok(v, _strides(v)))


def _descriptor(t: torch.Tensor, rows: int, layout) -> TensorDescriptor:
    """A rank-4 descriptor of t with tiles [1, 1, rows, d]. Built without the dataclass's
    checks, which cost about 5 us each on the launch path: `usable` made the same checks
    (alignment, strides) once for q, k and v, and O is allocated contiguous here."""
    desc = TensorDescriptor.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides = t, list(t.shape), _strides(t)
    desc.block_shape, desc.layout, desc.padding = [1, 1, rows, t.shape[3]], layout, "zero"
    return desc


# ---- launching without the JIT's dispatch (kernels/direct.py) ------------------------------
# The key holds every property the JIT specialises on for these arguments: dtype, head dim
# and tiles (the descriptors' types), the constexprs, and H and GROUP (and BH when persistent;
# 1 otherwise) being 1 or multiples of 16 (integer specialisation); s_q and s_k are not
# specialised, LSE2 is always 16-byte aligned (fresh allocation), qk_scale is an fp32.
# The four descriptors are passed as (tensor, rows, layout) and built by `_descriptor` only
# where an object is needed; on Triton 3.6 a repeated call on the same tensors reuses their
# encoded tensor maps (kernels/direct.py).
LAUNCHER = DirectLauncher(attn_fwd_sm90_kernel, descriptor=_descriptor)


def _int_spec(x: int) -> tuple[bool, bool]:
    return x == 1, x % 16 == 0


_SMS: dict = {}  # multiprocessor count by device index


def _sm_count(t: torch.Tensor) -> int:
    idx = t.device.index if t.device.index is not None else torch.cuda.current_device()
    n = _SMS.get(idx)
    if n is None:
        n = _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def attention_forward_sm90(q, k, v, causal: bool, qk_scale: float, stages: int | None = None,
                           block_n: int | None = None, pingpong: bool | None = None,
                           consumers: int | None = None, persistent: bool | None = None):
    """O (B, H, s_q, d) and lse2 (B, H, s_q) fp32, as flash_attn_fwd.attention_forward returns
    them. ``qk_scale`` is the softmax scale times log2(e). Check `usable` first.
    ``consumers``: 2 (default) or 3 consumer warpgroups (BLOCK_M = 64 per warpgroup; 3 only
    at d = 64, without ping-pong). ``persistent``: one program per SM looping over the tiles
    (`_persistent`; two consumers, no ping-pong; experimental, off by default)."""
    B, H, s_q, d = q.shape
    H_kv, s_k = k.shape[1], k.shape[2]
    bn, st = TILES[d]
    bn = block_n or bn
    st = stages or st
    pp = PINGPONG if pingpong is None else bool(pingpong)
    nc = CONSUMERS[d] if consumers is None else consumers
    if nc not in (2, 3) or (nc == 3 and (d != 64 or pp)):
        raise ValueError(f"SM90_CONSUMERS must be 2, or 3 at d = 64 without ping-pong; got {nc} "
                         f"at d = {d}" + (" with ping-pong" if pp else ""))
    pers = bool(persistent)
    if pers and (nc != 2 or pp):
        raise ValueError("SM90_PERSISTENT needs two consumer warpgroups and no ping-pong; got "
                         f"SM90_CONSUMERS={nc}, SM90_PINGPONG={pp}")
    o = q.new_empty((B, H, s_q, d))  # q's dtype and device, contiguous
    lse2 = q.new_empty((B, H, s_q), dtype=torch.float32)
    lay_m, lay_n = _layout(q.dtype, HALF_M, d), _layout(q.dtype, bn, d)
    group = H // H_kv
    args = ((q, HALF_M, lay_m), (k, bn, lay_n), (v, bn, lay_n), (o, HALF_M, lay_m), lse2,
            H, group, s_q, s_k, qk_scale, B * H if pers else 1)
    consts = {"CAUSAL": bool(causal), "STAGES": st, "PINGPONG": pp, "num_warps": NUM_WARPS,
              "CONSUMERS": nc}
    key = (q.dtype, d, bn, st, bool(causal), pp, nc, _int_spec(H), _int_spec(group))
    n_m = -(-s_q // (nc * HALF_M))
    if pers:  # B * H is an argument then (1 otherwise): its specialisation joins the key
        consts["PERSISTENT"] = True
        key += (True, _int_spec(B * H))
        LAUNCHER((min(n_m * B * H, _sm_count(q)), 1), key, args, consts)
    else:
        LAUNCHER((n_m, B * H), key, args, consts)
    return o, lse2
