# Measured: Hopper Gluon forward tile/stage variants' time beside cuDNN (H200).
"""Time the Gluon Hopper forward's tile/stage variants next to cuDNN, same process, same inputs.

    python -m attnmem.kernels.dev.sweep_sm90 [--seqs 4096 16384] [--dims 64 128]

Prints TFLOP/s (4*B*H*s^2*d, half when causal; B=1, H=32) per variant and the relative error of
each variant's output against cuDNN's (a variant off by more than 2e-2 is reported, not timed).
"""

from __future__ import annotations

import argparse
import functools
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from attnmem.kernels.flash import fwd_sm90 as k90
from attnmem.kernels.flash.common import LOG2E


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--dims", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--variants", nargs="+", default=["128,2", "128,3", "64,2"],
                    help="BLOCK_N,STAGES[,CONSUMERS] (consumer warpgroups, default 2)")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    args = ap.parse_args()
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    print("d causal s variant TFLOP/s rel_err | cudnn TFLOP/s")
    for d in args.dims:
        for causal in (False, True):
            for s in args.seqs:
                q, k, v = (torch.randn(1, 32, s, d, device="cuda", dtype=dt) for _ in range(3))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    ms = do_bench(functools.partial(F.scaled_dot_product_attention, q, k, v,
                                                    is_causal=causal), return_mode="median")
                fl = 4 * 32 * s * s * d * (0.5 if causal else 1.0)
                cud = fl / ms / 1e9
                for var in args.variants:
                    bn, st, nc = ([int(x) for x in var.split(",")] + [2])[:3]
                    if st * 2 * bn * d * 2 + nc * 64 * d * 2 > 227 * 1024:
                        continue
                    fn = functools.partial(k90.attention_forward_sm90, q, k, v, causal,
                                           LOG2E / math.sqrt(d), st, bn, nc)
                    try:
                        out = fn()[0]
                        rel = float((out.float() - ref.float()).norm() / ref.float().norm())
                        t = do_bench(fn, return_mode="median") if rel < 2e-2 else math.nan
                    except Exception as e:  # report the variant, go on
                        print(d, int(causal), s, var, "FAILED", type(e).__name__, str(e)[:200])
                        continue
                    print(d, int(causal), s, var, f"{fl / t / 1e9 if t == t else float('nan'):.0f}",
                          f"{rel:.1e}", "|", f"{cud:.0f}", flush=True)


if __name__ == "__main__":
    main()
