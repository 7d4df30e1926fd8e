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
    """A block of a segment: id of the segment (address order = creation order), offset."""

    __slots__ = ("seg", "offset", "size", "allocated", "mapped")

    def __init__(self, seg: int, offset: int, size: int, allocated: bool = False,
                 mapped: bool = True) -> None:
        self.seg = seg
        self.offset = offset
        self.size = size
        self.allocated = allocated
        self.mapped = mapped  # False: unmapped address space of an expandable segment


class CachingAllocator:
    """A replay of DeviceCachingAllocator's bookkeeping for one stream (module docstring).

    `malloc(nbytes) -> handle`, `free(handle)`, `empty_cache()`, `reset_peak()`; counters
    `allocated`, `reserved`, `peak_allocated`, `peak_reserved` in bytes, as
    `torch.cuda.memory_allocated()` etc. would read them for what this allocator was given.
    """

    #: virtual size of an expandable segment (any size larger than a GPU will do)
    _EXPANDABLE_SPAN = 1 << 50

    def __init__(self, expandable: bool = False) -> None:
        self.expandable = expandable
        self._segments: dict[int, list[_Block]] = {}  # id -> blocks in address order
        self._seg_small: dict[int, bool] = {}
        self._next_seg = 0
        self._live: dict[int, _Block] = {}
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
        self._segments[sid] = [_Block(sid, 0, size, mapped=mapped)]
        self._seg_small[sid] = small
        return sid

    def _free_blocks(self, small: bool) -> list[_Block]:
        small_of = self._seg_small
        return [b for sid, blocks in self._segments.items() if small_of[sid] is small
                for b in blocks if not b.allocated and b.mapped]

    def _take(self, block: _Block, size: int, small: bool) -> _Block:
        """`alloc_found_block`: split off `size` bytes when should_split says so."""
        blocks = self._segments[block.seg]
        if should_split(block.size, size, small, self.expandable):
            i = blocks.index(block)
            rest = _Block(block.seg, block.offset + size, block.size - size)
            block.size = size
            blocks.insert(i + 1, rest)
        block.allocated = True
        return block

    def _page(self, small: bool) -> int:
        return K_SMALL_BUFFER if small else K_LARGE_BUFFER

    def _expandable_size(self, b: _Block) -> int:
        blocks = self._segments[b.seg]
        i = blocks.index(b)
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    def _get_free_block(self, size: int, small: bool) -> _Block | None:
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

    def _merge_around(self, blocks: list[_Block], i: int) -> int:
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

    def _map(self, blocks: list[_Block], i: int, size: int, small: bool) -> int:
        """`map_block`: map the pages covering `size` bytes from the start of unmapped block i
        (which starts on a page boundary); returns the index of the merged free block."""
        b = blocks[i]
        page = self._page(small)
        mapped = min(b.size, page * -(-size // page))
        if mapped < b.size:
            blocks.insert(i + 1, _Block(b.seg, b.offset + mapped, b.size - mapped, mapped=False))
            b.size = mapped
        b.mapped = True
        self._add_reserved(mapped)
        return self._merge_around(blocks, i)

    def _alloc_expandable(self, size: int, small: bool) -> _Block:
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
                    pieces.append(_Block(sid, b.offset, lo - b.offset))
                pieces.append(_Block(sid, lo, hi - lo, mapped=False))
                if b.offset + b.size > hi:
                    pieces.append(_Block(sid, hi, b.offset + b.size - hi))
                self.reserved -= hi - lo
                blocks[i:i + 1] = pieces
                k = i + (1 if lo > b.offset else 0)
                k = self._merge_around(blocks, k)
                i = k + 1
            if all(not b.mapped for b in blocks):
                del self._segments[sid]


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
