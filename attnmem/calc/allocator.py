"""What PyTorch's CUDA caching allocator counts: each tensor as the block it gets.

`torch.cuda.max_memory_allocated()` is the peak of the allocator's `allocated_bytes` stat, which
adds a block's *size* when the block is handed out (`alloc_found_block`: `increase_stat(
stats.allocated_bytes, block->size)`), not the bytes the tensor asked for. `memory_reserved()`
is the `reserved_bytes` stat: the segments obtained from cudaMalloc (`alloc_block`) or, with
expandable segments, the pages mapped (`map_block`). This module replays that bookkeeping for a
sequence of tensor allocations and frees on one stream, so that calc can predict both numbers.

Source: c10/cuda/CUDACachingAllocator.cpp (read at pytorch/pytorch commit 001074d, the code of
the torch 2.x line the H200 runs, 2.11; the constants and the functions below have had this
form since torch 2.1), `DeviceCachingAllocator`:

- `round_size`: a request is rounded up to a multiple of kMinBlockSize = 512 B (at least 512)
  (the `roundup_power2_divisions` option is off by default and not modelled).
- `get_pool`: a rounded size of at most kSmallSize = 1 MiB comes from the small pool, anything
  larger from the large pool.
- `get_free_block`: best fit: the smallest cached free block of the pool (same stream) with
  size >= the request, ties by address (`BlockComparatorSize`).
- `get_allocation_size`: with no such block a new segment is cudaMalloc'ed: kSmallBuffer =
  2 MiB for the small pool, kLargeBuffer = 20 MiB for sizes below kMinLargeAlloc = 10 MiB,
  else the size rounded up to kRoundLarge = 2 MiB.
- `should_split`: a small-pool block (and, with expandable segments, any block) is split when
  at least 512 B would remain; a large-pool block only when more than kSmallSize = 1 MiB would
  remain. A block that is not split is handed out *whole*, and its whole size is "allocated".
- `free_block` / `try_merge_blocks`: a freed block is merged with free neighbours of its
  segment.
- `release_cached_blocks` / `release_blocks` (`torch.cuda.empty_cache()`): segments that are
  one free block are released; with expandable segments, `unmap_block` unmaps every whole page
  inside a free block.
- Expandable segments (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`; Note [Expandable
  Segments], `find_expandable_block`, `try_allocate_expandable_block`, `map_block`): one
  segment per pool and stream, grown by mapping pages of kSmallBuffer = 2 MiB (small pool) or
  kLargeBuffer = 20 MiB (large pool; the `segment_size` of `find_expandable_block`) at the
  lowest address with room; best fit as above, preferring blocks that cannot grow
  (`expandable_size`); blocks always split (`should_split`), so "allocated" is the sum of the
  512-rounded requests.

Not modelled: CUDA graph pools, several streams (`recordStream`), `max_split_size_mb`,
`roundup_power2_divisions`, `garbage_collection_threshold`, the retry that frees cached blocks
when cudaMalloc fails (near out of memory, reserved can then fall during a call).
"""

from __future__ import annotations

from bisect import bisect_left, insort

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize
K_SMALL_SIZE = 1 << 20  # kSmallSize: largest small-pool request, 1 MiB
K_SMALL_BUFFER = 2 << 20  # kSmallBuffer: small-pool segment (and expandable small page), 2 MiB
K_LARGE_BUFFER = 20 << 20  # kLargeBuffer: segment of a 1-10 MiB request (expandable large page)
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
K_ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are rounded up to 2 MiB


