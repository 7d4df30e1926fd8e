"""Tensors that hold one value everywhere, followed on the meta device so `.item()` can answer.

Meta tensors carry no values, so a model whose forward reads one (`if mask.all():`, transformers'
`masking_utils.fast_all(padding_mask)`) stops the trace with "Tensor.item() cannot be called on
meta tensors". Many of them read only masks the model made itself from `torch.ones` (BioGPT,
BART, BERT-style decoders build an all-ones attention mask when none is given, exactly what a
tokenizer gives for unpadded text). Their values are known exactly, so this tracker keeps the
value of every tensor that is one number everywhere: made by a filling factory (ones, zeros,
full, fill_), then carried through the ops that keep a tensor uniform (copies, casts, views,
indexing, negation, elementwise ops of two uniform tensors, reductions over them). `.item()` on
such a tensor (the dispatcher's `_local_scalar_dense`) returns that value; on any other it
still raises, so the trace never runs on a guessed value.

A tensor written in place loses its value, and so does every tensor sharing its storage (a
view), unless the write is itself a fill with a known value.

Totals: some tensors have unknown elements but a known sum. A scatter of one value into a zero
tensor at indices distinct along the scattered dim (those `topk` returns) writes exactly
`index.numel()` of them: MoE routers count their experts' tokens so (JetMoE's
`zeros.scatter(1, top_k_indices, 1).long().sum(0)`). The total is followed through casts,
views and sums; a sum over every element is then uniform. Copying such a count vector to the
host (`.tolist()`, which JetMoE splits its tokens by) is the one place a value is chosen: the
even split (total // E each, the remainder one each to the first), because which expert gets
how many tokens depends on the router's values, which meta does not have. Every split has the
same total, so the experts' tensors hold the same bytes together; only the caching
allocator's rounding of each (512 B) and its choice of blocks can differ.

Values that vary along a tensor but are fixed by the inputs (a causal mask, an arange) are
attnmem.trace.known's, consulted where this tracker does not know a value.
"""

from __future__ import annotations

import math
from typing import Any

#: Ops whose output is uniform with the value of their first argument (views, copies, gathers).
_SAME = frozenset({
    "alias", "clone", "contiguous", "detach", "expand", "lift_fresh", "lift_fresh_copy",
    "narrow", "permute", "repeat", "reshape", "select", "slice", "squeeze", "t", "transpose",
    "unsqueeze", "view", "_unsafe_view", "as_strided", "index", "index_select", "gather",
    "flatten", "unfold", "expand_copy", "view_copy", "slice_copy", "select_copy",
    "permute_copy", "unsqueeze_copy", "squeeze_copy", "transpose_copy", "_reshape_alias",
    "movedim", "flip", "roll", "diagonal",
})
_CAST = frozenset({"_to_copy", "to", "type_as"})
#: Ops whose output holds the same elements as their first argument (its total kept).
_KEEP_TOTAL = frozenset({
    "alias", "clone", "contiguous", "detach", "view", "_unsafe_view", "reshape", "flatten",
    "t", "transpose", "permute", "squeeze", "unsqueeze", "_reshape_alias", "lift_fresh",
    "lift_fresh_copy", "to", "type_as",
})
_FILL_FACTORY = {"ones": 1, "ones_like": 1, "new_ones": 1, "zeros": 0, "zeros_like": 0,
                 "new_zeros": 0}
_COMPARE = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
            "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}
_ARITH = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b, "logical_and": lambda a, b: bool(a) and bool(b),
          "logical_or": lambda a, b: bool(a) or bool(b), "bitwise_and": lambda a, b: a & b,
          "bitwise_or": lambda a, b: a | b, "minimum": min, "maximum": max}


