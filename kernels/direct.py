"""Launch an already compiled Triton (or Gluon) kernel without the JIT's per-call dispatch.

``kernel[grid](*args, **kwargs)`` binds the arguments, works out how each one specialises the
kernel (dtype, 16-byte alignment, integers equal to 1 or divisible by 16), turns that into a
cache key with the options, finds the compiled kernel, builds launch metadata for hooks and
only then launches. On the H200's host that costs 30 to 40 microseconds per launch
(``scripts/host_sm90.py``), more than the GPU work of a short attention call; a forward and a
backward make three launches.

`DirectLauncher` does the dispatch once per caller-given key, keeps the compiled kernel, and
from then on calls its launcher the way ``JITFunction.run`` does at its end (same arguments,
no launch metadata, no hooks). The caller's key must determine everything the JIT
specialises on for the arguments it passes: each kernel's host code documents why its key
does. When launch hooks are installed (profilers, proton) or FLASH_ATTN_DIRECT_LAUNCH=0, every
call takes the normal path.
"""

from __future__ import annotations

import inspect
import os

DIRECT_LAUNCH = os.environ.get("FLASH_ATTN_DIRECT_LAUNCH") != "0"


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
    """

    def __init__(self, fn, max_entries: int = 4096):
        self.fn = fn
        self.max_entries = max_entries
        self.cache: dict[tuple, tuple] = {}
        self.direct_calls = 0  # launches that skipped the JIT dispatch (tests read it)
        # Under TRITON_INTERPRET=1 kernels are InterpretedFunctions: nothing is compiled
        self.interpreted = type(fn).__name__ == "InterpretedFunction"
        self._runtime = self._device = self._stream = None  # bound at the first direct call

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
        from triton import knobs
        from triton.runtime import driver

        self._runtime = knobs.runtime
        self._device = driver.active.get_current_device
        self._stream = driver.active.get_current_stream

    def _jit_only(self) -> bool:
        """Every launch takes the JIT's path: switched off, interpreted, or hooks installed."""
        if not DIRECT_LAUNCH or self.interpreted:
            return True
        if self._runtime is None:
            self._bind()
        return hooks_installed(self._runtime)

    def __call__(self, grid: tuple, key: tuple | None, args: tuple, kwargs: dict) -> None:
        if key is not None and self._jit_only():
            key = None
        if key is not None:
            device = self._device()
            key = (device, key)  # the JIT compiles for the current device
            hit = self.cache.get(key)
            if hit is not None:
                kernel, tail = hit
                stream = self._stream(device)
                kernel.run(grid[0], grid[1] if len(grid) > 1 else 1,
                           grid[2] if len(grid) > 2 else 1, stream, kernel.function,
                           kernel.packed_metadata, None, None, None, *args, *tail)
                self.direct_calls += 1
                return
        kernel = self.fn[grid](*args, **kwargs)
        if key is None or kernel is None or hasattr(kernel, "result"):
            return  # hooks, no key, or an asynchronous compile: keep nothing
        tail = self._tail(len(args), kwargs)
        if tail is None:
            return
        if len(self.cache) >= self.max_entries:
            self.cache.clear()
        self.cache[key] = (kernel, tail)
