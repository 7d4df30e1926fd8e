# Measured: forward tile configs' time per key, the source of tuned.py (H200).
"""Sweep the forward kernel's configs by hand, next to sdpa_cudnn, and print the best per key.

    python -m attnmem.kernels.dev.tune_fwd --out tune.csv            # d 64/128, causal or not, fp16
    python -m attnmem.kernels.dev.tune_fwd --dims 128 --seqs 4096 16384 --jobs 8

The autotuner keeps only its winner; this keeps every candidate's time, so a tuning step in
attnmem/kernels/flash/NOTES.md can say what each choice (tile shape, warps, pipeline depth, tensor
descriptors or pointer loads) was worth. Compilation runs first, in ``--jobs`` worker
processes that each launch their share of the variants once on a tiny input (filling
Triton's on-disk cache); the timing then runs in this process alone, one variant at a time,
so no two measurements share the GPU. Time: median of ``triton.testing.do_bench``.
The last lines printed are TUNED_H200 entries for the forward, ready to paste.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor

# (BLOCK_M, BLOCK_N, num_warps, num_stages)
CANDIDATES = [
    (128, 128, 8, 2), (128, 128, 8, 3),
    (128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 8, 5),
    (128, 64, 4, 3), (128, 64, 4, 4), (128, 32, 4, 4),
    (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (64, 128, 8, 3),
]


def _fits(c: tuple[int, int, int, int], d: int, elem: int = 2) -> bool:
    from attnmem.kernels.flash.common import SMEM_BYTES

    bm, bn, _, st = c
    return (st - 1) * 2 * bn * d * elem + bm * d * elem <= SMEM_BYTES


def _variants(dims, causals, configs, descs) -> list[tuple]:
    """(d, causal, config, desc) for every combination that fits in shared memory."""
    return [(d, causal, c, desc) for d in dims for causal in causals
            for c in configs if _fits(c, d) for desc in descs]


def _inputs(s: int, d: int, dtype, B: int = 1, H: int = 32):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(s + d)
    return [torch.randn(B, H, s, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3)]


def _cfg(c, desc):
    """The portable forward (never the Hopper one) with tiles ``c``, descriptors on or off."""
    from attnmem.kernels.flash.config import KernelConfig

    return KernelConfig(tiles=c, use_desc=desc, sm90=False)


def _name(d, causal, c, desc) -> str:
    return f"{d} {causal} {c} desc={desc}"


def _compile(work: list[tuple]) -> list[str]:
    """Worker: launch each variant once on a small input so that it is compiled and cached."""
    import torch

    from attnmem.kernels.flash.route import attention_forward

    errors = []
    for d, causal, c, desc in work:
        q, k, v = _inputs(256, d, torch.float16)
        try:
            attention_forward(q, k, v, causal, d ** -0.5, _cfg(c, desc))
            torch.cuda.synchronize()
        except Exception as exc:  # reported, and the variant is dropped from the timing
            errors.append(f"{_name(d, causal, c, desc)}: {type(exc).__name__}: {exc}"[:400])
    return errors


def compile_all(compile_fn, variants: list, jobs: int) -> set[str]:
    """Run ``compile_fn`` (a module-level function taking a list of variants and returning
    error lines "name: ...") over ``variants``, split among ``jobs`` spawned worker processes;
    print every error and return the names of the variants that failed."""
    chunks = [variants[i::jobs] for i in range(jobs)]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        errors = list(itertools.chain.from_iterable(pool.map(compile_fn, chunks)))
    for e in errors:
        print("compile error:", e, flush=True)
    return {e.split(":")[0] for e in errors}


def _time_shape(d: int, causal: bool, s: int, dtype, variants: list[tuple]) -> list[tuple]:
    """(impl, config, desc, median ms, TFLOP/s, max |out - cuDNN|) for sdpa_cudnn and each variant on one shape."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from attnmem.calc import attention_flops
    from attnmem.kernels.flash.route import attention_forward

    q, k, v = _inputs(s, d, dtype)
    flop = attention_flops(1, 32, s, d, causal)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    out = []
    ms = do_bench(cudnn, warmup=25, rep=100, return_mode="median")
    out.append(("sdpa_cudnn", None, None, ms, flop / ms / 1e9, 0.0))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
    for c, desc in variants:
        cfg = _cfg(c, desc)
        err = (attention_forward(q, k, v, causal, d ** -0.5, cfg)[0].float() - ref).abs().max()
        ms = do_bench(lambda cfg=cfg: attention_forward(q, k, v, causal, d ** -0.5, cfg),
                      warmup=25, rep=100, return_mode="median")
        out.append(("triton", c, desc, ms, flop / ms / 1e9, float(err)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--jobs", type=int, default=8, help="compile worker processes")
    ap.add_argument("--configs", nargs="+", default=None, metavar="BM,BN,WARPS,STAGES",
                    help="candidates (default: the built-in list)")
    ap.add_argument("--desc", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    ap.add_argument("--out", default="tune_fwd.csv")
    args = ap.parse_args(argv)

    import torch

    from attnmem.kernels.flash.common import seq_bucket

    if not torch.cuda.is_available():
        print("tune_fwd needs a CUDA GPU", file=sys.stderr)
        return 2
    configs = ([tuple(int(x) for x in c.split(",")) for c in args.configs] if args.configs
               else CANDIDATES)
    variants = _variants(args.dims, [bool(c) for c in args.causal], configs,
                         [bool(x) for x in args.desc])
    broken = compile_all(_compile, variants, args.jobs)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    rows = []
    with open(args.out, "w", newline="") as sink:
        w = csv.writer(sink)
        w.writerow(["impl", "dtype", "d", "causal", "s", "BLOCK_M", "BLOCK_N", "warps",
                    "stages", "desc", "ms", "tflops", "max_abs_err_vs_cudnn"])
        for d in args.dims:
            for causal in (bool(c) for c in args.causal):
                for s in args.seqs:
                    mine = [(c, desc) for dd, cc, c, desc in variants
                            if dd == d and cc == causal
                            and _name(dd, cc, c, desc) not in broken]
                    for name, c, desc, ms, tf, err in _time_shape(d, causal, s, dtype, mine):
                        rows.append((name, d, causal, s, c, desc, tf))
                        w.writerow([name, args.dtype, d, int(causal), s,
                                    *(c if c else ("", "", "", "")),
                                    "" if desc is None else int(desc), f"{ms:.5f}", f"{tf:.1f}",
                                    f"{err:.3g}"])
                        sink.flush()
                    torch.cuda.empty_cache()

    print("\n| d | causal | s | cudnn | best ptr | best desc | best variant | best/cudnn |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    entries = []
    for d in args.dims:
        for causal in (bool(c) for c in args.causal):
            for s in args.seqs:
                mine = [r for r in rows if r[0].startswith("triton") and r[1:4] == (d, causal, s)]
                ref = [r[6] for r in rows if r[:4] == ("sdpa_cudnn", d, causal, s)]
                if not mine or not ref:
                    continue
                best = max(mine, key=lambda r: r[6])
                bp = max((r[6] for r in mine if not r[5]), default=math.nan)
                bd = max((r[6] for r in mine if r[5]), default=math.nan)
                print(f"| {d} | {int(causal)} | {s} | {ref[0]:.0f} | {bp:.0f} | {bd:.0f} | "
                      f"{best[0]} {best[4]} desc={int(best[5])} | {best[6] / ref[0]:.2f} |")
                entries.append(f'    ("fwd", 2, {d}, {causal}, {seq_bucket(s)}): {best[4]},'
                               f'  # desc={int(best[5])} {best[0]}')
    print("\n".join(entries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
