"""Tensors whose every value is fixed by the trace's inputs, computed on the CPU when read.

attnmem.trace.uniform follows tensors of one value everywhere, in O(1) whatever their size.
Some models read values that vary along a tensor but are still fixed by the shapes and the
trace's own inputs, never by the weights:

- Kolibri-1.1's indexer (modeling_kolibri1_1.py `Kolibri1_1Indexer.query_groups`) reads, from
  the causal mask masking_utils builds out of aranges, each query's first and last visible key
  (`argmax`), groups the queries by the first (`unique().tolist()`, `== start).nonzero()`),
  and keeps the rows longer than its budget (`if not long_rows.any()`, `rows[long_rows]`);
- XLM (modeling_xlm.py `XLMModel.forward`) counts the tokens that are not padding in ids its
  `prepare_inputs_for_generation` made by `torch.cat` of the prompt and a mask token.

For every tensor an op makes under the recorder, where the op is deterministic and each of its
tensor inputs is known, `Known` keeps the op and its inputs (a node); nothing is computed then,
so a model that never reads a value pays only a dictionary lookup per op. Where a value is read
(`.item()`, a copy to the host, an op whose output size depends on values), the node is
computed on the CPU from its leaves: values uniform.py knows (fills), factories of fixed values
(arange, full, eye), CPU tensors, and values the trace sets itself (`set_value`). The ops
without a meta form whose output size is read from the values (`nonzero`, `_unique2`) are made
on meta at the sizes the values give, with the allocations their CUDA kernels make (each
cited below). Unknown, and so still refused where read: parameters and buffers (meta holds no
values), everything computed from them, `empty`, random ops.

A write in place makes every tensor on the written storage unknown (its views too); uniform.py
still follows fills. A value is computed only up to MAX_BYTES per tensor (a causal mask is
queries x keys); past it `ValuesTooLarge` stops the trace and says so. A reduction that keeps
some dims (Kolibri's argmax and any over the keys) of a tensor past BLOCK_BYTES is computed
over blocks of the dims it keeps (`_blockwise`, exact), so a (B, s, s) mask is never held.
"""

from __future__ import annotations

import weakref
from typing import Any

from attnmem.trace.uniform import index_masks

#: The most bytes one tensor's values may take when computed on the CPU: a (B, 1, s, s) mask
#: read as int32 is 4·B·s² bytes, so B·s² up to 2^26 (s = 8,192 at B = 1).
MAX_BYTES = 1 << 28
#: A computed value up to this size is kept with its node, so a mask every layer reads is
#: computed once per forward; larger ones are computed again where read again.
KEEP_BYTES = 1 << 26
#: A reduction (argmax, any, ...) of a tensor of more bytes than this is computed over blocks of
#: the dims it keeps (`_blockwise`), each tensor of a block about this size at most.
BLOCK_BYTES = 1 << 24

#: Ops whose output values are not a function of their inputs' values (or are not tensors).
_NOT_VALUES = ("rand", "bernoulli", "normal", "uniform", "multinomial", "dropout",
               "exponential", "geometric", "cauchy", "poisson", "empty", "_local_scalar_dense",
               "resize", "set_", "record_stream", "nonzero", "unique", "masked_select")


class ValuesTooLarge(RuntimeError):
    """A value the model reads would take more than MAX_BYTES to compute on the CPU."""


class _Unknown(Exception):
    pass


class _Node:
    """How one tensor's values are made: `func(*args, **kwargs)` (its `index`-th output), with
    the tensors among the arguments replaced by their nodes; or a fixed CPU `value`."""

    __slots__ = ("func", "args", "kwargs", "index", "nbytes", "shape", "value", "key",
                 "__weakref__")

    def __init__(self, func: Any, args: Any, kwargs: Any, index: int | None, nbytes: int,
                 shape: tuple, value: Any = None) -> None:
        self.func, self.args, self.kwargs, self.index = func, args, kwargs, index
        self.nbytes, self.shape, self.value = nbytes, tuple(shape), value
        self.key: tuple | None = None  # its structure, once `_key` has needed it


