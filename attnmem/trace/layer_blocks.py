"""generate()'s trace of a deep model from the same model with a few layers (issue 42, item 4).

A trace's cost is the Python of each module call (attnmem.trace.recorder), so it grows with
the layer count, while the storage events of decoder layers of one kind are the same from one
layer to the next. Here the model is traced with few layers, and the event stream of the full
depth is built from that trace, exactly, or not at all.

The plan (`plan`): the full model is built on the meta device (it is needed for its weights
anyway) and each decoder layer gets a signature: every submodule's class, parameters and
buffers (shape, dtype), and its plain attributes (a sliding window, `use_rope`, an
`attention_type`), all but its own index (`layer_idx` and the like, which only picks its cache
slot). From the signatures, the smallest head `c` and period `p` such that layers c-1, c, ...
repeat with period p (a dense model: p = 1; Gemma 3's five local and one global layer: p = 6;
GLM-4.5's first dense layer sits in the head), with (L - c) a multiple of p. The short model
keeps the first c + p layers: the head as it is, one copy of the repeated block, and the layer
before it, so that every cross-layer event (a layer freeing its predecessor's output) is seen.
Its config is the full one with the layer count cut and every per-layer list or string
(`layer_types`, `no_rope_layers`, Nemotron-H's pattern) cut to its first c + p entries; its
layers' signatures must equal the full model's first c + p, and everything outside the layers
(and the config's other values) must be the same.

The stream (`expand`): each event belongs to the layer whose module made the last allocation
(frees carry no module; between-layer code goes with the layer before it). The head's events
are copied once; the block's events (the last p layers of each forward) are copied L/p times
over, their labels renumbered; a free names the tensor it frees by the layer that made it,
relative to its own layer (the previous layer's output is one layer back, the cache a prefill
made is the same layer one forward earlier), and where that layer is a copy the tensor is the
copy's. Frees outside every layer (deleting the cache) that sweep over all layers are swept
over all L. Sizes are copied as they are, so the same expansion serves a length model's
skeleton (attnmem.trace.lengths). The cache's bytes are the model's allocations left alive at
the end of the trace (checked against the trace's own count of the cache, else no shortcut).

What proves it: every use traces a second short model, one block longer (c + 2p layers), and
the expansion of the first to c + 2p layers must equal its trace event for event (ids, sizes,
labels, order) and in cache bytes; anything else (a layer whose events change with its index
where no attribute says so and the longer trace shows it, a sweep that is not over all layers,
layers run out of order) and the full model is traced instead. What it cannot see: code that
branches on the layer index only past c + 2p layers with no attribute to show it (the forward
source of the layers is searched for such comparisons: `_INDEX_BRANCH`). tests/trace/
test_layer_blocks.py checks the result equals a full trace byte for byte on dense,
sliding-window, MoE and hybrid layouts.
"""

from __future__ import annotations

import bisect
import inspect
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from attnmem.trace.weights import _LAYER_KEYS

#: Attributes that hold a module's own layer index (its cache slot): left out of a signature.
_INDEX_ATTRS = frozenset({"layer_idx", "layer_id", "layer_number", "layer_index", "idx",
                          "block_idx", "layer_num"})
#: Attributes that are not the module's own values (the config is compared on its own).
_SKIP_ATTRS = frozenset({"training", "config"})
#: A forward that compares or does arithmetic on a layer index (other than passing it on):
#: such a model's layers can differ by index alone, so no shortcut.
_INDEX_BRANCH = re.compile(
    r"\b(?:self\.)?(?:layer_idx|layer_id|layer_number|layer_index|block_idx)\s*"
    r"(?:==|!=|<=|>=|<|>|%|//|\bin\b)|(?:==|!=|<=|>=|<|>|%)\s*(?:self\.)?"
    r"(?:layer_idx|layer_id|layer_number|layer_index|block_idx)\b")
#: The shortcut is taken only where its two short traces together have fewer layers than the
#: model, by at least this many.
MIN_SAVED_LAYERS = 2
#: The most times a plan's head is made a period longer where the layer before the block
#: allocates unlike the block's last (`deeper`).
MAX_GROWN = 2


class NotRepeating(ValueError):
    """The short traces do not extend to the full depth (the reason in words)."""


@dataclass(frozen=True)
class LayerPlan:
    """How a model of `depth` decoder layers is traced with `head + period` of them."""

    layers_name: str  # qualified name of the decoder layers' ModuleList ("model.layers")
    depth: int
    head: int  # c: layers before the repeated block (the last of them precedes a block)
    period: int  # p
    short_text: str  # the config (JSON) with head + period layers
    check_text: str  # ... and with head + 2·period
    weights_bytes: int  # the full model's parameters and buffers
    model_class: str
    grown: int = 0  # times the head was made one period longer (`deeper`)

    @property
    def short_depth(self) -> int:
        return self.head + self.period

    @property
    def check_depth(self) -> int:
        return self.head + 2 * self.period


