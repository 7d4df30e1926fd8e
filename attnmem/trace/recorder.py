"""Every tensor storage a piece of torch code makes and frees, in order, on any device (meta too).

`Recorder` is a TorchDispatchMode: each tensor an op returns is looked up by its storage; a
storage not seen before is an allocation of `nbytes` (a view, or an in-place op's result, is
not), and a weak-reference finalizer on the storage records its free when the last tensor on it
dies (CPython frees at the last reference, so the order is the program's); temporaries a CUDA
kernel makes inside an op, which its meta kernel does not, come from attnmem.trace.cuda_only.
On the meta device
storages have sizes but no memory, so a 70B model's forward at 128k tokens costs nothing but
the Python of its modules.

Each allocation is labelled with the op and the innermost module running (`track_modules`), so
a peak can be said in the model's own names. `replay` feeds the events through
attnmem.calc.allocator.CachingAllocator: what `torch.cuda.max_memory_allocated()` counts is
each tensor as the block the CUDA caching allocator hands out (512-byte rounding, whole blocks
where the large pool does not split), and phases (`mark`) get their own peaks.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from attnmem.calc.allocator import CachingAllocator
from attnmem.trace.cuda_only import temporaries
from attnmem.trace.known import Known
from attnmem.trace.uniform import Uniform

#: ("a", id, nbytes, label) | ("f", id) | ("m", phase name)
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

    def own(self, st: Any, i: int) -> None:
        """Enter storage `st`, made outside the recorder, as allocation `i` (already in the
        events): its free is recorded when it dies, and ops do not count it again."""
        self._seen[st] = i
        weakref.finalize(st, self._freed, i)

    def new_id(self) -> int:
        """An id for an allocation that no storage of this run has (loops.py's copies)."""
        i = self._next
        self._next += 1
        return i

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


class ReplayTooSlow(ValueError):
    """A replay whose projected time is past the limit it was given."""


def replay(events: list[Event], expandable: bool = False,
           limit: float | None = None) -> dict[str, PhasePeak]:
    """Each phase's peak "allocated" (bytes above the start of recording) and what is alive
    then, with every tensor as the CUDA caching allocator's block (attnmem.calc.allocator).
    Two passes: the first finds each phase's peak event, the second lists what is alive there
    (listing at every new high would be quadratic in a long forward); the second stops at the
    last peak. ReplayTooSlow where, with `limit` seconds given, the first pass's pace projects
    both past it (checked every 16,384 events; calc.allocator's best fit bisects a sorted
    free index, about 200k-350k events a second, so a million-event stream takes seconds)."""
    import time

    phases: dict[str, PhasePeak] = {}
    where: dict[str, int] = {}
    cur: PhasePeak | None = None
    t0, total = time.perf_counter(), len(events)
    for i, a, _handles in _run(events, expandable):
        if limit is not None and i and not i % 16384:
            est = (time.perf_counter() - t0) * total / i * 1.8  # the second pass: shorter
            if est > limit:
                raise ReplayTooSlow(
                    f"replaying its {total:,} storage events through the caching allocator "
                    f"would take about {est:,.0f} s, past the {limit:g} s a trace may take "
                    f"here")
        ev = events[i]
        if ev[0] == "m":
            if ev[1] not in phases:
                phases[ev[1]] = PhasePeak(ev[1], start=a.allocated)
            cur = phases[ev[1]]
            if ev[1] not in where or a.allocated > cur.peak:
                cur.peak, where[ev[1]] = a.allocated, i
        elif cur is not None and ev[0] == "a" and a.allocated > cur.peak:
            cur.peak, where[cur.name] = a.allocated, i
    wanted = {i: name for name, i in where.items()}
    last = max(wanted, default=-1)
    for i, a, handles in _run(events, expandable):
        if i > last:
            break
        if i in wanted:
            alive: dict[str, tuple[int, int]] = {}
            for h, label in handles.values():
                if h >= 0:
                    n, b = alive.get(label, (0, 0))
                    alive[label] = (n + 1, b + a.block_size(h))
            phases[wanted[i]].at_peak = alive
    return phases


def _run(events: list[Event], expandable: bool) -> Iterator[tuple[int, CachingAllocator, dict]]:
    """Replay the events; yield (index, allocator, live handles) after each."""
    a = CachingAllocator(expandable)
    handles: dict[int, tuple[int, str]] = {}
    for i, ev in enumerate(events):
        if ev[0] == "a":
            handles[ev[1]] = (a.malloc(ev[2]) if ev[2] > 0 else -1, ev[3])
        elif ev[0] == "f":
            h, _ = handles.pop(ev[1], (-1, ""))
            if h >= 0:
                a.free(h)
        yield i, a, handles