class Uniform:
    """The values of the uniform tensors made under a dispatch mode (module docstring)."""

    def __init__(self) -> None:
        import torch
        from torch.utils.weak import WeakIdKeyDictionary

        self._torch = torch
        self._values = WeakIdKeyDictionary()
        self._totals = WeakIdKeyDictionary()  # tensor -> the known sum of its elements
        self._distinct = WeakIdKeyDictionary()  # tensor -> a dim its values are distinct along

    def value(self, t: Any) -> Any:
        """t's one value, or None where it is not known."""
        if not isinstance(t, self._torch.Tensor):
            return None
        return self._values.get(t)

    def choose(self, t: Any, v: Any) -> None:
        """State t's one value where the trace chooses it (meta does not have it): the caller
        says which value and why (attnmem.trace.inference: each generated token)."""
        self._values[t] = _as_dtype(v, t.dtype, self._torch)

    def scalar(self, func: Any, args: tuple) -> Any:
        """What `func(*args)` returns where it is `.item()` of a uniform tensor, else None."""
        if _name(func) != "_local_scalar_dense" or not args:
            return None
        return self.value(args[0])

    def to_host(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """What `func` returns where it copies a meta tensor of known values to the CPU (the
        copy `.tolist()` makes): a uniform tensor's value everywhere, or a 1-D integer count
        vector with a known total split evenly (module docstring); None otherwise."""
        torch = self._torch
        if _name(func) != "_to_copy" or not args or not isinstance(args[0], torch.Tensor):
            return None
        t, dev = args[0], kwargs.get("device")
        if t.device.type != "meta" or dev is None or torch.device(dev).type == "meta":
            return None
        dtype = kwargs.get("dtype") or t.dtype
        v = self.value(t)
        if v is not None:
            return torch.full(t.shape, v, dtype=dtype, device=dev)
        total = self._totals.get(t)
        if total is None or t.dim() != 1 or t.dtype.is_floating_point or not t.numel():
            return None
        n = t.numel()
        split = [total // n + (1 if i < total % n else 0) for i in range(n)]
        return torch.tensor(split, dtype=dtype, device=dev)

    def mask_index(self, func: Any, args: tuple) -> tuple[tuple, Any] | None:
        """`x[mask]` where each boolean mask's one value is known (`index_masks`): all of its
        positions are selected, or none."""
        def selected(mask: Any) -> int | None:
            v = self.value(mask)
            return None if v is None else mask.numel() if v else 0

        got = index_masks(func, args, selected)
        return None if got is None else got[:2]

    def after(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Follow one op: forget what it overwrote, and learn its output's value if uniform."""
        name = _name(func)
        for written in _written(func, args, kwargs):
            self._forget_storage(written)
        if name == "topk" and isinstance(out, (tuple, list)) and len(out) == 2:
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            self._distinct[out[1]] = dim % max(out[1].dim(), 1)
            return
        if not isinstance(out, self._torch.Tensor) or out.is_complex():
            return
        total = self._total_of(name, args, kwargs, out)
        if total is not None:
            self._totals[out] = total
            if out.dim() == 0:
                self._values[out] = _as_dtype(total, out.dtype, self._torch)
                return
        v = self._value_of(name, args, kwargs, out)
        if v is None:
            return
        if isinstance(v, float) and not math.isfinite(v):
            return
        self._values[out] = _as_dtype(v, out.dtype, self._torch)

    def _value_of(self, name: str, args: tuple, kwargs: dict, out: Any) -> Any:
        torch = self._torch
        first = args[0] if args else None
        if name in _FILL_FACTORY:
            return _FILL_FACTORY[name]
        if name in ("full", "new_full"):
            fill = args[-1] if len(args) >= 2 else kwargs.get("fill_value")
            return fill if isinstance(fill, (bool, int, float)) else None
        if name in ("full_like", "fill", "fill_", "scalar_tensor"):
            fill = args[1] if name != "scalar_tensor" and len(args) > 1 else (
                args[0] if name == "scalar_tensor" else kwargs.get("value"))
            if isinstance(fill, torch.Tensor):
                return self.value(fill)
            return fill if isinstance(fill, (bool, int, float)) else None
        if name == "copy_" and len(args) > 1:
            return self.value(args[1])
        v = self.value(first)
        if name in _SAME or name in _CAST:
            return v
        if name in ("bitwise_not", "logical_not"):
            if v is None:
                return None
            return (not v) if name == "logical_not" or isinstance(v, bool) else ~int(v)
        if name == "neg":
            return None if v is None else -v
        if name == "abs":
            return None if v is None else abs(v)
        if name in ("all", "any"):
            return None if v is None else bool(v) if first.numel() else name == "all"
        if name in ("sum", "mean", "amax", "amin", "max", "min", "prod"):
            return self._reduce(name, first, args, kwargs, v)
        if name in _COMPARE or name in _ARITH:
            other = args[1] if len(args) > 1 else kwargs.get("other")
            w = other if isinstance(other, (bool, int, float)) else self.value(other)
            if v is None or w is None:
                return None
            op = _COMPARE.get(name) or _ARITH[name]
            try:
                return op(v, w)
            except ZeroDivisionError:
                return None
        if name in ("where",) and len(args) == 3:
            c = self.value(args[0])
            if c is None:
                return None
            pick = args[1] if c else args[2]
            return pick if isinstance(pick, (bool, int, float)) else self.value(pick)
        if name == "masked_fill" and len(args) == 3:
            m = self.value(args[1])
            fill = args[2] if isinstance(args[2], (bool, int, float)) else self.value(args[2])
            if m is None:
                return v if v is not None and v == fill else None
            return fill if m else v
        return None

    def _total_of(self, name: str, args: tuple, kwargs: dict, out: Any) -> Any:
        """The known sum of out's elements, or None (module docstring: totals)."""
        torch = self._torch
        first = args[0] if args else None
        if not isinstance(first, torch.Tensor):
            return None
        if name == "scatter" and len(args) == 4 and isinstance(args[3], (bool, int)):
            dim, index = args[1], args[2]
            if (self.value(first) == 0 and isinstance(index, torch.Tensor)
                    and self._distinct.get(index) == dim % max(index.dim(), 1)
                    and index.shape[dim] <= first.shape[dim]):
                return int(args[3]) * index.numel()
            return None
        total = self._totals.get(first)
        if total is None:
            return None
        if name in _KEEP_TOTAL or (name == "_to_copy" and kwargs.get("device") is None):
            return total
        if name == "sum":
            return total
        return None

    def _reduce(self, name: str, t: Any, args: tuple, kwargs: dict, v: Any) -> Any:
        if v is None:
            return None
        if name in ("amax", "amin", "max", "min", "mean"):
            return v if t.numel() else None
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        if dims is None or dims == []:
            count = t.numel()
        else:
            dims = [dims] if isinstance(dims, int) else list(dims)
            count = math.prod(t.shape[d] for d in dims) if t.dim() else 1
        if name == "sum":
            return (int(v) if isinstance(v, bool) else v) * count
        return v ** count  # prod

    def _forget_storage(self, t: Any) -> None:
        if not isinstance(t, self._torch.Tensor):
            return
        st = t.untyped_storage()  # one Python object per storage, as the recorder relies on
        for known in list(self._values.keys()):
            if known.untyped_storage() is st:
                del self._values[known]
        self._values.pop(t, None)


def index_masks(func: Any, args: tuple, selected: Any) -> tuple[tuple, list, list] | None:
    """`x[mask]` (aten.index) where every boolean mask's selected positions are known: the
    meta kernel needs nonzero(), which has no meta form; CUDA's index makes `mask.nonzero()`,
    an int64 (k, mask dims) tensor of the k selected positions, and indexes with its columns
    (aten/src/ATen/native/IndexingUtils.h `expandTensors`: `nonzero.select(1, j)`).
    `selected(mask)` gives a mask's positions, as their count or as that (k, dims) tensor's
    CPU values, or None where they are not known (then None here). Returns the arguments with each mask so replaced,
    the nonzero tensors made (held while the op runs) and each one's columns; else None.
    Shared by this tracker (uniform masks) and attnmem.trace.known (masks whose values
    vary)."""
    import torch

    if _name(func) != "index" or len(args) < 2 or not isinstance(args[1], (list, tuple)):
        return None
    indices: list = []
    made: list = []
    columns: list = []
    for idx in args[1]:
        if not (isinstance(idx, torch.Tensor) and idx.dtype in (torch.bool, torch.uint8)):
            indices.append(idx)
            continue
        sel = selected(idx)
        if sel is None:
            return None
        k = sel if isinstance(sel, int) else sel.shape[0]
        made.append(torch.empty((k, idx.dim()), dtype=torch.long, device=idx.device))
        columns.append(made[-1].unbind(1))
        indices.extend(columns[-1])
    return ((args[0], indices, *args[2:]), made, columns) if made else None


def _name(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(func, "__name__", "").split(".")[0]


def _written(func: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The arguments func writes in place (its schema's mutable aliases)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    out = []
    for i, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is not None and info.is_write:
            if i < len(args):
                out.append(args[i])
            elif arg.name in kwargs:
                out.append(kwargs[arg.name])
    return out


def _as_dtype(v: Any, dtype: Any, torch: Any) -> Any:
    """v as the Python number `.item()` returns for a tensor of dtype."""
    if dtype == torch.bool:
        return bool(v)
    if dtype.is_floating_point:
        return float(v)
    return int(v)
