"""attnmem.calc.allocator's free index against a plain scan: the same block at every step.

CachingAllocator keeps its free blocks in a sorted index per pool (BlockComparatorSize's
(size, address) order, searched with bisect) and each segment's blocks as a linked list.
`ScanAllocator` below is the allocator as it was before (commit 15aff2e): best fit by looking
at every block of the pool, blocks in a Python list per segment. Long random streams of
malloc/free (ties of equal sizes, the pool and split boundaries, empty_cache, held blocks),
with and without expandable segments, must give the same block (segment, offset, size) for
every malloc, the same counters after every step and the same segments throughout.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmem.calc.allocator import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    CachingAllocator,
    get_allocation_size,
    is_small,
    round_size,
    should_split,
)

KIB, MIB = 1 << 10, 1 << 20


# ---- the reference: the allocator before its index, unchanged but for names --------------

class _ScanBlock:
    """A block of a segment: id of the segment (address order = creation order), offset."""

    __slots__ = ("seg", "offset", "size", "allocated", "mapped")

    def __init__(self, seg: int, offset: int, size: int, allocated: bool = False,
                 mapped: bool = True) -> None:
        self.seg = seg
        self.offset = offset
        self.size = size
        self.allocated = allocated
        self.mapped = mapped  # False: unmapped address space of an expandable segment


class ScanAllocator:
    """attnmem.calc.allocator.CachingAllocator as it was before its free index (commit
    15aff2e): best fit by a scan of every block of the pool, blocks in a list per segment.
    The reference the indexed allocator must equal step for step.

    `malloc(nbytes) -> handle`, `free(handle)`, `empty_cache()`, `reset_peak()`; counters
    `allocated`, `reserved`, `peak_allocated`, `peak_reserved` in bytes, as
    `torch.cuda.memory_allocated()` etc. would read them for what this allocator was given.
    """

    #: virtual size of an expandable segment (any size larger than a GPU will do)
    _EXPANDABLE_SPAN = 1 << 50

    def __init__(self, expandable: bool = False) -> None:
        self.expandable = expandable
        self._segments: dict[int, list[_ScanBlock]] = {}  # id -> blocks in address order
        self._seg_small: dict[int, bool] = {}
        self._next_seg = 0
        self._live: dict[int, _ScanBlock] = {}
        self._next_handle = 0
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self._expandable_seg: dict[bool, int] = {}  # small? -> its expandable segment id

    # ---- stats ---------------------------------------------------------------------------

    def reset_peak(self) -> None:
        """`resetPeakStats`: peaks start again from the current values."""
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved

    def _add_reserved(self, n: int) -> None:
        self.reserved += n
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    # ---- segments ------------------------------------------------------------------------

    def _new_segment(self, size: int, small: bool, mapped: bool = True) -> int:
        sid = self._next_seg
        self._next_seg += 1
        self._segments[sid] = [_ScanBlock(sid, 0, size, mapped=mapped)]
        self._seg_small[sid] = small
        return sid

    def _free_blocks(self, small: bool) -> list[_ScanBlock]:
        small_of = self._seg_small
        return [b for sid, blocks in self._segments.items() if small_of[sid] is small
                for b in blocks if not b.allocated and b.mapped]

    def _take(self, block: _ScanBlock, size: int, small: bool) -> _ScanBlock:
        """`alloc_found_block`: split off `size` bytes when should_split says so."""
        blocks = self._segments[block.seg]
        if should_split(block.size, size, small, self.expandable):
            i = blocks.index(block)
            rest = _ScanBlock(block.seg, block.offset + size, block.size - size)
            block.size = size
            blocks.insert(i + 1, rest)
        block.allocated = True
        return block

    def _page(self, small: bool) -> int:
        return K_SMALL_BUFFER if small else K_LARGE_BUFFER

    def _expandable_size(self, b: _ScanBlock) -> int:
        blocks = self._segments[b.seg]
        i = blocks.index(b)
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    def _get_free_block(self, size: int, small: bool) -> _ScanBlock | None:
        """`get_free_block`: best fit by (size, address); expandable blocks prefer the one
        that can grow least (`expandable_size`)."""
        if not self.expandable:
            best = None
            for b in self._free_blocks(small):
                if b.size >= size and (best is None or (b.size, b.seg, b.offset)
                                       < (best.size, best.seg, best.offset)):
                    best = b
            return best
        cands = [b for b in self._free_blocks(small) if b.size >= size]
        if not cands:
            return None
        cands.sort(key=lambda b: (b.size, b.seg, b.offset))
        i = 0
        if self.expandable:
            while (i + 1 < len(cands)
                   and self._expandable_size(cands[i + 1]) < self._expandable_size(cands[i])):
                i += 1
        return cands[i]

    def _merge_around(self, blocks: list[_ScanBlock], i: int) -> int:
        """`try_merge_blocks` with both neighbours; returns the merged block's index."""
        b = blocks[i]
        if i + 1 < len(blocks):
            n = blocks[i + 1]
            if not n.allocated and n.mapped == b.mapped:
                b.size += n.size
                del blocks[i + 1]
        if i > 0:
            p = blocks[i - 1]
            if not p.allocated and p.mapped == b.mapped:
                p.size += b.size
                del blocks[i]
                i -= 1
        return i

    def _map(self, blocks: list[_ScanBlock], i: int, size: int, small: bool) -> int:
        """`map_block`: map the pages covering `size` bytes from the start of unmapped block i
        (which starts on a page boundary); returns the index of the merged free block."""
        b = blocks[i]
        page = self._page(small)
        mapped = min(b.size, page * -(-size // page))
        if mapped < b.size:
            blocks.insert(i + 1, _ScanBlock(b.seg, b.offset + mapped, b.size - mapped, mapped=False))
            b.size = mapped
        b.mapped = True
        self._add_reserved(mapped)
        return self._merge_around(blocks, i)

    def _alloc_expandable(self, size: int, small: bool) -> _ScanBlock:
        """`try_allocate_expandable_block`: the lowest unmapped range (joined to a free block
        just before it) with room, mapped page by page."""
        sid = self._expandable_seg.get(small)
        if sid is None or sid not in self._segments:
            sid = self._new_segment(self._EXPANDABLE_SPAN, small, mapped=False)
            self._expandable_seg[small] = sid
        blocks = self._segments[sid]
        for i, c in enumerate(blocks):
            if c.mapped:
                continue
            start = i - 1 if i > 0 and not blocks[i - 1].allocated else i
            room, j = 0, start
            while room < size and j < len(blocks) and not blocks[j].allocated:
                room += blocks[j].size
                j += 1
            if room < size:
                continue
            cand = start
            if not blocks[cand].mapped:
                cand = self._map(blocks, cand, size, small)
            while blocks[cand].size < size:
                need = size - blocks[cand].size
                cand = self._map(blocks, cand + 1, need, small)
            return self._take(blocks[cand], size, small)
        raise AssertionError("an expandable segment always ends in unmapped space")

    # ---- the public operations -----------------------------------------------------------

    def malloc(self, nbytes: int) -> int:
        """`malloc`: round, pick a cached block or make a segment, split, count the block."""
        size = round_size(int(nbytes))
        small = is_small(size)
        block = self._get_free_block(size, small)
        if block is not None:
            block = self._take(block, size, small)
        elif self.expandable:
            block = self._alloc_expandable(size, small)
        else:
            seg = get_allocation_size(size)
            sid = self._new_segment(seg, small)
            self._add_reserved(seg)
            block = self._take(self._segments[sid][0], size, small)
        h = self._next_handle
        self._next_handle += 1
        self._live[h] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return h

    def hold_cached_block(self, nbytes: int) -> None:
        """Put a free cached block of `nbytes` (rounded to 512 B) in the pool that
        empty_cache() cannot release: a segment that a small long-lived allocation pins (as a
        cuBLAS workspace does when it is cut from a large freed segment). Non-expandable only;
        the pin (512 B) counts as allocated, like any live block."""
        size = round_size(int(nbytes))
        if self.expandable or size <= 0:
            return
        sid = self._new_segment(size + K_MIN_BLOCK_SIZE, is_small(size))
        self._add_reserved(size + K_MIN_BLOCK_SIZE)
        self._take(self._segments[sid][0], K_MIN_BLOCK_SIZE, is_small(size))
        self.allocated += K_MIN_BLOCK_SIZE
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def block_size(self, handle: int) -> int:
        """The size of the block behind a live allocation (what "allocated" counts for it)."""
        return self._live[handle].size

    def block_of(self, handle: int) -> tuple[int, int, int]:
        b = self._live[handle]
        return b.seg, b.offset, b.size

    def layout(self) -> list[tuple[int, int, int, bool, bool]]:
        return [(sid, b.offset, b.size, b.allocated, b.mapped)
                for sid, blocks in self._segments.items() for b in blocks]

    def free(self, handle: int) -> None:
        """`free` / `free_block`: uncount the block and merge it with free neighbours."""
        block = self._live.pop(handle)
        self.allocated -= block.size
        block.allocated = False
        blocks = self._segments[block.seg]
        self._merge_around(blocks, blocks.index(block))

    def empty_cache(self) -> None:
        """`release_cached_blocks`: release segments that are one free block; expandable
        segments unmap the whole pages inside each free block (`unmap_block`)."""
        for sid in list(self._segments):
            blocks = self._segments[sid]
            if not self.expandable:
                if len(blocks) == 1 and not blocks[0].allocated:
                    self.reserved -= blocks[0].size
                    del self._segments[sid]
                continue
            page = self._page(self._seg_small[sid])
            i = 0
            while i < len(blocks):
                b = blocks[i]
                if b.allocated or not b.mapped:
                    i += 1
                    continue
                lo = page * -(-b.offset // page)
                hi = page * ((b.offset + b.size) // page)
                if hi <= lo:
                    i += 1
                    continue
                pieces = []
                if lo > b.offset:
                    pieces.append(_ScanBlock(sid, b.offset, lo - b.offset))
                pieces.append(_ScanBlock(sid, lo, hi - lo, mapped=False))
                if b.offset + b.size > hi:
                    pieces.append(_ScanBlock(sid, hi, b.offset + b.size - hi))
                self.reserved -= hi - lo
                blocks[i:i + 1] = pieces
                k = i + (1 if lo > b.offset else 0)
                k = self._merge_around(blocks, k)
                i = k + 1
            if all(not b.mapped for b in blocks):
                del self._segments[sid]



# ---- the streams --------------------------------------------------------------------------

#: Sizes that sit on the allocator's boundaries (512 B rounding, the 1 MiB pool limit, the
#: 1 MiB split rule of the large pool, 10 MiB kMinLargeAlloc, 2 MiB rounding above it).
EDGES = (1, 512, 513, 4 * KIB, 700 * KIB, MIB - 512, MIB, MIB + 1, 1536 * KIB, 4 * MIB,
         10 * MIB - 512, 10 * MIB, 10 * MIB + 1, 11 * MIB + 1, 12 * MIB, 33 * MIB + 7)


def _size(rng: random.Random) -> int:
    """A request: a few repeated sizes (ties broken by address), edges, or anything."""
    r = rng.random()
    if r < 0.4:
        return rng.choice((2 * KIB, 64 * KIB, 3 * MIB, 12_288_000))  # many equal blocks
    if r < 0.6:
        return rng.choice(EDGES)
    if r < 0.85:
        return rng.randint(1, 2 * MIB)
    return rng.randint(1, 64 * MIB)


def _ops(seed: int, n: int, expandable: bool) -> list[tuple]:
    """n operations: mallocs and frees in phases that grow and shrink the live set (so the
    segments fragment and merge), now and then empty_cache or (non-expandable) a held block."""
    rng = random.Random(seed)
    ops: list[tuple] = []
    live = 0
    grow = 0.7
    for i in range(n):
        if i % 500 == 0:
            grow = rng.choice((0.3, 0.5, 0.7, 0.85))
        r = rng.random()
        if r < 0.004:
            ops.append(("empty_cache",))
        elif r < 0.006 and not expandable:
            ops.append(("hold", rng.choice((5 * MIB, 300 * KIB, 50 * MIB + 3))))
        elif live and rng.random() > grow:
            ops.append(("free", rng.randrange(live)))  # index into the live handles
            live -= 1
        else:
            ops.append(("malloc", _size(rng)))
            live += 1
    return ops


def _compare(ops: list[tuple], expandable: bool, layout_every: int = 97) -> None:
    """Run ops on both allocators; every result must agree, step by step."""
    new, ref = CachingAllocator(expandable), ScanAllocator(expandable)
    handles: list[tuple[int, int]] = []
    for step, op in enumerate(ops):
        if op[0] == "malloc":
            h, g = new.malloc(op[1]), ref.malloc(op[1])
            assert new.block_of(h) == ref.block_of(g), (step, op)
            handles.append((h, g))
        elif op[0] == "free":
            h, g = handles.pop(op[1])
            new.free(h)
            ref.free(g)
        elif op[0] == "hold":
            new.hold_cached_block(op[1])
            ref.hold_cached_block(op[1])
        else:
            new.empty_cache()
            ref.empty_cache()
        assert (new.allocated, new.reserved, new.peak_allocated, new.peak_reserved) == (
            ref.allocated, ref.reserved, ref.peak_allocated, ref.peak_reserved), (step, op)
        if step % layout_every == 0:
            assert new.layout() == ref.layout(), (step, op)
    assert new.layout() == ref.layout()
    _check_index(new)


def _check_index(a: CachingAllocator) -> None:
    """The index holds exactly the free mapped blocks, each in its own pool, in order."""
    free = sorted((small, size, sid, off) for sid, off, size, alloc, mapped in a.layout()
                  if not alloc and mapped for small in [a._seg_small[sid]])
    indexed = sorted((small, b.size, b.seg, b.offset) for small, keys in a._free_keys.items()
                     for b in (a._free_at[k] for k in keys))
    assert indexed == free
    for keys in a._free_keys.values():
        assert keys == sorted(keys)


@pytest.mark.parametrize("expandable", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_random_streams_choose_the_same_block_as_a_full_scan(seed, expandable):
    _compare(_ops(seed, 12_000 if not expandable else 6_000, expandable), expandable)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("malloc"), st.sampled_from(EDGES) | st.integers(1, 40 * MIB)),
    st.tuples(st.just("free"), st.integers(0, 10**6)),
    st.tuples(st.just("empty_cache")),
    st.tuples(st.just("hold"), st.sampled_from((300 * KIB, 5 * MIB, 50 * MIB + 3)))),
    max_size=120), st.booleans())
def test_short_streams_agree_with_a_full_scan(raw, expandable):
    """Short streams Hypothesis can shrink to the first step where the two part ways."""
    ops, live = [], 0
    for op in raw:
        if op[0] == "free":
            if not live:
                continue
            op = ("free", op[1] % live)
            live -= 1
        elif op[0] == "malloc":
            live += 1
        elif op[0] == "hold" and expandable:
            continue
        ops.append(op)
    _compare(ops, expandable, layout_every=1)


def test_ties_go_to_the_lowest_address():
    """Three equal free blocks in three segments: the first segment's is taken, then the
    next; with equal sizes in one segment, the lower offset."""
    a = CachingAllocator()
    big = [a.malloc(12 * MIB) for _ in range(3)]  # three 12 MiB segments
    for h in reversed(big):
        a.free(h)
    assert [a.block_of(a.malloc(12 * MIB))[0] for _ in range(3)] == [0, 1, 2]
    b = CachingAllocator()
    hs = [b.malloc(2 * KIB) for _ in range(6)]  # one 2 MiB small segment
    b.free(hs[4])
    b.free(hs[1])  # two free 2 KiB holes at offsets 2 KiB and 8 KiB
    assert b.block_of(b.malloc(2 * KIB)) == (0, 2 * KIB, 2 * KIB)
    assert b.block_of(b.malloc(2 * KIB)) == (0, 8 * KIB, 2 * KIB)


def test_best_fit_takes_the_smallest_block_that_fits_not_the_first():
    a = CachingAllocator()
    hs = [a.malloc(n) for n in (64 * KIB, 512, 8 * KIB, 512, 4 * KIB, 512)]
    a.free(hs[0])
    a.free(hs[2])
    a.free(hs[4])  # holes of 64, 8 and 4 KiB, then the segment's free tail
    assert a.block_of(a.malloc(3 * KIB)) == (0, 64 * KIB + 512 + 8 * KIB + 512, 3 * KIB)


def test_a_segment_id_past_the_index_key_is_refused():
    a = CachingAllocator()
    a._next_seg = 1 << 96
    with pytest.raises(ValueError, match=rf"segment {1 << 96} .*below 2\*\*96"):
        a.malloc(1)


def test_a_segment_past_2_56_bytes_is_indexed():
    """The pages accept inputs whose steps reach segments of ~2**57 B (their hostile-URL tests);
    the index keeps such sizes apart from the segment id and offset."""
    a = CachingAllocator()
    h = a.malloc(1 << 57)
    a.free(h)
    assert a.malloc(1 << 57) is not None