def _fill(shape: tuple, v: Any, dtype: Any) -> Any:
    import torch

    return torch.full(shape, v, dtype=dtype)


def _name(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(func, "__name__", "").split(".")[0]


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


class Known:
    """The values of the tensors made under one recorder that its inputs fix (module
    docstring). `uniform` is the recorder's attnmem.trace.uniform.Uniform; `devices` the
    device types that stand for the GPU."""

    def __init__(self, uniform: Any, devices: tuple[str, ...] = ("meta",)) -> None:
        import torch
        from torch.utils.weak import WeakIdKeyDictionary

        self._torch = torch
        self._uniform = uniform
        self._devices = devices
        self._nodes = WeakIdKeyDictionary()  # tensor -> _Node
        self._by_storage: dict[int, list] = {}  # storage -> weak refs of its known tensors

    # ---- what is known ---------------------------------------------------------------------

    def node(self, t: Any) -> _Node | None:
        """t's node, or None where its values are not known."""
        torch = self._torch
        v = self._uniform.value(t)
        if v is not None:
            return _Node(_fill, (tuple(t.shape), v, t.dtype), {}, None, _nbytes(t), t.shape)
        n = self._nodes.get(t)
        if n is not None or t.device.type in self._devices or t.device.type == "meta":
            return n
        if t.layout != torch.strided or _nbytes(t) > MAX_BYTES:
            return None
        # a CPU tensor holds its values: taken as they are now (a later write is not followed)
        return _Node(None, (), {}, None, _nbytes(t), t.shape, t.detach().clone())

    def set_value(self, t: Any, value: Any) -> None:
        """Enter `value` (a CPU tensor of t's shape) as the values of meta tensor t."""
        if tuple(value.shape) != tuple(t.shape):
            raise ValueError(f"values of shape {tuple(value.shape)} given for a tensor of "
                             f"shape {tuple(t.shape)}")
        self._set(t, _Node(None, (), {}, None, _nbytes(t), t.shape, value))

    def values(self, t: Any) -> Any:
        """t's values as a CPU tensor, or None where they are not known; ValuesTooLarge where
        computing them would pass MAX_BYTES."""
        if not isinstance(t, self._torch.Tensor):
            return None
        n = self.node(t)
        return None if n is None else _evaluate(n)

    def scalar(self, func: Any, args: tuple) -> Any:
        """What `func(*args)` returns where it is `.item()` of a known tensor, else None."""
        if _name(func) != "_local_scalar_dense" or not args:
            return None
        v = self.values(args[0])
        return None if v is None else v.item()

    def to_host(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The CPU copy (`.tolist()`, `.cpu()`: aten._to_copy to another device) of a known
        meta tensor, else None."""
        torch = self._torch
        if _name(func) != "_to_copy" or not args or not isinstance(args[0], torch.Tensor):
            return None
        t, dev = args[0], kwargs.get("device")
        if (t.device.type not in self._devices or dev is None
                or torch.device(dev).type in self._devices):
            return None
        v = self.values(t)
        if v is None:
            return None
        return v.to(dtype=kwargs.get("dtype") or t.dtype, device=dev, copy=True)

    def _set(self, t: Any, n: _Node) -> None:
        self._nodes[t] = n
        key = t.untyped_storage()._cdata
        self._by_storage.setdefault(key, []).append(weakref.ref(t))

    def _forget(self, t: Any) -> None:
        """A write to t's storage: no tensor on it is known any more."""
        if not isinstance(t, self._torch.Tensor):
            return
        for ref in self._by_storage.pop(t.untyped_storage()._cdata, ()):
            other = ref()
            if other is not None:
                self._nodes.pop(other, None)
        self._nodes.pop(t, None)

    # ---- following ops ---------------------------------------------------------------------

    def after(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Follow one op that ran: forget what it wrote; where it computes values from known
        values only, keep how (a node per output)."""
        from attnmem.trace.uniform import _written

        written = _written(func, args, kwargs)
        if written:
            for w in written:
                self._forget(w)
            return
        torch = self._torch
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and self.node(first) is None:
            return  # the usual case: an activation or a weight goes in
        outs = out if isinstance(out, (tuple, list)) else (out,)
        targets = [(i, o) for i, o in enumerate(outs) if isinstance(o, torch.Tensor)
                   and o.device.type in self._devices and o.layout == torch.strided
                   and self._uniform.value(o) is None]
        if not targets:
            return
        name = _name(func)
        if any(bad in name for bad in _NOT_VALUES):
            return
        try:
            targs, tkw = self._template(args), self._template(kwargs)
        except _Unknown:
            return
        many = isinstance(out, (tuple, list))
        for i, o in targets:
            self._set(o, _Node(func, targs, tkw, i if many else None, _nbytes(o),
                                 o.shape))

    def _template(self, x: Any) -> Any:
        """x with each tensor replaced by its node and the meta device by the CPU."""
        torch = self._torch
        if isinstance(x, torch.Tensor):
            n = self.node(x)
            if n is None:
                raise _Unknown
            return n
        if isinstance(x, (list, tuple)):
            items = [self._template(y) for y in x]
            return torch.Size(items) if isinstance(x, torch.Size) else type(x)(items)
        if isinstance(x, dict):
            return {k: self._template(v) for k, v in x.items()}
        if isinstance(x, torch.device) and x.type in self._devices:
            return torch.device("cpu")
        return x

    # ---- ops whose output size is read from the values ------------------------------------

    def run(self, func: Any, args: tuple, kwargs: dict) -> tuple[Any, list] | None:
        """Where `func` is an op without a meta form whose output size depends on its input's
        values and those are known: (its result on meta, the tensors its CUDA kernel allocates
        in order, outputs and temporaries alike); None otherwise. The temporaries are dropped
        when the op returns, as the kernel frees them. The outputs' values are known."""
        torch = self._torch
        name = _name(func)
        if name not in ("nonzero", "_unique2") or not args:
            return None
        t = args[0]
        if not isinstance(t, torch.Tensor) or t.device.type not in self._devices:
            return None
        v = self.values(t)
        if v is None:
            return None
        if name == "nonzero":
            return self._nonzero(t, v)
        return self._unique2(t, v, *args[1:], **kwargs)

    def _nonzero(self, t: Any, v: Any) -> tuple[Any, list]:
        """aten/src/ATen/native/cuda/Nonzero.cu `nonzero_cuda_out_impl`: counts the nonzeros
        (cub reduce into a 4-byte counter), syncs, resizes `out` to (ndim, k) int64 and hands
        back its transpose: one int64 (k, ndim) storage. CUB's temporary storage and the
        counter (one 512-byte block each, freed before it returns) are not counted."""
        nz = self._torch.nonzero(v)
        out = self._torch.empty(tuple(nz.shape), dtype=self._torch.long, device=t.device)
        self.set_value(out, nz)
        return out, [out]

    def _unique2(self, t: Any, v: Any, sorted: bool = True, return_inverse: bool = False,
                 return_counts: bool = False) -> tuple[Any, list] | None:
        """aten/src/ATen/native/cuda/UniqueCub.cu `UniqueCub<scalar_t>` (non-bool; a bool
        input takes another kernel and is left to raise): a contiguous copy where the input is
        not contiguous; `sorted`, the input's size (radix-sorted whether or not `sorted` is
        asked, so the values come out sorted); with return_inverse an int64 arange and the
        sorted indices (n each), the int64 inverse (output) and `inv_loc_out` (n);
        `data_out` of n elements, resized down to the k unique values (a resize never shrinks
        the storage: the output holds n elements' bytes); counts (n int64 where asked, else
        empty); `length` (one int64). All but the outputs are freed before it returns. CUB's
        temporary storage is not counted."""
        torch = self._torch
        if t.dtype == torch.bool:
            return None
        n, meta = t.numel(), t.device
        vals, inv, counts = torch._unique2(v, sorted=True, return_inverse=return_inverse,
                                           return_counts=return_counts)
        k = vals.numel()
        order: list = []
        if not t.is_contiguous():
            order.append(torch.empty(n, dtype=t.dtype, device=meta))
        order.append(torch.empty(n, dtype=t.dtype, device=meta))  # sorted
        if return_inverse:
            order += [torch.empty(n, dtype=torch.long, device=meta) for _ in range(2)]
            inverse = torch.empty(tuple(t.shape), dtype=torch.long, device=meta)
            order += [inverse, torch.empty(n, dtype=torch.long, device=meta)]
        else:
            inverse = torch.empty(0, dtype=torch.long, device=meta)
            order.append(inverse)
        data_out = torch.empty(n, dtype=t.dtype, device=meta)
        count_out = torch.empty(n if return_counts else 0, dtype=torch.long, device=meta)
        order += [data_out, count_out, torch.empty(1, dtype=torch.long, device=meta)]
        out_vals = data_out[:k]
        out_counts = count_out[:k] if return_counts else count_out
        self.set_value(out_vals, vals)
        if return_inverse:
            self.set_value(inverse, inv)
        if return_counts:
            self.set_value(out_counts, counts)
        return (out_vals, inverse, out_counts), order

    def mask_index(self, func: Any, args: tuple) -> tuple[tuple, Any] | None:
        """`x[mask]` where each boolean mask's values are known (uniform.py's
        `index_masks`): the nonzero tensor and its columns carry the positions as values."""
        found: list = []

        def selected(mask: Any) -> Any:
            v = self.values(mask)
            if v is None:
                return None
            found.append(self._torch.nonzero(v))
            return found[-1]

        got = index_masks(func, args, selected)
        if got is None:
            return None
        new_args, made, columns = got
        for t, cols, nz in zip(made, columns, found, strict=True):
            self.set_value(t, nz)
            for j, col in enumerate(cols):
                self.set_value(col, nz[:, j])
        return new_args, made


def _evaluate(root: _Node) -> Any:
    """root's values, computed on the CPU from its leaves (iteratively: chains can be long)."""
    from torch.utils._pytree import tree_leaves, tree_map

    if root.value is not None:
        return root.value
    done: dict[int, Any] = {}

    def get(x: Any) -> Any:
        if not isinstance(x, _Node):
            return x
        return x.value if x.value is not None else done[id(x)]

    stack: list[tuple[_Node, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if node.value is not None or id(node) in done:
            continue
        if not ready:
            got = _blockwise(node)
            if got is not None:
                done[id(node)] = got
                if node.nbytes <= KEEP_BYTES:
                    node.value = got
                continue
            if node.nbytes > MAX_BYTES:
                raise ValuesTooLarge(
                    f"its forward reads values computed from a tensor of {node.nbytes:,} "
                    f"bytes (a mask of the queries against the keys); the trace computes such "
                    f"values on the CPU up to {MAX_BYTES:,} bytes a tensor")
            stack.append((node, True))
            stack += [(x, False) for x in tree_leaves((node.args, node.kwargs))
                      if isinstance(x, _Node) and x.value is None and id(x) not in done]
            continue
        out = node.func(*tree_map(get, node.args), **tree_map(get, node.kwargs))
        if node.index is not None:
            out = out[node.index]
        done[id(node)] = out
        if node.nbytes <= KEEP_BYTES:
            node.value = out
    return get(root)


# ---- reductions computed over blocks of the dims they keep --------------------------------
#
# Kolibri-1.1 reads, of its (B, s, s) causal mask, only reductions over the keys: each query's
# first and last visible key (argmax of the mask and of its flip, as int32) and whether it sees
# any (`any(-1)`). Each output element of such a reduction is the same reduction of the same
# input elements however the kept dims are split, so it is computed block by block over rows
# of a dim it keeps, each block made by the same ops on the matching slices of their operands:
# elementwise ops take the slice of each operand along the aligned dim (an operand broadcast
# there whole), views map the dim through (unsqueeze, squeeze, select, expand, flip: the
# mirrored range, transpose, permute), and nested reductions through the dims they keep. An op
# not listed is computed whole and sliced, so MAX_BYTES still refuses a value that is large
# for another reason. The values are exact: every element is computed by the same op from the
# same values as in the whole tensor; the reductions taken blockwise are ones whose result
# does not depend on the order of their elements (argmax/argmin take the first extreme, as the
# whole does, since a block holds whole rows).

#: The reductions taken blockwise (order-independent, so exact over any split of kept dims).
_BLOCK_REDUCTIONS = ("argmax", "argmin", "any", "all", "amax", "amin")
#: Ops passing their dims through unchanged, like elementwise ones.
_SAME_DIMS = ("_to_copy", "clone", "alias", "lift_fresh", "detach", "contiguous")


def _bound(func: Any, args: tuple, kwargs: dict) -> dict:
    """func's arguments by schema name, defaults filled in."""
    out: dict = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _reduced(node: _Node) -> tuple[_Node, list[int]] | None:
    """Where node is a reduction of _BLOCK_REDUCTIONS over some but not all dims of one known
    tensor: (that tensor's node, for each of node's dims the input dim it is), else None."""
    if node.func is None or node.func is _fill or _name(node.func) not in _BLOCK_REDUCTIONS:
        return None
    b = _bound(node.func, node.args, node.kwargs)
    x, dim = b.get("self"), b.get("dim")
    if not isinstance(x, _Node) or dim is None:
        return None
    m = len(x.shape)
    dims = {(k % m) for k in ([dim] if isinstance(dim, int) else dim)} if m else set()
    if not dims or len(dims) == m:
        return None
    kept = list(range(m)) if b.get("keepdim") else [i for i in range(m) if i not in dims]
    return x, kept


def _same(a: int, b: int) -> tuple[int, int]:
    return a, b


def _row_spec(node: _Node, d: int) -> tuple[list, Any] | None:
    """How node's values over [a, b) of its dim d are made (the notes above `_BLOCK_REDUCTIONS`):
    ([(argument node, its dim to slice or None for whole, range map)], a function giving the
    op's arguments for the block, or None); None where the op is not followed."""
    import torch
    from torch.utils._pytree import tree_leaves

    func, n = node.func, len(node.shape)
    kids = [c for c in tree_leaves((node.args, node.kwargs)) if isinstance(c, _Node)]

    def aligned(c: _Node) -> int | None:  # broadcasting aligns dims from the right
        k = d - (n - len(c.shape))
        return k if k >= 0 and c.shape[k] != 1 else None

    name = _name(func)
    if torch.Tag.pointwise in func.tags or name in _SAME_DIMS:
        return [(c, aligned(c), _same) for c in kids], None
    reduced = _reduced(node)
    if reduced is not None:
        return [(reduced[0], reduced[1][d], _same)], None
    x = node.args[0] if node.args else None
    if len(kids) != 1 or not isinstance(x, _Node):
        return None
    m = len(x.shape)
    b = _bound(func, node.args, node.kwargs)
    if name == "unsqueeze":
        u = b["dim"] % n
        return [(x, d if d < u else d - 1, _same)], None
    if name == "squeeze":
        dim = b.get("dim")
        gone = set(range(m)) if dim is None else {k % m for k in (
            [dim] if isinstance(dim, int) else dim)}
        kept = [i for i in range(m) if not (i in gone and x.shape[i] == 1)]
        return [(x, kept[d], _same)], None
    if name == "select":
        k = b["dim"] % m
        return [(x, d if d < k else d + 1, _same)], None
    if name == "expand":
        def sizes(args: tuple, a: int, bb: int) -> tuple:
            new = list(args[1])
            new[d] = bb - a
            return (args[0], new, *args[2:])
        return [(x, aligned(x), _same)], sizes
    if name == "flip":
        if d in {k % m for k in b["dims"]}:
            size = node.shape[d]
            return [(x, d, lambda a, bb: (size - bb, size - a))], None
        return [(x, d, _same)], None
    if name == "transpose":
        i, j = b["dim0"] % m, b["dim1"] % m
        return [(x, j if d == i else i if d == j else d, _same)], None
    if name == "permute":
        return [(x, b["dims"][d] % m, _same)], None
    return None


def _rows(node: _Node, d: int | None, a: int, b: int, memo: dict) -> Any:
    """node's values over [a, b) of its dim d (None: all of them), made from slices of its
    arguments' where `_row_spec` follows the op, else computed whole and sliced."""
    from torch.utils._pytree import tree_map

    key = (id(node), None) if d is None else (id(node), d, a, b)
    if key in memo:
        return memo[key]
    if d is None:
        out = _evaluate(node)
    elif node.value is not None:
        out = node.value.narrow(d, a, b - a)
    elif node.func is _fill:
        shape = list(node.shape)
        shape[d] = b - a
        out = _fill(tuple(shape), *node.args[1:])
    else:
        spec = _row_spec(node, d)
        cast = _cast_of_bool(node, spec, a, b, memo)
        if cast is not None:
            out = cast
        elif spec is None:
            out = _evaluate(node).narrow(d, a, b - a)
        else:
            parts, adjust = spec
            got = {id(c): _rows(c, k, *f(a, b), memo) for c, k, f in parts}
            args = tree_map(lambda x: got[id(x)] if isinstance(x, _Node) else x, node.args)
            kwargs = tree_map(lambda x: got[id(x)] if isinstance(x, _Node) else x, node.kwargs)
            if adjust is not None:
                args = adjust(args, a, b)
            out = node.func(*args, **kwargs)
            if node.index is not None:
                out = out[node.index]
    memo[key] = out
    return out


def _cast_of_bool(node: _Node, spec: Any, a: int, b: int, memo: dict) -> Any:
    """argmax/argmin of a bool tensor cast to a number (Kolibri's `visible.int().argmax(-1)`)
    taken of the bools viewed as uint8: the cast maps False, True to 0, 1 in every number
    dtype, keeping their order, and both return the first index of the extreme, so the result
    is the same, without the cast's 4-byte copy (argmax has no bool kernel). None otherwise."""
    import torch

    if spec is None or _name(node.func) not in ("argmax", "argmin"):
        return None
    (x, k, _), = spec[0]
    if (x.func is None or _name(x.func) != "_to_copy" or len(x.args) != 1
            or not isinstance(x.args[0], _Node) or set(x.kwargs) - {"dtype"}
            or x.kwargs.get("dtype") in (None, torch.bool, torch.uint8, torch.int8)):
        return None  # 8-bit results hold the cast as it is: nothing to save
    src = _rows(x.args[0], k, a, b, memo)
    if src.dtype != torch.bool:
        return None
    return node.func(src.view(torch.uint8), *node.args[1:], **node.kwargs)


def _row_bytes(node: _Node, d: int | None, seen: set) -> int:
    """The most bytes one index of dim d takes in any tensor a block of node is made of (the
    whole tensors left out: each is held to MAX_BYTES where it is computed)."""
    if d is None or (id(node), d) in seen:
        return 0
    seen.add((id(node), d))
    here = node.nbytes // max(1, node.shape[d])
    if node.value is not None or node.func is None or node.func is _fill:
        return here
    spec = _row_spec(node, d)
    if spec is None:
        return here
    return max([here] + [_row_bytes(c, k, seen) for c, k, _ in spec[0]])


def _key(root: _Node, leaves: list) -> tuple:
    """What root's values are made of, as a hashable structure: equal keys, equal values (ops
    and their non-tensor arguments, each with its type; a fixed value by its node, which
    `leaves` gets so that the caller can keep it alive while the key is in use)."""
    from torch.utils._pytree import tree_flatten

    def plain(x: Any) -> Any:
        if isinstance(x, _Node):
            return x.key
        return (type(x).__name__, repr(x))  # 1, 1.0 and True make different dtypes

    stack = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if node.key is not None:
            continue
        if node.func is None:
            node.key = ("value", id(node))
            continue
        flat, spec = tree_flatten((node.args, node.kwargs))
        if not ready:
            stack.append((node, True))
            stack += [(x, False) for x in flat if isinstance(x, _Node) and x.key is None]
            continue
        node.key = (str(node.func), node.index, str(spec), tuple(plain(x) for x in flat))
    todo, seen = [root], set()
    while todo:  # the fixed values it rests on
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.func is None:
            leaves.append(node)
        else:
            todo += [x for x in tree_flatten((node.args, node.kwargs))[0]
                     if isinstance(x, _Node)]
    return root.key


#: Blockwise results by `_key`, newest last: every layer of a model reads the same reductions
#: of the same mask through new tensors (Kolibri: `visible.int().argmax(-1)` per layer).
_BLOCK_CACHE: dict[tuple, tuple[Any, list]] = {}
_BLOCK_CACHE_SIZE = 32


def _blockwise(node: _Node) -> Any:
    """node's values where it is a reduction of _BLOCK_REDUCTIONS of a tensor of more than
    BLOCK_BYTES, computed over blocks of its largest kept dim; else None (computed as usual)."""
    reduced = _reduced(node)
    if reduced is None or node.value is not None:
        return None
    x, _ = reduced
    if x.nbytes <= BLOCK_BYTES or x.value is not None or not node.shape:
        return None
    leaves: list = []
    key = (_key(node, leaves), BLOCK_BYTES, MAX_BYTES)
    hit = _BLOCK_CACHE.pop(key, None)
    if hit is None:
        hit = (_blocks(node), leaves)
    if sum(n.nbytes for n in leaves) > KEEP_BYTES:
        return hit[0]  # not kept: the entry would hold large CPU values alive
    _BLOCK_CACHE[key] = hit
    while len(_BLOCK_CACHE) > _BLOCK_CACHE_SIZE:
        del _BLOCK_CACHE[next(iter(_BLOCK_CACHE))]
    return hit[0]


def _blocks(node: _Node) -> Any:
    """_blockwise's computation, block by block."""
    import torch

    x = _reduced(node)[0]
    d = max(range(len(node.shape)), key=lambda i: node.shape[i])
    size = node.shape[d]
    per = _row_bytes(node, d, set())
    if per > MAX_BYTES:
        raise ValuesTooLarge(
            f"its forward reads values computed from a tensor of {x.nbytes:,} bytes, of "
            f"{per:,} bytes a row; the trace computes such values on the CPU up to "
            f"{MAX_BYTES:,} bytes a tensor")
    step = max(1, BLOCK_BYTES // max(1, per))
    whole: dict = {}
    out = None
    for a in range(0, size, step):
        memo = dict(whole)
        part = _rows(node, d, a, min(size, a + step), memo)
        whole.update((k, v) for k, v in memo.items() if k[1] is None)
        del memo  # this block's tensors, before the next block makes its own
        if out is None:  # one output, filled in place: small results kept between the
            # blocks' freed temporaries hold the heap's top and the process grows a block
            # each (1 GB at s = 32,768, measured)
            out = torch.empty(node.shape, dtype=part.dtype)
        out.narrow(d, a, part.shape[d]).copy_(part)
        del part
    return out
