"""attnmem.calc.allocator against the rules of c10/cuda/CUDACachingAllocator.cpp, boundary by boundary."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnmem.calc.allocator import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    CachingAllocator,
    blocks_of,
    fresh_block_bytes,
    get_allocation_size,
    is_small,
    round_size,
    should_split,
)

KIB, MIB = 1 << 10, 1 << 20


def test_round_size_is_512_byte_multiples():
    assert round_size(0) == 512 and round_size(1) == 512 and round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(12_288_000) == 12_288_000  # already a multiple of 512
    assert round_size(384_001) == 384_512


def test_pools_and_segment_sizes():
    assert is_small(MIB) and not is_small(MIB + 512)
    assert get_allocation_size(512) == K_SMALL_BUFFER == 2 * MIB
    assert get_allocation_size(MIB) == 2 * MIB
    assert get_allocation_size(MIB + 512) == K_LARGE_BUFFER == 20 * MIB
    assert get_allocation_size(10 * MIB - 512) == 20 * MIB
    assert get_allocation_size(10 * MIB) == 10 * MIB  # kMinLargeAlloc: rounded to 2 MiB
    assert get_allocation_size(10 * MIB + 512) == 12 * MIB


def test_should_split_rules():
    # small pool: split when at least 512 B remain
    assert should_split(2 * MIB, 2 * MIB - 512, small=True)
    assert not should_split(2 * MIB, 2 * MIB, small=True)
    # large pool: only when more than 1 MiB remains
    assert not should_split(12 * MIB, 11 * MIB, small=False)  # exactly 1 MiB left: whole
    assert should_split(12 * MIB, 11 * MIB - 512, small=False)
    # expandable segments: always when 512 B remain
    assert should_split(12 * MIB, 11 * MIB, small=False, expandable=True)


def test_fresh_block_of_the_issue_example_is_the_whole_12_mib_segment():
    # B=2, H=16, s=3,000, d=64, bf16 output: 12,288,000 B -> 12 MiB segment, 294,912 B left
    assert fresh_block_bytes(12_288_000) == 12 * MIB
    assert fresh_block_bytes(12_288_000, expandable=True) == 12_288_000
    # 1-10 MiB requests are split from a 20 MiB segment: only the 512 B rounding
    assert fresh_block_bytes(3 * MIB + 1) == 3 * MIB + 512
    # just over 10 MiB: a 12 MiB segment with 2 MiB - 512 left, split
    assert fresh_block_bytes(10 * MIB + 1) == 10 * MIB + 512
    # 11 MiB + 1 B: 12 MiB segment, under 1 MiB left: whole
    assert fresh_block_bytes(11 * MIB + 1) == 12 * MIB


@given(st.integers(1, 1 << 34))
def test_fresh_block_is_at_least_the_request_and_at_most_1_mib_more(n):
    b = fresh_block_bytes(n)
    assert round_size(n) <= b <= max(round_size(n), n + MIB)
    assert b % 512 == 0


@given(st.integers(1, 1 << 34), st.integers(0, 1 << 20))
def test_fresh_block_is_non_decreasing(n, k):
    assert fresh_block_bytes(n + k) >= fresh_block_bytes(n)


def test_small_requests_share_a_2_mib_segment():
    a = CachingAllocator()
    h1, h2 = a.malloc(700 * KIB), a.malloc(700 * KIB)
    assert a.reserved == 2 * MIB and a.allocated == 2 * 700 * KIB
    a.malloc(700 * KIB)  # 2,100 KiB > 2 MiB: a second segment
    assert a.reserved == 4 * MIB
    a.free(h1)
    a.free(h2)
    a.empty_cache()  # the first segment is one free block again: released
    assert a.reserved == 2 * MIB and a.allocated == 700 * KIB


def test_medium_requests_share_a_20_mib_segment_and_split():
    a = CachingAllocator()
    for _ in range(5):
        a.malloc(4 * MIB)
    assert a.reserved == 20 * MIB and a.allocated == 20 * MIB  # five fill it exactly
    a.malloc(4 * MIB)
    assert a.reserved == 40 * MIB
    b = CachingAllocator()
    for _ in range(4):
        b.malloc(4 * MIB + 512 * KIB)  # 18 MiB used, 2 MiB free
    h = b.malloc(1536 * KIB)  # 0.5 MiB would remain in the large pool: not split
    assert b.block_size(h) == 2 * MIB and b.reserved == 20 * MIB


def test_a_tail_of_an_input_segment_is_taken_whole():
    """An input of 10.5 MiB gets a 12 MiB segment and a free tail of 1.5 MiB (split: more than
    1 MiB left). A later 1.2 MiB request is best-fit into that tail, which leaves 0.3 MiB: not
    split, so "allocated" grows by the whole 1.5 MiB, and no segment is created."""
    a = CachingAllocator()
    a.malloc(10 * MIB + 512 * KIB)
    assert a.reserved == 12 * MIB and a.allocated == 10 * MIB + 512 * KIB
    a.empty_cache()
    before_alloc, before_res = a.allocated, a.reserved
    h = a.malloc(1228 * KIB)
    assert a.block_size(h) == 1536 * KIB
    assert a.allocated - before_alloc == 1536 * KIB and a.reserved == before_res


def test_freed_blocks_merge_and_are_reused():
    a = CachingAllocator()
    x, y = a.malloc(4 * MIB), a.malloc(4 * MIB)
    a.free(x)
    a.free(y)
    h = a.malloc(8 * MIB)  # the two merged into the 20 MiB block: no new segment
    assert a.reserved == 20 * MIB and a.block_size(h) == 8 * MIB
    a.reset_peak()
    assert a.peak_allocated == 8 * MIB and a.peak_reserved == 20 * MIB


def test_reserved_peak_counts_segments_of_freed_temporaries():
    a = CachingAllocator()
    t = a.malloc(64 * MIB)
    a.free(t)  # cached, not returned
    a.malloc(100 * MIB)
    assert a.peak_reserved == 164 * MIB and a.peak_allocated == 100 * MIB


def test_blocks_of_sequence():
    assert blocks_of([12_288_000, 384_000, 16, 8]) == [12 * MIB, 384_000, 512, 512]


def test_expandable_segments_map_20_mib_pages_and_always_split():
    a = CachingAllocator(expandable=True)
    h = a.malloc(12_288_000)
    assert a.block_size(h) == 12_288_000
    assert a.reserved == 20 * MIB  # one 20 MiB page of the large pool's segment
    a.malloc(12_288_000)  # 24.6 MB used: a second page
    assert a.reserved == 40 * MIB
    a.malloc(100)  # small pool: its own segment of 2 MiB pages
    assert a.reserved == 42 * MIB
    assert a.allocated == 2 * 12_288_000 + 512


def test_expandable_empty_cache_unmaps_whole_free_pages_only():
    a = CachingAllocator(expandable=True)
    x = a.malloc(30 * MIB)  # pages 0-1
    a.malloc(30 * MIB)  # 30-60 MiB: pages 1-2
    a.free(x)
    a.empty_cache()  # page 0 (0-20 MiB) is free and whole: unmapped; page 1 is shared
    assert a.reserved == 40 * MIB
    a.malloc(15 * MIB)  # fits again at the start: page 0 mapped back
    assert a.reserved == 60 * MIB


@pytest.mark.parametrize("expandable", [False, True])
def test_allocated_returns_to_zero(expandable):
    a = CachingAllocator(expandable)
    hs = [a.malloc(n) for n in (1, 5 * MIB, 33 * MIB + 7, 700 * KIB, 11 * MIB + 1)]
    for h in hs:
        a.free(h)
    assert a.allocated == 0
    a.empty_cache()
    assert a.reserved == 0


def test_a_held_block_survives_empty_cache_and_serves_requests_split():
    a = CachingAllocator()
    a.hold_cached_block(500 * MIB)
    a.empty_cache()
    assert a.reserved == 500 * MIB + 512 and a.allocated == 512
    h = a.malloc(12_288_000)  # cut from the held block: more than 1 MiB remains, split
    assert a.block_size(h) == 12_288_000 and a.reserved == 500 * MIB + 512
    a.malloc(600 * MIB)  # larger than what is held: a new segment
    assert a.reserved == 500 * MIB + 512 + 600 * MIB
