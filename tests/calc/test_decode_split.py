"""attnmem.calc.decode_split without torch: the split rule stated as waves of programs against
the SM count and key tiles, which chunk counts and tiles combine in the split kernel (2-4
chunks: both sides of the threshold), the counters, and the
refusals (tests/kernels/test_decode.py checks the kernel allocates exactly this)."""

from __future__ import annotations

import pytest

from attnmem.calc.decode_split import (
    DECODE_FUSED_MAX_SPLITS,
    DECODE_MAX_SPLITS,
    DECODE_MIN_SPLIT_TILES,
    DECODE_SMS,
    decode_buffer_bytes,
    decode_counters,
    decode_plan,
    fused_combine,
    split_count,
)


def test_split_count_is_one_wave_of_sms_capped_by_tiles():
    # floor(132 / P), at most one chunk per 2 tiles, at most 256, at least 1
    assert split_count(8, 1024) == DECODE_SMS // 8 == 16
    assert split_count(8, 1024, waves=4) == 66
    assert split_count(32, 8) == 4 == 8 // DECODE_MIN_SPLIT_TILES
    assert split_count(66, 1000) == 2 and split_count(67, 1000) == 1
    assert split_count(1, 10**6) == DECODE_SMS and split_count(1, 10**6, waves=4) == (
        DECODE_MAX_SPLITS)
    assert split_count(5, 3) == 1  # fewer than 2 x 2 tiles: never cut
    for p in range(1, 300):
        s = split_count(p, 10**6)
        assert s == 1 or p * s <= DECODE_SMS < p * (s + 1)


@pytest.mark.parametrize("bad", [dict(programs=0), dict(tiles=-1), dict(waves=1.5)])
def test_split_count_refuses(bad):
    args = dict(programs=4, tiles=10, waves=1) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        split_count(**args)


def test_fused_combine_by_tile():
    assert fused_combine(2, 16, 128) and fused_combine(2, 32, 128) and fused_combine(2, 16, 256)
    assert fused_combine(2, 128, 32) and not fused_combine(2, 128, 64)  # 128 x 64 > 32 x 128
    assert not fused_combine(2, 64, 80)  # d = 80 pads to 128: 64 x 128
    assert not fused_combine(1, 16, 128)  # one chunk: nothing to combine
    assert not fused_combine(2, 16, 128, fused=False)


def test_fused_combine_up_to_four_chunks():
    # the last program's serial tail of S partial reads against the combine kernel's launch:
    # measured to cross at 4.5-5.0 chunks (decode_split's docstring), so fused at 2-4
    assert DECODE_FUSED_MAX_SPLITS == 4
    for tile in ((16, 128), (32, 128), (16, 64), (128, 32)):
        assert [fused_combine(s, *tile) for s in range(1, 8)] == [False, True, True, True,
                                                                   False, False, False]
        assert not fused_combine(16, *tile) and not fused_combine(132, *tile)
    # the tile cap still holds below the threshold
    assert not fused_combine(4, 64, 128)


def test_plans_on_both_sides_of_the_threshold():
    # Llama-3-8B heads (H = 32, H_kv = 8, d = 128), one query: 8·B programs unsplit
    def plan(b, kv):
        p = decode_plan(b, 32, 8, 1, kv, 128)
        return p.splits, p.fused

    assert plan(1, 1024) == (4, True)  # 8 tiles: at most 4 chunks of 2
    assert plan(1, 2048) == (8, False) and plan(1, 8192) == (16, False)
    assert plan(3, 2048) == (4, True) and plan(3, 4096) == (5, False)  # 132 // 24 = 5
    assert plan(4, 131072) == (4, True) and plan(8, 8192) == (2, True)
    assert plan(16, 1024) == (1, False)  # unsplit: nothing to combine
    # eight queries: 32 rows, a 32 x 128 tile, the same chunk counts
    assert decode_plan(1, 32, 8, 8, 1024, 128).fused
    assert not decode_plan(1, 32, 8, 8, 8192, 128).fused


def test_counters_and_buffers_follow_the_plan():
    # Llama-3-8B heads, one query, 8k keys: B = 1 splits in 16 (combine kernel), B = 4 in 4
    # (fused: counters), B = 16 does not split
    p1, p4, p16 = (decode_plan(b, 32, 8, 1, 8192, 128) for b in (1, 4, 16))
    assert (p1.splits, p4.splits, p16.splits) == (16, 4, 1)
    assert (p1.fused, p4.fused, p16.fused) == (False, True, False)
    assert (decode_counters(1, 8, p1), decode_counters(4, 8, p4), decode_counters(16, 8, p16)) \
        == (0, 32, 0)
    assert decode_buffer_bytes(1, 32, 8, 1, 8192, 128, 2) == (
        32 * 128 * 2, 32 * 16 * 128 * 4, 32 * 16 * 4)
    assert decode_buffer_bytes(4, 32, 8, 1, 8192, 128, 2) == (
        4 * 32 * 128 * 2, 4 * 32 * 4 * 128 * 4, (4 * 32 * 4 + 32) * 4)
    assert decode_buffer_bytes(16, 32, 8, 1, 8192, 128, 2) == (16 * 32 * 128 * 2, 0, 0)
    unfused = decode_plan(4, 32, 8, 1, 8192, 128, fused=False)
    assert unfused.splits == 4 and not unfused.fused and decode_counters(4, 8, unfused) == 0


@pytest.mark.parametrize("bad, match", [
    (dict(batch=0), "batch"), (dict(heads=6), "multiple of kv_heads"),
    (dict(block_n=24), "block_n"), (dict(block_n=8), "block_n"), (dict(kv_len=1.0), "kv_len")])
def test_decode_plan_refuses(bad, match):
    args = dict(batch=1, heads=8, kv_heads=4, new_tokens=1, kv_len=100, head_dim=64) | bad
    with pytest.raises(ValueError, match=match):
        decode_plan(**args)
