# Measured: atomic-dQ vs two-kernel backward time by grid size (H200).
"""Time the two backwards (atomic-dQ and two-kernel) over grids of different sizes, to set
`attnmem.calc.dispatch`'s atomic-dQ program threshold from measurements rather than two samples.

    python -m attnmem.kernels.dev.atomic_threshold --out atomic_threshold.csv
    python -m attnmem.kernels.dev.atomic_threshold --dims 128 --seqs 4096 --kv-heads 4 8 --batches 1 2

For every (d, s, causal, B, H, H_kv) both backwards run on the same inputs with their default
tiles (``KernelConfig(atomic_dq=True)`` and False); each is timed as the median of
`triton.testing.do_bench` (L2 cleared before each call), both in this one process, one after
the other per shape. The dK/dV grid of the atomic backward is B * H_kv * ceil(s / BLOCK_N)
programs (`atomic_tiles`), the figure the default rule compares with its threshold. Prints one
line per shape and the ratio two-kernel / atomic (> 1: atomic faster); with GQA also both
backwards with the group split over `kv_split` programs per key block (``KernelConfig.kv_split``;
the columns without it use a split of 1).
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--seqs", nargs="+", type=int, default=[4096, 8192])
    p.add_argument("--causal", nargs="+", type=int, default=[0, 1], choices=[0, 1])
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", nargs="+", type=int, default=[2, 4, 8, 16, 32])
    p.add_argument("--batches", nargs="+", type=int, default=[1])
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--out", default="atomic_threshold.csv")
    a = p.parse_args(argv)
    for hk in a.kv_heads:
        if hk < 1 or a.heads % hk:
            p.error(f"--kv-heads {hk}: must be a positive divisor of --heads {a.heads}")

    import torch
    from triton.testing import do_bench

    from attnmem.kernels.flash.bwd import atomic_tiles
    from attnmem.kernels.flash.config import KernelConfig
    from attnmem.kernels.flash.route import attention_backward, attention_forward, kv_split

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = torch.float16 if a.dtype == "fp16" else torch.bfloat16
    rows = []
    print(f"{'d':>4} {'s':>6} {'c':>2} {'B':>3} {'H':>3} {'Hkv':>4} {'progs':>6} "
          f"{'atomic us':>10} {'2-kernel us':>12} {'2k/atomic':>10} {'split':>6} "
          f"{'at split':>10} {'2k split':>10}", flush=True)
    for d in a.dims:
        for s in a.seqs:
            for causal in a.causal:
                for B in a.batches:
                    for hk in a.kv_heads:
                        g = torch.Generator(device="cuda").manual_seed(0)
                        q = torch.randn(B, a.heads, s, d, device="cuda", dtype=dtype, generator=g)
                        k = torch.randn(B, hk, s, d, device="cuda", dtype=dtype, generator=g)
                        v = torch.randn_like(k)
                        do = torch.randn_like(q)
                        scale = 1 / math.sqrt(d)
                        o, lse = attention_forward(q, k, v, bool(causal), scale, None)
                        split = kv_split(B, a.heads, hk, s, s, d, 2)
                        t = {}
                        for atomic in (True, False):
                            for sp in sorted({1, split}):
                                call = functools.partial(
                                    attention_backward, do, q, k, v, o, lse, bool(causal), scale,
                                    KernelConfig(atomic_dq=atomic, kv_split=sp))
                                call()
                                t[atomic, sp] = do_bench(call, warmup=25, rep=100) * 1e3
                        progs = B * hk * math.ceil(s / atomic_tiles(d)["BLOCK_N"])
                        ratio = t[False, 1] / t[True, 1]
                        print(f"{d:>4} {s:>6} {causal:>2} {B:>3} {a.heads:>3} {hk:>4} {progs:>6} "
                              f"{t[True, 1]:>10.1f} {t[False, 1]:>12.1f} {ratio:>10.3f} {split:>6} "
                              f"{t[True, split]:>10.1f} {t[False, split]:>10.1f}", flush=True)
                        rows.append(dict(dtype=a.dtype, head_dim=d, seq_len=s, causal=causal,
                                         batch=B, heads=a.heads, kv_heads=hk, programs=progs,
                                         atomic_us=round(t[True, 1], 2),
                                         two_kernel_us=round(t[False, 1], 2),
                                         two_kernel_over_atomic=round(ratio, 4),
                                         split=split,
                                         atomic_split_us=round(t[True, split], 2),
                                         two_kernel_split_us=round(t[False, split], 2)))
                        del q, k, v, do, o, lse
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
