# Measured: backward tile configs' time per key, the source of tuned.py (H200).
"""Sweep the backward kernels' configs by hand, next to sdpa_flash, and print the best per key.

    python -m attnmem.kernels.dev.tune_bwd --out tune_bwd.csv          # d 64/128, causal or not, fp16
    python -m attnmem.kernels.dev.tune_bwd --dims 64 --seqs 2048 --jobs 8
    python -m attnmem.kernels.dev.tune_bwd --atomic ...    # also the atomic-dQ backward's dK/dV tiles
    python -m attnmem.kernels.dev.tune_bwd --atomic --kv-heads 8 --batch 2 ...   # GQA, other grids

The backward is two launches (dQ, which also writes delta; then dK/dV). Each candidate of one
kernel is timed as the whole backward with the other kernel held at a fixed config, so the
differences between candidates belong to the kernel being varied, and the best pair is the
best of each (the two launches run one after the other and share nothing but delta). Every
candidate's gradients are checked against the reference pair's. Compilation runs first in
``--jobs`` worker processes (tiny inputs, filling Triton's on-disk cache); the timing then runs
in this process alone. Time: median of ``triton.testing.do_bench``, L2 cleared before each
call, as the autotuner does. The last lines printed are TUNED_H200 entries, ready to paste.

``--atomic`` adds the atomic-dQ backward (``KernelConfig(atomic_dq=True)``: delta kernel,
dK/dV kernel that also adds dQ, cast) with each dK/dV candidate, timed whole, and prints its
best next to the best pair of the default backward. On Hopper its dQ tiles go through the copy
engine's bulk reduce-add (``attnmem.kernels.flash.route.dq_tma_usable``); ``--atomic-elementwise`` times
the element-wise atomic adds instead.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys

from attnmem.kernels.dev.tune_fwd import compile_all

# (BLOCK_M, BLOCK_N, num_warps, num_stages). dK/dV programs own BLOCK_N keys and stream
# BLOCK_M query rows; dQ programs own BLOCK_M rows and stream BLOCK_N keys.
DKDV = [
    (64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 2), (32, 128, 8, 3), (32, 128, 4, 3),
    (64, 64, 4, 2), (64, 64, 4, 3), (32, 64, 4, 3), (32, 64, 4, 4), (64, 128, 4, 2),
    (128, 128, 8, 2), (16, 64, 4, 4), (32, 64, 4, 2),
]
# 16 warps (four warpgroups, half the registers per thread) lose at every key
# (attnmem/kernels/flash/NOTES.md, "the atomic-dQ backward, timed"): not candidates.
DQ = [
    (128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 4, 2), (128, 32, 4, 3), (64, 64, 4, 3),
    (64, 64, 4, 4), (128, 128, 8, 2), (64, 128, 4, 2), (64, 32, 4, 3), (128, 64, 4, 3),
]
HELD = {"dq": (128, 64, 8, 3), "dkdv": (64, 128, 8, 3)}  # the other kernel, while one varies


def _fits(kernel: str, c: tuple, d: int, elem: int = 2) -> bool:
    from attnmem.kernels.flash.common import SMEM_BYTES

    bm, bn, _, st = c
    streamed, resident = (bm, bn) if kernel == "dkdv" else (bn, bm)
    return (st - 1) * 2 * streamed * d * elem + 2 * resident * d * elem <= SMEM_BYTES


def _cfg(kern: str, c: tuple):
    """The KernelConfig that times candidate ``c`` of ``kern``: the two-kernel backward with
    ``c`` for that launch and HELD for the other, or the atomic-dQ backward with dK/dV
    tiles ``c`` (bulk reduce-adds, or element-wise ones for "dkdv_atomic_ew")."""
    from attnmem.kernels.flash.config import KernelConfig

    if kern.startswith("dkdv_atomic"):
        return KernelConfig(atomic_dq=True, dq_tma=None if kern == "dkdv_atomic" else False,
                            dkdv_tiles=c)
    return KernelConfig(atomic_dq=False, dq_tiles=c if kern == "dq" else HELD["dq"],
                        dkdv_tiles=c if kern == "dkdv" else HELD["dkdv"])


def _variants(dims, causals, atomic: bool = False, elementwise: bool = False) -> list[tuple]:
    """(d, causal, kernel, config) for every candidate that fits in shared memory; kernel
    "dkdv_atomic" is the whole atomic-dQ backward with that dK/dV config ("dkdv_atomic_ew"
    with element-wise atomic adds of dQ)."""
    out = [(d, causal, kern, c) for d in dims for causal in causals
           for kern, space in (("dq", DQ), ("dkdv", DKDV)) for c in space
           if _fits(kern, c, d) and _fits("dq" if kern == "dkdv" else "dkdv",
                                          HELD["dq" if kern == "dkdv" else "dkdv"], d)]
    if atomic:
        kind = "dkdv_atomic_ew" if elementwise else "dkdv_atomic"
        out += [(d, causal, kind, c) for d in dims for causal in causals
                for c in DKDV if _fits("dkdv", c, d)]
    return out


def _inputs(s: int, d: int, dtype, causal: bool, B: int = 1, H: int = 32,
            H_kv: int | None = None):
    import torch

    from attnmem.kernels.flash.route import attention_forward

    gen = torch.Generator(device="cuda").manual_seed(s + d)
    heads = (H, H_kv or H, H_kv or H, H)
    q, k, v, do = (torch.randn(B, n, s, d, device="cuda", dtype=dtype, generator=gen)
                   for n in heads)
    o, lse2 = attention_forward(q, k, v, causal, d ** -0.5)
    return q, k, v, do, o, lse2


def _run(inp, causal, kern, c):
    from attnmem.kernels.flash.route import attention_backward

    q, k, v, do, o, lse2 = inp
    return attention_backward(do, q, k, v, o, lse2, causal, q.shape[-1] ** -0.5, _cfg(kern, c))


def _compile(work: list[tuple]) -> list[str]:
    """Worker: run each variant once on a small input so that it is compiled and cached."""
    import torch

    errors = []
    for d, causal, kern, c in work:
        try:
            _run(_inputs(256, d, torch.float16, causal), causal, kern, c)
            torch.cuda.synchronize()
        except Exception as exc:  # reported, and the variant is dropped from the timing
            errors.append(f"{d} {causal} {kern} {c}: {type(exc).__name__}: {exc}"[:400])
    return errors


def _time_shape(d, causal, s, dtype, variants, B: int = 1, H: int = 32,
                H_kv: int | None = None) -> list[tuple]:
    """(name, config, ms, max |grad - reference pair's grad|) for sdpa_flash's fwd+bwd minus
    its fwd (its backward alone) and each variant on one shape."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    inp = _inputs(s, d, dtype, causal, B, H, H_kv)
    q, k, v, do = (t.detach().requires_grad_(i < 3) for i, t in enumerate(inp[:4]))
    gqa = (H_kv or H) != H

    def flash_fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    both = do_bench(lambda: flash_fwd().backward(do), warmup=25, rep=100,
                    grad_to_none=[q, k, v], return_mode="median")
    with torch.no_grad():
        fwd = do_bench(flash_fwd, warmup=25, rep=100, return_mode="median")
    out = [("sdpa_flash_bwd", None, both - fwd, 0.0)]
    ref = _run(inp, causal, "dq", HELD["dq"])
    for kern, c in variants:
        got = _run(inp, causal, kern, c)
        err = max(float((g.float() - r.float()).abs().max()) for g, r in zip(got, ref, strict=True))
        ms = do_bench(lambda kern=kern, c=c: _run(inp, causal, kern, c), warmup=25, rep=100,
                      return_mode="median")
        out.append((kern, c, ms, err))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="key/value heads (GQA; must divide --heads); default: --heads")
    ap.add_argument("--jobs", type=int, default=8, help="compile worker processes")
    ap.add_argument("--out", default="tune_bwd.csv")
    ap.add_argument("--atomic", action="store_true",
                    help="also time the atomic-dQ backward with each dK/dV candidate")
    ap.add_argument("--atomic-elementwise", action="store_true",
                    help="with --atomic: element-wise atomic adds, not bulk reduce-adds")
    args = ap.parse_args(argv)
    kv = args.kv_heads if args.kv_heads is not None else args.heads
    if args.batch < 1 or args.heads < 1 or kv < 1 or args.heads % kv:
        ap.error(f"--batch and --heads must be >= 1 and --kv-heads must divide --heads; got "
                 f"--batch {args.batch}, --heads {args.heads}, --kv-heads {kv}")

    import torch

    from attnmem.kernels.flash.common import seq_bucket
    from attnmem.kernels.flash.tuned import TUNED_H200

    if not torch.cuda.is_available():
        print("tune_bwd needs a CUDA GPU", file=sys.stderr)
        return 2
    causals = [bool(c) for c in args.causal]
    variants = _variants(args.dims, causals, args.atomic, args.atomic_elementwise)
    broken = compile_all(_compile, variants, args.jobs)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    entries, summary = [], []
    with open(args.out, "w", newline="") as sink:
        w = csv.writer(sink)
        w.writerow(["kernel", "dtype", "d", "causal", "s", "BLOCK_M", "BLOCK_N", "warps",
                    "stages", "ms_whole_backward", "max_abs_diff", "batch", "heads",
                    "kv_heads"])
        for d, causal, s in itertools.product(args.dims, causals, args.seqs):
            mine = [(kern, c) for dd, cc, kern, c in variants
                    if (dd, cc) == (d, causal) and f"{dd} {cc} {kern} {c}" not in broken]
            rows = _time_shape(d, causal, s, dtype, mine, args.batch, args.heads,
                               args.kv_heads)
            for kern, c, ms, err in rows:
                w.writerow([kern, args.dtype, d, int(causal), s, *(c or ("",) * 4),
                            f"{ms:.5f}", f"{err:.3g}", args.batch, args.heads, kv])
            sink.flush()
            torch.cuda.empty_cache()
            flash = rows[0][2]
            bucket = seq_bucket(s)
            best, now = {}, {}
            for kern in ("dq", "dkdv"):
                timed = [(ms, c) for k_, c, ms, err in rows[1:] if k_ == kern and err < 0.05]
                if not timed:
                    continue
                best[kern] = min(timed)
                stored = TUNED_H200.get((kern, 2, d, causal, bucket))
                now[kern] = next((ms for ms, c in timed if c == stored), float("nan"))
                entries.append(f'    ("{kern}", 2, {d}, {causal}, {bucket}): {best[kern][1]},')
            atomic = [(ms, c) for k_, c, ms, err in rows[1:]
                      if k_.startswith("dkdv_atomic") and err < 0.05]
            baseline = [ms for kern, c, ms, _ in rows[1:] if kern in HELD and c == HELD[kern]]
            if len(best) == 2 and baseline:
                # the whole backward with each kernel's best: both gains over the held pair
                base = sum(baseline) / len(baseline)
                pair = best["dq"][0] + best["dkdv"][0] - base
                stored = now["dq"] + now["dkdv"] - base
                best_atomic = min(atomic) if atomic else (float("nan"), None)
                summary.append(f"| {d} | {int(causal)} | {s} | {flash * 1e3:.0f} | "
                               f"{stored * 1e3:.0f} | {pair * 1e3:.0f} | "
                               f"{best['dq'][1]} | {best['dkdv'][1]} | "
                               f"{best_atomic[0] * 1e3:.0f} | {best_atomic[1]} |")
    print(f"\nbackward alone, us, B = {args.batch}, H = {args.heads}, H_kv = {kv} (best pair "
          "estimated from the per-kernel timings; atomic: the whole atomic-dQ backward with its "
          "best dK/dV tiles, nan without --atomic)")
    print("| d | causal | s | sdpa_flash bwd | stored configs | best pair | dq | dkdv | "
          "atomic | atomic dkdv |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(summary))
    print("\n".join(entries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
