"""The split rule of the bundled kernel's decode path (one copy: the kernel and calc read it).

The decode path (attnmem/kernels/flash/decode.py) runs attention of a few new queries per
sequence against a KV cache: flash-decoding (Dao, Haziza, Massa, Sizov, "Flash-Decoding for
long-context inference", PyTorch blog / Stanford CRFM, 2023). One program owns the rows of
one (batch, key/value head): every query head of its GQA group times every new query, so a
KV tile is read once for the whole group. With few rows per sequence that grid is tiny
(B·H_kv programs: 8 at B = 1 with 8 key/value heads, against 132 SMs), so the cache is cut
into ``splits`` chunks along the keys, one program per chunk; each writes its chunk's
normalised partial output and log2-sum-exp in fp32, and a second kernel combines them.

The rule (`decode_plan`), read from the shape only, never the GPU, so that attnmem.calc.peak
predicts the partial buffers exactly on every GPU:

- rows per (batch, key/value head) R = (H / H_kv)·s_q; row tile BLOCK_M = R rounded up to a
  power of two, at least 16 (the smallest tensor-core tile) and at most 128 (64 at
  d > 128, where a 128 × 256 fp32 accumulator would not fit the registers); row blocks
  M = ⌈R / BLOCK_M⌉;
- key tile BLOCK_N = 128 keys at d ≤ 128, 64 above (`decode_block_n`);
- programs without a split P = M·B·H_kv. The target is T = ``DECODE_WAVES`` waves of
  ``DECODE_SMS`` SMs (4 × 132 = 528): splits S = ⌊T / P⌋, at least 1, but at most one split
  per ``DECODE_MIN_SPLIT_TILES`` key tiles (a chunk shorter than that spends more on writing
  and combining its partials than it saves) and at most ``DECODE_MAX_SPLITS``. So the grid
  P·S is at least 2 waves wherever the cache is long enough (P ≥ T/2 is 2 waves without a
  split; below, P·S > T − P > T/2) and close to 4 waves on small grids (B·H_kv = 8 at
  B = 1: S = 66, re-cut to 64 chunks of whole tiles at 128k keys); a grid of 2-4 waves unsplit (B = 64, H_kv = 8: 512 programs) writes no
  partials at all;
- split length L = ⌈tiles / S⌉·BLOCK_N keys (a multiple of the tile), then S = ⌈s_k / L⌉, so
  no chunk is empty of cache and every chunk but the last is whole tiles.

S = 1 writes the output directly (no partials, no combine). The SM count is the H100's and
the H200's (132) on every GPU: a GPU with more SMs gets the same chunks (about 3 programs per
SM on a 144-SM B200), one with fewer more than 4 waves.
"""

from __future__ import annotations

from typing import NamedTuple

#: SMs of an H100/H200 SXM (cudaDeviceProp.multiProcessorCount), fixed so that the buffers do
#: not depend on the GPU (as attnmem.calc.attention_steps.FA2_NUM_SMS for FlashAttention-2).
DECODE_SMS = 132
#: Programs the split aims at, in units of DECODE_SMS: 4 waves of SMs, so that the last
#: wave's idle SMs cost at most about a quarter of the time where one program fits per SM
#: (d = 128 with 128-key tiles: 139 KiB of shared memory, compiled for sm_90) and the grid
#: is about one full wave where three fit (64-key tiles: 70 KiB). Not yet timed on a GPU.
DECODE_WAVES = 4
#: A chunk holds at least this many key tiles (2 x 128 keys at d <= 128).
DECODE_MIN_SPLIT_TILES = 2
#: At most this many chunks per (row block, batch, key/value head).
DECODE_MAX_SPLITS = 256
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

    @property
    def partial(self) -> bool:
        return self.splits > 1


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def decode_block_n(head_dim: int) -> int:
    """Keys per tile: 128 at d <= 128, 64 above (two K/V tiles of 64 x 256 in 16-bit are
    64 KiB; three stages of them fit an H100's 227 KiB of shared memory)."""
    return 128 if head_dim <= 128 else 64


def decode_plan(batch: int, heads: int, kv_heads: int, new_tokens: int, kv_len: int,
                head_dim: int, block_n: int | None = None) -> DecodePlan:
    """The cut of one decode call (module docstring): q (B, H, s_q, d) against keys of
    length ``kv_len`` (the longest valid length; the cache tensor's length where lengths are
    given per sequence on the device). ``block_n`` forces another key tile (the interpreter
    tests use 16 or 32 to get several tiles per chunk on small caches)."""
    for name, x in (("batch", batch), ("heads", heads), ("kv_heads", kv_heads),
                    ("new_tokens", new_tokens), ("kv_len", kv_len), ("head_dim", head_dim)):
        if type(x) is not int or x < 1:
            raise ValueError(f"decode_plan: {name} must be an int >= 1, got {x!r}")
    if heads % kv_heads:
        raise ValueError(f"decode_plan: heads ({heads}) must be a multiple of kv_heads "
                         f"({kv_heads})")
    group = heads // kv_heads
    rows = group * new_tokens
    cap = 128 if head_dim <= 128 else 64
    block_m = max(16, min(_pow2_at_least(rows), cap))
    row_blocks = -(-rows // block_m)
    bn = decode_block_n(head_dim) if block_n is None else int(block_n)
    tiles = -(-kv_len // bn)
    programs = row_blocks * batch * kv_heads
    want = DECODE_WAVES * DECODE_SMS // programs
    splits = max(1, min(want, tiles // DECODE_MIN_SPLIT_TILES, DECODE_MAX_SPLITS))
    per = -(-tiles // splits)
    split_len = per * bn
    splits = -(-kv_len // split_len)
    return DecodePlan(block_m, bn, row_blocks, splits, split_len)


def decode_buffer_bytes(batch: int, heads: int, kv_heads: int, new_tokens: int, kv_len: int,
                        head_dim: int, elem: int) -> tuple[int, int, int]:
    """(output, partial outputs, partial log2-sum-exps) in bytes of one decode call: O is
    B·H·s_q·d·e; where the plan splits (S > 1) the partials are B·H·s_q·S·d fp32 and
    B·H·s_q·S fp32, freed when the combine kernel has written O; else 0 and 0."""
    plan = decode_plan(batch, heads, kv_heads, new_tokens, kv_len, head_dim)
    rows = batch * heads * new_tokens
    if not plan.partial:
        return rows * head_dim * elem, 0, 0
    return rows * head_dim * elem, rows * plan.splits * head_dim * 4, rows * plan.splits * 4
