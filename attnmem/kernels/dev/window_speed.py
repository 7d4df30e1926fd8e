# Measured: causal sliding window time vs full causal attention (H200).
"""Time of our kernel's causal sliding window against full causal attention, on the GPU.

    python -m attnmem.kernels.dev.window_speed [--seq 8192] [--windows 512 1024 4096] [--heads 8]

For each window W (and None, plain causal) it times ``flash_attention(q, k, v, causal=True,
window=W)`` forward, and forward + backward (``torch.autograd.grad``), B = 1, bf16, d = 128,
with ``triton.testing.do_bench`` (CUDA events, median; one untimed call first compiles and
tunes). A windowed forward runs the portable Triton forward on Hopper (the Gluon forward has
no window), so the table also prints that forward without a window (``KernelConfig(sm90=
False)``) to separate what the window saves from what the kernel change costs. The tile work
of a window is s·W - W²/2 score elements against causal's s²/2 (for s_q = s_k = s), i.e.
1 - (1 - W/s)² of it (0.23 at W = 1,024, s = 8,192), the ratio the window's time would reach
if the tile loop were all of it.
"""

from __future__ import annotations

import argparse


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--windows", type=int, nargs="+", default=[512, 1024, 4096])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    args = p.parse_args(argv)
    if args.seq < 2 or args.heads < 1 or args.dim < 1 or any(w < 1 for w in args.windows):
        p.error(f"--seq >= 2, --heads, --dim and every window >= 1: got {args.seq}, "
                f"{args.heads}, {args.dim}, {args.windows}")

    import torch
    from triton.testing import do_bench

    from attnmem.kernels import flash_attention
    from attnmem.kernels.flash.config import KernelConfig

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, args.heads, args.seq, args.dim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]

    def timed(window, config=None):
        def fwd():
            flash_attention(q, k, v, causal=True, window=window, config=config)

        def fwd_bwd():
            out = flash_attention(*leaves, causal=True, window=window, config=config)
            torch.autograd.grad(out, leaves, do)
        fwd(), fwd_bwd()  # compile / tune
        return do_bench(fwd, warmup=25, rep=200), do_bench(fwd_bwd, warmup=25, rep=200)

    full = timed(None)
    portable = timed(None, KernelConfig(sm90=False))
    print(f"{torch.cuda.get_device_name()}, bf16, B=1, H={args.heads}, s={args.seq}, "
          f"d={args.dim}, causal; ms (do_bench median)")
    print("| window | fwd ms | fwd+bwd ms | fwd / causal | fwd+bwd / causal | tile work 1-(1-W/s)^2 |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| none (default forward) | {full[0]:.3f} | {full[1]:.3f} | 1.00 | 1.00 | 1.00 |")
    print(f"| none (portable forward) | {portable[0]:.3f} | {portable[1]:.3f} | "
          f"{portable[0] / full[0]:.2f} | {portable[1] / full[1]:.2f} | 1.00 |")
    for w in args.windows:
        t = timed(w)
        work = 1 - (1 - min(w, args.seq) / args.seq) ** 2
        print(f"| {w} | {t[0]:.3f} | {t[1]:.3f} | {t[0] / full[0]:.2f} | {t[1] / full[1]:.2f} "
              f"| {work:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
