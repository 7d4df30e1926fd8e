"""FlashAttention backward for Hopper (sm_90), written in Gluon: the gradients of ``bwd.py``
with FlashAttention-3's schedule (Shah et al. 2024, arXiv 2407.08608, section 3 and
Appendix B.1), spelled out by hand.

What one program does
---------------------
One program owns one block of BLOCK_N = 128 keys of one (batch, key/value head). It keeps its
K and V tiles in shared memory and its dK, dV accumulators (fp32) in registers for the whole
walk over the query blocks of every query head of the GQA group, so dK and dV are written once,
complete, with no reduction afterwards. dQ gets this key block's share of every query block,
added into a zeroed fp32 buffer with the copy engine's bulk reduce-add (FA3 accumulates its
dQ in global memory with atomic adds the same way, section 3 / Appendix B.1), then cast.

Roles, split by ``gl.warp_specialize`` (as in ``fwd_sm90.py``; their device code is in
``bwd_sm90_partitions.py``, the kernels, the small Triton kernels and the host side here):

* a loader warp issues every copy through the copy engine (TMA): K and V (two halves of 64 rows
  each, one per consumer), then Q_i, dO_i and the rows' lse2 and delta of query block
  i = lo, lo + 1, ... into a ring of STAGES slots; a slot is refilled once both consumers have
  released it (lse2 is the forward's; delta comes from `_stats_kernel`, which also zeroes the
  dQ buffer: one small launch before this kernel);
* two consumer warpgroups, warpgroup w owning keys 64w .. 64w + 63 of the block (FA3 tiles
  its MMA warpgroups along the key dimension for S and dP). Per query block of BLOCK_M rows,
  in the transposed domain (rows = this warpgroup's keys, columns = queries):

      S^T  = K_w Q^T,   dP^T = V_w dO^T          (both issued at once, asynchronous)
      P^T  = exp2(S^T * scale * log2 e - lse2)   (masked on the diagonal / ragged keys)
      dV_w += P^T dO                             (P^T from registers, asynchronous)
      dS^T = P^T * (dP^T - delta)                (overlaps the dV product)
      dS^T -> shared memory (for dQ)
      -- both warpgroups have written their half of dS (an mbarrier with two arrivals) --
      dQ^T half w = K^T dS^T                     (K = 128 keys; d = 64: query columns
                                                   32w .., M = d, N = BLOCK_M / 2; d = 128,
                                                   DQ_SPLIT_D: rows 64w .. of d, M = d / 2,
                                                   N = BLOCK_M)
      dK_w += dS^T Q                             (dS^T from registers; issued after dQ's
                                                   product, it runs while the warpgroup stores
                                                   dQ^T: FA3's and FA4's order)
      dQ^T half -> shared memory (fp32, in register order) -> one bulk reduce-add into
                                                  the block's 4,096 floats of an fp32 buffer
                                                  (`flat_tile`), decoded, scaled and cast at
                                                  the end (`_flat_cast_kernel`)

  The dQ product runs with M = d or d / 2 (``dQ^T``, FA3's "dQ_swapAB") so that the two
  warpgroups can split its output without the 64-row minimum of a warpgroup MMA: at d = 128
  each holds a (d / 2, BLOCK_M) accumulator, 32 registers per thread, next to dK_w and dV_w
  (64 each); split by rows of d its operands take a third less shared-memory traffic than
  split by queries, and it measured 1.21-1.26x faster (attnmem/kernels/flash/NOTES.md, "dQ^T split
  between the warpgroups by rows of d"). dS lives in a double buffer, so a warpgroup may write
  the next block's half while the other still reads the previous one (it cannot get two
  blocks ahead: each warpgroup waits for the other's arrival every block).

Masks (top-left causal alignment, as ``bwd.py``): query blocks above the diagonal are never
visited (the loop starts at the block holding query row start_n); blocks that cross the
diagonal run with the mask ``query >= key``; a key block that crosses the end of the keys
masks ``key < s_k`` on every step (the copy engine fills rows past s_k with zeros, whose
scores 0 would otherwise get probability exp2(-lse2)). Query rows past s_q need no mask:
the copy engine reads their Q, dO, lse2 and delta as zeros, so P = 1 there but dV gains
P^T dO = 0 and dS = P (dP - delta) = 0, so their share of dQ is zero (it lands in the
buffer's padding past s_q, which the final cast does not read).

dQ staging is FA4's (attnmem/kernels/flash/NOTES.md, "DQ_FLAT" and "DQ_FLAT kept, the others
deleted"): each warpgroup's 64 x 64 fp32 partial goes to an unswizzled shared tile in register order (16-byte stores, no bank conflicts) and one
bulk reduce-add per partial into a flat buffer, B * H * ceil(s_q / BLOCK_M) * BLOCK_M * d
floats (s_q rounded up to the query block, `dq_buffer_rows`); 1.05-1.23x the backward alone
against the swizzled dQ^T tile it replaced (H200). FA4's early lse/delta reads
(EARLY_STATS) and a polynomial exp2 in the forward measured slower and are gone (same section).

Scope: compute capability 9.x, fp16/bf16, d in {64, 128}, inputs whose layout a TMA
descriptor can describe (`usable`). The Triton backward (``bwd.py``) covers the rest.

Packed sequences (``flash_attention(..., cu_seqlens=...)``) run a sibling kernel,
``attn_bwd_sm90_varlen_kernel``, on the same partitions with VARLEN (FlashAttention-3's varlen
backward, Shah et al. 2024, arXiv 2407.08608, and its ``hopper/`` code, has this structure):
grid (key blocks of the longest sequence, sequences x key/value heads), as
`bwd.packed_backward`'s dK/dV kernel; a program reads its sequence's starts and lengths and
returns at once past its end. The descriptors span the packed rows, so a block running past
the sequence's end reads the next sequence: its keys are masked as the ragged tail's (P = 0),
and the query block where the sequence ends runs as a masked step whose rows past s_q get
P = 0 (so dS = 0 and they add nothing to dK, dV or dQ). dK, dV leave by masked register
stores, as in the dense kernel, so a key block's rows past the end (another program's) are
never written. lse2 and delta are read from copies in padded rows, and dQ is summed in a
flat buffer of the same padded rows (`packed_pad_rows`: sequence i's rows start at
((cu_seqlens[i] + i * BLOCK_M) // BLOCK_M) * BLOCK_M, FA3's padded offsets), so each query
block of a sequence owns whole 4,096-float partials and no reduce-add reaches another
sequence's rows; `_stats_varlen_kernel` fills the copies and zeroes the sequence's tiles,
`_flat_cast_varlen_kernel` maps them back to packed rows. Its dense counterpart's PTX is
unchanged by the VARLEN branches (every dense variant hashes as before).

Status: compiles for sm_90 with Triton 3.6 and 3.9 (attnmem/kernels/dev/compile_bwd_sm90.py). The
consumers run at 240 registers (the first at 256), dK and dV taking 128 of them; with the K and
V descriptors rebuilt every step (`bwd_sm90_partitions._q_step`) ptxas spills nothing at d = 128 and 16-56 bytes
at d = 64 with Triton 3.6 (3.9: 0-8 and 32-56), almost none of it inside the loops (attnmem/kernels/flash/
NOTES.md, "where the backward's time goes (ncu)").
Correctness and speed on the H200: attnmem/kernels/dev/bwd_sm90_check.py and tests/kernels/
test_bwd_sm90.py (packed: tests/kernels/test_bwd_sm90_varlen.py, whose ``__main__`` prints the
packed variants' registers and spills). Chosen by attnmem.kernels.flash.route (`backward_route`).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from attnmem.calc import dispatch
from attnmem.kernels.flash import common
from attnmem.kernels.flash.bwd_sm90_partitions import grid_order, one_block
from attnmem.kernels.flash.launcher import DirectLauncher

LOG2E = 1.4426950408889634

HEAD_DIMS = (64, 128)
BLOCK_N = 128  # keys per program: two consumer warpgroups of 64
HALF_N = BLOCK_N // 2
NUM_WARPS = 4  # the default partition (first consumer); + 4 (second consumer) + 1 (loader)
# (BLOCK_M, STAGES) per head dim: query rows per step and ring slots of Q and dO each.
# Shared memory at d = 128: K, V 64 KiB; ring 2 * (16 + 16 + 0.5) KiB; dS 2 * 2 * 8 KiB;
# dQ staging (flat) 2 * 16 KiB; 193 KiB in all as compiled (of the 227 a block may use; 3 stages:
# 226 KiB, no faster: attnmem/kernels/flash/NOTES.md, "the Hopper region"). At d = 64 BLOCK_M = 128
# (as FA3 and FA4 take it): the S^T and dP^T products are N = 128 wide; 194 KiB (BLOCK_M = 64:
# 113 KiB, 3-17% slower on the H200, same section), though it then spilled 100-240 bytes under
# Triton 3.6 where 64 spilled none (16-56 since the descriptors are rebuilt every step: NOTES.md,
# "where the backward's time goes (ncu)").
TILES = {64: (128, 2), 128: (64, 2)}
# How the two warpgroups share dQ^T = K^T dS^T (d x BLOCK_M, over the 128 keys), by head dim:
# False, each takes half of the query columns (M = d, N = BLOCK_M / 2: at d = 128 two m64n32
# products whose shared-memory operands, 3 KiB per 16 keys, take longer to read than the
# tensor cores take to multiply them); True, each takes half of the rows of d (M = d / 2,
# N = BLOCK_M: 4 KiB per 16 keys for twice the work, a third less shared-memory traffic; its
# staging tile's 256-byte rows go out as two copy-engine boxes). Measured: NOTES.md, "dQ^T split
# between the warpgroups by rows of d".
DQ_SPLIT_D = {64: False, 128: True}


@gluon.jit(do_not_specialize=["s_q", "s_k"])
def attn_bwd_sm90_kernel(
    q_desc, k_desc, v_desc, do_desc,  # rank-4 over (B, H or H_kv, s, d); tiles [1, 1, rows, d]
    dq_desc,  # the zeroed flat fp32 dQ buffer as (B * H * n_m * 2 * 128, 32), tiles [128, 32]
    # unswizzled: partial u of query block m of (b, h) at rows ((b H + h) n_m + m) 2 + u (`flat_tile`)
    lse_desc, delta_desc,  # (B * H, s_q) fp32: the forward's lse2, and delta (`_stats_kernel`);
    # tiles [1, BLOCK_M]
    DK, DV,  # outputs (B, H_kv, s_k, d), contiguous, written in full
    H, H_kv, GROUP,  # query heads, key/value heads, H // H_kv
    HEADS_PER_GROUP,  # causal grid order: (batch, key/value head)s launched together (`head_group`)
    s_q, s_k,
    qk_scale,  # scale * log2(e)
    sm_scale,  # scale
    CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,  # ring slots of Q and of dO
    DQ_SPLIT_D: gl.constexpr,  # dQ^T split between the warpgroups by rows of d (else by queries)
    num_warps: gl.constexpr,  # 4: the default partition is the first consumer warpgroup
):
    HALF: gl.constexpr = k_desc.block_type.shape[2]
    gl.static_assert(2 * HALF == 128)

    start_n, bhk = grid_order(HEADS_PER_GROUP, 2 * HALF, CAUSAL)
    b = bhk // H_kv
    h_kv = bhk % H_kv
    one_block(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_desc, delta_desc, DK, DV, b, h_kv,
               H, H_kv, GROUP, start_n, s_q, s_k, 0, 0, 0, 0, 0, qk_scale, sm_scale, CAUSAL,
               STAGES, DQ_SPLIT_D, False)


@gluon.jit(do_not_specialize=["total_k", "n_pad"])
def attn_bwd_sm90_varlen_kernel(
    q_desc, k_desc, v_desc, do_desc,  # rank-4 over (1, H or H_kv, total, d); tiles [1, 1, rows, d]
    dq_desc,  # the zeroed flat fp32 dQ buffer, (H * n_pad * 2 * 128, 32), tiles [128, 32]:
    # partial u of the sequence's query block m of head h at rows ((h n_pad + pb0 + m) 2 + u)
    lse_desc, delta_desc,  # (H, n_pad * BLOCK_M) fp32 in the padded rows; tiles [1, BLOCK_M]
    DK, DV,  # outputs (1, H_kv, total_k, d), contiguous
    CU_Q, CU_K,  # int32 (n_seq + 1,) starts of the packed sequences' query / key rows
    H, H_kv, GROUP,  # query heads, key/value heads, H // H_kv
    HEADS_PER_GROUP,  # causal grid order: (sequence, key/value head)s launched together
    total_k,  # packed key rows
    n_pad,  # padded query blocks per head (`packed_pad_rows` / BLOCK_M)
    qk_scale,  # scale * log2(e)
    sm_scale,  # scale
    CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,
    DQ_SPLIT_D: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Packed sequences (`attention_backward_sm90_packed`), FlashAttention-3's varlen backward
    on the dense kernel's partitions: grid (key blocks of the longest sequence, sequences x
    key/value heads), as the portable varlen kernels (`bwd.packed_backward`), reordered as the
    dense kernel's with the causal mask. A program reads
    its sequence's start and lengths from CU_Q, CU_K and returns at once past its end; inside,
    it is the dense program on one sequence, its tiles loaded at the sequence's first rows.
    Its queries' lse2, delta and dQ sums live in padded rows, the sequence's first at padded
    block pb0 = q0 // BLOCK_M + seq (FA3's padded offsets: ((q0 + seq * BLOCK_M) // BLOCK_M)
    * BLOCK_M rows), so no query block of one sequence shares a 4,096-float dQ partial with
    another's and every reduce-add stays inside its own sequence's rows."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    HALF: gl.constexpr = k_desc.block_type.shape[2]
    gl.static_assert(2 * HALF == 128)
    # the dense kernel's grid order over (sequence, key/value head) pairs: a wave does not end
    # on a long sequence's first key block
    start_n, sh = grid_order(HEADS_PER_GROUP, 2 * HALF, CAUSAL)
    seq = sh // H_kv
    h_kv = sh % H_kv
    q0 = gl.load(CU_Q + seq)
    s_q = gl.load(CU_Q + seq + 1) - q0
    k0 = gl.load(CU_K + seq)
    s_k = gl.load(CU_K + seq + 1) - k0
    if start_n < s_k:  # the grid is sized for the longest sequence: shorter ones stop here
        pb0 = q0 // BLOCK_M + seq
        one_block(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_desc, delta_desc, DK, DV, 0,
                   h_kv, H, H_kv, GROUP, start_n, s_q, s_k, q0, k0, pb0, n_pad, total_k,
                   qk_scale, sm_scale, CAUSAL, STAGES, DQ_SPLIT_D, True)


# ---- delta = rowsum(dO * O) and the dQ buffer's zeroing: one small launch ------------------

@triton.jit(do_not_specialize=["s_q", "s_pad"])
def _stats_kernel(Out, DO, DELTA, DQ_ACC,
                  stride_ob, stride_oh, stride_om,
                  stride_dob, stride_doh, stride_dom,
                  H, s_q, s_pad, HEAD_D: tl.constexpr, BLOCK: tl.constexpr):
    """For BLOCK rows of one (batch, head): DELTA[bh, row] = rowsum(dO * O) in fp32, (B * H, s_q),
    and zeros into BLOCK x d floats of (batch, head)'s share of the flat fp32 dQ buffer,
    s_pad x d floats from bh * s_pad * d (s_pad = s_q rounded up to the backward's query
    block, a multiple of BLOCK; the grid covers s_pad rows), which the backward adds into
    (one launch, not two)."""
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_D)
    inside = rows < s_q
    mask = inside[:, None]
    o = tl.load(Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
                + rows[:, None] * stride_om + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
                 + rows[:, None] * stride_dom + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * s_q + rows, delta, mask=inside)
    tl.store(DQ_ACC + (bh.to(tl.int64) * s_pad + rows[:, None]) * HEAD_D + offs_d[None, :],
             tl.zeros([BLOCK, HEAD_D], tl.float32))


# ---- host side ------------------------------------------------------------------------------

_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
STATS_ROWS = 64
# lse2/delta tiles [2, BLOCK_M] fp32 come unswizzled: they are read row by row, never by a MMA;
# so do the [128, 32] dQ staging tiles (a flat run of 16 KiB in register order)
STATS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
FLAT_ROWS = 128  # a dQ partial, 4,096 floats, as the copy engine's [128, 32] box


def flat_tile(part: torch.Tensor) -> torch.Tensor:
    """A warpgroup's 64 x 64 dQ^T partial (rows: its rows of d, or every row of d at d = 64;
    columns: its queries) as the kernel stores it, (128, 32): the kernel's reshape and permute in
    torch's (row-major) terms, which Gluon's follow. Tests build the flat buffer with it."""
    return part.reshape(4, 2, 8, 8, 4, 2).permute(3, 0, 2, 4, 1, 5).reshape(FLAT_ROWS, 32)


@triton.jit
def _flat_offset(qi, dd, SPLIT_D: tl.constexpr):
    """(u, float within partial u) of dQ element (query qi of a block, column dd of d) in a
    query block's two flat partials (`flat_tile`: element (r, c) of a partial is float
    512 (c // 8) + 128 (r // 16) + 16 (r % 8) + 4 (c // 2 % 4) + 2 (r // 8 % 2) + c % 2).
    u is the half of d (SPLIT_D, d = 128) or of the block's queries (d = 64); both casts
    decode with it."""
    if SPLIT_D:
        u, r, c = dd // 64, dd % 64, qi
    else:
        u, r, c = qi // 64, dd, qi % 64
    inner = (512 * (c // 8) + 128 * (r // 16) + 16 * (r % 8) + 4 * (c // 2 % 4)
             + 2 * (r // 8 % 2) + c % 2)
    return u, inner


@triton.jit(do_not_specialize=["s_q"])
def _flat_cast_kernel(ACC, DQ, scale, s_q, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr,
                      SPLIT_D: tl.constexpr):
    """dQ (B, H, s_q, d), contiguous, in DQ's dtype = scale x the flat dQ buffer: program
    (m, bh) decodes the two 4,096-float partials of query block m of (batch, head) bh, tile
    (bh * n_m + m) * 2 + u (`_flat_offset`). n_m = ceil(s_q / BLOCK_M): rows of the last
    block past s_q (the buffer's padding) are not written."""
    m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    n_m = (s_q + BLOCK_M - 1) // BLOCK_M
    qi = tl.arange(0, BLOCK_M)[:, None]  # query within the block
    dd = tl.arange(0, HEAD_D)[None, :]
    u, inner = _flat_offset(qi, dd, SPLIT_D)
    acc = tl.load(ACC + ((bh * n_m + m) * 2 + u) * 4096 + inner)
    rows = m * BLOCK_M + qi
    tl.store(DQ + (bh * s_q + rows) * HEAD_D + dd, (acc * scale).to(DQ.dtype.element_ty),
             mask=rows < s_q)


def _strides(t: torch.Tensor) -> list[int]:
    """t's strides, with those of size-1 dims replaced by the packed value (a view's arbitrary
    stride there addresses nothing but could upset the descriptor's encoding)."""
    st = list(t.stride())
    for i in (2, 1, 0):
        if t.shape[i] == 1:
            st[i] = st[i + 1] * t.shape[i + 1]
    return st


def _descriptor_ok(t: torch.Tensor) -> bool:
    """A unit last stride, positive strides that are multiples of 16 bytes, a 16-byte aligned
    base (cuTensorMapEncodeTiled's rules)."""
    st, e = _strides(t), t.element_size()
    return (st[3] == 1 and all(s > 0 and (s * e) % 16 == 0 for s in st[:3])
            and t.data_ptr() % 16 == 0)


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor | None = None,
           o: torch.Tensor | None = None) -> bool:
    """Whether this backward can run these inputs: a CUDA device of compute capability 9.x,
    fp16/bf16, d in HEAD_DIMS, B * H_kv and the key blocks within a grid dimension's
    `dispatch.GRID_Y_MAX`, and q, k, v (and dO, O when given) in layouts a TMA descriptor can
    describe (O and dO also need unit last strides for the delta kernel, which the descriptor
    rule implies)."""
    if q.device.type != "cuda" or q.dtype not in _GL_DTYPES or q.shape[3] not in HEAD_DIMS:
        return False
    grid = dispatch.GRID_Y_MAX
    if q.shape[0] * k.shape[1] > grid or k.shape[2] > grid * BLOCK_N:
        return False
    if q.shape[2] % 4:  # lse2 and delta rows of s_q fp32: 16-byte strides for the copy engine
        return False
    idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if torch.cuda.get_device_capability(idx)[0] != 9:
        return False
    return all(_descriptor_ok(t) for t in (q, k, v, do, o) if t is not None)


def usable_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  do: torch.Tensor | None = None, o: torch.Tensor | None = None) -> bool:
    """Whether the packed backward (`attention_backward_sm90_packed`) can run these inputs (q
    (1, H, total_q, d), k, v (1, H_kv, total_k, d)): `usable`'s rules except the one on the
    query count (lse2 and delta are read from padded copies whose rows are 16-byte aligned,
    so any total runs); the grid's limit on sequences x heads is the route's
    (`route.GRID_Y_MAX`)."""
    if q.device.type != "cuda" or q.dtype not in _GL_DTYPES or q.shape[3] not in HEAD_DIMS:
        return False
    idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if torch.cuda.get_device_capability(idx)[0] != 9:
        return False
    return all(_descriptor_ok(t) for t in (q, k, v, do, o) if t is not None)


