"""The split rule of the bundled kernel's decode path (one copy: the kernel and calc read it).

The decode path (attnmem/kernels/flash/decode.py) runs attention of a few new queries per
sequence against a KV cache: flash-decoding (Dao, Haziza, Massa, Sizov, "Flash-Decoding for
long-context inference", PyTorch blog / Stanford CRFM, 2023). One program owns the rows of
one (batch, key/value head): every query head of its GQA group times every new query, so a
KV tile is read once for the whole group. With few rows per sequence that grid is tiny
(B·H_kv programs: 8 at B = 1 with 8 key/value heads, against 132 SMs), so the cache is cut
into ``splits`` chunks along the keys, one program per chunk; each writes its chunk's
normalised partial output and log2-sum-exp in fp32, and the chunks are combined exactly.

The rule (`decode_plan`), read from the shape only, never the GPU, so that attnmem.calc.peak
predicts the buffers exactly on every GPU:

- rows per (batch, key/value head) R = (H / H_kv)·s_q; row tile BLOCK_M = R rounded up to a
  power of two, at least 16 (the smallest tensor-core tile) and at most 128 (64 at
  d > 128, where a 128 × 256 fp32 accumulator would not fit the registers); row blocks
  M = ⌈R / BLOCK_M⌉;
- key tile BLOCK_N = 128 keys at d ≤ 128, 64 above (`decode_block_n`); the cache is
  t = ⌈kv_len / BLOCK_N⌉ tiles;
- programs without a split P = M·B·H_kv. Splits S = ⌊``DECODE_WAVES``·``DECODE_SMS`` / P⌋
  (one wave of one program per SM: 132), at least 1, at most one split per
  ``DECODE_MIN_SPLIT_TILES`` key tiles, at most ``DECODE_MAX_SPLITS``. Why one wave: at the
  default tiles one program fills an SM's shared memory (139 KiB at d = 128, BLOCK_N = 128,
  compiled for sm_90: `python -m attnmem.kernels.dev.compile_decode`), so a grid of 4
  waves runs as 4 rounds, each paying a chunk's fixed cost (loading q, filling the 3-stage
  pipeline, writing partials) again, and writes 4 × the partials; one wave pays it once and
  still streams from every SM. Consequences, no threshold of their own: P ≥ 67 (B ≥ 9 with
  8 key/value heads) runs unsplit (a split in two would make two rounds), smaller grids are
  cut to P·S ≤ 132 and > 66 programs where the cache has 2 tiles per chunk (B = 1, H_kv = 8:
  16 chunks; at 128k keys 16 chunks of 8,192 keys), and a cache of fewer than 2·2 tiles is
  never cut;
- split length L = ⌈t / S⌉·BLOCK_N keys (a multiple of the tile), then S = ⌈kv_len / L⌉, so
  no chunk is empty of cache and every chunk but the last is whole tiles.

S = 1 writes the output directly (no partials, no counters). With S > 1 each chunk writes
its normalised partial output and log2-sum-exp in fp32, and the chunks are combined one of
two ways (`fused_combine`):

- fused, where 2 <= S <= ``DECODE_FUSED_MAX_SPLITS`` (4) and the tile BLOCK_M x d is at most
  ``DECODE_FUSED_MAX_TILE`` (every decode tile up to 8 queries at d <= 128): the last chunk
  of each (row block, batch, key/value head) to finish, found by an int32 counter per row
  block that every chunk increments, combines them in the same launch; the counters (P
  int32, zeroed by the host) sit behind the log2-sum-exps in one buffer;
- else a second kernel, one program per output row, combines.

Why at most 4 chunks (the work of each side, then the measurement). The fused combine is a
serial tail: after the other chunks have finished, one program reads S partial tiles of
(rows x d) fp32 (its rows' share of the partials) and writes O, a time S·t_c that grows
with the chunks. The combine kernel spreads the same reads over B·H·s_q programs, so its
time barely depends on S, but it is one more launch and its programs' round trips, less
what the fused path pays on its own (the counters' zero fill, a small launch too, and the
ticket): a saving K per call. Fusing pays while S·t_c < K, i.e. below S* = K / t_c chunks.
Both t_c and K grow with the rows (the tail's tile, the combine kernel's programs), so S*
is a number of chunks. Measured on an H100 (attnmem/kernels/flash/NOTES.md, "Decode and
chunked prefill (split-KV, issue 44 item 4)", the A/B; data/kernel_speed_decode_ab_h100.csv: fused "new" minus
"new_kernel", H = 32, H_kv = 8, d = 128, bf16, one-wave grids; t_c and K from the line
Δ = S·t_c − K through the means at 4 and 16 chunks): one new query (4 rows of a
16 x 128 tile) -0.83, +0.02, +0.06, 0.00, +0.50 µs at 4 chunks and +1.40, +1.04, +1.17 at
16: t_c = 0.10 µs, K = 0.47 µs, S* = 4.5; eight (32 rows) +0.82, -1.04, -1.42, -0.94, +0.04
at 4 and +5.36, +4.81, +5.77 at 16: t_c = 0.49 µs, K = 2.45 µs, S* = 5.0. So fused up to 4
chunks (at 16 x 128, the fused combine's one unrolled step), the combine kernel from 5
(B = 1, H_kv = 8: 8 chunks at 2k keys, 16 from 4k; B = 2: 8 chunks). Not measured between 4
and 16 chunks (the preset's one-wave grids have 1, 4 or 16); `attnmem.kernels.dev.ab_decode`
times both combines at every split shape.

The SM count is the H100's and the H200's (132) on every GPU: a GPU with more SMs gets the same chunks (some SMs idle while the
grid is small), one with fewer two rounds.

The first rule (2026-12-07) aimed at 4 waves (``waves=4``: B = 1, H_kv = 8 at 128k keys in
64 chunks; B = 16 in 4) with a second combine kernel; measured on an H100 it lost to cuDNN
by up to 23 % with one new query (attnmem/kernels/flash/NOTES.md, "Decode and chunked
prefill (split-KV, issue 44 item 4)"); `attnmem.kernels.dev.ab_decode` times both rules in
one process.
"""

