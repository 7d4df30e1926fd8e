"""The bundled kernel's dispatch rules that decide which buffers it allocates (one copy).

The backward of our FlashAttention kernel (attnmem/kernels/flash/bwd.py) chooses between code paths
whose extra memory differs. These rules read shapes and the element size only, never the GPU,
so that `attnmem.calc.peak` can predict the buffers exactly; the kernel calls these same functions.

- GQA split: a dK/dV program owns one key block of one key/value head and walks the query
  heads of its group, so with grouped-query attention the grid is B·H_kv·⌈s_k/128⌉ programs.
  On a small grid the group is split over S programs, each over H/H_kv/S query heads, which
  write partial dK, dV sums of 2·B·H_kv·S·s_k·d·e bytes that are then summed into dK, dV.
  FlashAttention-2 does the same with S = H/H_kv (Dao 2023, arXiv 2307.08691, section 3.2:
  per-query-head dK, dV, then a sum over the group).
- Atomic dQ: on large grids one dK/dV kernel also adds dQ into a zeroed fp32 buffer of
  B·H·s_q·d·4 bytes (as FlashAttention-2's backward does, ibid., Algorithm 2), which saves the
  separate dQ kernel's recomputation. Short calls and small grids keep the two-kernel,
  deterministic backward. The thresholds come from a sweep of both backwards on an H200
  (attnmem/kernels/flash/NOTES.md, "atomic-dQ threshold").
- The Hopper region (`sm90_region`): 16-bit inputs, d = 64 or 128, and B·H_kv·⌈s_k/128⌉ ≥ 256
  dK/dV programs from 4,096 queries on; from 512 to 4,095 queries, ≥ 512 programs over at
  least 8,192 queries in the call (B·s_q). There the backward runs the Gluon kernel
  (attnmem/kernels/flash/bwd_sm90.py: one program per 128 keys of a key/value head walks every query
  head of its group, so it needs no GQA split, and adds dQ into the fp32 buffer), so the rules
  say S = 1 and atomic dQ. Timed against the Triton backward's split / two-kernel paths on an
  H200 (attnmem/kernels/flash/NOTES.md, "the Hopper region"), backward alone: 1.0-1.7x from 256
  programs on (0.97x at d = 128 causal MHA, 16,384 queries), 0.4-0.9x below with the causal mask (too few long
  programs for 132 SMs). The region first began at 4,096 queries; on the 36 dense shapes of
  the training grid (`python -m attnmem.measure.bench --preset training`, H200, 2026-12-02) the Gluon
  backward forced at 512 to 3,000 queries (B = 8 to 256, 512 to 32,768 programs) ran forward +
  backward at 1.02-1.35x the Triton backward's rate at all 19 such shapes, so the region now
  begins at 512 queries (the shortest length measured) on grids of at least 512 programs and
  calls of at least 8,192 queries (the smallest grid and call measured there). Held-out calls
  of 2,048 queries (B = 1 and 2) ran both backwards at 0.3-0.7x cuDNN, so they stay with the
  Triton rules (attnmem/kernels/flash/NOTES.md, "the Hopper region"). The rules stay GPU-free: on other GPUs, or where the Gluon kernel
  cannot take the inputs (layouts, s_q % 4, a sliding window), the Triton backward runs the same
  path (atomic dQ, no split), so the buffers, and the peak model, are the same everywhere; the
  Triton backward's speed there is not measured. One difference: the Gluon kernel's fp32 dQ
  buffer holds s_q rounded up to its query block (`sm90_dq_rows`: 64 rows at d = 128, 128 at
  d = 64), which attnmem.calc.peak counts in this region; where the Triton backward runs there instead
  it allocates the same padded buffer and adds into its first s_q rows (attnmem/kernels/flash/bwd.py,
  triton_backward), so the bytes are the same.
- Packed sequences (`sm90_packed`): the Hopper backward's packed form where it can run without
  a window, and sequences average at least one query block; its fp32 dQ buffer and lse2 /
  delta copies cover FlashAttention-3's padded rows (`sm90_packed_pad_rows`). Elsewhere the
  portable two-kernel packed backward, no buffer (on a GPU where the Hopper kernel cannot run,
  the portable one runs and allocates less than attnmem.calc.peak counts).
"""

from __future__ import annotations

#: Head dims the bundled kernel takes (attnmem/kernels/flash/api.py checks its inputs against these;
#: attnmem.calc.peak refuses the others for "triton"): the smallest dot tile is 16 wide, and 256 is the
#: widest tile the forward and backward hold in shared memory.
HEAD_DIM_MIN = 16
HEAD_DIM_MAX = 256

#: A dK/dV grid of at least this many programs needs no GQA split.
KV_SPLIT_MIN_PROGRAMS = 1024
#: The key block the split rule counts in (the tiles vary with the config; the rule does not).
KV_SPLIT_BLOCK = 128

