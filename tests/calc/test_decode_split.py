"""attnmem.calc.decode_split without torch: the split rule stated as waves of programs against
the SM count and key tiles, which tiles combine in the split kernel, the counters, and the
refusals (tests/kernels/test_decode.py checks the kernel allocates exactly this)."""

from __future__ import annotations

import pytest

from attnmem.calc.decode_split import (
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


def test_counters_and_buffers_follow_the_plan():
    # Llama-3-8B heads, one query, 8k keys: B = 1 and 4 split (fused), B = 16 does not
    p1, p4, p16 = (decode_plan(b, 32, 8, 1, 8192, 128) for b in (1, 4, 16))
    assert (p1.splits, p4.splits, p16.splits) == (16, 4, 1)
    assert (decode_counters(1, 8, p1), decode_counters(4, 8, p4), decode_counters(16, 8, p16)) \
        == (8, 32, 0)
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
