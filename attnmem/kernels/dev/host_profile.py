# Measured: cProfile of the host time of short calls (H200).
"""Where the host time of one short forward call goes (cProfile, tiny shape, GPU mostly idle).

    python -m attnmem.kernels.dev.host_profile [--calls 3000] [--backward] [--d 64]
"""
import argparse
import cProfile
import pstats

import torch

from attnmem.kernels.flash.api import flash_attention
from attnmem.measure.bench.speed import host_us_per_call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--backward", action="store_true", help="forward + backward instead")
    ap.add_argument("--d", type=int, default=64, help="head dim (128: the Gluon forward)")
    args = ap.parse_args()
    n = args.calls
    q, k, v, do = (torch.randn(1, 2, 128, args.d, device="cuda", dtype=torch.float16)
                   for _ in range(4))
    if args.backward:
        for t in (q, k, v):
            t.requires_grad_()

    def call():
        if args.backward:
            flash_attention(q, k, v).backward(do)
        else:
            flash_attention(q, k, v)

    what = "fwd+bwd" if args.backward else "fwd, no grad"
    print(f"flash_attention {what}: {host_us_per_call(call, n, warmup=50):.1f} us/call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        call()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