def round_size(nbytes: int) -> int:
    """`round_size`: the request rounded up to a multiple of 512 B, at least 512 B."""
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * -(-nbytes // K_MIN_BLOCK_SIZE)


def is_small(size: int) -> bool:
    """`get_pool`: a rounded size of at most kSmallSize (1 MiB) is served by the small pool."""
    return size <= K_SMALL_SIZE


def get_allocation_size(size: int) -> int:
    """`get_allocation_size`: the segment cudaMalloc'ed for a rounded request with no cached
    block to serve it: 2 MiB (small pool), 20 MiB (below 10 MiB), else rounded up to 2 MiB."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * -(-size // K_ROUND_LARGE)


def should_split(block_size: int, size: int, small: bool, expandable: bool = False) -> bool:
    """`should_split`: small pool or expandable segments: split when >= 512 B remain; large
    pool: split only when more than 1 MiB remains (otherwise the block is handed out whole)."""
    remaining = block_size - size
    if small or expandable:
        return remaining >= K_MIN_BLOCK_SIZE
    return remaining > K_SMALL_SIZE


def fresh_block_bytes(nbytes: int, expandable: bool = False) -> int:
    """What "allocated" counts for one tensor of `nbytes` that gets a new segment (no cached
    block fits): round_size, or the whole segment when should_split says no (only possible
    from 10 MiB up: a segment rounded to 2 MiB with at most 1 MiB left over)."""
    size = round_size(nbytes)
    if expandable:
        return size
    seg = get_allocation_size(size)
    return size if should_split(seg, size, is_small(size)) else seg


class _Block:
    """A block of a segment: id of the segment (address order = creation order), offset, its
    neighbours in the segment (`prev`, `next`, as the allocator's Block), and the key it is
    filed under in the free index while it is a free mapped block (else None)."""

    __slots__ = ("seg", "offset", "size", "allocated", "mapped", "prev", "next", "key")

    def __init__(self, seg: int, offset: int, size: int, allocated: bool = False,
                 mapped: bool = True) -> None:
        self.seg = seg
        self.offset = offset
        self.size = size
        self.allocated = allocated
        self.mapped = mapped  # False: unmapped address space of an expandable segment
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.key: int | None = None


#: Free-index key: size, then segment id, then offset, packed into one int (ints compare faster
#: than tuples under bisect). Offsets and segment ids below 2**96 keep the three fields apart:
#: far past any size the pages accept (their hostile-URL tests reach segments of ~2**57 B).
_SEG_SHIFT = 96
_SIZE_SHIFT = 2 * _SEG_SHIFT
_FIELD_LIMIT = 1 << _SEG_SHIFT


class CachingAllocator:
    """A replay of DeviceCachingAllocator's bookkeeping for one stream (module docstring).

    `malloc(nbytes) -> handle`, `free(handle)`, `empty_cache()`, `reset_peak()`; counters
    `allocated`, `reserved`, `peak_allocated`, `peak_reserved` in bytes, as
    `torch.cuda.memory_allocated()` etc. would read them for what this allocator was given.

    The free blocks are indexed as the allocator's BlockPool keeps them: a sorted set ordered
    by BlockComparatorSize (stream, size, address; c10/cuda/CUDACachingAllocator.cpp), here
    one sorted list per pool of keys (size, segment, offset) searched with bisect, so best fit
    costs a binary search instead of a scan of every block. A segment's blocks are a linked
    list (Block's prev/next), so splitting and merging need no search either. Address order
    is (segment id, offset): segments are numbered as they are created. tests/calc/
    test_allocator.py replays long random streams against a plain scan of every block and
    asks for the same block at every step.
    """

    #: virtual size of an expandable segment (any size larger than a GPU will do)
    _EXPANDABLE_SPAN = 1 << 50

    def __init__(self, expandable: bool = False) -> None:
        self.expandable = expandable
        self._segments: dict[int, _Block] = {}  # id -> its first block (offset 0)
        self._seg_small: dict[int, bool] = {}
        self._next_seg = 0
        self._live: dict[int, _Block] = {}
        self._next_handle = 0
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self._expandable_seg: dict[bool, int] = {}  # small? -> its expandable segment id
        # the free index: small? -> sorted keys of the pool's free mapped blocks; key -> block
        self._free_keys: dict[bool, list[int]] = {True: [], False: []}
        self._free_at: dict[int, _Block] = {}

    # ---- stats ---------------------------------------------------------------------------

    def reset_peak(self) -> None:
        """`resetPeakStats`: peaks start again from the current values."""
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved

    def _add_reserved(self, n: int) -> None:
        self.reserved += n
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    # ---- the free index ------------------------------------------------------------------

    def _file(self, b: _Block) -> None:
        """Put `b` in its pool's free index if it is a free mapped block (`pool.blocks.insert`)."""
        if b.allocated or not b.mapped:
            return
        k = (b.size << _SIZE_SHIFT) | (b.seg << _SEG_SHIFT) | b.offset
        b.key = k
        insort(self._free_keys[self._seg_small[b.seg]], k)
        self._free_at[k] = b

    def _unfile(self, b: _Block) -> None:
        """Take `b` out of the free index if it is there (`pool.blocks.erase`)."""
        k = b.key
        if k is None:
            return
        keys = self._free_keys[self._seg_small[b.seg]]
        del keys[bisect_left(keys, k)]
        del self._free_at[k]
        b.key = None

    # ---- segments ------------------------------------------------------------------------

    def _new_segment(self, size: int, small: bool, mapped: bool = True) -> int:
        sid = self._next_seg
        if sid >= _FIELD_LIMIT or size >= _FIELD_LIMIT:
            raise ValueError(f"segment {sid} of {size:,} B: the allocator's free index holds "
                             f"segment ids and sizes below 2**{_SEG_SHIFT}")
        self._next_seg += 1
        head = _Block(sid, 0, size, mapped=mapped)
        self._segments[sid] = head
        self._seg_small[sid] = small
        self._file(head)
        return sid

    def _take(self, block: _Block, size: int, small: bool) -> _Block:
        """`alloc_found_block`: split off `size` bytes when should_split says so."""
        self._unfile(block)
        if should_split(block.size, size, small, self.expandable):
            rest = _Block(block.seg, block.offset + size, block.size - size)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._file(rest)
        block.allocated = True
        return block

    def _page(self, small: bool) -> int:
        return K_SMALL_BUFFER if small else K_LARGE_BUFFER

    @staticmethod
    def _expandable_size(b: _Block) -> int:
        nxt = b.next
        return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    def _get_free_block(self, size: int, small: bool) -> _Block | None:
        """`get_free_block`: best fit by (size, address), the first key of the pool's index at
        or after `size`; expandable blocks prefer the one that can grow least
        (`expandable_size`), walking on while the next block in the index can grow less."""
        keys = self._free_keys[small]
        i = bisect_left(keys, size << _SIZE_SHIFT)
        if i == len(keys):
            return None
        at = self._free_at
        if not self.expandable:
            return at[keys[i]]
        grow = self._expandable_size
        while i + 1 < len(keys) and grow(at[keys[i + 1]]) < grow(at[keys[i]]):
            i += 1
        return at[keys[i]]

    def _unlink(self, b: _Block) -> None:
        """Take `b` out of its segment's list (it has a block before it)."""
        b.prev.next = b.next
        if b.next is not None:
            b.next.prev = b.prev

    def _merge_around(self, b: _Block) -> _Block:
        """`try_merge_blocks` with both neighbours of the unfiled block `b`; returns the merged
        block, unfiled (the caller files it)."""
        n = b.next
        if n is not None and not n.allocated and n.mapped == b.mapped:
            self._unfile(n)
            b.size += n.size
            self._unlink(n)
        p = b.prev
        if p is not None and not p.allocated and p.mapped == b.mapped:
            self._unfile(p)
            p.size += b.size
            self._unlink(b)
            b = p
        return b

    def _map(self, b: _Block, size: int, small: bool) -> _Block:
        """`map_block`: map the pages covering `size` bytes from the start of unmapped block
        `b` (which starts on a page boundary); returns the merged free block, filed."""
        page = self._page(small)
        mapped = min(b.size, page * -(-size // page))
        if mapped < b.size:
            rest = _Block(b.seg, b.offset + mapped, b.size - mapped, mapped=False)
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = mapped
        b.mapped = True
        self._add_reserved(mapped)
        b = self._merge_around(b)
        self._file(b)
        return b

    def _alloc_expandable(self, size: int, small: bool) -> _Block:
        """`try_allocate_expandable_block`: the lowest unmapped range (joined to a free block
        just before it) with room, mapped page by page."""
        sid = self._expandable_seg.get(small)
        if sid is None or sid not in self._segments:
            sid = self._new_segment(self._EXPANDABLE_SPAN, small, mapped=False)
            self._expandable_seg[small] = sid
        c = self._segments[sid]
        while c is not None:
            if c.mapped:
                c = c.next
                continue
            start = c.prev if c.prev is not None and not c.prev.allocated else c
            room, j = 0, start
            while room < size and j is not None and not j.allocated:
                room += j.size
                j = j.next
            if room < size:
                c = c.next
                continue
            cand = start
            if not cand.mapped:
                cand = self._map(cand, size, small)
            while cand.size < size:
                cand = self._map(cand.next, size - cand.size, small)
            return self._take(cand, size, small)
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
            block = self._take(self._segments[sid], size, small)
        h = self._next_handle
        self._next_handle += 1
        self._live[h] = block
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
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
        self._take(self._segments[sid], K_MIN_BLOCK_SIZE, is_small(size))
        self.allocated += K_MIN_BLOCK_SIZE
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def block_size(self, handle: int) -> int:
        """The size of the block behind a live allocation (what "allocated" counts for it)."""
        return self._live[handle].size

    def block_of(self, handle: int) -> tuple[int, int, int]:
        """Where a live allocation's block is: (segment id, offset, size); segment ids count
        segments in the order they were created (address order)."""
        b = self._live[handle]
        return b.seg, b.offset, b.size

    def layout(self) -> list[tuple[int, int, int, bool, bool]]:
        """Every block of every segment in address order: (segment id, offset, size,
        allocated, mapped), as torch.cuda.memory_snapshot() lists a segment's blocks."""
        out = []
        for sid, b in self._segments.items():
            while b is not None:
                out.append((sid, b.offset, b.size, b.allocated, b.mapped))
                b = b.next
        return out

    def free(self, handle: int) -> None:
        """`free` / `free_block`: uncount the block and merge it with free neighbours."""
        block = self._live.pop(handle)
        self.allocated -= block.size
        block.allocated = False
        self._file(self._merge_around(block))

    def empty_cache(self) -> None:
        """`release_cached_blocks`: release segments that are one free block; expandable
        segments unmap the whole pages inside each free block (`unmap_block`)."""
        for sid in list(self._segments):
            head = self._segments[sid]
            if not self.expandable:
                if head.next is None and not head.allocated:
                    self._unfile(head)
                    self.reserved -= head.size
                    del self._segments[sid]
                continue
            page = self._page(self._seg_small[sid])
            b = head
            while b is not None:
                if b.allocated or not b.mapped:
                    b = b.next
                    continue
                lo = page * -(-b.offset // page)
                hi = page * ((b.offset + b.size) // page)
                if hi <= lo:
                    b = b.next
                    continue
                # b becomes [mapped head][unmapped lo..hi][mapped tail]; b stays the first
                # piece, so a segment's first block is still its first
                self._unfile(b)
                end, after = b.offset + b.size, b.next
                if lo > b.offset:
                    b.size = lo - b.offset
                    hole = _Block(sid, lo, hi - lo, mapped=False)
                    hole.prev, b.next = b, hole
                    self._file(b)
                else:
                    hole = b
                    hole.size, hole.mapped = hi - lo, False
                last = hole
                if end > hi:
                    tail = _Block(sid, hi, end - hi)
                    tail.prev, last.next = last, tail
                    self._file(tail)
                    last = tail
                last.next = after
                if after is not None:
                    after.prev = last
                self.reserved -= hi - lo
                b = self._merge_around(hole).next
            if all(not blk.mapped for blk in self._blocks(head)):
                del self._segments[sid]

    @staticmethod
    def _blocks(b: _Block | None):
        """The blocks from `b` on, in address order."""
        while b is not None:
            yield b
            b = b.next


def blocks_of(sizes: list[int], expandable: bool = False) -> list[int]:
    """The block each of `sizes` gets when they are allocated in this order by a fresh
    allocator and none is freed (what each counts in "allocated")."""
    a = CachingAllocator(expandable)
    return [a.block_size(a.malloc(n)) for n in sizes]


class TensorReplay:
    """The tensors of one call, by name, allocated and freed through a CachingAllocator, with
    the set alive when "allocated" is highest: the peak and its terms.

    Shared by attnmem.calc.peak (one attention call's allocation sequence) and attnmem.calc.context_parallel
    (one rank of a ring). `peak` is the most "allocated" grows above its value when the replay
    starts (tensors already there, such as the call's inputs, are not counted); `at_peak`
    holds (label, requested bytes, counted bytes, tensors) for every named allocation alive
    then, in allocation order. Counted bytes are the blocks the allocator hands out
    (`block_size`): 512 B rounding, and whole segments where `should_split` says no.

    With no allocator, every tensor counts `round_size` of its bytes: what a
    CachingAllocator(expandable=True) hands out, since expandable segments split every block
    (`should_split`), without the segment bookkeeping that only `reserved` needs (the ring's
    replays run thousands of tensors in a search; tests/calc/test_attention_call.py checks
    that both give the same peaks and terms).
    """

    def __init__(self, allocator: CachingAllocator | None = None) -> None:
        self.allocator = allocator
        self._allocated = 0  # without an allocator: the live blocks' bytes
        self.base = allocator.allocated if allocator is not None else 0
        #: key -> (label, requested bytes, counted bytes, tensors, allocator handles)
        self.alive: dict[str, tuple[str, int, int, int, list[int]]] = {}
        self._best = -1  # so that the first allocation is the peak until another exceeds it
        self.at_peak: list[tuple[str, int, int, int]] = []

    @property
    def allocated(self) -> int:
        """"allocated" now, in bytes (the allocator's, tensors from before included)."""
        return self.allocator.allocated if self.allocator is not None else self._allocated

    @property
    def peak(self) -> int:
        """Highest "allocated" above the start, in bytes (0 before anything is allocated)."""
        return max(self._best, 0)

    def alloc(self, key: str, label: str, *sizes: int) -> None:
        """Allocate tensors of `sizes` bytes under `key` (a size <= 0 allocates nothing)."""
        if key in self.alive:
            raise AssertionError(f"replay: {key!r} allocated twice")
        a = self.allocator
        if a is None:
            counted = tensors = 0
            for n in sizes:
                if n > 0:
                    counted += round_size(n)
                    tensors += 1
            self._allocated += counted
            self.alive[key] = (label, sum(sizes), counted, tensors, [])
            grown = self._allocated
        else:
            handles = [a.malloc(n) for n in sizes if n > 0]
            counted = sum(a.block_size(h) for h in handles)
            self.alive[key] = (label, sum(sizes), counted, len(handles), handles)
            grown = a.allocated - self.base
        if grown > self._best:
            self._best = grown
            self.at_peak = [entry[:4] for entry in self.alive.values()]

    def free(self, *keys: str) -> None:
        """Free the tensors allocated under each key."""
        for key in keys:
            _, _, counted, _, handles = self.alive.pop(key)
            if self.allocator is None:
                self._allocated -= counted
            for h in handles:
                self.allocator.free(h)

    def rename(self, old: str, new: str, label: str | None = None) -> None:
        """The tensors of `old` are now held as `new` (moved to the end of the allocation
        order), optionally under a new label."""
        lab, *rest = self.alive.pop(old)
        self.alive[new] = (lab if label is None else label, *rest)

    def relabel(self, key: str, label: str) -> None:
        """Describe the tensors of `key` by `label` from now on (same place, same bytes)."""
        _, *rest = self.alive[key]
        self.alive[key] = (label, *rest)
