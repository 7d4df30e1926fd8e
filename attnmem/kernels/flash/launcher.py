"""Launch an already compiled Triton (or Gluon) kernel without the JIT's per-call dispatch.

``kernel[grid](*args, **kwargs)`` binds the arguments, works out how each one specialises the
kernel (dtype, 16-byte alignment, integers equal to 1 or divisible by 16), turns that into a
cache key with the options, finds the compiled kernel, builds launch metadata for hooks and
only then launches. That costs tens of microseconds per launch on the host
(``attnmem/kernels/dev/host_sm90.py`` measures it), more than the GPU work of a short attention
call; a forward and a backward make three launches.

`DirectLauncher` does the dispatch once per caller-given key, keeps the compiled kernel, and
from then on calls its launcher the way ``JITFunction.run`` does at its end (same arguments,
no launch metadata, no hooks). The caller's key must determine everything the JIT
specialises on for the arguments it passes: each kernel's host code documents why its key
does. When launch hooks are installed (profilers, proton) or ``SETTINGS.direct_launch`` is off
(tests), every call takes the normal path.

Two more host costs go on Triton 3.6, whose launcher this module knows (`raw_launch`): the
compiled kernel's ``run`` object allocates no scratch for these kernels and, for
tensor-descriptor parameters, encodes each descriptor into a CUDA tensor map on every launch
(``make_tensordesc_arg``). The launcher calls the C launch function under it directly, and
keeps each encoded tensor map, keyed by what the encoding reads (the kernel, the parameter,
the base address, shape and strides), so that a call on the same tensors as before reuses it.
On other Triton versions the hit path calls ``kernel.run`` as the JIT would.
"""

from __future__ import annotations

import inspect

from attnmem.kernels.flash.config import SETTINGS

# Triton versions whose compiled-kernel launcher `raw_launch` knows (CudaLauncher: scratch
# allocation, then the tensor-descriptor expansion closure around the C launch function).
KNOWN_LAUNCHERS = ("3.6.",)
_TENSORDESC_CLOSURE = {"launcher", "tensordesc_indices", "tensordesc_meta"}


def raw_launch(run, version: str) -> tuple | None:
    """(launch, cooperative, pdl, descriptor slots, descriptor metadata) for the compiled
    kernel's ``run`` object, when it is Triton 3.6's CudaLauncher and needs no scratch memory:
    ``launch(gx, gy, gz, stream, function, cooperative, pdl, None, None, packed_metadata,
    None, None, None, *args)`` is then what ``run`` does. Slots and metadata are None when
    the kernel has no descriptor parameters; with them, ``launch`` wants each descriptor
    expanded as ``make_tensordesc_arg`` does. None for any other layout."""
    if not version.startswith(KNOWN_LAUNCHERS) or type(run).__name__ != "CudaLauncher":
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    launch = run.launch
    code = getattr(launch, "__code__", None)
    coop, pdl = run.launch_cooperative_grid, run.launch_pdl
    if code is None:  # the C launch function itself: no descriptor parameters
        return launch, coop, pdl, None, None
    if set(code.co_freevars) != _TENSORDESC_CLOSURE:
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__),
                     strict=True))
    slots, meta = sorted(cells["tensordesc_indices"]), cells["tensordesc_meta"]
    if not meta or len(meta) != len(slots):
        return None
    return cells["launcher"], coop, pdl, tuple(slots), tuple(meta)


def _has_hooks(hook) -> bool:
    """Triton 3.6 keeps launch hooks in a HookChain (never None; empty when unused); older
    builds keep a callable or None."""
    return bool(hook.calls) if hasattr(hook, "calls") else hook is not None


def hooks_installed(runtime) -> bool:
    """Whether launch hooks are set in ``runtime`` (``triton.knobs.runtime``)."""
    return _has_hooks(runtime.launch_enter_hook) or _has_hooks(runtime.launch_exit_hook)


