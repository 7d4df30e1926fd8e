"""The Hopper backward's device code under its two kernels (attnmem.kernels.flash.bwd_sm90,
whose docstring has the schedule): `one_block`, one program's shared memory, barriers and
warp-specialised partitions; `_loader`, the copy-engine warp; `_consumer`, one MMA warpgroup
over every query block of the GQA group, each step `_q_step`; and `grid_order`, which
(key block, head) a program takes. Gluon compiles these into bwd_sm90's kernels (helpers are
inlined: the kernels' PTX is that of one file), reading their source from this file.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

__all__ = ["CONSUMER_REGS", "LOADER_REGS", "grid_order", "one_block"]

# The copy-engine calls were renamed after Triton 3.6 (as in fwd_sm90.py).
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared

# The copy engine's bulk reduce-add, `_tma_reduce_add(tensor_desc, coord, src)`: Triton 3.7 and
# newer export it; on Triton 3.6 it takes private Triton internals, the only kernel code that
# does (the host side's other private use is launcher.py's direct launch, for host time).
if hasattr(tma, "async_atomic_add"):
    _tma_reduce_add = tma.async_atomic_add
else:
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """Add the shared-memory tile ``src`` into global memory at ``coord`` of
        ``tensor_desc`` with one bulk reduce-add of the copy engine (cp.reduce.async.bulk
        .add). Triton 3.6 has the operation in its IR (ttng.async_tma_reduce) but no Gluon
        function that emits it, and no public way to reach it, so this one emits it through
        Triton's private builtin decorator and IR builder (Triton 3.7's
        ``tma.async_atomic_add`` is the same call). Delete it with Triton 3.6."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD,
                                                  tensor_desc.handle, coord, src.handle)

CONSUMER_REGS = gl.constexpr(240)  # registers per thread of the second consumer (FA3: 240)
LOADER_REGS = gl.constexpr(24)  # ... and of the loader warp