_LAYOUTS: dict = {}


def _layout(dtype, shape: tuple):
    key = (dtype, shape)
    lay = _LAYOUTS.get(key)
    if lay is None:
        lay = _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for(list(shape), dtype)
    return lay


def _descriptor(t: torch.Tensor, block: tuple, layout) -> TensorDescriptor:
    """A descriptor of all of t (rank 2 or 4) with tiles ``block``. Built without the
    dataclass's checks, which are slow on the launch path: `usable` checked q, k, v, dO (and
    the host code makes contiguous what it must); the fp32 buffers are fresh allocations."""
    desc = TensorDescriptor.__new__(TensorDescriptor)
    desc.base, desc.shape = t, list(t.shape)
    desc.strides = _strides(t) if t.dim() == 4 else list(t.stride())
    desc.block_shape, desc.layout, desc.padding = list(block), layout, "zero"
    return desc


# ---- launching without the JIT's dispatch (launcher.DirectLauncher) -------------------------
# Each key holds what the JIT specialises on for the arguments passed (the descriptors' dtype,
# tiles and layout; the integers equal to 1 or multiples of 16; the constexprs; the 16-byte
# alignment of pointers the caller owns). s_q and s_k are marked do_not_specialize; DELTA,
# DQ_ACC, DK, DV are fresh allocations (aligned). The descriptors go as
# (tensor, block, layout) tuples: on Triton 3.6 a call on the same tensors as before reuses
# their encoded tensor maps.
STATS_LAUNCHER = DirectLauncher(_stats_kernel)
FLAT_CAST_LAUNCHER = DirectLauncher(_flat_cast_kernel)
LAUNCHER = DirectLauncher(attn_bwd_sm90_kernel, descriptor=_descriptor)


