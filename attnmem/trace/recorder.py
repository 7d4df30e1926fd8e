"""Every tensor storage a piece of torch code makes and frees, in order, on any device (meta too).

`Recorder` is a TorchDispatchMode: each tensor an op returns is looked up by its storage; a
storage not seen before is an allocation of `nbytes` (a view, or an in-place op's result, is
not), and a weak-reference finalizer on the storage records its free when the last tensor on it
dies (CPython frees at the last reference, so the order is the program's); temporaries a CUDA
kernel makes inside an op, which its meta kernel does not, come from attnmem.trace.cuda_only.
On the meta device storages have sizes but no memory, so a 70B model's forward at 128k tokens
costs nothing but the Python of its modules. A loop over the tokens that attnmem.trace.loops
folds is one repeat event ("r": an iteration's events as a template, taken n times with fresh
ids; `unrolled`, `flat`), and `ops` counts the work the trace's limits are set in.

Each allocation is labelled with the op and the innermost module running (`track_modules`), so
a peak can be said in the model's own names. `replay` feeds the events through
attnmem.calc.allocator.CachingAllocator: what `torch.cuda.max_memory_allocated()` counts is
each tensor as the block the CUDA caching allocator hands out (512-byte rounding, whole blocks
where the large pool does not split), and phases (`mark`) get their own peaks; the small
pool's requests, whose block never depends on the allocator's state, without it (`_bypass`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from attnmem.calc.allocator import CachingAllocator, is_small, round_size
from attnmem.trace.cuda_only import temporaries
from attnmem.trace.known import Known
from attnmem.trace.uniform import Uniform

#: ("a", id, nbytes, label) | ("f", id) | ("m", phase name) | ("r", template, copies, first id,
#: previous ids) (`unrolled`)
Event = tuple


@dataclass
class PhasePeak:
    """The highest "allocated" of one phase, above the bytes alive before recording started,
    and the allocations alive at that moment: label -> (tensors, bytes as blocks)."""

    name: str
    peak: int = 0
    start: int = 0  # "allocated" when the phase began
    at_peak: dict[str, tuple[int, int]] = field(default_factory=dict)


class Recorder:
    """Allocation and free events of the storages made under `with recorder:`."""

    def __init__(self, devices: tuple[str, ...] = ("meta",), values: bool = False) -> None:
        """`values`: also follow tensors whose values vary but are fixed by the inputs
        (attnmem.trace.known), computed on the CPU where a value is read; the traces turn it
        on, a bare recorder follows uniform tensors only."""
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.weak import WeakIdKeyDictionary

        self._torch = torch
        self._seen = WeakIdKeyDictionary()
        self.events: list[Event] = []
        self.stack: list[str] = []
        self._next = 0
        #: tensor ops dispatched (and tensors a fold made): the trace's work, which its limits
        #: count (attnmem.trace.loops), never its seconds
        self.ops = 0
        self._shared = WeakIdKeyDictionary()  # storage -> loops._Kept (`shared`)
        self.rename: dict[int, int] = {}  # a storage's free recorded as another id's (loops.py)
        self.watch: Any = None  # called with (func, args, out) after each op (loops.py)
        self._devices = devices  # the device that stands for the GPU; CPU tensors are not its
        self.uniform = Uniform()  # values of one-number tensors, so .item() can answer on meta
        self.known_values = Known(self.uniform, devices) if values else None
        rec = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                rec.ops += 1
                known = rec.uniform.scalar(func, args)  # .item() of a uniform tensor
                if known is None and rec.known_values is not None:
                    known = rec.known_values.scalar(func, args)  # .item() of a known tensor
                if known is not None:
                    return known
                host = rec.uniform.to_host(func, args, kwargs)  # .tolist() of one
                if host is None and rec.known_values is not None:
                    host = rec.known_values.to_host(func, args, kwargs)
                if host is not None:
                    return host
                if rec.known_values is not None:  # nonzero, unique: sizes from known values
                    ran = rec.known_values.run(func, args, kwargs)
                    if ran is not None:
                        out, made = ran
                        for t in made:
                            rec._add(t, func)
                        del ran, made  # the kernel's temporaries die here, its outputs live on
                        if rec.watch is not None:
                            rec.watch(func, args, out)
                        rec.uniform.after(func, args, kwargs, out)
                        return out
                held = temporaries(func, args)  # a CUDA kernel's own temporaries
                masked = rec.uniform.mask_index(func, args)  # x[mask], the mask's values known
                if masked is None and rec.known_values is not None:
                    masked = rec.known_values.mask_index(func, args)
                if masked is not None:
                    args, made = masked
                    held = [*held, *made]
                for t in held:
                    rec._add(t, func)
                out = _meta_stack(torch, func, args, kwargs)
                if out is None:
                    out = func(*args, **kwargs)
                del held
                for o in out if isinstance(out, (tuple, list)) else [out]:
                    rec._add(o, func)
                if rec.watch is not None:
                    rec.watch(func, args, out)
                rec.uniform.after(func, args, kwargs, out)
                if rec.known_values is not None:
                    rec.known_values.after(func, args, kwargs, out)
                return out

        self._mode = _Mode()

    def known(self, *tensors: Any) -> None:
        """Storages that exist before recording (parameters, buffers): never counted."""
        for t in tensors:
            if isinstance(t, self._torch.Tensor):
                self._seen[t.untyped_storage()] = -1

    def _add(self, t: Any, func: Any) -> None:
        if not isinstance(t, self._torch.Tensor) or t.device.type not in self._devices:
            return
        st = t.untyped_storage()
        if st in self._seen:
            if self._seen[st] == -2:  # a view of a folded loop's kept copies
                self._shared[st].view(t)
            return
        i = self._next
        self._next += 1
        self._seen[st] = i
        where = self.stack[-1] if self.stack else ""
        op = getattr(func, "__name__", str(func)).split(".")[0]
        self.events.append(("a", i, st.nbytes(), f"{where}|{op}"))
        weakref.finalize(st, self._freed, i)

    def _freed(self, i: int) -> None:
        self.events.append(("f", self.rename.pop(i, i)))

    def new_ids(self, count: int) -> int:
        """The first of `count` consecutive ids that no storage of this run has (loops.py's
        copies)."""
        i = self._next
        self._next += count
        return i

    def shared(self, st: Any, owner: Any) -> None:
        """Storage `st`, made outside the recorder, holds tensors that stand for allocations
        already in the events (loops._Kept): never counted itself; each tensor an op makes on
        it is passed to `owner.view`, which keeps the allocation it lies in alive with it."""
        self._seen[st] = -2
        self._shared[st] = owner

    def mark(self, phase: str) -> None:
        """Start a phase: `replay` reports each phase's own peak."""
        self.events.append(("m", phase))

    def __enter__(self) -> Recorder:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def track_modules(self, model: Any):
        """Keep `stack` (qualified names of the modules running) current inside the block."""
        return module_stack(model, self.stack)