class DirectLauncher:
    """``launcher(grid, key, args, kwargs)`` behaves as ``fn[grid](*args, **kwargs)``.

    ``args`` are the kernel's leading positional parameters; ``kwargs`` the remaining
    parameters (constexprs) and launch options (num_warps, num_stages, ...). ``key`` is None
    to force the JIT path. At most ``max_entries`` compiled kernels are remembered (the table
    is emptied when full: the next call of each key pays one JIT dispatch again).

    ``descriptor``, when given, builds the kernel's tensor-descriptor arguments: the caller
    passes each of them as a tuple ``(tensor, *extra)``, turned into
    ``descriptor(tensor, *extra)`` where a descriptor object is needed (the JIT path, or a
    Triton whose launcher `raw_launch` does not know). The key must then also determine the
    ``extra`` values (tile shape, layout).
    """

    def __init__(self, fn, max_entries: int = 4096, descriptor=None):
        self.fn = fn
        self.max_entries = max_entries
        self.descriptor = descriptor
        self.cache: dict[tuple, tuple] = {}
        self.encoded: dict[tuple, list] = {}  # tensor maps, by (key, slot, address, shape, strides)
        self.direct_calls = 0  # launches that skipped the JIT dispatch (tests read it)
        self.raw_calls = 0  # ... of which went to the C launch function directly
        # Under TRITON_INTERPRET=1 kernels are InterpretedFunctions: nothing is compiled
        self.interpreted = type(fn).__name__ == "InterpretedFunction"
        self._runtime = self._device = self._stream = None  # bound at the first direct call
        self._version = ""
        self._encode = None

    def _tail(self, n_args: int, kwargs: dict) -> tuple | None:
        """Values of the parameters after the positional ones, in signature order, as the
        JIT binds them (given, else the default); None if one has neither."""
        tail = []
        for p in self.fn.params[n_args:]:
            if p.name in kwargs:
                tail.append(kwargs[p.name])
            elif p.default is not inspect.Parameter.empty:
                tail.append(p.default)
            else:
                return None
        return tuple(tail)

    def _bind(self) -> None:
        """Look up once what every direct call reads: the launch-hook settings, and the
        device and raw-stream getters the JIT itself calls."""
        import triton
        from triton import knobs
        from triton.runtime import driver

        self._runtime = knobs.runtime
        self._device = driver.active.get_current_device
        self._stream = driver.active.get_current_stream
        self._version = triton.__version__
        if self._version.startswith(KNOWN_LAUNCHERS):
            from triton.backends.nvidia.driver import make_tensordesc_arg

            self._encode = make_tensordesc_arg

    def _jit_only(self) -> bool:
        """Every launch takes the JIT's path: switched off, interpreted, or hooks installed."""
        if not SETTINGS.direct_launch or self.interpreted:
            return True
        if self._runtime is None:
            self._bind()
        return hooks_installed(self._runtime)

    def _built(self, a):
        """``a`` as a descriptor object: built from its ``(tensor, *extra)`` tuple, or as given."""
        return self.descriptor(*a) if type(a) is tuple else a

    def _descriptors(self, args: tuple) -> tuple:
        """args with every ``(tensor, *extra)`` tuple built into a descriptor object."""
        if self.descriptor is None:
            return args
        return tuple(self._built(a) for a in args)

    def _tensor_map(self, key: tuple, slot: int, a, meta: dict) -> list:
        """Descriptor argument ``a`` encoded as Triton's launcher passes it (tensor map, shape,
        strides), from the table when the same tensor (address, shape, strides) was encoded
        for this kernel and parameter before."""
        if type(a) is tuple:  # the encoding reads the address, shape and strides only
            t = a[0]
            ekey = (key, slot, t.data_ptr(), t.shape, t.stride())
        else:
            ekey = (key, slot, a.base.data_ptr(), tuple(a.shape), tuple(a.strides),
                    tuple(a.block_shape), getattr(a, "padding", None))
        enc = self.encoded.get(ekey)
        if enc is None:
            if len(self.encoded) >= self.max_entries:
                self.encoded.clear()
            enc = self.encoded[ekey] = self._encode(self._built(a), meta)
        return enc

    def _expand(self, key: tuple, args: tuple, slots: tuple, meta: tuple) -> list:
        """args with each descriptor slot replaced by what Triton's launcher passes for it."""
        out = list(args[:slots[0]])
        for j, (slot, m) in enumerate(zip(slots, meta, strict=True)):
            a = args[slot]
            if m is None:  # a host descriptor the kernel takes as pointer, shape and strides:
                out.extend(self._encode(self._built(a), None))  # nothing to encode or keep
            else:
                out.extend(self._tensor_map(key, slot, a, m))
            end = slots[j + 1] if j + 1 < len(slots) else len(args)
            out.extend(args[slot + 1:end])
        return out

    def __call__(self, grid: tuple, key: tuple | None, args: tuple, kwargs: dict) -> None:
        if key is not None and self._jit_only():
            key = None
        if key is not None:
            device = self._device()
            key = (device, key)  # the JIT compiles for the current device
            hit = self.cache.get(key)
            if hit is not None:
                kernel, tail, raw = hit
                stream = self._stream(device)
                g1 = grid[1] if len(grid) > 1 else 1
                g2 = grid[2] if len(grid) > 2 else 1
                self.direct_calls += 1
                if raw is not None:
                    launch, coop, pdl, slots, meta = raw
                    if slots is not None:
                        args = self._expand(key, args, slots, meta)
                    launch(grid[0], g1, g2, stream, kernel.function, coop, pdl, None, None,
                           kernel.packed_metadata, None, None, None, *args, *tail)
                    self.raw_calls += 1
                    return
                kernel.run(grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata,
                           None, None, None, *self._descriptors(args), *tail)
                return
        kernel = self.fn[grid](*self._descriptors(args), **kwargs)
        if key is None or kernel is None or hasattr(kernel, "result"):
            return  # hooks, no key, or an asynchronous compile: keep nothing
        tail = self._tail(len(args), kwargs)
        if tail is None:
            return
        raw = raw_launch(kernel.run, self._version)
        if raw is not None and raw[3] is not None and (self._encode is None
                                                       or raw[3][-1] >= len(args)):
            raw = None  # descriptors among the constexpr tail: not a layout this code expands
        if len(self.cache) >= self.max_entries:
            self.cache.clear()
        self.cache[key] = (kernel, tail, raw)
