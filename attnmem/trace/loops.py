"""Python loops over the tokens in transformers' code, folded: a few iterations run, the rest
are proved to repeat them and added to the trace as copies of their storage events.

Where a mixer's CUDA kernel is absent (as on the meta device) transformers falls back to torch
code that loops in Python: RecurrentGemma's RG-LRU scan and RWKV's WKV loop over every token,
the gated delta rule (Qwen3-Next) over every chunk of 64. On meta each iteration costs only the
Python of its ops, but that is ~1 ms per token and layer: minutes for a long prompt.

On meta the loop index only picks slices, whose sizes do not depend on it, so every iteration
after the first runs the same ops on tensors of the same sizes. `fold_loops` makes that a
checked fact rather than an assumption, for each `for` statement in transformers' code whose
`range(...)` has at least FOLD_MIN steps:

1. the loop runs for real at the indices 0, 1, 2, 3 and n // 2, each iteration's storage events
   (attnmem.trace.recorder) kept as a block;
2. the blocks after the first must be identical: the same allocations (sizes, module|op labels)
   and frees in the same order, each free naming an allocation of its own block or of the one
   before at the same position (so what an iteration leaves alive, the next one frees: nothing
   accumulates); every list, dict, set or tuple among the loop's local variables must keep its
   length (no Python-side accumulation either), and the block must make at least one tensor;
3. then the n − 6 iterations not run are added as one repeat event: the block as a template
   (sizes, labels, frees by position) to be taken n − 6 times with fresh storage ids, each
   "prev" free naming the copy before (attnmem.trace.recorder.unrolled; the replay runs it in
   closed form where it can, `replay`), at the cost of one event however long the loop; the
   last index, n − 1, runs for real, its frees of the previous iteration's tensors renamed to
   the last copy's. Where each iteration appends one tensor to one list (Mamba's selective
   scan keeps its per-token outputs), the list is extended with a tensor per copy (`_Kept`).

The caching allocator's replay then sees exactly the events of all n iterations. A loop that
fails a check is not folded: it runs every remaining iteration, and `_Folder.check_cost`
refuses it where its tensor ops (counted by the recorder) or its events would take the trace
past its `Limits`, naming the loop; the limits are counts, so a refusal depends on the model
and its inputs, not on the host's load. Only `for` statements are folded (an AST check of the
statement at the instruction: comprehensions and `list(range(n))` get the plain range), only
in the tracing thread, and only in inference (no autograd graph: a training step's backward
would replay the iterations that were not run).
"""

from __future__ import annotations

import ast
import linecache
import sys
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from typing import Any

from attnmem.trace.recorder import flat

#: Loops shorter than this run as written (layer loops, heads, small chunks).
FOLD_MIN = 64
#: Positions of the iterations that run before the rest are folded (n // 2 is added).
_SAMPLED = (0, 1, 2, 3)
_BUILTIN_RANGE = range
#: Tensors a fold makes for a list of per-step outputs (`_Kept`) that count as one tensor op
#: in the trace's limit of ops.
KEPT_PER_OP = 5
#: Iterations of an unfolded loop between two checks of its cost.
_RECHECK = 256


class LoopTooSlow(ValueError):
    """A loop that cannot be folded would take the trace past its time limit."""


@lru_cache(maxsize=256)
def _for_statements(filename: str) -> frozenset:
    """(lineno, end_lineno, col, end_col) of every `for` statement in a source file."""
    source = "".join(linecache.getlines(filename))
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    return frozenset((n.lineno, n.end_lineno, n.col_offset, n.end_col_offset)
                     for n in ast.walk(tree) if isinstance(n, ast.For))


