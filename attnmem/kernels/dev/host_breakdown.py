# Measured: host microseconds per step of a short no-grad forward call (H200).
"""Host microseconds of each step of one no-grad forward call, by path, on a small shape
(B = 1, H = 2, s = 128: the GPU work is a few microseconds, what is measured is host time),
next to SDPA's cuDNN and FlashAttention-2 forwards measured in the same process.

    python -m attnmem.kernels.dev.host_breakdown [--d 128] [--calls 3000] [--profile]

Each row times one step alone, back to back (``attnmem.measure.bench.speed.host_us_per_call``); the steps
of a path add up to about its whole call. ``--profile`` also prints cProfile's top entries of
the whole call.
"""
import argparse
import cProfile
import pstats

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnmem.kernels.flash.api as fa
from attnmem.kernels.flash import route
from attnmem.kernels.flash.config import SETTINGS, KernelConfig
from attnmem.measure.bench.speed import host_us_per_call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    n, d = args.calls, args.d
    q, k, v = (torch.randn(1, 2, 128, d, device="cuda", dtype=torch.float16) for _ in range(3))
    scale = d ** -0.5
    k90 = route.fwd_sm90
    rows: list[tuple[str, float]] = []

    def row(name, call):
        rows.append((name, host_us_per_call(call, n, warmup=50)))


    row("flash_attention (default path)", lambda: fa.flash_attention(q, k, v))
    if k90 is not None:
        raw = [entry[2] is not None for entry in k90.LAUNCHER.cache.values()]
        print(f"Gluon launcher: {len(raw)} kernels, C launch called directly: {raw}")
        saved = k90.LAUNCHER.cache.copy()
        for key, (kernel, tail, _) in saved.items():  # the same calls through kernel.run
            k90.LAUNCHER.cache[key] = (kernel, tail, None)
        row("flash_attention (default path), through kernel.run",
            lambda: fa.flash_attention(q, k, v))
        k90.LAUNCHER.cache.update(saved)
    SETTINGS.direct_launch = False
    row("flash_attention (default path), JIT dispatch", lambda: fa.flash_attention(q, k, v))
    SETTINGS.direct_launch = True
    row("flash_attention, Triton kernel", lambda: fa.flash_attention(q, k, v,
                                                                      config=KernelConfig(sm90=False)))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        row("sdpa cuDNN", lambda: F.scaled_dot_product_attention(q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        row("sdpa flash (FA2)", lambda: F.scaled_dot_product_attention(q, k, v))
    row("  _check_inputs", lambda: fa._check_inputs(q, k, v, None))
    row("  grad checks", lambda: torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                             or v.requires_grad))
    row("  route.attention_forward", lambda: route.attention_forward(q, k, v, False, scale))
    row("  route.forward_route", lambda: route.forward_route(
        route.Call.of(q, k, False, None), None, route.probe(q, k, v)))
    row("  torch.empty x2", lambda: (torch.empty((1, 2, 128, d), dtype=q.dtype, device=q.device),
                                     torch.empty((1, 2, 128), dtype=torch.float32,
                                                 device=q.device)))
    if k90 is not None and d in k90.HEAD_DIMS:
        row("  attention_forward_sm90", lambda: k90.attention_forward_sm90(q, k, v, False, 0.2))
        lay = k90._layout(q.dtype, 64, d)
        row("  _descriptor x4", lambda: [k90._descriptor(q, 64, lay) for _ in range(4)])
        row("  usable", lambda: k90.usable(q, k, v))
        hit = next(iter(k90.LAUNCHER.cache.values()), None)
        meta = getattr(hit[0].metadata, "tensordesc_meta", None) if hit else None
        if meta:
            from triton.backends.nvidia import driver as nvd

            descs = [k90._descriptor(t, 64, lay) for t in (q, k, v, q)]
            pairs = list(zip(descs, meta, strict=True))
            try:
                nvd.make_tensordesc_arg(descs[0], meta[0])
                extra = ()
            except TypeError:  # newer Triton: a third argument
                extra = (None,)
            row("  Triton's descriptor encoding x4 (in the launch)",
                lambda: [nvd.make_tensordesc_arg(a, m, *extra) for a, m in pairs])
    width = max(len(name) for name, _ in rows)
    print(f"\nhost us per call, d = {d}, fp16, (1, 2, 128, {d}), {n} calls each")
    for name, us in rows:
        print(f"{name:<{width}}  {us:7.1f}")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fa.flash_attention(q, k, v)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
