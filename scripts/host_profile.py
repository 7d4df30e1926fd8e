"""Where the host time of one short forward call goes (cProfile, tiny shape, GPU mostly idle).

    python scripts/host_profile.py [--calls 3000]
"""
import argparse
import cProfile
import pstats
import time

import torch

from kernels.flash_attn import flash_attention


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    n = ap.parse_args().calls
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    for _ in range(50):
        flash_attention(q, k, v)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        flash_attention(q, k, v)
    torch.cuda.synchronize()
    print(f"flash_attention fwd, no grad: {(time.perf_counter() - t) / n * 1e6:.1f} us/call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        flash_attention(q, k, v)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