#: Head dims that have an atomic-dQ dK/dV tile.
ATOMIC_HEAD_DIMS = (64, 128)
#: The atomic-dQ dK/dV kernel's key block per head dim (its BLOCK_N, in attnmem/kernels/flash/bwd.py).
ATOMIC_KEY_BLOCK = {64: 64, 128: 128}
#: The longer of s_q and s_k must be at least this long.
ATOMIC_MIN_LEN = 2049
#: ... and the dK/dV grid (GQA split counted) at least this large.
ATOMIC_MIN_PROGRAMS = 2048


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: The Hopper region: at least this many queries (the shortest length timed there) ...
SM90_MIN_SEQ = 512
#: ... and at least this many dK/dV programs of 128 keys of one key/value head, B·H_kv·⌈s_k/128⌉,
#: from SM90_LONG_SEQ queries on (the region as first timed) ...
SM90_MIN_PROGRAMS = 256
SM90_LONG_SEQ = 4096
#: ... and below that length at least this many (the smallest grid timed there: shorter
#: programs need more of them to fill 132 SMs) ...
SM90_MIN_PROGRAMS_SHORT = 512
#: ... over at least this many queries in the call, B·s_q (the fewest the training grid timed
#: there; at 2,048 both backwards ran at 0.3-0.7x cuDNN, fixed per-call costs dominating).
SM90_MIN_TOKENS_SHORT = 8192
#: The Gluon backward's key block (bwd_sm90.BLOCK_N).
SM90_KEY_BLOCK = 128
#: The Gluon backward's query block per head dim (bwd_sm90.TILES): its flat fp32 dQ buffer
#: holds s_q rounded up to it (`sm90_dq_rows`).
SM90_QUERY_BLOCK = {64: 128, 128: 64}


def sm90_region(batch: int, kv_heads: int, s_q: int, s_k: int, head_dim: int,
                elem_bytes: int) -> bool:
    """Whether the default backward takes the Hopper path: no GQA split, atomic dQ (module
    docstring). 16-bit, d in ATOMIC_HEAD_DIMS, and B·H_kv·⌈s_k/SM90_KEY_BLOCK⌉ ≥
    SM90_MIN_PROGRAMS programs from s_q = SM90_LONG_SEQ; at SM90_MIN_SEQ ≤ s_q < SM90_LONG_SEQ,
    ≥ SM90_MIN_PROGRAMS_SHORT programs and B·s_q ≥ SM90_MIN_TOKENS_SHORT queries."""
    if elem_bytes != 2 or head_dim not in ATOMIC_HEAD_DIMS or s_q < SM90_MIN_SEQ:
        return False
    programs = batch * kv_heads * _cdiv(s_k, SM90_KEY_BLOCK)
    if s_q >= SM90_LONG_SEQ:
        return programs >= SM90_MIN_PROGRAMS
    return programs >= SM90_MIN_PROGRAMS_SHORT and batch * s_q >= SM90_MIN_TOKENS_SHORT


def sm90_dq_rows(s_q: int, head_dim: int) -> int:
    """Query rows per (batch, head) of the Gluon backward's flat fp32 dQ buffer: s_q rounded up
    to its query block (bwd_sm90.dq_buffer_rows), since each block's partials take whole
    4,096-float tiles (FA4's dQ staging; measured in attnmem/kernels/flash/NOTES.md,
    "DQ_FLAT kept, the others deleted")."""
    bm = SM90_QUERY_BLOCK[head_dim]
    return _cdiv(s_q, bm) * bm


#: CUDA's limit on a grid's dimension y (gridDim.y), which the kernels check their grids against.
GRID_Y_MAX = 65535
#: The packed Hopper backward's grids put sequences x query heads on dimension y (its stats and
#: cast kernels; the main kernel sequences x key/value heads), at most this many.
SM90_PACKED_GRID_Y_MAX = GRID_Y_MAX


