# Measured: host microseconds per short forward+backward call, by part (H200).
"""Host microseconds per forward+backward call on a tiny shape, by part, next to SDPA's
FlashAttention-2 and cuDNN (the GPU work is a few microseconds: what is left is host time).

    python -m attnmem.kernels.dev.host_fwdbwd [--d 128] [--calls 1000]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnmem.kernels.flash.api import flash_attention
from attnmem.kernels.flash.config import SETTINGS
from attnmem.kernels.flash.route import attention_backward, attention_forward
from attnmem.measure.bench.speed import host_us_per_call


class _Identity(torch.autograd.Function):
    """The autograd machinery alone: a Function that saves three tensors and does nothing."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return q.view_as(q)

    @staticmethod
    def backward(ctx, g):
        return g, g, g


def timeline(q, k, v, do, n: int) -> None:
    """Mean host microseconds between the marks of one forward+backward call: entering
    flash_attention, leaving it, calling .backward, entering our backward, leaving it, and
    .backward returning."""
    import time

    import attnmem.kernels.flash.api as fa

    marks: list[float] = []
    inner = fa.FlashAttentionFunction.backward

    def backward(ctx, g):
        marks.append(time.perf_counter())
        out = inner(ctx, g)
        marks.append(time.perf_counter())
        return out

    fa.FlashAttentionFunction.backward = staticmethod(backward)
    spans = []
    for i in range(n + 30):
        marks.clear()
        t0 = time.perf_counter()
        out = flash_attention(q, k, v)
        t1 = time.perf_counter()
        out.backward(do)
        t2 = time.perf_counter()
        if i >= 30 and len(marks) == 2:
            spans.append((t1 - t0, marks[0] - t1, marks[1] - marks[0], t2 - marks[1]))
    torch.cuda.synchronize()
    fa.FlashAttentionFunction.backward = staticmethod(inner)
    names = ("forward call", ".backward() -> our backward", "our backward",
             "our backward -> .backward() returns")
    for j, name in enumerate(names):
        print(f"timeline: {name:36s} {sum(s[j] for s in spans) / len(spans) * 1e6:7.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--calls", type=int, default=1000)
    args = ap.parse_args()
    q, k, v, do = (torch.randn(1, 2, 128, args.d, device="cuda", dtype=torch.float16)
                   for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    o, lse2 = attention_forward(q, k, v, False, 0.125)
    scale = args.d ** -0.5

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v).backward(do)
        return call

    parts = [
        ("ours fwd+bwd", lambda: flash_attention(q, k, v).backward(do)),
        ("ours fwd (autograd, no bwd)", lambda: flash_attention(q, k, v)),
        ("ours fwd (no grad)", lambda: flash_attention(q.detach(), k.detach(), v.detach())),
        ("attention_forward", lambda: attention_forward(q, k, v, False, scale)),
        ("attention_backward", lambda: attention_backward(do, q, k, v, o, lse2, False, scale)),
        ("autograd identity fwd+bwd", lambda: _Identity.apply(q, k, v).backward(do)),
        ("torch.empty x4", lambda: [torch.empty((1, 2, 128, args.d), dtype=q.dtype,
                                                device=q.device) for _ in range(4)]),
        ("sdpa flash fwd+bwd", sdpa(SDPBackend.FLASH_ATTENTION)),
        ("sdpa cudnn fwd+bwd", sdpa(SDPBackend.CUDNN_ATTENTION)),
    ]
    for name, call in parts:
        print(f"{name:32s} {host_us_per_call(call, args.calls, warmup=30):7.1f} us/call",
              flush=True)
    with torch.autograd.set_multithreading_enabled(False):  # backward on this thread
        for name, call in (parts[0], parts[5], parts[7]):
            print(f"{name + ', one thread':32s} "
                  f"{host_us_per_call(call, args.calls, warmup=30):7.1f} us/call", flush=True)
    timeline(q, k, v, do, args.calls)
    SETTINGS.direct_launch = False
    print(f"{'ours fwd+bwd, JIT dispatch':32s} "
          f"{host_us_per_call(parts[0][1], args.calls, warmup=30):7.1f} us/call")
    SETTINGS.direct_launch = True


if __name__ == "__main__":
    main()