def _plain(v: Any, depth: int = 0) -> Any:
    """A comparable stand-in for an attribute value."""
    import torch

    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return repr(v)  # NaN == NaN here
    if isinstance(v, (torch.dtype, torch.device)):
        return str(v)
    if isinstance(v, (list, tuple)) and depth < 3:
        return (type(v).__name__, tuple(_plain(x, depth + 1) for x in v))
    if isinstance(v, dict) and depth < 3:
        return ("dict", tuple(sorted((str(k), _plain(x, depth + 1)) for k, x in v.items())))
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype))
    fn = getattr(v, "__qualname__", None)
    if callable(v) and fn:
        return ("fn", getattr(v, "__module__", ""), fn)
    return ("object", type(v).__module__, type(v).__qualname__)


def signature(module: Any, skip: tuple[str, ...] = ()) -> tuple:
    """Every submodule's class, parameters, buffers and plain attributes (not its layer index),
    leaving out the submodules under the names in `skip`."""
    out = []
    for name, m in module.named_modules():
        if any(name == s or name.startswith(s + ".") for s in skip):
            continue
        params = tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad)
                       for n, p in m.named_parameters(recurse=False))
        non_persistent = getattr(m, "_non_persistent_buffers_set", set())
        buffers = tuple((n, tuple(b.shape), str(b.dtype), n in non_persistent)
                        for n, b in m.named_buffers(recurse=False))
        attrs = tuple(sorted((k, _plain(v)) for k, v in vars(m).items()
                             if not k.startswith("_") and k not in _INDEX_ATTRS
                             and k not in _SKIP_ATTRS))
        out.append((name, type(m).__module__, type(m).__qualname__, params, buffers, attrs))
    return tuple(out)


def _decoder_layers(model: Any, depth: int) -> tuple[str, Any]:
    """(qualified name, ModuleList) of the model's decoder layers: its one ModuleList of
    `depth` modules."""
    import torch

    found = [(n, m) for n, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList) and len(m) == depth]
    if len(found) != 1:
        raise NotRepeating(f"{len(found)} module lists of {depth} modules (the layer count) "
                           f"in {type(model).__name__}: "
                           f"{', '.join(n for n, _ in found[:4]) or 'none'}")
    return found[0]


