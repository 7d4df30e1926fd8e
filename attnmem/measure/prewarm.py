"""Create the cuBLAS workspaces before the first measured point, so that none is cut from a
freed segment later (issue 16).

Imported by the measurement child when the sweep asks for it
(``attnmem.measure.child.run_points(impl_module="attnmem.measure.prewarm")``, as
``python -m attnmem.measure.awkward_sweep`` does by default). Why: cuBLAS keeps one workspace
per (handle, stream), allocated through PyTorch's caching allocator the first time a thread
runs a matrix product, and never freed. The autograd engine runs backwards on its own thread,
so its workspace (32 MiB on the H200) appears during the first backward's warm-up, when the
forward's freed s x s segments are cached: it is cut from one of them, and empty_cache() can
then never release that segment. Every later point starts with hundreds of MB cached and
free, and its tensors are cut from them (counted at their 512 B-rounded size instead of whole
segments; measured: data/attention_calls_awkward_h200.csv). Running small products forward
and backward here, while the cache holds nothing large, gives each workspace a segment of its
own, so that the harness's "caches emptied" (attnmem/measure/harness.py, step 3) holds for every
point.

The module defines neither make_device nor get_implementation: the child measures with its
defaults (the registry's implementations on the CUDA device).
"""

from __future__ import annotations


def prewarm() -> bool:
    """Matrix products (mm and bmm, forward and backward) in fp16, bf16 and fp32 on the GPU,
    then empty the cache. Returns False without a GPU (nothing to do)."""
    import torch

    if not torch.cuda.is_available():
        return False
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        a = torch.randn(64, 64, device="cuda", dtype=dtype, requires_grad=True)
        b = torch.randn(2, 64, 64, device="cuda", dtype=dtype, requires_grad=True)
        (a @ a).sum().backward()  # mm on this thread and on the autograd thread
        (b @ b.transpose(1, 2)).sum().backward()  # bmm, as attention's products are
        del a, b
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return True


WARMED = prewarm()