from __future__ import annotations

from typing import NamedTuple

#: SMs of an H100/H200 SXM (cudaDeviceProp.multiProcessorCount), fixed so that the buffers do
#: not depend on the GPU (as attnmem.calc.attention_steps.FA2_NUM_SMS for FlashAttention-2).
DECODE_SMS = 132
#: Programs the split aims at, in units of DECODE_SMS: one wave of one program per SM
#: (module docstring). The first rule aimed at 4 (``decode_plan(..., waves=4)``).
DECODE_WAVES = 1
#: A chunk holds at least this many key tiles (2 x 128 keys at d <= 128).
DECODE_MIN_SPLIT_TILES = 2
#: At most this many chunks per (row block, batch, key/value head).
DECODE_MAX_SPLITS = 256
#: The last chunk of each row block combines the partials in the split kernel (int32
#: counters zeroed per call) where the chunks are at most DECODE_FUSED_MAX_SPLITS and its
#: tile at most DECODE_FUSED_MAX_TILE. False: a second kernel combines everywhere.
DECODE_FUSED_COMBINE = True
#: Chunks up to which the split kernel combines its own (module docstring: the fused tail's
#: S·t_c against the combine kernel's saving K, measured on an H100 to cross at 4.5 chunks
#: with one new query and 5.0 with eight; from 16 chunks the fused tail lost 1.0-1.4 µs and
#: 4.8-5.8 µs).
DECODE_FUSED_MAX_SPLITS = 4
#: BLOCK_M x padded head dim up to which the split kernel combines its own chunks. Compiled
#: for sm_90 (Triton 3.9) the fused combine adds no spill up to 32 x 128 (BLOCK_M = 16-64,
#: d 64-256 with 4 warps) and 50-120 bytes of spills at 64 x 128 and above (8 warps, or
#: d = 80 with 64 rows), tiles already at 255 registers: there the combine kernel runs.
DECODE_FUSED_MAX_TILE = 32 * 128
#: New queries per sequence the decode path is meant for (the kernel takes any number; above
#: this the HF integration's chunked prefill uses it too).
DECODE_MAX_QUERIES = 8


class DecodePlan(NamedTuple):
    """How one decode call is cut: tiles, row blocks, and the key chunks."""

    block_m: int  # query rows per program: GQA group x new queries, padded
    block_n: int  # keys per tile
    row_blocks: int  # programs along the rows of one (batch, key/value head)
    splits: int  # chunks of the keys (1: no partials, no combine)
    split_len: int  # keys per chunk, a multiple of block_n
    fused: bool = False  # splits > 1 and the split kernel combines its own chunks

    @property
    def partial(self) -> bool:
        return self.splits > 1


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def decode_block_n(head_dim: int) -> int:
    """Keys per tile: 128 at d <= 128, 64 above (two K/V tiles of 64 x 256 in 16-bit are
    64 KiB; three stages of them fit an H100's 227 KiB of shared memory)."""
    return 128 if head_dim <= 128 else 64


