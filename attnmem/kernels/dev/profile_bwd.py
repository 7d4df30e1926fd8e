# Measured: one Gluon backward and one FA4 backward call, for Nsight Compute (H200).
"""One backward call of ours (the Hopper Gluon backward) and one of FlashAttention-4's, for
Nsight Compute, on a GPU.

    ncu --profile-from-start off --set full --clock-control none -o REPORT \\
        python -m attnmem.kernels.dev.profile_bwd H/H_KV/S/D/CAUSAL [...]

    e.g. 32/32/4096/128/0 (bf16, B = 1). Then:
    ncu -i REPORT.ncu-rep --page details                        # sections per kernel
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass   # stall samples per instruction

Both backward calls are made twice first (compiles, caches), then once each between
cudaProfilerStart and cudaProfilerStop, so only those kernels are profiled: ours (the stats
kernel, the Gluon kernel, the final cast) and FA4's (its preprocess, main and postprocess
kernels), when ``flash_attn.cute`` imports. ``--clock-control none`` leaves the clocks as the
timed runs have them. attnmem/kernels/flash/NOTES.md, "where the backward's time goes (ncu)", is
what the first such profile found.
"""

from __future__ import annotations

import argparse
import math


def parse(text: str) -> tuple[int, int, int, int, bool]:
    """H/H_KV/S/D/CAUSAL as whole numbers (CAUSAL 0 or 1), H a multiple of H_KV, D 64 or 128."""
    parts = text.split("/")
    try:
        h, hk, s, d, c = (int(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be H/H_KV/S/D/CAUSAL in whole numbers, e.g. 32/32/4096/128/0; got "
            f"{text!r}") from None
    if min(h, hk, s) < 1 or d not in (64, 128) or c not in (0, 1) or h % hk:
        raise argparse.ArgumentTypeError(
            f"shape {text!r}: H, H_KV, S >= 1 with H a multiple of H_KV, D 64 or 128 (the Hopper "
            f"backward's head dims), CAUSAL 0 or 1")
    return h, hk, s, d, bool(c)


def calls(h: int, hk: int, s: int, d: int, causal: bool):
    """(ours, fa4 or None): zero-argument callables running one backward each on fresh bf16
    inputs (B = 1); fa4 is None when flash_attn.cute does not import."""
    import torch

    from attnmem.kernels.flash import bwd_sm90
    from attnmem.kernels.flash.route import attention_forward

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, n, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for n in (h, hk, hk, h))
    scale = 1 / math.sqrt(d)
    o, lse2 = attention_forward(q, k, v, causal, scale)
    if not bwd_sm90.usable(q, k, v, do, o):
        raise SystemExit("the Hopper backward cannot run here (needs compute capability 9.x)")

    def ours():
        return bwd_sm90.attention_backward_sm90(do, q, k, v, o, lse2, causal, scale)

    return ours, fa4_backward(q, k, v, do, causal)


def fa4_backward(q, k, v, do, causal: bool):
    """A zero-argument call of FA4's backward alone (autograd on its forward's output, which
    this runs once) on these (B, H, s, d) inputs; None when flash_attn.cute does not import."""
    import torch

    try:
        from flash_attn.cute import flash_attn_func
    except ImportError:
        return None
    qf, kf, vf = (t.transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    dof = do.transpose(1, 2).contiguous()
    of = flash_attn_func(qf, kf, vf, causal=causal)
    of = of[0] if isinstance(of, tuple) else of
    return lambda: torch.autograd.grad(of, (qf, kf, vf), dof, retain_graph=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="+", type=parse, metavar="H/H_KV/S/D/CAUSAL")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this profiles GPU kernels")
    for shape in args.shapes:
        fns = [f for f in calls(*shape) if f is not None]
        for fn in fns:
            fn()
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for fn in fns:
            fn()
            torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled {shape}: ours{' and FA4' if len(fns) == 2 else ' (FA4 not installed)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