def _int_spec(x: int) -> tuple[bool, bool]:
    return x == 1, x % 16 == 0


# What the programs of one causal group read and add, per (batch, key/value head), may take
# this much of the H200's 60 MB L2 (`head_group`).
GROUP_L2_BYTES = 24 << 20


@functools.lru_cache(maxsize=1024)  # on every causal backward's host path
def head_group(heads: int, group: int, s_q: int, s_k: int, d: int, sms: int) -> int:
    """How many (batch, key/value head)s of a causal backward launch together, longest key
    block first (the kernel's grid order), among the divisors of ``heads`` (= B * H_kv): the
    largest whose heads' Q and dO (16-bit) and fp32 dQ rows, 8 * s_q * d bytes per query head
    of the ``group``, fit in GROUP_L2_BYTES (at least 1); raised, where that group has fewer
    key-block programs than the GPU has SMs (``sms``), to the smallest that fills them. All
    heads in one group is the plain longest-first order, which streams every head's Q and dO
    from memory once a wave holds more heads than L2 holds (attnmem/kernels/flash/NOTES.md, "Grid
    order of the causal backward")."""
    n_kb = -(-s_k // BLOCK_N)
    divisors = [g for g in range(1, heads + 1) if heads % g == 0]
    cap = max(1, GROUP_L2_BYTES // (8 * s_q * d * group))
    best = max(g for g in divisors if g <= cap)
    if best * n_kb < sms:
        best = min((g for g in divisors if g * n_kb >= sms), default=heads)
    return best


_SMS: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _SMS.get(idx)
    if n is None:
        n = _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def dq_buffer_rows(s_q: int, d: int) -> int:
    """Query rows of the flat fp32 dQ buffer per (batch, head): s_q rounded up to the query
    block (TILES), as attnmem.calc.dispatch.sm90_dq_rows counts them."""
    bm = TILES[d][0]
    return -(-s_q // bm) * bm


def attention_backward_sm90(do, q, k, v, o, lse2, causal: bool, scale: float):
    """Gradients (dq, dk, dv) in the inputs' dtype and shapes, as bwd.triton_backward
    returns them: q, o, do (B, H, s_q, d), k, v (B, H_kv, s_k, d), lse2 (B, H, s_q) fp32 the
    forward's base-2 log-sum-exp, ``scale`` the softmax scale. Check `usable` first. The
    schedule is this module's: TILES and DQ_SPLIT_D by head dim, the grid order by the causal
    flag.

    Allocates in the order of the Triton backward's atomic-dQ path (bwd.triton_backward),
    so that calc's peak model holds: delta (B * H, s_q) fp32, dK and dV (contiguous), the flat
    fp32 buffer dQ is added into (B * H * `dq_buffer_rows` * d floats: s_q rounded up to the
    query block, which attnmem.calc.peak counts in the Hopper region; zeroed by the delta kernel; alive
    until the cast), then dQ. dQ is nondeterministic in its last bits (the adds land in any
    order), as in FA2, FA3 and cuDNN.
    """
    B, H, s_q, d = q.shape
    H_kv, s_k = k.shape[1], k.shape[2]
    bm, st = TILES[d]
    sd = DQ_SPLIT_D[d]
    causal = bool(causal)
    if not _descriptor_ok(do):  # e.g. the expanded (stride-0) gradient of a sum()
        do = do.contiguous()
    if o.stride(3) != 1:  # the stats kernel reads rows of O with unit stride
        o = o.contiguous()
    lse2 = lse2.contiguous()
    n_m = -(-s_q // bm)
    s_pad = n_m * bm
    delta = common.empty(q, (B * H, s_q), torch.float32)
    dk = common.empty(k, k.shape)  # contiguous
    dv = common.empty(v, v.shape)
    dq_acc = common.empty(q, (B * H * s_pad * d // 32, 32), torch.float32)  # flat partials
    so, sdo = o.stride(), do.stride()
    h_spec = _int_spec(H)
    STATS_LAUNCHER(
        (s_pad // STATS_ROWS, B * H),
        ("stats", q.dtype, d, so[:3], sdo[:3], h_spec, o.data_ptr() % 16, do.data_ptr() % 16),
        (o, do, delta, dq_acc, so[0], so[1], so[2], sdo[0], sdo[1], sdo[2], H, s_q, s_pad),
        {"HEAD_D": d, "BLOCK": STATS_ROWS, "num_warps": 4})
    n_kb = -(-s_k // BLOCK_N)
    gdt = _GL_DTYPES[q.dtype]
    lay_m, lay_n = _layout(gdt, (1, 1, bm, d)), _layout(gdt, (1, 1, HALF_N, d))
    group = H // H_kv
    hg = head_group(B * H_kv, group, s_q, s_k, d, _sm_count(q.device)) if causal else 1
    grid = (hg * n_kb, B * H_kv // hg) if causal else (n_kb, B * H_kv)  # the kernel's order
    args = ((q, (1, 1, bm, d), lay_m), (k, (1, 1, HALF_N, d), lay_n),
            (v, (1, 1, HALF_N, d), lay_n), (do, (1, 1, bm, d), lay_m),
            (dq_acc, (FLAT_ROWS, 32), STATS_LAYOUT),
            (lse2.view(B * H, s_q), (1, bm), STATS_LAYOUT),
            (delta, (1, bm), STATS_LAYOUT),
            dk, dv, H, H_kv, group, hg, s_q, s_k, scale * LOG2E, scale)
    consts = {"CAUSAL": causal, "STAGES": st, "DQ_SPLIT_D": sd, "num_warps": NUM_WARPS}
    key = ("bwd", q.dtype, d, bm, st, causal, sd, h_spec, _int_spec(H_kv), _int_spec(group),
           _int_spec(hg))
    LAUNCHER(grid, key, args, consts)
    dq = common.empty(q, (B, H, s_q, d))
    # the kernel adds K^T dS^T unscaled: one decode-scale-cast in fp32, written in the inputs'
    # dtype, no temporary
    FLAT_CAST_LAUNCHER((n_m, B * H), ("flat", q.dtype, d, bm, sd),
                       (dq_acc, dq, scale, s_q),
                       {"HEAD_D": d, "BLOCK_M": bm, "SPLIT_D": sd, "num_warps": 4})
    return dq, dk, dv


# ---- packed sequences (cu_seqlens) ------------------------------------------------------------

@triton.jit(do_not_specialize=["total_q", "n_rows"])
def _stats_varlen_kernel(Out, DO, LSE2, STATS, DQ_ACC, CU_Q,
                         stride_oh, stride_om, stride_doh, stride_dom,
                         H, total_q, n_rows, HEAD_D: tl.constexpr, BLOCK: tl.constexpr):
    """Packed sequences: for query block m (BLOCK rows, the backward's BLOCK_M) of sequence
    seq, head h (program (m, seq * H + h)), the padded rows pad = (q0 // BLOCK + seq) * BLOCK
    + m * BLOCK .. (`attn_bwd_sm90_varlen_kernel`): STATS[0, h, pad] = lse2 (copied from the
    packed (1, H, total_q) rows), STATS[1, h, pad] = delta = rowsum(dO * O) in fp32 (both 0
    for rows past the sequence's end, which the backward masks), and zeros into the block's
    BLOCK x d floats of the flat dQ buffer, which the backward adds into. STATS is (2, H,
    n_rows) fp32, DQ_ACC H * n_rows * d fp32. Blocks past the sequence's end return."""
    m = tl.program_id(0)
    sh = tl.program_id(1)
    seq = sh // H
    h = sh % H
    q0 = tl.load(CU_Q + seq)
    s_q = tl.load(CU_Q + seq + 1) - q0
    if m * BLOCK < s_q:
        rows = m * BLOCK + tl.arange(0, BLOCK)
        offs_d = tl.arange(0, HEAD_D)
        inside = rows < s_q
        mask = inside[:, None]
        packed = (q0 + rows).to(tl.int64)
        o = tl.load(Out + h.to(tl.int64) * stride_oh + packed[:, None] * stride_om
                    + offs_d[None, :], mask=mask, other=0.0)
        do = tl.load(DO + h.to(tl.int64) * stride_doh + packed[:, None] * stride_dom
                     + offs_d[None, :], mask=mask, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        lse = tl.load(LSE2 + h.to(tl.int64) * total_q + packed, mask=inside, other=0.0)
        pad = h.to(tl.int64) * n_rows + (q0 // BLOCK + seq + m).to(tl.int64) * BLOCK \
            + tl.arange(0, BLOCK)
        tl.store(STATS + pad, lse)
        tl.store(STATS + n_rows.to(tl.int64) * H + pad, delta)  # H may be a constexpr 1
        tl.store(DQ_ACC + pad[:, None] * HEAD_D + offs_d[None, :],
                 tl.zeros([BLOCK, HEAD_D], tl.float32))


@triton.jit(do_not_specialize=["total_q", "n_pad"])
def _flat_cast_varlen_kernel(ACC, DQ, CU_Q, scale, H, total_q, n_pad, HEAD_D: tl.constexpr,
                             BLOCK_M: tl.constexpr, SPLIT_D: tl.constexpr):
    """Packed sequences: dQ (1, H, total_q, d), contiguous, in DQ's dtype = scale x the flat
    dQ buffer, as `_flat_cast_kernel` decodes it; program (m, seq * H + h) decodes query block
    m of sequence seq, head h, whose partials are tiles (h * n_pad + q0 // BLOCK_M + seq + m)
    * 2 + u (`attn_bwd_sm90_varlen_kernel`), into the sequence's packed rows q0 + m * BLOCK_M
    .. (rows past its end, which are the next sequence's, not written)."""
    m = tl.program_id(0)
    sh = tl.program_id(1)
    seq = sh // H
    h = sh % H
    q0 = tl.load(CU_Q + seq)
    s_q = tl.load(CU_Q + seq + 1) - q0
    if m * BLOCK_M < s_q:
        qi = tl.arange(0, BLOCK_M)[:, None]  # query within the block
        dd = tl.arange(0, HEAD_D)[None, :]
        u, inner = _flat_offset(qi, dd, SPLIT_D)
        tile = (h.to(tl.int64) * n_pad + q0 // BLOCK_M + seq + m) * 2
        acc = tl.load(ACC + (tile + u) * 4096 + inner)
        rows = m * BLOCK_M + qi
        tl.store(DQ + (h.to(tl.int64) * total_q + q0 + rows) * HEAD_D + dd,
                 (acc * scale).to(DQ.dtype.element_ty), mask=rows < s_q)


def packed_pad_rows(total_q: int, n_seq: int, d: int) -> int:
    """Padded query rows per head of the packed backward's flat dQ buffer and of its lse2 and
    delta copies (FlashAttention-3's padded total, `attnmem.calc.dispatch.sm90_packed_pad_rows`, the one
    copy attnmem.calc.peak counts too); sequence i's rows start at ((cu_seqlens[i] + i * BLOCK_M) //
    BLOCK_M) * BLOCK_M, so each sequence's query blocks own whole dQ tiles."""
    assert dispatch.SM90_QUERY_BLOCK[d] == TILES[d][0]
    return dispatch.sm90_packed_pad_rows(total_q, n_seq, d)


STATS_VARLEN_LAUNCHER = DirectLauncher(_stats_varlen_kernel)
FLAT_CAST_VARLEN_LAUNCHER = DirectLauncher(_flat_cast_varlen_kernel)
# Keys as LAUNCHER's, plus the cu_seqlens tensors' 16-byte alignment (pointer arguments);
# total_k and n_pad are not specialised.
LAUNCHER_VARLEN = DirectLauncher(attn_bwd_sm90_varlen_kernel, descriptor=_descriptor)


def attention_backward_sm90_packed(do, q, k, v, o, lse2, causal: bool, scale: float, packed):
    """Gradients (dq, dk, dv) of packed sequences (`common.Packed`, checked by
    `api.flash_attention`), as `bwd.packed_backward` returns them: q, o, do (1, H, total_q,
    d), k, v (1, H_kv, total_k, d), any strides `usable_packed` accepts (a (total, H, d)
    tensor's transposed view among them), lse2 (1, H, total_q) fp32 the forward's.

    Allocates, in order: the padded lse2 and delta copies, (2, H, P) fp32 with P =
    `packed_pad_rows` (lse2's own rows need no 16-byte row stride then, so any total_q
    runs); dK and dV (contiguous); the flat fp32 dQ buffer, H * P * d floats (zeroed by the
    stats kernel in the sequences' blocks, alive until the cast); then dQ (1, H, total_q, d),
    contiguous. attnmem.calc.peak.varlen_peak_bytes counts these where attnmem.calc.dispatch.sm90_packed
    says this backward runs. Grids: stats and cast (ceil(max_q / BLOCK_M), n_seq * H), the
    backward (ceil(max_k / 128), n_seq * H_kv), or with the causal mask the dense kernel's
    longest-first order over head groups (`head_group`)."""
    _, H, total_q, d = q.shape
    H_kv, total_k = k.shape[1], k.shape[2]
    bm, st = TILES[d]
    sd = DQ_SPLIT_D[d]
    causal = bool(causal)
    if not _descriptor_ok(do):
        do = do.contiguous()
    if o.stride(3) != 1:
        o = o.contiguous()
    lse2 = lse2.contiguous()
    n_seq = packed.n_seq
    cu_q, cu_k = packed.cu_q, packed.cu_k
    rows = packed_pad_rows(total_q, n_seq, d)
    n_pad = rows // bm
    stats = common.empty(q, (2, H, rows), torch.float32)  # lse2, delta in the padded rows
    dk = common.empty(k, k.shape)  # contiguous
    dv = common.empty(v, v.shape)
    dq_acc = common.empty(q, (H * rows * d // 32, 32), torch.float32)  # flat partials
    so, sdo = o.stride(), do.stride()
    h_spec = _int_spec(H)
    cu_al = (cu_q.data_ptr() % 16 == 0, cu_k.data_ptr() % 16 == 0)
    n_qb = -(-packed.max_q // bm)
    STATS_VARLEN_LAUNCHER(
        (n_qb, n_seq * H),
        ("stats_varlen", q.dtype, d, bm, so[1:3], sdo[1:3], h_spec, o.data_ptr() % 16,
         do.data_ptr() % 16, lse2.data_ptr() % 16, cu_al[0]),
        (o, do, lse2, stats, dq_acc, cu_q, so[1], so[2], sdo[1], sdo[2], H, total_q, rows),
        {"HEAD_D": d, "BLOCK": bm, "num_warps": 4})
    gdt = _GL_DTYPES[q.dtype]
    lay_m, lay_n = _layout(gdt, (1, 1, bm, d)), _layout(gdt, (1, 1, HALF_N, d))
    group = H // H_kv
    # the dense backward's grid order (`head_group`) over the n_seq * H_kv (sequence, key/value
    # head) pairs, the longest sequence standing for every one (its Q, dO and dQ rows bound
    # what a group holds in L2)
    n_kb = -(-packed.max_k // BLOCK_N)
    pairs = n_seq * H_kv
    hg = head_group(pairs, group, packed.max_q, packed.max_k, d, _sm_count(q.device)) \
        if causal else 1
    grid = (hg * n_kb, pairs // hg) if causal else (n_kb, pairs)
    args = ((q, (1, 1, bm, d), lay_m), (k, (1, 1, HALF_N, d), lay_n),
            (v, (1, 1, HALF_N, d), lay_n), (do, (1, 1, bm, d), lay_m),
            (dq_acc, (FLAT_ROWS, 32), STATS_LAYOUT),
            (stats[0], (1, bm), STATS_LAYOUT), (stats[1], (1, bm), STATS_LAYOUT),
            dk, dv, cu_q, cu_k, H, H_kv, group, hg, total_k, n_pad, scale * LOG2E, scale)
    consts = {"CAUSAL": causal, "STAGES": st, "DQ_SPLIT_D": sd, "num_warps": NUM_WARPS}
    key = ("bwd_varlen", q.dtype, d, bm, st, causal, sd, h_spec, _int_spec(H_kv),
           _int_spec(group), _int_spec(hg), cu_al)
    LAUNCHER_VARLEN(grid, key, args, consts)
    dq = common.empty(q, (1, H, total_q, d))
    FLAT_CAST_VARLEN_LAUNCHER((n_qb, n_seq * H), ("flat_varlen", q.dtype, d, bm, sd, h_spec,
                                                   cu_al[0]),
                              (dq_acc, dq, cu_q, scale, H, total_q, n_pad),
                              {"HEAD_D": d, "BLOCK_M": bm, "SPLIT_D": sd, "num_warps": 4})
    return dq, dk, dv
