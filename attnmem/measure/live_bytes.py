"""Count the bytes of live tensor storages during any torch code, on any device (CPU too).

`LiveBytes` is a TorchDispatchMode: every tensor an op returns is registered once per storage
(weak references, so a storage counts from its creation until the last tensor on it dies);
`bytes` is what is alive now and `peak` the largest value seen, with the op and the module
stack (`track_modules`) at that moment. It counts tensor bytes, not the caching allocator's
blocks: on CUDA `max_memory_allocated()` adds each block's rounding to 512 bytes, which this
does not.

Why it exists: the analytic inference and training models (attnmem.calc.inference_step,
attnmem.calc.training_step) are lists of the tensors alive at named moments. Replaying the real
transformers code on the CPU under this mode shows which moment is the peak and what is alive
then, without a GPU; the GPU measurement (attnmem.measure --infer / --train) then checks the
CUDA-only parts (fused attention kernels, cuBLAS workspaces, allocator rounding).
"""

from __future__ import annotations

import weakref
from typing import Any


def _mode_base() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class LiveBytes:
    """Live storage bytes under a dispatch mode; `with LiveBytes() as live: ...`."""

    def __init__(self) -> None:
        import torch
        from torch.utils.weak import WeakIdKeyDictionary

        self._torch = torch
        self._seen = WeakIdKeyDictionary()
        self.bytes = 0
        self.peak = 0
        self.peak_op = ""
        self.peak_stack: tuple[str, ...] = ()
        self.stack: list[str] = []
        live = self

        class _Mode(_mode_base()):  # type: ignore[misc]
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                for o in out if isinstance(out, (tuple, list)) else [out]:
                    live.add(o, str(func))
                return out

        self._mode = _Mode()

    def add(self, t: Any, op: str = "") -> None:
        """Register t's storage if it is new (parameters, inputs made before the mode)."""
        if not isinstance(t, self._torch.Tensor):
            return
        st = t.untyped_storage()
        if st in self._seen:
            return
        self._seen[st] = n = st.nbytes()
        self.bytes += n
        weakref.finalize(st, self._drop, n)
        if self.bytes > self.peak:
            self.peak = self.bytes
            self.peak_op = op
            self.peak_stack = tuple(self.stack)

    def _drop(self, n: int) -> None:
        self.bytes -= n

    def reset_peak(self) -> None:
        self.peak = self.bytes
        self.peak_op = ""
        self.peak_stack = tuple(self.stack)

    def __enter__(self) -> LiveBytes:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def track_modules(self, model: Any):
        """Keep `stack` (module names entered and not yet left) current while in the block;
        the root module is named by its class (attnmem.trace.recorder.module_stack)."""
        from attnmem.trace.recorder import module_stack

        return module_stack(model, self.stack, lambda name, mod: name or type(mod).__name__)