@gluon.jit
def _tile(smem, i):
    """The 2-d (rows, d) view of slot i of a ring of rank-4 [1, 1, rows, d] tiles."""
    t = smem.index(i)
    return t.reshape([t.shape[2], t.shape[3]])


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem,
            v_smem, lse_smem, delta_smem, kv_bar, ready, empty, b, H, h_kv, GROUP, start_n, lo,
            n_m, q0, k0, stat0, STAGES: gl.constexpr, VARLEN: gl.constexpr):
    """The producer warp: the two halves of K and V, then Q_i, dO_i and the rows' lse2 and
    delta for query blocks i = lo .. n_m - 1 of each query head of the group, through the
    ring (FA3 loads LSE and dPsum with the producer too). VARLEN (packed sequences): the
    descriptors span the packed rows, the sequence's queries start at row q0, its keys at k0,
    its lse2 and delta at column stat0 of the (H, padded rows) stats (`bwd_sm90.attn_bwd_sm90_varlen_kernel`)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    HALF: gl.constexpr = k_desc.block_type.shape[2]
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
    for i in gl.static_range(2):
        if VARLEN:
            _tma_load(k_desc, [0, h_kv, k0 + start_n + i * HALF, 0], kv_bar, k_smem.index(i))
            _tma_load(v_desc, [0, h_kv, k0 + start_n + i * HALF, 0], kv_bar, v_smem.index(i))
        else:
            _tma_load(k_desc, [b, h_kv, start_n + i * HALF, 0], kv_bar, k_smem.index(i))
            _tma_load(v_desc, [b, h_kv, start_n + i * HALF, 0], kv_bar, v_smem.index(i))
    it = 0  # ring copies issued so far
    for g in range(GROUP):
        h = h_kv * GROUP + g
        for m in range(lo, n_m):
            slot = it % STAGES
            # completion number it // STAGES - 1 of the slot's "empty" barrier: both consumers
            # released copy it - STAGES (the first pass through the ring waits for nothing)
            mbarrier.wait(empty.index(slot), ((it // STAGES) + 1) & 1, pred=it >= STAGES)
            bar = ready.index(slot)
            mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes
                            + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
            if VARLEN:
                _tma_load(q_desc, [0, h, q0 + m * BLOCK_M, 0], bar, q_smem.index(slot))
                _tma_load(do_desc, [0, h, q0 + m * BLOCK_M, 0], bar, do_smem.index(slot))
                _tma_load(lse_desc, [h, stat0 + m * BLOCK_M], bar, lse_smem.index(slot))
                _tma_load(delta_desc, [h, stat0 + m * BLOCK_M], bar, delta_smem.index(slot))
            else:
                _tma_load(q_desc, [b, h, m * BLOCK_M, 0], bar, q_smem.index(slot))
                _tma_load(do_desc, [b, h, m * BLOCK_M, 0], bar, do_smem.index(slot))
                _tma_load(lse_desc, [b * H + h, m * BLOCK_M], bar, lse_smem.index(slot))
                _tma_load(delta_desc, [b * H + h, m * BLOCK_M], bar, delta_smem.index(slot))
            it += 1


@gluon.jit
def _q_step(it, start_m, dq_tile, dk, dv, zero, k_smem, v_smem, q_smem, do_smem, lse_smem,
            delta_smem, ds_smem, dq_smem, ready, empty, ds_bar, dq_desc, keys, s_k, s_q,
            qk_scale, HALF_ID: gl.constexpr, st_layout: gl.constexpr, pa_layout: gl.constexpr,
            dq_layout: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr,
            CAUSAL: gl.constexpr, DQ_SPLIT_D: gl.constexpr, VARLEN: gl.constexpr):
    """One query block (ring copy ``it``, rows start_m ..) for this warpgroup's 64 keys:
    updates dK_w, dV_w and adds this program's share of the block's dQ (module docstring).
    ``dq_tile``: the block's first partial in the flat dQ buffer (((b * H + h) * n_m + m) * 2
    dense). VARLEN: a MASKED step also masks queries >= s_q (the next sequence's rows)."""
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HALF_M: gl.constexpr = BLOCK_M // 2
    DTYPE: gl.constexpr = q_smem.dtype
    HALF: gl.constexpr = k_smem.shape[3]  # this warpgroup's keys
    HEAD_D: gl.constexpr = k_smem.shape[4]
    slot = it % STAGES
    # This warpgroup's K and V halves, (64 keys, d), indexed by HALF_ID + rz with rz = 0 that
    # the compiler cannot prove 0 and that changes per step: their MMA descriptors (8 K-slices
    # each of K_w, V_w and of K^T for dQ) are then rebuilt every step in uniform registers,
    # not hoisted out of the loop, where ptxas kept them in about 48 vector registers and
    # spilled around them (7-15 local loads per step). 0 spilled bytes at d = 128 since, and
    # 1.02-1.08x the backward alone (NOTES.md, "K and V descriptors rebuilt every step").
    rz = slot * zero
    k_w = _tile(k_smem, HALF_ID + rz)
    v_w = _tile(v_smem, HALF_ID + rz)
    mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
    q_t = _tile(q_smem, slot)  # (BLOCK_M, d)
    do_t = _tile(do_smem, slot)

    # ---- S^T = K_w Q^T and dP^T = V_w dO^T, both in flight ------------------------------------
    zero = gl.zeros([HALF, BLOCK_M], gl.float32, st_layout)
    st = warpgroup_mma(k_w, q_t.permute((1, 0)), zero, use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_w, do_t.permute((1, 0)), zero, use_acc=False, is_async=True)
    # The block's lse2 and delta per query column come from shared memory, (1, BLOCK_M) each,
    # broadcast over the keys. Rows past s_q read as zeros (lse2 = 0 makes P = 1 there), and
    # so do their Q and dO rows: S = dP = 0, so they add nothing to dV (dO = 0) or dS
    # (P (dP - delta) = 0), and their dQ is zero. Each is read right where it is used (read
    # before the MMA waits, FA4's order, it measured 0.28x at d = 64: NOTES.md, "EARLY_STATS").
    st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))  # groups complete in order
    lse = lse_smem.index(slot).load(st_layout)

    # ---- P^T, then dV_w += P^T dO (asynchronous; P^T from registers) ----------------------------
    pt = gl.exp2(st * qk_scale - lse)
    if MASKED:
        cols = start_m + gl.arange(0, BLOCK_M, gl.SliceLayout(0, st_layout))
        visible = gl.expand_dims(keys, 1) < s_k
        if VARLEN:  # query rows past the sequence's end are the next sequence's: P = 0, so
            # they add nothing to dV, and dS = 0 * (dP - delta) = 0 (delta is 0 there, finite)
            visible = visible & (gl.expand_dims(cols, 0) < s_q)
        if CAUSAL:  # top-left alignment: query i sees keys j <= i
            visible = visible & (gl.expand_dims(cols, 0) >= gl.expand_dims(keys, 1))
        pt = gl.where(visible, pt, 0.0)
    p16 = gl.convert_layout(pt.to(DTYPE), pa_layout)  # P^T as the A operand from registers
    dv = warpgroup_mma(p16, do_t, dv, is_async=True)
    dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt,))  # dP^T landed; dV may still run
    delta = delta_smem.index(slot).load(st_layout)

    # ---- dS^T = P^T (dP^T - delta), to shared memory (for dQ, both warpgroups' halves) ----------
    dst = (pt * (dpt - delta)).to(DTYPE)
    buf = it % 2
    ds_w = ds_smem.index(2 * buf + HALF_ID)  # (BLOCK_M, 64): queries x this warpgroup's keys
    ds_w.permute((1, 0)).store(dst)
    fence_async_shared()  # the stores must be visible to the tensor cores (async proxy)
    mbarrier.arrive(ds_bar.index(buf), count=1)
    dsa = gl.convert_layout(dst, pa_layout)  # dS^T stays in registers as dK's A operand

    # ---- dQ^T, this warpgroup's half (of the rows of d or of the queries): K^T dS^T -------------
    mbarrier.wait(ds_bar.index(buf), (it // 2) & 1)  # the other warpgroup's half is written
    if DQ_SPLIT_D:  # rows HALF_ID * d / 2 .. of dQ^T, every query column
        HALF_D: gl.constexpr = HEAD_D // 2
        dqt = gl.zeros([HALF_D, BLOCK_M], gl.float32, dq_layout)
        for i in gl.static_range(2):
            k_h = k_smem.index(i + rz)
            k_h = k_h.reshape([k_h.shape[2], k_h.shape[3]])  # (64 keys, d)
            k_h = k_h.slice(HALF_ID * HALF_D, HALF_D, dim=1)  # (64 keys, d / 2)
            ds_h = ds_smem.index(2 * buf + i)  # (BLOCK_M, 64 keys)
            dqt = warpgroup_mma(k_h.permute((1, 0)), ds_h.permute((1, 0)), dqt, use_acc=i > 0,
                                is_async=True)
    else:  # query columns HALF_ID * BLOCK_M / 2 .., every row of d
        dqt = gl.zeros([HEAD_D, HALF_M], gl.float32, dq_layout)
        for i in gl.static_range(2):
            k_h = k_smem.index(i + rz)
            k_h = k_h.reshape([k_h.shape[2], k_h.shape[3]])  # (64 keys, d)
            ds_h = ds_smem.index(2 * buf + i).slice(HALF_ID * HALF_M, HALF_M, dim=0)
            dqt = warpgroup_mma(k_h.permute((1, 0)), ds_h.permute((1, 0)), dqt, use_acc=i > 0,
                                is_async=True)
    # dV's product (issued first) lands, then dK_w += dS^T Q (A from registers, FA3's and FA4's
    # RS product) runs on the tensor cores while this warpgroup waits for dQ^T and stores it
    # (groups complete in order)
    dv, p16 = warpgroup_mma_wait(num_outstanding=1, deps=(dv, p16))
    dk = warpgroup_mma(dsa, q_t, dk, is_async=True)
    dqt = warpgroup_mma_wait(num_outstanding=1, deps=(dqt,))

    # ---- dQ half -> shared memory -> one bulk reduce-add into the fp32 buffer ---------------------
    tma.store_wait(pendings=0)  # the previous block's reduce has read the staging tile
    # The (64, 64) accumulator goes out in register order (FA4's dQ staging): thread t of
    # the warpgroup writes its 32 values as 8 chunks of 4, chunk c at float (128 c + t) * 4,
    # so every store is a 16-byte vector and a warp's 32 stores fill 512 contiguous bytes
    # (no bank conflict), and the buffer holds each (query block, half) as those 4,096
    # floats (`bwd_sm90.flat_tile`; the final cast reads them back). In the accumulator's layout
    # row r = 16 w + 8 h + i and column c = 8 j + 2 a + e, where w is the warp, i = lane
    # // 4, a = lane % 4, and (j, h, e) the register: the reshape and permute below only
    # rename those bits, so they move no data.
    gl.static_assert(dqt.shape[0] == 64 and dqt.shape[1] == 64)
    flat = dqt.reshape([4, 2, 8, 8, 4, 2]).permute((3, 0, 2, 4, 1, 5)).reshape([128, 32])
    dq_t = dq_smem.index(HALF_ID)  # (128, 32) fp32, unswizzled
    dq_t.store(flat)  # unscaled: the host's final cast multiplies by the softmax scale
    fence_async_shared()
    _tma_reduce_add(dq_desc, [(dq_tile + HALF_ID) * 128, 0], dq_t)
    dk, dsa = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dsa))
    mbarrier.arrive(empty.index(slot), count=1)  # this warpgroup is done with Q_i, dO_i
    return dk, dv