def sm90_packed(n_seq: int, heads: int, kv_heads: int, max_len: int, total: int,
                head_dim: int, elem_bytes: int, window: int | None = None) -> bool:
    """Whether the default backward of packed sequences (``cu_seqlens``: ``n_seq`` sequences,
    the longest ``max_len``, ``total`` tokens) takes the Hopper path
    (attnmem/kernels/flash/bwd_sm90.py, `attention_backward_sm90_packed`: FlashAttention-3's varlen
    backward, Shah et al. 2024, arXiv 2407.08608, with its padded fp32 dQ buffer,
    `sm90_packed_pad_rows`) rather than the portable two-kernel one (attnmem/kernels/flash/bwd.py,
    packed_backward, no buffer): 16-bit, d = 64 or 128, no sliding window shorter than the
    longest sequence (a window of ``max_len`` keys or more hides none and is dropped, as
    attnmem.kernels.flash.api does), at most SM90_PACKED_GRID_Y_MAX sequences x heads, and sequences
    of at least BLOCK_M tokens on average (total >= n·BLOCK_M, `SM90_QUERY_BLOCK`): each
    sequence pads its rows of the fp32 dQ buffer by up to BLOCK_M, so the buffer stays below
    twice the packed rows plus one block (8,192 one-token sequences would otherwise ask 65
    times the rows). Unlike `sm90_region` it has no lower bound on the lengths or the grid:
    none was measured yet, and packed training batches are long (attnmem/kernels/flash/NOTES.md,
    "Packed sequences"). GPU-free,
    like the other rules: where the Hopper kernel cannot run (another GPU, layouts the copy
    engine cannot read) the portable backward runs without the buffer, so attnmem.calc.peak's
    prediction there is high by the buffer and the stats copies."""
    if elem_bytes != 2 or head_dim not in ATOMIC_HEAD_DIMS:
        return False
    if window is not None and window < max_len:
        return False
    return (n_seq * max(heads, kv_heads) <= SM90_PACKED_GRID_Y_MAX
            and total >= n_seq * SM90_QUERY_BLOCK[head_dim] and total >= max_len >= 1)


def sm90_packed_pad_rows(total: int, n_seq: int, head_dim: int) -> int:
    """Padded query rows per head of the packed Hopper backward's fp32 dQ buffer and of its
    lse2 / delta copies: T + n·BLOCK_M rounded up to BLOCK_M, for T packed queries in n
    sequences and BLOCK_M its query block (`SM90_QUERY_BLOCK`); sequence i starts at padded
    row ((cu_seqlens[i] + i·BLOCK_M) // BLOCK_M)·BLOCK_M, so no two sequences share a query
    block of the buffer. FlashAttention-3's padded offsets (hopper/seqlen.h offset_q_padded;
    hopper/flash_bwd_launch_template.h total_q_padded_rounded sizes dq_accum, softmax_lse_log2
    and dpsum so). The kernel (attnmem/kernels/flash/bwd_sm90.py, `packed_pad_rows`) calls this."""
    bm = SM90_QUERY_BLOCK[head_dim]
    return _cdiv(total + n_seq * bm, bm) * bm


def _triton_split(batch: int, heads: int, kv_heads: int, s_k: int) -> int:
    group = heads // kv_heads
    blocks = batch * kv_heads * _cdiv(s_k, KV_SPLIT_BLOCK)
    for split in range(1, group):
        if group % split == 0 and blocks * split >= KV_SPLIT_MIN_PROGRAMS:
            return split
    return group


def kv_split(batch: int, heads: int, kv_heads: int, s_q: int, s_k: int, head_dim: int,
             elem_bytes: int) -> int:
    """S: how many dK/dV programs share one key block of one key/value head (1 without GQA).

    1 in the Hopper region (`sm90_region`); elsewhere the smallest divisor S of the group
    H/H_kv with B·H_kv·S·⌈s_k/KV_SPLIT_BLOCK⌉ ≥ KV_SPLIT_MIN_PROGRAMS, else the whole group."""
    if sm90_region(batch, kv_heads, s_q, s_k, head_dim, elem_bytes):
        return 1
    return _triton_split(batch, heads, kv_heads, s_k)


def atomic_dq(batch: int, heads: int, kv_heads: int, s_q: int, s_k: int, head_dim: int,
              elem_bytes: int) -> bool:
    """Whether the backward adds dQ with atomics into an fp32 buffer by default.

    Always in the Hopper region (`sm90_region`); elsewhere for 16-bit inputs, d in
    ATOMIC_HEAD_DIMS, max(s_q, s_k) ≥ ATOMIC_MIN_LEN and B·H_kv·S·⌈s_k/BLOCK_N⌉ ≥
    ATOMIC_MIN_PROGRAMS dK/dV programs (BLOCK_N from ATOMIC_KEY_BLOCK, S from `kv_split`).
    The kernel also keeps the deterministic backward under
    ``torch.use_deterministic_algorithms(True)``, a flag this pure rule does not see."""
    if sm90_region(batch, kv_heads, s_q, s_k, head_dim, elem_bytes):
        return True
    if elem_bytes != 2 or head_dim not in ATOMIC_HEAD_DIMS or max(s_q, s_k) < ATOMIC_MIN_LEN:
        return False
    split = _triton_split(batch, heads, kv_heads, s_k)
    programs = batch * kv_heads * split * _cdiv(s_k, ATOMIC_KEY_BLOCK[head_dim])
    return programs >= ATOMIC_MIN_PROGRAMS