@contextmanager
def module_stack(model: Any, stack: list[str], label_of: Any = None) -> Iterator[None]:
    """Inside the block, `stack` holds the modules of `model` entered and not yet left (forward
    hooks), each as `label_of(name, module)` (default: its qualified name, "" for the root)."""
    handles = []
    for name, mod in model.named_modules():
        label = name if label_of is None else label_of(name, mod)

        def pre(_m: Any, _a: Any, label: str = label) -> None:
            stack.append(label)

        def post(_m: Any, _a: Any, _o: Any) -> None:
            if stack:
                stack.pop()

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class ReplayTooLong(ValueError):
    """A replay of more steps (`replay_cost`) than the limit it was given."""


def unrolled(ev: Event) -> Iterator[Event]:
    """The plain events of one repeat event ("r", template, copies, first id, previous ids):
    `copies` iterations of the template, whose entries are ("a", nbytes, label) (the
    iteration's next allocation, ids first id + iteration · allocations + position),
    ("f", "this", position) (a free of this iteration's allocation) and ("f", "prev",
    position) (of the iteration before's: for the first, the previous ids')."""
    _, template, copies, base, prev = ev
    k = sum(1 for t in template if t[0] == "a")
    last: Any = prev
    for c in range(copies):
        start = base + c * k
        pos = 0
        for t in template:
            if t[0] == "a":
                yield ("a", start + pos, t[1], t[2])
                pos += 1
            elif t[1] == "this":
                yield ("f", start + t[2])
            else:
                yield ("f", last[t[2]])
        last = range(start, start + k)


def flat(events: Any) -> Iterator[Event]:
    """The events with every repeat event unrolled (`unrolled`): the stream as it was made."""
    for ev in events:
        if ev[0] == "r":
            yield from unrolled(ev)
        else:
            yield ev


#: Fewer tensors than this are stacked by the meta kernel itself.
STACK_FAST_MIN = 64