def _is_for_statement(frame: Any) -> bool:
    """Whether the instruction `frame` is at (GET_ITER) starts a `for` statement."""
    try:
        pos = list(frame.f_code.co_positions())[frame.f_lasti // 2]
    except (AttributeError, IndexError):
        return False
    return pos in _for_statements(frame.f_code.co_filename)


class _Made:
    """The tensors each op makes while a loop's sampled iterations run, by iteration, held
    weakly: one still alive two iterations later is accumulated (a list of per-step outputs or
    of views), which a fold would cut short."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.blocks: list[list[Any]] = []

    def new_block(self) -> None:
        self.blocks.append([])

    def __call__(self, func: Any, args: tuple, out: Any) -> None:
        if not self.blocks:
            return
        ins = {id(a) for a in args if isinstance(a, self._torch.Tensor)}
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(o, self._torch.Tensor) and id(o) not in ins:  # not an in-place op's
                self.blocks[-1].append(weakref.ref(o))

    def one_list(self, upto: int) -> tuple[list, Any] | None:
        """(the list, a tensor in it) where the tensors of iterations 1 .. upto - 1 still alive
        are one per iteration, each in one list that ends with one made by the last iteration
        (a loop appending its per-step output); None otherwise."""
        import gc

        alive = []  # tuples: the lists looked for below are other code's
        for b in self.blocks[1:upto]:
            objs = tuple(o for o in (r() for r in b) if o is not None)
            bases = {id(o._base) for o in objs if o._base is not None}
            alive.append(tuple(o for o in objs if id(o) not in bases))  # a view keeps its base
            del objs
        if not alive or any(len(a) != 1 for a in alive):
            return None
        lists = [x for x in gc.get_referrers(alive[0][0]) if isinstance(x, list)]
        if len(lists) != 1:
            return None
        lst = lists[0]
        last = {id(o) for o in (r() for r in self.blocks[-1]) if o is not None}
        if not lst or id(lst[-1]) not in last or any(
                not any(x is a[0] for x in lst) for a in alive):
            return None
        return lst, alive[-1][0]

    def kept(self, upto: int) -> bool:
        """Whether a tensor made in iterations 1 .. upto - 1 is still alive."""
        return any(r() is not None for b in self.blocks[1:upto] for r in b)


class _Folder:
    """The state of one trace's folding: the recorder, the thread, the limits (counts of the
    trace's work, so a refusal depends on the model and its inputs only)."""

    def __init__(self, rec: Any, limits: Limits | None, model: Any) -> None:
        import torch

        self.rec = rec
        self.thread = threading.get_ident()
        self.limits = limits
        self.model = model
        self.grad = torch.is_grad_enabled
        self.folded = 0  # loops folded
        self.unfolded: list[str] = []  # loops run in full, "file:line (n steps): why"
        self.runs: dict[str, int] = {}  # unfolded loops by place: how many ran

    def active(self) -> bool:
        return threading.get_ident() == self.thread

    def check_spent(self, where: str, n: int) -> None:
        """LoopTooSlow where the trace has already run past its limit of ops."""
        lim = self.limits
        if lim is None or self.rec.ops <= lim.ops:
            return
        raise LoopTooSlow(
            f"after {self.rec.ops:,} tensor ops, past the {lim.ops:,} a trace may run here, it "
            f"reached another Python loop of {n:,} steps in transformers' code ({where}); "
            f"{self.folded} loops were folded, {len(self.unfolded)} run in full; a shorter "
            f"prompt runs fewer (a loop over the tokens makes work for every token)")

    def check_cost(self, where: str, n: int, left_here: int, ops: float, events: float,
                   why: str) -> None:
        """LoopTooSlow where this loop's `left_here` iterations, and the loops like it in the
        model's other modules of the class running it, at `ops` tensor ops and `events`
        storage events an iteration, would take the trace past its limit of ops or its
        events past the replay's limit of steps."""
        lim = self.limits
        if lim is None:
            return
        owner = None
        if self.model is not None and self.rec.stack:
            try:  # the innermost module running: the recorder's module stack
                owner = self.model.get_submodule(self.rec.stack[-1])
            except AttributeError:
                owner = None
        alike = 1
        if owner is not None:
            alike = max(1, sum(1 for m in self.model.modules() if type(m) is type(owner)))
        ahead = max(0, alike - self.runs.get(where, 1))  # its like not yet run
        iters = left_here + ahead * n
        over = []
        if self.rec.ops + ops * iters > lim.ops:
            over.append((f"{self.rec.ops + ops * iters:,.0f} tensor ops ({ops:,.0f} an "
                         f"iteration)", f"{lim.ops:,} a trace may run here",
                         lim.ops / max(ops * alike, 1)))
        if len(self.rec.events) + events * iters > lim.steps:
            over.append((f"{len(self.rec.events) + events * iters:,.0f} storage events to "
                         f"replay ({events:,.0f} an iteration)",
                         f"{lim.steps:,} the replay takes here",
                         lim.steps / max(events * alike, 1)))
        if not over:
            return
        steps = int(min(s for _, _, s in over))
        who = f" in each of its {alike} {type(owner).__name__} modules" if alike > 1 else ""
        raise LoopTooSlow(
            f"a Python loop of {n:,} steps in transformers' code ({where}){who} cannot be "
            f"folded ({why}) and would bring the trace to "
            + " and ".join(f"{what}, past the {limit}" for what, limit, _ in over)
            + f"; the trace answers such loops up to about {steps:,} steps (for a loop over "
              f"the tokens, a prompt that long)")


@dataclass(frozen=True)
class Limits:
    """How much work a trace may do: `ops` tensor ops dispatched (Recorder.ops), `steps` of
    the allocator replay (attnmem.trace.recorder.replay_cost)."""

    ops: int
    steps: int


_FOLDER: list[_Folder] = []


class _Range:
    """range(...) as transformers' code calls it during a trace: a real range for everything
    but the iteration of a `for` statement of at least FOLD_MIN steps."""

    __slots__ = ("_r",)

    def __init__(self, r: range) -> None:
        self._r = r

    def __iter__(self):
        folder = _FOLDER[-1] if _FOLDER else None
        if folder is None or not folder.active():
            return iter(self._r)
        frame = sys._getframe(1)
        if not _is_for_statement(frame):
            return iter(self._r)
        return _fold(folder, self._r, frame)

    def __len__(self) -> int:
        return len(self._r)

    def __getitem__(self, i: Any) -> Any:
        return self._r[i]

    def __contains__(self, x: Any) -> bool:
        return x in self._r

    def __reversed__(self):
        return reversed(self._r)

    def __eq__(self, other: Any) -> bool:
        return self._r == (other._r if isinstance(other, _Range) else other)

    def __hash__(self) -> int:
        return hash(self._r)

    def __getattr__(self, name: str) -> Any:  # start, stop, step, count, index
        return getattr(self._r, name)

    def __repr__(self) -> str:
        return repr(self._r)


def _range(*args: Any) -> Any:
    r = _BUILTIN_RANGE(*args)
    if len(r) < FOLD_MIN or not _FOLDER or not _FOLDER[-1].active():
        return r
    return _Range(r)


def _normal(events: list, start: int, end: int, prev: dict[int, int]) -> tuple[tuple, dict]:
    """Block events[start:end] with ids replaced by positions: ("a", nbytes, label),
    ("f", "this"|"prev", position) or ("f", "old", id); and its id -> position map."""
    own: dict[int, int] = {}
    out = []
    for ev in flat(events[start:end]):  # a loop folded inside an iteration: its events
        if ev[0] == "a":
            own[ev[1]] = len(own)
            out.append(("a", ev[2], ev[3]))
        elif ev[0] == "f":
            if ev[1] in own:
                out.append(("f", "this", own[ev[1]]))
            elif ev[1] in prev:
                out.append(("f", "prev", prev[ev[1]]))
            else:
                out.append(("f", "old", ev[1]))
        else:
            out.append(ev)
    return tuple(out), own


def _fold(folder: _Folder, r: range, frame: Any):
    """Iterate r for a `for` statement, folding it where the checks hold (module docstring)."""
    rec = folder.rec
    events = rec.events
    n = len(r)
    where = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
    sampled = [*_SAMPLED, n // 2]
    folder.check_spent(where, n)
    bounds: list[int] = []
    made = _Made()
    outer, rec.watch = rec.watch, made
    ops0 = rec.ops
    try:
        for pos in sampled:
            bounds.append(len(events))
            made.new_block()
            yield r[pos]
        bounds.append(len(events))
    finally:
        rec.watch = outer
    why, kept = _check(events, bounds)
    out_list = None
    if not why and kept:  # a tensor kept per iteration: folded only where one list holds them
        out_list = made.one_list(len(sampled) - 1)
        if out_list is None or len(kept) != 1:
            why = ("each iteration keeps a tensor alive other than by appending one to a list "
                   "of per-step outputs")
    elif not why and made.kept(len(sampled) - 1):
        why = "each iteration keeps a view alive (a list of per-step views)"
    del made
    if not why and folder.grad():
        why = "autograd records its iterations (a training step's backward replays them)"
    if why:
        rest = [i for i in _BUILTIN_RANGE(n) if i not in set(sampled)]
        folder.unfolded.append(f"{where} ({n:,} steps): {why}")
        folder.runs[where] = folder.runs.get(where, 0) + 1
        ops = (rec.ops - ops0) / len(sampled)
        evs = _length(events[bounds[0]:bounds[-1]]) / len(sampled)
        folder.check_cost(where, n, len(rest), ops, evs, why)
        ops1, ev1 = rec.ops, len(events)
        for k, i in enumerate(rest):
            if k and k % _RECHECK == 0:  # iterations that do more than the sampled ones
                ops = max(ops, (rec.ops - ops1) / _RECHECK)
                evs = max(evs, (len(events) - ev1) / _RECHECK)
                ops1, ev1 = rec.ops, len(events)
                folder.check_cost(where, n, len(rest) - k, ops, evs, why)
            yield r[i]
        return
    # the template: the last sampled block, its ids relative to the block before; the copies
    # are one repeat event (attnmem.trace.recorder.unrolled), their ids taken as one range
    prev_ids = _ids(events, bounds[-3], bounds[-2])
    template, last = _normal(events, bounds[-2], bounds[-1], prev_ids)
    k = len(last)
    copies = n - len(sampled) - 1
    base = rec.new_ids(copies * k)
    events.append(("r", template, copies, base, tuple(last)))
    if out_list is not None:  # the per-step outputs the list keeps: real tensors
        (p,) = kept
        made_here = _Kept(rec, out_list[1], [base + c * k + p for c in _BUILTIN_RANGE(copies)])
        out_list[0].extend(made_here.views)  # the list the loop appends to: n - 1 entries
        made_here.views = ()
        # each a tensor the model's code then handles (a stack's input) and frees: about a
        # fifth of an op's time (Mamba-130M at 16,384 tokens: 393k of them, ~8 s of 10)
        rec.ops += copies // KEPT_PER_OP
    # the last iteration runs: its frees of the last real block's tensors are the last copy's
    end = base + (copies - 1) * k
    for pos, real in enumerate(last):
        if pos not in kept:  # a kept tensor is freed as itself (with its list)
            rec.rename[real] = end + pos
    folder.folded += 1
    yield r[n - 1]


class _Kept:
    """The per-step outputs of a folded loop's copies (the tensors a loop appends to a list):
    views shaped as `proto` (size, stride, offset, dtype), one per id, of one storage made
    outside the recorder, which the recorder treats as made before it (`Recorder.shared`).
    Copy c's tensor stands for allocation ids[c], whose free is recorded when the last tensor
    on it dies: its view here, or any view an op makes of it (counted by `view`), as a storage
    of its own would be freed. Made in one call (`unbind`, ~1 µs a tensor): a storage of its
    own per copy cost ~40 µs, minutes for a long prompt's loops over every layer."""

    def __init__(self, rec: Any, proto: Any, ids: list[int]) -> None:
        import torch
        from torch.utils._python_dispatch import _disable_current_modes

        self.rec, self.ids = rec, ids
        self.span = proto.untyped_storage().nbytes()  # each copy's bytes, as the proto's
        self.alive = [1] * len(ids)
        self._refs: dict[Any, int] = {}
        item = proto.element_size()
        with _disable_current_modes():
            whole = torch.empty(max(1, len(ids) * self.span // item), dtype=proto.dtype,
                                device=proto.device)
            views = whole.as_strided((len(ids), *proto.size()),
                                     (self.span // item, *proto.stride()),
                                     proto.storage_offset()).unbind(0)
        rec.shared(whole.untyped_storage(), self)
        del whole
        # one weak reference per view, made in C (a Python loop doubled the cost)
        refs = map(weakref.ref, views, repeat(self._died))
        self._refs = dict(zip(refs, range(len(ids)), strict=True))
        self.views = views

    def view(self, t: Any) -> None:
        """An op made `t` on the shared storage: the copy it lies in lives while it does."""
        c = t.storage_offset() * t.element_size() // self.span
        self.alive[c] += 1
        self._refs[weakref.ref(t, self._died)] = c

    def _died(self, ref: Any) -> None:
        c = self._refs.pop(ref)
        self.alive[c] -= 1
        if not self.alive[c]:
            self.rec._freed(self.ids[c])


def _ids(events: list, start: int, end: int) -> dict[int, int]:
    own: dict[int, int] = {}
    for ev in flat(events[start:end]):
        if ev[0] == "a":
            own[ev[1]] = len(own)
    return own


def _check(events: list, bounds: list[int]) -> tuple[str, set[int]]:
    """Why the sampled blocks do not prove the loop repeats ("" where they do), and the
    positions of the allocations each iteration keeps (freed neither in it nor the next)."""
    blocks = []
    prev: dict[int, int] = _ids(events, bounds[0], bounds[1])
    for k in _BUILTIN_RANGE(1, len(bounds) - 1):
        norm, own = _normal(events, bounds[k], bounds[k + 1], prev)
        blocks.append(norm)
        prev = own
    if any(ev[0] == "m" for b in blocks for ev in b):
        return "a phase mark inside it", set()
    if not any(ev[0] == "a" for ev in blocks[0]):
        return "its iterations make no tensor", set()
    if any(b != blocks[0] for b in blocks[1:]):
        return "its iterations differ", set()
    if any(ev[0] == "f" and ev[1] == "old" for ev in blocks[0]):
        return "its iterations free tensors made before the one before", set()
    made = sum(1 for ev in blocks[0] if ev[0] == "a")
    freed = {ev[2] for ev in blocks[0] if ev[0] == "f"}  # this block's or the one before's
    return "", {pos for pos in _BUILTIN_RANGE(made) if pos not in freed}


def _length(events: list) -> int:
    """How many events `events` stand for (repeat events unrolled)."""
    n = 0
    for ev in events:
        n += 1 if ev[0] != "r" else ev[2] * len(ev[1])
    return n


@contextmanager
def fold_loops(rec: Any, limits: Limits | None = None, model: Any = None):
    """Inside the block, `for` loops over range(n ≥ FOLD_MIN) in transformers' code are folded
    into `rec` (module docstring); where one cannot be, LoopTooSlow is raised once running it
    would take the trace past `limits` (its like in `model`'s other modules counted). Yields
    the _Folder (what was folded, what was not and why)."""
    folder = _Folder(rec, limits, model)
    mods = [m for name, m in list(sys.modules.items())
            if name.startswith("transformers.") and m is not None and hasattr(m, "__dict__")]
    patched = []
    for m in mods:
        if "range" not in vars(m):
            try:
                m.range = _range
            except (AttributeError, TypeError):
                continue
            patched.append(m)
    _FOLDER.append(folder)
    try:
        yield folder
    finally:
        _FOLDER.pop()
        for m in patched:
            if vars(m).get("range") is _range:
                del m.range
