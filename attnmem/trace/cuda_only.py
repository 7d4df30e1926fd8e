"""Allocations a CUDA kernel makes that the same op's meta kernel does not.

The recorder (attnmem.trace.recorder) sees what each op returns. A few CUDA kernels also make
a temporary of their own, through the caching allocator, freed before they return; the meta
device never runs them. Each entry here makes that temporary on the meta device for the
duration of the op, so that the replay counts it at that moment:

- `aten._softmax_backward_data`: softmax_backward_cuda_out forms `tmp = grad * output` (the
  gradient's size and dtype) and runs the backward kernel on it (aten/src/ATen/native/cuda/
  SoftMax.cu; attnmem.calc.train_dense._attention_backward_extra counts it, measured on the
  H200: eager training rows within 0.15%).
"""

from __future__ import annotations

from typing import Any


def temporaries(func: Any, args: tuple) -> list[Any]:
    """Tensors the CUDA kernel of `func` would hold while it runs, made now (empty if none)."""
    name = getattr(func, "__name__", "")
    if name.startswith("_softmax_backward_data"):
        import torch

        return [torch.empty_like(args[0])]
    return []