@gluon.jit
def _dq_block(b, h, m, H_kv, GROUP, n_m, n_pad, pb0, VARLEN: gl.constexpr):
    """Which block of the flat dQ buffer (in halves, two per query block) and of the lse2 /
    delta rows query block m of query head h adds into: dense, (batch, head)-major over n_m
    blocks; packed, the sequence's padded rows from block pb0, n_pad blocks per head."""
    if VARLEN:
        return (h * n_pad + pb0 + m) * 2
    else:
        return ((b * H_kv * GROUP + h) * n_m + m) * 2


@gluon.jit
def _consumer(HALF_ID: gl.constexpr, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
              ds_smem,
              dq_smem, kv_bar, ready, empty, ds_bar, dq_desc, DK, DV, b, h_kv, H_kv, GROUP,
              start_n, lo, mid, n_m, s_q, s_k, pb0, n_pad, k0, total_k, qk_scale, sm_scale,
              CAUSAL: gl.constexpr, STAGES: gl.constexpr, DQ_SPLIT_D: gl.constexpr,
              VARLEN: gl.constexpr):
    """One warpgroup: keys start_n + 64 * HALF_ID .. + 63 over every query block of the group
    (masked steps [lo, mid), unmasked [mid, n_m)); stores its rows of dK and dV.

    VARLEN (packed sequences, `bwd_sm90.attn_bwd_sm90_varlen_kernel`): s_q, s_k are the sequence's
    lengths; its query block m adds into flat dQ tiles (h * n_pad + pb0 + m) * 2 (the
    sequence's blocks start at padded block pb0 of each head's n_pad); a ragged last query
    block is a masked step too (its rows past s_q are the next sequence's); dK, dV rows go to
    packed rows k0 + key of head h_kv's total_k."""
    HEAD_D: gl.constexpr = q_smem.shape[4]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HALF: gl.constexpr = k_smem.shape[3]
    DTYPE: gl.constexpr = q_smem.dtype
    # Warpgroup-MMA register layouts over 4 warps (warp w owns rows 16w .. 16w + 15).
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_D, 16])
    pa_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    DQ_N: gl.constexpr = BLOCK_M if DQ_SPLIT_D else BLOCK_M // 2  # dQ^T columns per warpgroup
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DQ_N, 16])

    zero = s_k >> 31  # 0 (s_k >= 0) but a runtime value: see _q_step
    keys = start_n + HALF_ID * HALF + gl.arange(0, HALF, gl.SliceLayout(1, st_layout))
    dk = gl.zeros([HALF, HEAD_D], gl.float32, acc_layout)
    dv = gl.zeros([HALF, HEAD_D], gl.float32, acc_layout)
    mbarrier.wait(kv_bar, 0)

    it = 0
    # query blocks whose rows all lie inside the queries: packed, the blocks before the
    # sequence's ragged last one, whose rows past s_q (the next sequence's) are masked
    n_full = s_q // BLOCK_M if VARLEN else n_m
    for g in range(GROUP):
        h = h_kv * GROUP + g
        for m in range(lo, mid):  # the diagonal band (or every block of a ragged key block)
            blk = _dq_block(b, h, m, H_kv, GROUP, n_m, n_pad, pb0, VARLEN)
            dk, dv = _q_step(it, m * BLOCK_M, blk, dk, dv, zero, k_smem, v_smem,
                             q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem, ready,
                             empty, ds_bar, dq_desc, keys, s_k, s_q, qk_scale, HALF_ID,
                             st_layout, pa_layout, dq_layout, STAGES, True, CAUSAL,
                             DQ_SPLIT_D, VARLEN)
            it += 1
        for m in range(mid, n_full):  # every key of the block visible to every row
            blk = _dq_block(b, h, m, H_kv, GROUP, n_m, n_pad, pb0, VARLEN)
            dk, dv = _q_step(it, m * BLOCK_M, blk, dk, dv, zero, k_smem, v_smem,
                             q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem, ready,
                             empty, ds_bar, dq_desc, keys, s_k, s_q, qk_scale, HALF_ID,
                             st_layout, pa_layout, dq_layout, STAGES, False, CAUSAL,
                             DQ_SPLIT_D, VARLEN)
            it += 1
        if VARLEN:
            for m in range(gl.maximum(mid, n_full), n_m):  # the ragged last block, masked
                blk = _dq_block(b, h, m, H_kv, GROUP, n_m, n_pad, pb0, VARLEN)
                dk, dv = _q_step(it, m * BLOCK_M, blk, dk, dv, zero, k_smem, v_smem,
                                 q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem, ready,
                                 empty, ds_bar, dq_desc, keys, s_k, s_q, qk_scale, HALF_ID,
                                 st_layout, pa_layout, dq_layout, STAGES, True, CAUSAL,
                                 DQ_SPLIT_D, VARLEN)
                it += 1
    tma.store_wait(pendings=0)  # the last reduce has read its staging tile

    # ---- dK, dV: written once, in the inputs' dtype (rows past s_k dropped) ---------------------
    # Register stores under a mask: the rows of a key block past the sequence's end belong to
    # the next sequence (its program writes them), or lie past the tensor.
    rows = start_n + HALF_ID * HALF + gl.arange(0, HALF, gl.SliceLayout(1, acc_layout))
    offs_d = gl.arange(0, HEAD_D, gl.SliceLayout(0, acc_layout))
    if VARLEN:
        base = (h_kv.to(gl.int64) * total_k + k0) * HEAD_D
    else:
        base = (b * H_kv + h_kv).to(gl.int64) * s_k * HEAD_D
    offs = base + gl.expand_dims(rows, 1).to(gl.int64) * HEAD_D + gl.expand_dims(offs_d, 0)
    mask = gl.expand_dims(rows, 1) < s_k
    gl.store(DK + offs, (dk * sm_scale).to(DTYPE), mask=mask)
    gl.store(DV + offs, dv.to(DTYPE), mask=mask)