def _meta_stack(torch: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """`torch.stack` of many contiguous meta tensors of one shape and dtype, made at once: an
    empty contiguous meta tensor of the stacked shape, which is what the meta kernel returns
    (torch/_refs `stack`: `cat` of each input unsqueezed, contiguous inputs giving a contiguous
    result), without its Python per input (Mamba's scan stacks 16,384 steps a layer: 0.45 s).
    None where the inputs are otherwise (the meta kernel runs)."""
    if func is not torch.ops.aten.stack.default or not args:
        return None
    tensors = args[0]
    if len(tensors) < STACK_FAST_MIN:
        return None
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    first = tensors[0]
    shape, dtype = first.shape, first.dtype
    if any(not isinstance(t, torch.Tensor) or t.device.type != "meta" or t.shape != shape
           or t.dtype != dtype or not t.is_contiguous() for t in tensors):
        return None
    ndim = len(shape) + 1
    if not -ndim <= dim < ndim:
        return None  # the kernel says what is wrong
    dim %= ndim
    return torch.empty((*shape[:dim], len(tensors), *shape[dim:]), dtype=dtype, device="meta")


def _bypass(nbytes: int, expandable: bool) -> bool:
    """Whether the caching allocator hands out exactly round_size(nbytes) whatever its state:
    every small-pool request (rounded to at most 1 MiB: a small block is split whenever 512 B
    would remain, and a small pool's sizes are multiples of 512 B) and, with expandable
    segments, every request (blocks always split); calc.allocator `should_split`. The small and
    large pools share no blocks (`get_pool`), so such requests never change what a large
    request gets: the replay counts them without the allocator."""
    return expandable or is_small(round_size(nbytes))


class _Repeat:
    """What the replay needs of one repeat event's template (`unrolled`)."""

    __slots__ = ("template", "copies", "base", "prev", "k", "sizes", "kept", "carried",
                 "closed")

    def __init__(self, ev: Event, expandable: bool) -> None:
        _, self.template, self.copies, self.base, self.prev = ev
        self.sizes = [t[1] for t in self.template if t[0] == "a"]
        self.k = len(self.sizes)
        this = {t[2] for t in self.template if t[0] == "f" and t[1] == "this"}
        prev = {t[2] for t in self.template if t[0] == "f" and t[1] == "prev"}
        self.carried = sorted(prev)  # freed by the next iteration
        self.kept = [p for p in range(self.k) if p not in this and p not in prev]
        #: every allocation bypasses the allocator: iterations after the first in closed form
        self.closed = all(_bypass(n, expandable) for n in self.sizes)

    def ids(self, c: int, positions: list[int]) -> Iterator[int]:
        start = self.base + c * self.k
        return (start + p for p in positions)

    def steady(self) -> tuple[int, int, int]:
        """For an iteration after the first (closed form): (its change of "allocated", the
        highest "allocated" above its start at an allocation, the first template index
        reaching it)."""
        level, best, at = 0, None, -1
        for j, t in enumerate(self.template):
            if t[0] == "a":
                level += round_size(t[1]) if t[1] > 0 else 0
                if best is None or level > best:
                    best, at = level, j
            else:
                n = self.sizes[t[2]]
                level -= round_size(n) if n > 0 else 0
        return level, (0 if best is None else best), at


def replay_cost(events: Any, expandable: bool = False) -> int:
    """The steps `replay` takes: one per plain event; a repeat event whose allocations all
    bypass the allocator (`_bypass`), its template twice (the first iteration, the steady one)
    and one per tensor it leaves alive; any other repeat, every iteration's events."""
    cost = 0
    for ev in events:
        if ev[0] != "r":
            cost += 1
            continue
        r = _Repeat(ev, expandable)
        if r.closed:
            cost += 2 * len(r.template) + (r.copies - 1) * len(r.kept) + len(r.carried)
        else:
            cost += r.copies * len(r.template)
    return cost


def replay(events: Any, expandable: bool = False,
           limit: int | None = None) -> dict[str, PhasePeak]:
    """Each phase's peak "allocated" (bytes above the start of recording) and what is alive
    then, with every tensor as the CUDA caching allocator's block (attnmem.calc.allocator).

    Two passes: the first replays the allocator and finds each phase's peak (its first
    moment), the second lists what is alive there from the block sizes the first found, with
    no allocator (listing at every new high would be quadratic in a long forward); it stops at
    the last peak. Requests that get exactly their rounded size whatever the allocator's state
    (`_bypass`: the small pool's, every one with expandable segments) are counted without
    it. A repeat event (a folded loop, attnmem.trace.loops) of such requests only is replayed
    in closed form after its first iteration: every later iteration changes "allocated" by the
    same bytes (what it keeps), so its highest moment is the last iteration's (the first
    after the first, where it keeps nothing), and the tensors it leaves alive are entered in
    bulk. Any other repeat is replayed iteration by iteration. `_run` is the plain replay of
    every event through the allocator, which tests/trace/test_replay.py holds this to.

    ReplayTooLong where `limit` is given and `replay_cost` is past it (a count of steps, so
    the refusal depends on the events only, never on the machine's load)."""
    if limit is not None:
        cost = replay_cost(events, expandable)
        if cost > limit:
            raise ReplayTooLong(
                f"replaying its storage events through the caching allocator takes "
                f"{cost:,} steps, past the {limit:,} a trace may take here")
    phases, where, sizes = _peaks(events, expandable)
    _alive(events, phases, where, sizes, expandable)
    return phases


class _Pass:
    """The first pass of `replay`: the allocator, the bypassed bytes, the live ids."""

    def __init__(self, expandable: bool) -> None:
        self.a = CachingAllocator(expandable)
        self.expandable = expandable
        self.small = 0  # bytes of the live bypassed blocks
        self.handles: dict[int, int] = {}  # id -> allocator handle (>= 0) or -(bypassed bytes)
        self.sizes: dict[int, int] = {}  # id -> block size, for the allocator's
        self.phases: dict[str, PhasePeak] = {}
        self.where: dict[str, tuple[int, int, int]] = {}
        self.cur: PhasePeak | None = None

    @property
    def allocated(self) -> int:
        return self.a.allocated + self.small

    def alloc(self, i: int, nbytes: int, pos: tuple[int, int, int]) -> None:
        if nbytes > 0:
            if _bypass(nbytes, self.expandable):
                r = round_size(nbytes)
                self.small += r
                self.handles[i] = -r
            else:
                h = self.a.malloc(nbytes)
                self.handles[i] = h
                self.sizes[i] = self.a.block_size(h)
        cur = self.cur
        if cur is not None:
            now = self.a.allocated + self.small
            if now > cur.peak:
                cur.peak, self.where[cur.name] = now, pos

    def free(self, i: int) -> None:
        v = self.handles.pop(i, None)
        if v is None:
            return
        if v < 0:
            self.small += v
        else:
            self.a.free(v)

    def mark(self, name: str, pos: tuple[int, int, int]) -> None:
        if name not in self.phases:
            self.phases[name] = PhasePeak(name, start=self.allocated)
        cur = self.cur = self.phases[name]
        if name not in self.where or self.allocated > cur.peak:
            cur.peak, self.where[name] = self.allocated, pos

    def iteration(self, i: int, r: _Repeat, c: int, last: Any) -> None:
        """Iteration c of repeat event i, event by event; `last`: the ids the "prev" frees
        name (the previous iteration's, by position)."""
        start = r.base + c * r.k
        pos = 0
        for j, t in enumerate(r.template):
            if t[0] == "a":
                self.alloc(start + pos, t[1], (i, c, j))
                pos += 1
            elif t[1] == "this":
                self.free(start + t[2])
            else:
                self.free(last[t[2]])

    def repeat(self, i: int, r: _Repeat) -> None:
        self.iteration(i, r, 0, r.prev)
        if r.copies == 1:
            return
        if not r.closed:
            for c in range(1, r.copies):
                self.iteration(i, r, c, range(r.base + (c - 1) * r.k, r.base + c * r.k))
            return
        grow, high, at = r.steady()
        before = self.allocated
        c = r.copies - 1 if grow > 0 else 1
        cur = self.cur
        if cur is not None and at >= 0 and before + (c - 1) * grow + high > cur.peak:
            cur.peak, self.where[cur.name] = before + (c - 1) * grow + high, (i, c, at)
        self.small += (r.copies - 1) * grow
        h = self.handles
        for x in r.ids(0, r.carried):  # freed by iteration 1
            h.pop(x, None)
        neg = [-round_size(n) if n > 0 else 0 for n in r.sizes]
        for c in range(1, r.copies):
            start = r.base + c * r.k
            for p in r.kept:
                if neg[p]:
                    h[start + p] = neg[p]
        start = r.base + (r.copies - 1) * r.k
        for p in r.carried:
            if neg[p]:
                h[start + p] = neg[p]


def _peaks(events: Any, expandable: bool) -> tuple[dict[str, PhasePeak], dict, dict]:
    """The first pass of `replay`: phases with their peaks, where each is reached
    ((event index, iteration, template index), -1s outside a repeat), block sizes."""
    p = _Pass(expandable)
    for i, ev in enumerate(events):
        kind = ev[0]
        if kind == "a":
            p.alloc(ev[1], ev[2], (i, -1, -1))
        elif kind == "f":
            p.free(ev[1])
        elif kind == "m":
            p.mark(ev[1], (i, -1, -1))
        elif kind == "r":
            p.repeat(i, _Repeat(ev, expandable))
    return p.phases, p.where, p.sizes


def _alive(events: Any, phases: dict[str, PhasePeak], where: dict, sizes: dict,
           expandable: bool) -> None:
    """The second pass of `replay`: at each phase's peak, the allocations alive, by label
    (tensors, bytes as blocks), from the first pass's block sizes; no allocator."""
    wanted: dict[tuple[int, int, int], list[str]] = {}
    for name, pos in where.items():
        wanted.setdefault(pos, []).append(name)
    if not wanted:
        return
    last = max(pos[0] for pos in wanted)
    inside = {pos[0] for pos in wanted if pos[1] >= 0}
    live: dict[int, tuple[str, int]] = {}

    def block(i: int, nbytes: int) -> int:
        return sizes.get(i) or round_size(nbytes)

    def listed() -> dict[str, tuple[int, int]]:
        alive: dict[str, tuple[int, int]] = {}
        for label, b in live.values():
            n, by = alive.get(label, (0, 0))
            alive[label] = (n + 1, by + b)
        return alive

    def at(pos: tuple[int, int, int]) -> None:
        for name in wanted.get(pos, ()):
            phases[name].at_peak = listed()

    for i, ev in enumerate(events):
        if i > last:
            break
        kind = ev[0]
        if kind == "a":
            if ev[2] > 0:
                live[ev[1]] = (ev[3], block(ev[1], ev[2]))
        elif kind == "f":
            live.pop(ev[1], None)
        elif kind == "r":
            r = _Repeat(ev, expandable)
            if r.closed and i not in inside:
                _bulk(r, live)
                continue
            prev: Any = r.prev
            for c in range(r.copies):
                start = r.base + c * r.k
                pos = 0
                for j, t in enumerate(r.template):
                    if t[0] == "a":
                        if t[1] > 0:
                            live[start + pos] = (t[2], block(start + pos, t[1]))
                        pos += 1
                        if i in inside:
                            at((i, c, j))
                    elif t[1] == "this":
                        live.pop(start + t[2], None)
                    else:
                        live.pop(prev[t[2]], None)
                prev = range(start, start + r.k)
            continue
        at((i, -1, -1))


def _bulk(r: _Repeat, live: dict[int, tuple[str, int]]) -> None:
    """What a whole closed-form repeat leaves in `live` (the second pass): the previous
    iteration's tensors its first frees are gone; each iteration's kept tensors and the last
    one's carried tensors are alive."""
    labels = [t[2] for t in r.template if t[0] == "a"]
    for t in r.template:
        if t[0] == "f" and t[1] == "prev":
            live.pop(r.prev[t[2]], None)
    for c in range(r.copies):
        start = r.base + c * r.k
        for p in r.kept:
            if r.sizes[p] > 0:
                live[start + p] = (labels[p], round_size(r.sizes[p]))
    start = r.base + (r.copies - 1) * r.k
    for p in r.carried:
        if r.sizes[p] > 0:
            live[start + p] = (labels[p], round_size(r.sizes[p]))


def _run(events: list[Event], expandable: bool) -> Iterator[tuple[int, CachingAllocator, dict]]:
    """The plain replay: every event (repeats unrolled) through the allocator; yields (index in
    the unrolled stream, allocator, live handles) after each. `replay`'s reference."""
    a = CachingAllocator(expandable)
    handles: dict[int, tuple[int, str]] = {}
    for i, ev in enumerate(flat(events)):
        if ev[0] == "a":
            handles[ev[1]] = (a.malloc(ev[2]) if ev[2] > 0 else -1, ev[3])
        elif ev[0] == "f":
            h, _ = handles.pop(ev[1], (-1, ""))
            if h >= 0:
                a.free(h)
        yield i, a, handles