def choose_block(kinds: list[int]) -> tuple[int, int] | None:
    """(head c, period p) that trace the fewest layers (c + p, then c + 2p): layers from c - 1
    on repeat with period p, and len(kinds) - c is a multiple of p; None where the two short
    traces would not be MIN_SAVED_LAYERS layers fewer than the model's (Jamba's period of 8 in
    32 layers: 16 + 24)."""
    depth = len(kinds)
    best = None
    for p in range(1, depth // 2 + 1):
        # the first layer from which kinds repeat with period p
        start = 0
        for i in range(depth - p - 1, -1, -1):
            if kinds[i] != kinds[i + p]:
                start = i + 1
                break
        c = start + 1 + (depth - start - 1) % p  # c - 1 >= start, depth - c ≡ 0 (mod p)
        cost = 2 * c + 3 * p  # the layers of both short traces
        if depth - cost < MIN_SAVED_LAYERS:  # a first answer would cost as much as a trace
            continue
        if best is None or cost < best[0]:
            best = (cost, c, p)
    return None if best is None else (best[1], best[2])


def _scope(cfg_dict: dict, cfg: Any, text_cfg: Any) -> dict:
    """The dict inside `cfg_dict` (cfg's to_dict()) that holds the decoder's own values: the
    top level, or the nested one (text_config) of a multimodal config."""
    if text_cfg is cfg:
        return cfg_dict
    for k, v in vars(cfg).items():
        if v is text_cfg and isinstance(cfg_dict.get(k), dict):
            return cfg_dict[k]
    raise NotRepeating(f"{type(cfg).__name__}: its text config is not one of its values")


def _cut(cfg_dict: dict, cfg: Any, text_cfg: Any, depth: int, n: int) -> dict:
    """cfg_dict with n decoder layers: the layer count and every per-layer value (a list or
    string of `depth` entries) cut to its first n."""
    out = json.loads(json.dumps(cfg_dict))
    scope = _scope(out, cfg, text_cfg)
    keys = [k for k in _LAYER_KEYS if scope.get(k) == depth]
    cut = False
    for k, v in list(scope.items()):
        if k in keys:
            scope[k] = n
        elif (isinstance(v, list) or _pattern(v)) and len(v) == depth:
            scope[k], cut = v[:n], True
    if not keys and not cut:  # (Nemotron-H's count is its pattern's length)
        raise NotRepeating(f"no layer count of {depth} ({', '.join(_LAYER_KEYS)}) and no "
                           f"per-layer list in the config")
    return out


def _pattern(v: Any) -> bool:
    """A string that can be a per-layer pattern (Nemotron-H's "M-M-M*-..."): no lowercase, so
    that a word that happens to have one letter per layer ("silu" of 4 layers) is not cut."""
    return isinstance(v, str) and not any(ch.islower() for ch in v)


def _normal(d: dict) -> dict:
    """A config dict as JSON reads it (int keys become strings), without the version stamp."""
    out = json.loads(json.dumps(d, sort_keys=True, default=str))
    out.pop("transformers_version", None)
    return out


#: Plans (or why none) by (config text, dtype, attention), the most recent MAX_PLANS.
_PLANS: dict[tuple[str, str, str], LayerPlan | str] = {}
MAX_PLANS = 256
_PLANS_LOCK = threading.Lock()


def plan(text: str, dtype: str, attn: str) -> LayerPlan | str:
    """The LayerPlan of the config JSON `text`, or why there is none (cached)."""
    key = (text, dtype, attn)
    with _PLANS_LOCK:
        if key in _PLANS:
            return _PLANS[key]
    try:
        got: LayerPlan | str = _plan(text, dtype, attn)
    except NotRepeating as e:
        got = str(e)
    with _PLANS_LOCK:
        _PLANS[key] = got
        while len(_PLANS) > MAX_PLANS:  # a long-running app: forget the oldest
            _PLANS.pop(next(iter(_PLANS)))
    return got


def deeper(text: str, dtype: str, attn: str, pl: LayerPlan, why: str) -> LayerPlan:
    """The plan with a head one period longer, now this model's plan, where `pl`'s short trace
    does not expand (`why`); else the plan is refused and NotRepeating raised. The layers
    before the block can allocate unlike the block's even with the same signature: Mamba's
    block casts its input to the norm's dtype and its residual to fp32, so layer 0 (given the
    bf16 embeddings) copies the residual and every later layer (given fp32) the input. The
    expansion stands the layer before the block for the block's last layer, so the head takes
    the first block layer too: one more layer in each short trace."""
    if pl.grown >= MAX_GROWN:
        refuse(text, dtype, attn, why)
        raise NotRepeating(why)
    try:
        got = _plan(text, dtype, attn, pl.grown + 1)
    except NotRepeating as e:
        refuse(text, dtype, attn, f"{why}; with a longer head: {e}")
        raise NotRepeating(f"{why}; with a longer head: {e}") from None
    with _PLANS_LOCK:
        _PLANS[(text, dtype, attn)] = got
    return got


def refuse(text: str, dtype: str, attn: str, why: str) -> None:
    """Remember that the shortcut failed its check for this model: full traces from now on."""
    with _PLANS_LOCK:
        _PLANS[(text, dtype, attn)] = why


def _plan(text: str, dtype: str, attn: str, grown: int = 0) -> LayerPlan:
    from attnmem.trace.inference import TRACE_LOCK, _built, _held_bytes

    with TRACE_LOCK:
        try:
            full = _built(text, dtype, attn)
        except ValueError as e:  # the full trace says why in its own words
            raise NotRepeating(str(e)) from None
    cfg = full.config
    text_cfg = cfg.get_text_config(decoder=True)
    depth = getattr(text_cfg, "num_hidden_layers", None)
    if not isinstance(depth, int) or isinstance(depth, bool):
        raise NotRepeating("the config has no layer count")
    name, layers = _decoder_layers(full, depth)
    _no_index_branches(full, layers)
    sigs = [signature(m) for m in layers]
    ids = {s: i for i, s in enumerate(dict.fromkeys(sigs))}
    block = choose_block([ids[s] for s in sigs])
    if block is None:
        raise NotRepeating(f"no block of layers repeats often enough in {depth} layers")
    c, p = block
    c += grown * p
    if depth - (2 * c + 3 * p) < MIN_SAVED_LAYERS:
        raise NotRepeating(f"a head of {c} layers saves too few of {depth} layers")
    full_dict = cfg.to_dict()
    texts = []
    for n in (c + p, c + 2 * p):
        short = _cut(full_dict, cfg, text_cfg, depth, n)
        t = json.dumps(short, sort_keys=True)
        with TRACE_LOCK:
            try:
                model = _built(t, dtype, attn)
            except ValueError as e:
                raise NotRepeating(f"the {n}-layer copy cannot be built: {e}") from None
        _same_model(full, model, name, n, short)
        texts.append(t)
    return LayerPlan(name, depth, c, p, texts[0], texts[1], _held_bytes(full),
                     type(full).__name__, grown)


def _no_index_branches(model: Any, layers: Any) -> None:
    """NotRepeating where a decoder layer's forward (or a submodule's) compares a layer index."""
    seen: set[type] = set()
    for m in [model, *model.modules()]:
        cls = type(m)
        if cls in seen:
            continue
        seen.add(cls)
        try:
            src = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            continue
        hit = _INDEX_BRANCH.search(src)
        if hit:
            raise NotRepeating(f"{cls.__name__}.forward branches on its layer index "
                               f"({hit.group(0).strip()!r})")


def _same_model(full: Any, short: Any, name: str, n: int, short_dict: dict) -> None:
    """NotRepeating unless the n-layer model reads its config as written (the class derived
    nothing else from the cut count), has the full model's first n layers, and is the same
    everywhere else."""
    got, have = _normal(short_dict), _normal(short.config.to_dict())
    if got != have:
        diff = sorted(k for k in set(got) | set(have) if got.get(k) != have.get(k))
        raise NotRepeating(f"the {n}-layer config reads differently: {', '.join(diff[:4])}")
    short_layers = dict(short.named_modules()).get(name)
    full_layers = dict(full.named_modules())[name]
    if short_layers is None or len(short_layers) != n:
        raise NotRepeating(f"the {n}-layer model has no {n} layers at {name}")
    for i in range(n):
        if signature(short_layers[i]) != signature(full_layers[i]):
            raise NotRepeating(f"layer {i} of the {n}-layer model is not the full model's")
    if signature(short, (name,)) != signature(full, (name,)):
        raise NotRepeating(f"the {n}-layer model differs outside its layers")


class _Layers:
    """The layer index in an allocation's label ("model.layers.7.mlp|mm" -> 7)."""

    def __init__(self, layers_name: str) -> None:
        self.prefix = layers_name + "."
        self._re = re.compile(rf"^{re.escape(layers_name)}\.(\d+)(?=[.|])")

    def of(self, label: str) -> int | None:
        if not label.startswith(self.prefix):
            return None
        m = self._re.match(label)
        return int(m.group(1)) if m else None

    def relabel(self, label: str, u: int, g: int) -> str:
        return f"{self.prefix}{g}{label[len(self.prefix) + len(str(u)):]}"


def _top_level(label: str) -> bool:
    """An allocation made by the driver itself, outside every module (generate()'s ids, mask)."""
    return label.startswith("|")


def _never_freed(events: tuple) -> Iterator[tuple[int, Any, str]]:
    """(id, third field, label) of each allocation never freed, folded loops kept folded: of a
    repeat event (recorder.unrolled), the allocations its template never frees, in every
    iteration, and those it frees in the next iteration ("prev"), in the last, where no free
    event outside names them."""
    freed = {ev[1] for ev in events if ev[0] == "f"}
    for ev in events:  # a repeat's first iteration frees the allocations before it ("prev")
        if ev[0] == "r":
            freed.update(ev[4][t[2]] for t in ev[1] if t[0] == "f" and t[1] == "prev")
    for ev in events:
        if ev[0] == "a":
            if ev[1] not in freed:
                yield ev[1], ev[2], ev[3]
        elif ev[0] == "r":
            _, template, copies, base, _ = ev
            made = [t for t in template if t[0] == "a"]
            this = {t[2] for t in template if t[0] == "f" and t[1] == "this"}
            prev = {t[2] for t in template if t[0] == "f" and t[1] == "prev"}
            for pos, t in enumerate(made):
                if pos in this:
                    continue
                first = copies - 1 if pos in prev else 0
                for c in range(first, copies):
                    x = base + c * len(made) + pos
                    if x not in freed:
                        yield x, t[1], t[2]


def cache_ids(events: tuple) -> set[int]:
    """The allocations the cache holds at the end: the model's (not the driver's top-level)
    allocations that are never freed (the trace ends with the cache alive)."""
    return {x for x, _, label in _never_freed(events) if not _top_level(label)}


def cache_bytes(events: tuple) -> int:
    return sum(nbytes for _, nbytes, label in _never_freed(events) if not _top_level(label))


def expand(events: tuple, layers_name: str, short_depth: int, head: int, period: int,
           depth: int) -> tuple:
    """The events of the `depth`-layer model from those of its `short_depth` = head + period
    layer copy (module docstring), allocations numbered in the order they are made;
    NotRepeating where the events do not follow that form. The third field of an allocation
    (its size, or a length model's coefficient index) is copied as it is."""
    if short_depth != head + period or (depth - head) % period or depth < short_depth:
        raise NotRepeating(f"{depth} layers are not {head} + a multiple of {period}")
    # a folded loop's repeat event stays one event per copy of its layer: unrolled, Mamba's
    # 24 scans of 16,384 steps are 2.4M events the replay takes one by one
    return _Expansion(tuple(events), _Layers(layers_name), head, period, depth).run()


class _Expansion:
    """One expansion (`expand`). Template: the short trace; its layers 0 .. c-1 are the head,
    c .. c+p-1 the block, which the full depth has `copies` times (copy k's layer u is layer
    u + k·p). A generated tensor is (template allocation, copy), copy 0 outside the block."""

    def __init__(self, events: tuple, names: _Layers, c: int, p: int, depth: int) -> None:
        self.events, self.names, self.c, self.p, self.depth = events, names, c, p, depth
        self.n1 = c + p
        self.copies = (depth - c) // p
        self.out: list[tuple] = []
        self.new_id: dict[tuple[int, int], int] = {}
        self.count = 0  # generated allocations so far (the next one's id)
        # a repeat event's allocations: template id -> its first id; (first id, copy) -> the
        # generated repeat's first id (its ids are consecutive, as the recorder's)
        self.repeat_of: dict[int, int] = {}
        self.repeat_new: dict[tuple[int, int], int] = {}
        self.alike: dict[tuple[int, int, int], bool] = {}
        self._contexts()

    def _contexts(self) -> None:
        """Each event's layer (`ctx`: None outside the layers), each allocation's layer and
        forward (`owner`), each layer's allocations in a forward in order (`allocs`)."""
        ctx: int | None = None
        fwd = -1
        self.ctx: list[int | None] = []
        self.owner: dict[int, tuple[int | None, int]] = {}
        self.allocs: dict[tuple[int, int], list[int]] = {}
        self.labels: dict[int, str] = {}
        last = self.n1 - 1
        for ev in self.events:
            if ev[0] == "a":
                made = [(ev[1], ev[3])]
            elif ev[0] == "r":  # a folded loop: its first allocation moves the layer, the rest
                # stay in it (one layer), taken at once: Mamba's scan makes 65,536 at 16k
                layers = {self.names.of(t[2]) for t in ev[1] if t[0] == "a"}
                if len(layers) > 1:
                    raise NotRepeating(f"a folded loop allocates in layers {sorted(layers)}")
                made = _repeat_allocs(ev)
                self.repeat_of.update(dict.fromkeys((x for x, _ in made), ev[3]))
                self.labels.update(made)
            else:
                made = []
            for i, (x, label) in enumerate(made):
                if ev[0] == "r" and i:
                    break  # the rest of the repeat, below
                u = self.names.of(label)
                self.labels[x] = label
                if u is None:
                    if ctx == last:
                        ctx = None  # past the last layer: the model's tail
                elif ctx is None or (u == 0 and ctx == last):
                    if u != 0:
                        raise NotRepeating(f"a forward starts at layer {u}")
                    ctx, fwd = 0, fwd + 1
                elif u == ctx + 1:
                    ctx = u
                elif u != ctx:
                    raise NotRepeating(f"layer {u} runs after layer {ctx}")
                self.owner[x] = (ctx, fwd)
                if ctx is not None:
                    self.allocs.setdefault((fwd, ctx), []).append(x)
            if ev[0] == "r" and len(made) > 1:
                rest = [x for x, _ in made[1:]]
                self.owner.update(dict.fromkeys(rest, (ctx, fwd)))
                if ctx is not None:
                    self.allocs.setdefault((fwd, ctx), []).extend(rest)
            self.ctx.append(ctx)
        if ctx is not None:
            raise NotRepeating("the trace ends inside the layers")
        self.position = {x: i for ids in self.allocs.values() for i, x in enumerate(ids)}

    def _where(self, g: int) -> tuple[int, int]:
        """(template layer, copy) of generated layer g."""
        c, p = self.c, self.p
        return (g, 0) if g < c else (c + (g - c) % p, (g - c) // p)

    def _gen(self, v: int, k: int) -> int:
        """The generated layer of template layer v in copy k."""
        return v if v < self.c else v + k * self.p

    def _instance(self, x: int, g: int) -> tuple[int, int]:
        """The generated tensor that stands for template allocation x made in generated layer
        g: x's own copy where g's template layer is x's, else the allocation at the same place
        in g's template layer (the layer before the block, standing for the block's last)."""
        u, f = self.owner[x]
        t, k = self._where(g)
        if t != u:
            if not self._alike(f, u, t):
                raise NotRepeating(f"layers {u} and {t} allocate differently")
            x = self.allocs[(f, t)][self.position[x]]
        return (x, k if t >= self.c else 0)

    def _alike(self, f: int, u: int, t: int) -> bool:
        """Whether layers u and t make the same allocations (labels but the layer) in forward
        f (asked once per pair: a folded loop gives a layer tens of thousands)."""
        if (f, u, t) not in self.alike:
            ids_u, ids_t = self.allocs[(f, u)], self.allocs.get((f, t), [])
            self.alike[(f, u, t)] = len(ids_u) == len(ids_t) and all(
                self.names.relabel(self.labels[a], u, 0)
                == self.names.relabel(self.labels[b], t, 0)
                for a, b in zip(ids_u, ids_t, strict=True))
        return self.alike[(f, u, t)]

    def _relabel(self, label: str, k: int) -> str:
        u = self.names.of(label)
        return label if u is None else self.names.relabel(label, u, self._gen(u, k))

    def _alloc(self, ev: tuple, v: int | None, k: int) -> None:
        key = (ev[1], k if v is not None and v >= self.c else 0)
        self.new_id[key] = self.count
        self.count += 1
        self.out.append(("a", self.new_id[key], ev[2], self._relabel(ev[3], k)))

    def _repeat(self, ev: tuple, v: int | None, k: int) -> None:
        """A repeat event in template layer v (None: outside the layers) as copy k: its
        template relabelled, its ids the next ones, its previous ids those of the copy."""
        _, template, copies, base, prev = ev
        made = sum(1 for t in template if t[0] == "a")
        self.repeat_new[(base, k if v is not None and v >= self.c else 0)] = self.count
        new_prev = tuple(self._id(self._ref(x, v, k)) for x in prev)
        self.out.append(("r", tuple((t[0], t[1], self._relabel(t[2], k)) if t[0] == "a"
                                    else t for t in template),
                         copies, self.count, new_prev))
        self.count += copies * made

    def _id(self, key: tuple[int, int]) -> int:
        """The generated id of (template allocation, copy)."""
        got = self.new_id.get(key)
        if got is None:
            base = self.repeat_of.get(key[0])
            first = None if base is None else self.repeat_new.get((base, key[1]))
            if first is None:
                raise NotRepeating("a free of a tensor not made yet")
            got = first + key[0] - base
        return got

    def _free(self, key: tuple[int, int]) -> None:
        self.out.append(("f", self._id(key)))

    def _ref(self, x: int, v: int | None, k: int) -> tuple[int, int]:
        """The generated tensor that template allocation x is in template layer v (None:
        outside the layers), copy k: made outside the layers, or by the layer as many layers
        back as in the template."""
        u, _ = self.owner[x]
        if u is None or v is None:
            if u is not None and v is None:
                raise NotRepeating("a folded loop outside the layers reads a layer's tensor")
            return (x, 0)
        gv = self._gen(v, k)
        g = gv + (u - v)
        if not 0 <= g < self.depth:
            raise NotRepeating(f"layer {gv} frees a tensor of layer {g}")
        return self._instance(x, g)

    def _free_in_layer(self, x: int, v: int, k: int) -> None:
        """A free inside template layer v (copy k) (`_ref`)."""
        self._free(self._ref(x, v, k))

    def run(self) -> tuple:
        events, ctx, c = self.events, self.ctx, self.c
        i = 0
        while i < len(events):
            in_block = ctx[i] is not None and ctx[i] >= c
            j = i
            while j < len(events) and (ctx[j] is not None and ctx[j] >= c) == in_block:
                j += 1
            if in_block:
                for k in range(self.copies):
                    self._stretch(i, j, k)
            else:
                self._outside(i, j)
            i = j
        return tuple(self.out)

    def _stretch(self, start: int, end: int, k: int) -> None:
        """The block's events of one forward, as copy k."""
        repeat_of, repeat_new, owner, out = self.repeat_of, self.repeat_new, self.owner, self.out
        for idx in range(start, end):
            ev = self.events[idx]
            if ev[0] == "a":
                self._alloc(ev, self.ctx[idx], k)
            elif ev[0] == "r":
                self._repeat(ev, self.ctx[idx], k)
            elif ev[0] == "f":
                base = repeat_of.get(ev[1])
                first = None if base is None else repeat_new.get((base, k))
                if first is not None and owner[ev[1]][0] == self.ctx[idx]:
                    # a folded loop's output freed in its own layer (Mamba: 16,384 a layer
                    # after the stack): `_free_in_layer` in short
                    out.append(("f", first + ev[1] - base))
                else:
                    self._free_in_layer(ev[1], self.ctx[idx], k)
            else:
                out.append(ev)

    def _outside(self, start: int, end: int) -> None:
        """Events outside the block: the head's layers and the model's own code, once; frees
        of layers' tensors from outside every layer go to `_sweeps`."""
        events, ctx, i = self.events, self.ctx, start
        while i < end:
            ev, v = events[i], ctx[i]
            if ev[0] == "a":
                self._alloc(ev, v, 0)
            elif ev[0] == "r":
                self._repeat(ev, v, 0)
            elif ev[0] == "m":
                self.out.append(ev)
            elif v is not None:  # inside a head layer
                self._free_in_layer(ev[1], v, 0)
            elif self.owner[ev[1]][0] is None:
                self._free((ev[1], 0))
            else:
                j = i
                while j < end and events[j][0] == "f" and ctx[j] is None \
                        and self.owner[events[j][1]][0] is not None:
                    j += 1
                self._sweeps([events[x][1] for x in range(i, j)])
                i = j
                continue
            i += 1

    def _sweeps(self, xs: list[int]) -> None:
        """Frees of layers' tensors from outside every layer. Grouped by layer, they form runs
        strictly up or down the layers (the cache deleted: each layer that holds some frees
        them in turn; layers without any are skipped): such a run is run over all layers, each
        template layer's frees for each of its copies. A lone layer's frees are its last
        copy's (the last layer's output, freed after the loop)."""
        groups: list[tuple[int, list[int]]] = []
        for x in xs:
            u = self.owner[x][0]
            if groups and groups[-1][0] == u:
                groups[-1][1].append(x)
            else:
                groups.append((u, [x]))
        runs: list[list[tuple[int, list[int]]]] = []
        for grp in groups:
            run = runs[-1] if runs else None
            if run and (len(run) == 1 or _same_way(run[0][0], run[1][0], run[-1][0], grp[0])):
                run.append(grp)
            elif run and len(run) == 2:  # [7], [0, 1, ...]: the lone group stands alone
                runs.append([run.pop(), grp])
            else:
                runs.append([grp])
        for run in runs:
            if len(run) == 1:
                u, ids = run[0]
                g = u if u < self.c else self._gen(u, self.copies - 1)
                for x in ids:
                    self._free(self._instance(x, g))
                continue
            by_layer = dict(run)
            up = run[1][0] > run[0][0]
            for g in range(self.depth) if up else range(self.depth - 1, -1, -1):
                for x in by_layer.get(self._where(g)[0], ()):
                    self._free(self._instance(x, g))


def _repeat_allocs(ev: tuple) -> list[tuple[int, str]]:
    """(id, label) of each allocation of repeat event `ev` (recorder.unrolled), in order."""
    _, template, copies, base, _ = ev
    labels = [t[2] for t in template if t[0] == "a"]
    return [(base + i, labels[i % len(labels)]) for i in range(copies * len(labels))]


def _same_way(a: int, b: int, y: int, z: int) -> bool:
    """Whether y -> z goes the same way as a -> b (both up or both down)."""
    return (b - a) * (z - y) > 0


def canonical(events: tuple) -> tuple:
    """The events with the allocations numbered in the order they are made (ids are only
    names: the allocator's replay is the same under any renaming); `expand` numbers so. A
    folded loop stays one repeat event, its ids renumbered as a range (equal folded streams
    unroll to equal streams)."""
    ids: dict[int, int] = {}
    starts: list[int] = []  # repeat events' first ids, sorted, and their (end, new first)
    ranges: dict[int, tuple[int, int]] = {}
    count = 0

    def new(x: int) -> Any:
        got = ids.get(x)
        if got is None:
            i = bisect.bisect_right(starts, x) - 1
            if i >= 0 and x < ranges[starts[i]][0]:
                return ranges[starts[i]][1] + x - starts[i]
            return ("unmade", x)
        return got

    out = []
    for ev in events:
        if ev[0] == "a":
            ids[ev[1]] = count
            count += 1
            out.append(("a", ids[ev[1]], ev[2], ev[3]))
        elif ev[0] == "f":
            out.append(("f", new(ev[1])))
        elif ev[0] == "r":
            _, template, copies, base, prev = ev
            n = copies * sum(1 for t in template if t[0] == "a")
            out.append(("r", template, copies, count, tuple(new(x) for x in prev)))
            bisect.insort(starts, base)
            ranges[base] = (base + n, count)
            count += n
        else:
            out.append(ev)
    return tuple(out)


def check(pl: LayerPlan, short: Any, longer: Any, got: tuple | None = None) -> None:
    """NotRepeating unless the short trace, expanded to the longer one's depth (`got`, where
    the caller has it), is the longer trace (events, up to the numbering of allocations, and
    cache bytes), and both traces' cache is what `cache_bytes` counts."""
    for rec, n in ((short, pl.short_depth), (longer, pl.check_depth)):
        if cache_bytes(rec.events) != rec.cache_bytes:
            raise NotRepeating(f"the {n}-layer trace's cache is not its tensors left alive "
                               f"({cache_bytes(rec.events):,} B against "
                               f"{rec.cache_bytes:,} B)")
    if got is None:
        got = expand(short.events, pl.layers_name, pl.short_depth, pl.head, pl.period,
                     pl.check_depth)
    want = canonical(longer.events)
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                  min(len(got), len(want)))
        raise NotRepeating(f"the {pl.short_depth}-layer trace expanded to {pl.check_depth} "
                           f"layers differs from their trace at event {at}")


@lru_cache(maxsize=64)
def short_record(short_text: str, b: int, s: int, n: int, attention: str, dtype: str) -> Any:
    """A trace of a plan's short model (cached: the length model reuses the first answer's)."""
    from attnmem.trace.inference import record as record_full

    return record_full(short_text, b, s, n, attention, dtype)


#: (config text, dtype, attention, batch, new tokens) -> prompt lengths where the check held
_CHECKED: dict[tuple, set[int]] = {}


def checked(pl: LayerPlan, text: str, b: int, s: int, n: int, attention: str,
            dtype: str) -> LayerPlan:
    """The plan that holds at these inputs: `pl`, or one with a longer head (`deeper`) where
    `pl`'s short trace does not expand to the longer model's depth. Its `check` (the longer
    model's trace against the short one's expansion) is run once per inputs; on failure the
    plan is refused for this model (`refuse`) and NotRepeating raised."""
    attn = "eager" if attention == "eager" else "sdpa"
    key = (text, dtype, attention, b, n)
    if s in was_checked(text, b, n, attention, dtype):
        return pl
    from attnmem.trace.inference import record as record_full

    while True:
        short = short_record(pl.short_text, b, s, n, attention, dtype)
        try:  # the short trace alone shows a head too short, before the longer trace is run
            got = expand(short.events, pl.layers_name, pl.short_depth, pl.head, pl.period,
                         pl.check_depth)
        except NotRepeating as e:
            pl = deeper(text, dtype, attn, pl, str(e))
            continue
        break
    try:
        check(pl, short, record_full(pl.check_text, b, s, n, attention, dtype), got)
    except NotRepeating as e:
        refuse(text, dtype, attn, str(e))
        raise
    with _PLANS_LOCK:
        _CHECKED.setdefault(key, set()).add(s)
        while len(_CHECKED) > MAX_PLANS:
            _CHECKED.pop(next(iter(_CHECKED)))
    return pl


def was_checked(text: str, b: int, n: int, attention: str, dtype: str) -> set[int]:
    """The prompt lengths where `checked` held for these inputs."""
    with _PLANS_LOCK:
        return set(_CHECKED.get((text, dtype, attention, b, n), ()))


def plan_for(text: str, attention: str, dtype: str) -> LayerPlan | None:
    """The plan for a trace with this attention, or None (no shortcut)."""
    got = plan(text, dtype, "eager" if attention == "eager" else "sdpa")
    return got if isinstance(got, LayerPlan) else None


def record(text: str, b: int, s: int, n: int, attention: str, dtype: str) -> Any:
    """generate()'s events (attnmem.trace.inference.Recorded) of the config JSON `text`: built
    from two short traces where the plan holds and they check, else traced at full depth."""
    from attnmem.trace.inference import record as record_full

    pl = plan_for(text, attention, dtype)
    if pl is None:
        return record_full(text, b, s, n, attention, dtype)
    try:
        pl = checked(pl, text, b, s, n, attention, dtype)
        short = short_record(pl.short_text, b, s, n, attention, dtype)
    except NotRepeating:
        return record_full(text, b, s, n, attention, dtype)
    except ValueError:  # the short model's code refused: the full trace says why in its words
        return record_full(text, b, s, n, attention, dtype)
    return full_recorded(pl, short.events)


def full_recorded(pl: LayerPlan, short_events: tuple) -> Any:
    """Recorded of the full depth from a checked plan's short-trace events."""
    from attnmem.trace.inference import Recorded

    events = expand(short_events, pl.layers_name, pl.short_depth, pl.head, pl.period,
                    pl.depth)
    return Recorded(events, pl.weights_bytes, cache_bytes(events), pl.model_class)