@gluon.jit
def one_block(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_desc, delta_desc, DK, DV, b, h_kv,
               H, H_kv, GROUP, start_n, s_q, s_k, q0, k0, pb0, n_pad, total_k, qk_scale,
               sm_scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr, DQ_SPLIT_D: gl.constexpr,
               VARLEN: gl.constexpr):
    """One program: keys start_n .. start_n + 127 of (batch b or packed sequence, key/value head
    h_kv) with s_q queries and s_k keys; its query-block range, shared memory, barriers and
    the warp-specialised partitions. ``q0``, ``k0``, ``pb0``, ``n_pad``, ``total_k``: where a
    packed sequence lies (VARLEN, see `_loader` and `_consumer`); 0 otherwise."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    HALF: gl.constexpr = k_desc.block_type.shape[2]
    DTYPE: gl.constexpr = q_desc.dtype
    n_m = (s_q + BLOCK_M - 1) // BLOCK_M
    if CAUSAL:
        lo = start_n // BLOCK_M  # rows before start_n see none of these keys
        # blocks with a row < start_n + 127 see part of the block: the mask
        mid = gl.minimum((start_n + 2 * HALF + BLOCK_M - 1) // BLOCK_M, n_m)
    else:
        lo = 0
        mid = 0
    if start_n + 2 * HALF > s_k:  # ragged key block: every step masks key >= s_k
        mid = n_m

    k_smem = gl.allocate_shared_memory(DTYPE, [2] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(DTYPE, [2] + v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(DTYPE, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(DTYPE, [STAGES] + do_desc.block_type.shape,
                                        do_desc.layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + lse_desc.block_type.shape,
                                         lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + delta_desc.block_type.shape,
                                           delta_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HALF], DTYPE)
    ds_smem = gl.allocate_shared_memory(DTYPE, [4, BLOCK_M, HALF], ds_layout)  # [buf * 2 + wg]
    dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape,
                                        dq_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival per consumer
    for i in gl.static_range(2):
        mbarrier.init(ds_bar.index(i), count=2)  # both halves of dS written

    # (constexprs go into each argument list literally, as in fwd_sm90)
    gl.warp_specialize(
        [(_consumer, (0, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem,
                      dq_smem,
                      kv_bar, ready, empty, ds_bar, dq_desc, DK, DV, b, h_kv, H_kv, GROUP,
                      start_n, lo, mid, n_m, s_q, s_k, pb0, n_pad, k0, total_k, qk_scale,
                      sm_scale, CAUSAL, STAGES, DQ_SPLIT_D, VARLEN)),
         (_consumer, (1, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem,
                      dq_smem,
                      kv_bar, ready, empty, ds_bar, dq_desc, DK, DV, b, h_kv, H_kv, GROUP,
                      start_n, lo, mid, n_m, s_q, s_k, pb0, n_pad, k0, total_k, qk_scale,
                      sm_scale, CAUSAL, STAGES, DQ_SPLIT_D, VARLEN)),
         (_loader, (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem,
                    k_smem, v_smem, lse_smem, delta_smem, kv_bar, ready, empty, b, H, h_kv,
                    GROUP, start_n, lo, n_m, q0, k0, pb0 * BLOCK_M, STAGES, VARLEN))],
        [4, 1], [CONSUMER_REGS, LOADER_REGS])


@gluon.jit
def grid_order(HEADS_PER_GROUP, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(first key of this program's block, its (batch or sequence, key/value head) index).
    Without the mask, head-major (grid (key blocks, heads)): the programs running side by side
    share their heads' Q and dO in L2. With the causal mask, key block j has n_m - j // 2
    query blocks of work, so each group of HEADS_PER_GROUP heads launches longest first (every
    head's block 0, then every head's block 1, ...; grid (HEADS_PER_GROUP * key blocks,
    groups)): the short programs fill each group's last wave, and the programs side by side
    still share few heads' Q, dO and dQ rows in L2 (`bwd_sm90.head_group`)."""
    if CAUSAL:
        i = gl.program_id(0)
        start_n = (i // HEADS_PER_GROUP) * BLOCK_N
        pair = gl.program_id(1) * HEADS_PER_GROUP + i % HEADS_PER_GROUP
    else:
        start_n = gl.program_id(0) * BLOCK_N
        pair = gl.program_id(1)
    return start_n, pair