def split_count(programs: int, tiles: int, waves: int = DECODE_WAVES) -> int:
    """Chunks of the keys for ``programs`` unsplit programs over a cache of ``tiles`` key
    tiles (module docstring): floor(waves x DECODE_SMS / programs), at least 1, at most one
    per DECODE_MIN_SPLIT_TILES tiles and DECODE_MAX_SPLITS (before the re-cut to whole
    tiles, `decode_plan`)."""
    for name, x in (("programs", programs), ("tiles", tiles), ("waves", waves)):
        if type(x) is not int or x < 1:
            raise ValueError(f"split_count: {name} must be an int >= 1, got {x!r}")
    want = waves * DECODE_SMS // programs
    return max(1, min(want, tiles // DECODE_MIN_SPLIT_TILES, DECODE_MAX_SPLITS))


def fused_combine(splits: int, block_m: int, head_dim: int,
                  fused: bool = DECODE_FUSED_COMBINE) -> bool:
    """Whether the split kernel combines its own chunks: ``fused``, 2 <= S <=
    DECODE_FUSED_MAX_SPLITS (the last program's serial tail of S partial reads is shorter
    than the combine kernel's launch, module docstring), and the tile BLOCK_M x d (d padded
    to a power of two, at least 16) at most DECODE_FUSED_MAX_TILE (registers)."""
    block_d = max(16, _pow2_at_least(head_dim))
    return (fused and 1 < splits <= DECODE_FUSED_MAX_SPLITS
            and block_m * block_d <= DECODE_FUSED_MAX_TILE)


def decode_plan(batch: int, heads: int, kv_heads: int, new_tokens: int, kv_len: int,
                head_dim: int, block_n: int | None = None, *, waves: int = DECODE_WAVES,
                fused: bool = DECODE_FUSED_COMBINE) -> DecodePlan:
    """The cut of one decode call (module docstring): q (B, H, s_q, d) against keys of
    length ``kv_len`` (the longest valid length; the cache tensor's length where lengths are
    given per sequence on the device). ``block_n`` forces another key tile (the interpreter
    tests use 16 or 32 to get several tiles per chunk on small caches); ``waves`` another
    target grid (4: the first rule, which attnmem.kernels.dev.ab_decode times against this
    one); ``fused`` False plans the second-kernel combine everywhere, True (the default) the
    fused combine where `fused_combine` gives it (at most 4 chunks, tiles up to 32 x 128)."""
    for name, x in (("batch", batch), ("heads", heads), ("kv_heads", kv_heads),
                    ("new_tokens", new_tokens), ("kv_len", kv_len), ("head_dim", head_dim)):
        if type(x) is not int or x < 1:
            raise ValueError(f"decode_plan: {name} must be an int >= 1, got {x!r}")
    if heads % kv_heads:
        raise ValueError(f"decode_plan: heads ({heads}) must be a multiple of kv_heads "
                         f"({kv_heads})")
    if block_n is not None and (type(block_n) is not int or block_n < 16
                                or block_n & (block_n - 1)):
        raise ValueError(f"decode_plan: block_n must be None or a power of two >= 16, got "
                         f"{block_n!r}")
    group = heads // kv_heads
    rows = group * new_tokens
    cap = 128 if head_dim <= 128 else 64
    block_m = max(16, min(_pow2_at_least(rows), cap))
    row_blocks = -(-rows // block_m)
    bn = decode_block_n(head_dim) if block_n is None else block_n
    tiles = -(-kv_len // bn)
    splits = split_count(row_blocks * batch * kv_heads, tiles, waves)
    split_len = -(-tiles // splits) * bn
    splits = -(-kv_len // split_len)
    return DecodePlan(block_m, bn, row_blocks, splits, split_len,
                      fused_combine(splits, block_m, head_dim, fused))


def decode_counters(batch: int, kv_heads: int, plan: DecodePlan) -> int:
    """int32 counters one call zeroes: one per (row block, batch, key/value head) where the
    split kernel combines its own chunks (``plan.fused``), else 0."""
    return plan.row_blocks * batch * kv_heads if plan.fused else 0


def decode_buffer_bytes(batch: int, heads: int, kv_heads: int, new_tokens: int, kv_len: int,
                        head_dim: int, elem: int, fused: bool = DECODE_FUSED_COMBINE
                        ) -> tuple[int, int, int]:
    """(output, partial outputs, partial log2-sum-exps and counters) in bytes of one decode
    call, in the order attnmem/kernels/flash/decode.py allocates them: O is B·H·s_q·d·e;
    where the plan splits (S > 1) the partial outputs are B·H·s_q·S·d fp32 and the second
    buffer B·H·s_q·S fp32 log2-sum-exps followed, where the plan combines in the split
    kernel, by `decode_counters` int32 counters, both freed when O is written; else 0 and 0.
    ``fused`` False: the second-kernel combine everywhere (no counters)."""
    plan = decode_plan(batch, heads, kv_heads, new_tokens, kv_len, head_dim, fused=fused)
    rows = batch * heads * new_tokens
    if not plan.partial:
        return rows * head_dim * elem, 0, 0
    return (rows * head_dim * elem, rows * plan.splits * head_dim * 4,
            (rows * plan.splits + decode_counters(batch, kv_heads, plan)) * 4)
