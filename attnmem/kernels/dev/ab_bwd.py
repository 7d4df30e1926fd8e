# Measured: Hopper Gluon backward time, default vs tile/stage/dQ-split variants (H200).
"""A/B timing of the Hopper (Gluon) backward alone: its default against settings of it, or
against the kernel file as it was at another commit, in one process, on a GPU.

    python -m attnmem.kernels.dev.ab_bwd [--variant NAME:KEY=VAL[,KEY=VAL...]]... [--against COMMIT]
        [--shapes H/H_KV/S/D/CAUSAL ...] [--rounds 3] [--fa4] [--skip-check]

    e.g.  --variant s3:stages=3 --variant qs:dq_split_d=0
          --against HEAD~1                         (the committed kernel against the working tree)

KEY is one of `SETTINGS`: ``block_m`` and ``stages`` replace the kernel module's TILES entry for
the call's head dim, ``dq_split_d`` its DQ_SPLIT_D entry, for the variant's calls only
(`schedule`); VAL a whole number (0/1 for the switch). ``--against`` loads
attnmem/kernels/flash/bwd_sm90.py from that commit (``git show``) as a module of its own, with its own
compiled kernels, and times it as candidate "base"; without it the default of the working tree
is the base.

1. Correctness of every candidate on attnmem.kernels.dev.grad_check's CHECK_SHAPES (ragged,
   causal and not, GQA, fp16 and bf16, d = 64 and 128): max |grad - fp32 reference| of dQ, dK,
   dV; PASS where each is at most twice plain PyTorch's low-precision error plus a floor (the
   rule of tests/kernels/test_flash_attention.py). Timing runs only if every candidate passes.
2. Time of one backward call per candidate (stats kernel, main kernel, final cast: what
   `attention_backward_sm90` launches), triton.testing.do_bench's median with L2 flushed
   between calls, in ``--rounds`` rounds that interleave the candidates; the best round is
   kept (the method of attnmem/kernels/flash/NOTES.md, "K and V descriptors rebuilt every step").
   ``--fa4`` adds FlashAttention-4's backward alone (autograd on its forward's output), where
   flash_attn.cute imports. bf16, B = 1.
   TFLOP/s count 2.5 x 4 B H s^2 d (halved when causal): the backward's share of the 3.5 of
   forward+backward. The last lines are each candidate's time against the base per shape and
   their geometric mean.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import math
import os
import re
import subprocess
import sys
import tempfile

# What a variant may set (entries of bwd_sm90's TILES and DQ_SPLIT_D tables, `schedule`) and
# the values each takes.
SETTINGS = {"block_m": (64, 128), "stages": (2, 3, 4), "dq_split_d": (0, 1)}
# bf16, B = 1: issue 18's timing shapes, the ones attnmem/kernels/flash/NOTES.md, "where the
# backward's time goes (ncu)", measured.
DEFAULT_SHAPES = ["32/32/4096/128/0", "32/32/4096/128/1", "32/32/16384/128/0",
                  "32/32/16384/128/1", "32/8/8192/128/1", "32/32/8192/64/1", "32/32/8192/64/0",
                  "32/8/8192/64/0"]
KERNEL_FILE = "attnmem/kernels/flash/bwd_sm90.py"
# The modules of our package KERNEL_FILE imports its device code from, by file: `load_at`
# loads each as it was at the same commit (where the file exists there) and has KERNEL_FILE
# import that copy, so a commit's kernel runs with its own partitions.
KERNEL_PARTS = {"attnmem.kernels.flash.bwd_sm90_partitions":
                "attnmem/kernels/flash/bwd_sm90_partitions.py"}


def parse_variant(text: str, settings: dict | None = None) -> tuple[str, dict[str, int]]:
    """NAME:KEY=VAL[,KEY=VAL...] -> (NAME, {KEY: VAL}); refuses keys not in ``settings``
    (default `SETTINGS`) and values outside theirs."""
    settings = SETTINGS if settings is None else settings
    name, sep, body = text.partition(":")
    if not sep or not name or not body:
        raise argparse.ArgumentTypeError(
            f"variant must be NAME:KEY=VAL[,KEY=VAL...], e.g. s3:stages=3; got {text!r}")
    if name in ("base", "tree", "fa4"):
        raise argparse.ArgumentTypeError(f"variant name {name!r} is taken (base, tree, fa4)")
    opts: dict[str, int] = {}
    for item in body.split(","):
        key, eq, val = item.partition("=")
        if key not in settings:
            raise argparse.ArgumentTypeError(
                f"variant {name!r}: unknown setting {key!r}; accepted: {', '.join(settings)}")
        try:
            num = int(val) if eq else None
        except ValueError:
            num = None
        if num not in settings[key]:
            raise argparse.ArgumentTypeError(
                f"variant {name!r}: {key}={val!r}; accepted values: "
                f"{', '.join(map(str, settings[key]))}")
        opts[key] = num
    return name, opts


def _show(root: str, commit: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", root, "show", f"{commit}:{path}"], capture_output=True,
                          text=True)


def _module_from(folder: str, name: str, source: str):
    """``source`` written to ``folder``/``name``.py and imported as module ``name`` (Gluon
    reads its kernels' source from the file)."""
    path = os.path.join(folder, f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_at(commit: str, root: str | None = None):
    """attnmem/kernels/flash/bwd_sm90.py as it was at ``commit``, imported as a module of its own
    (written to a temporary file), with the `KERNEL_PARTS` of that commit: while it imports,
    each part's name in sys.modules is that commit's copy (put back afterwards), so its kernels
    compile that commit's device code, not the working tree's."""
    root = root or os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    got = _show(root, commit, KERNEL_FILE)
    if got.returncode:
        raise SystemExit(f"--against {commit!r}: git cannot show {KERNEL_FILE} there "
                         f"({got.stderr.strip()[:200]})")
    folder = tempfile.mkdtemp(prefix="ab_bwd_")
    tag = re.sub(r"[^A-Za-z0-9]", "_", commit)
    saved = {}
    try:
        for name, path in KERNEL_PARTS.items():
            part = _show(root, commit, path)
            if part.returncode:  # not there at that commit: the kernel file holds it all
                continue
            saved[name] = sys.modules.get(name)
            sys.modules[name] = _module_from(
                folder, f"{name.rsplit('.', 1)[1]}_at_{tag}", part.stdout)
        return _module_from(folder, f"bwd_sm90_at_{tag}", got.stdout)
    finally:
        for name, real in saved.items():
            if real is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = real


@contextlib.contextmanager
def schedule(module, d: int, block_m: int | None = None, stages: int | None = None,
             dq_split_d: int | None = None):
    """Inside the block, ``module`` (attnmem.kernels.flash.bwd_sm90) runs head dim ``d`` with these
    settings: its TILES[d] = (BLOCK_M, STAGES) and DQ_SPLIT_D[d] entries are replaced, and put
    back on the way out. The kernel's launch key holds them, so each variant compiles its own
    kernel. A choice whose dQ^T partial per warpgroup is not the 64 x 64 of the kernel's flat
    dQ staging is refused (ValueError) before anything runs."""
    tiles, split = module.TILES[d], module.DQ_SPLIT_D[d]
    bm = block_m or tiles[0]
    st = stages or tiles[1]
    sd = split if dq_split_d is None else bool(dq_split_d)
    part = (d // 2, bm) if sd else (d, bm // 2)
    if part != (64, 64):
        raise ValueError(f"the Hopper backward's dQ staging needs a 64 x 64 dQ^T partial per "
                         f"warpgroup (d = 128 split by rows of d with block_m 64, or d = 64 split "
                         f"by queries with block_m 128); got d = {d}, block_m = {bm}, "
                         f"dq_split_d = {sd}")
    module.TILES[d], module.DQ_SPLIT_D[d] = (bm, st), sd
    try:
        yield
    finally:
        module.TILES[d], module.DQ_SPLIT_D[d] = tiles, split


def variant(module, opts: dict):
    """f(do, q, k, v, o, lse2, causal, scale): ``module``'s backward under `schedule`."""
    def run(do, q, *rest):
        with schedule(module, q.shape[3], **opts):
            return module.attention_backward_sm90(do, q, *rest)
    return run


def candidates(variants: list[tuple[str, dict]], base_module=None) -> dict:
    """name -> f(do, q, k, v, o, lse2, causal, scale) -> (dq, dk, dv): "base" (the default of
    the working tree, or ``base_module``'s, and then "tree", the working tree's default), then
    each variant (the working tree's kernel with its settings)."""
    from attnmem.kernels.flash import bwd_sm90

    base = base_module or bwd_sm90
    out = {"base": base.attention_backward_sm90}
    if base_module is not None:
        out["tree"] = bwd_sm90.attention_backward_sm90
    for name, opts in variants:
        if name in out:
            raise SystemExit(f"variant name {name!r} given twice")
        out[name] = variant(bwd_sm90, opts)
    return out


def check(cands: dict) -> bool:
    """Step 1 of the module docstring; prints one line per shape."""
    import torch

    from attnmem.kernels.dev.grad_check import CHECK_SHAPES, FLOOR, reference_grads
    from attnmem.kernels.flash.route import attention_forward

    ok = True
    print("== correctness: max |grad - fp32 reference| per candidate (dq/dk/dv), eager low "
          "precision last", flush=True)
    for B, H, H_kv, s, d, causal, dtype in CHECK_SHAPES:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(B, n, s, d, device="cuda", dtype=dtype)
                       for n in (H, H_kv, H_kv, H))
        scale = 1.0 / math.sqrt(d)
        o, lse2 = attention_forward(q, k, v, causal, scale)
        ref = reference_grads(q.float(), k.float(), v.float(), do.float(), causal, scale)
        low = reference_grads(q, k, v, do, causal, scale)
        limit = [2 * (g.float() - r).abs().max().item() + FLOOR[dtype] for g, r in zip(low, ref, strict=True)]
        parts = []
        for name, fn in cands.items():
            try:
                got = fn(do, q, k, v, o, lse2, causal, scale)
                errs = [(g.float() - r).abs().max().item() for g, r in zip(got, ref, strict=True)]
            except Exception as e:  # a variant that does not build or run fails the check
                errs = [float("nan")] * 3
                print(f"  {name}: {type(e).__name__}: {str(e)[:300]}")
            good = all(math.isfinite(e) and e <= lim for e, lim in zip(errs, limit, strict=True))
            ok &= good
            parts.append(f"{name} " + "/".join(f"{e:.1e}" for e in errs)
                         + ("" if good else " FAIL"))
        eager = "/".join(f"{(g.float() - r).abs().max().item():.1e}" for g, r in zip(low, ref, strict=True))
        print(f"B={B} H={H}/{H_kv} s={s} d={d} {'causal' if causal else 'full'} "
              f"{str(dtype)[6:]}: " + "  ".join(parts) + f"  eager {eager}", flush=True)
    print("correctness:", "PASS" if ok else "FAIL", flush=True)
    return ok


def timing(cands: dict, shapes: list, rounds: int, fa4: bool) -> dict:
    """Step 2: {shape: {name: best-of-rounds ms}}, printing a line per shape."""
    import torch

    from attnmem.kernels.dev.profile_bwd import fa4_backward
    from attnmem.kernels.flash.route import attention_forward

    results = {}
    for h, hk, s, d, causal in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(1, n, s, d, device="cuda", dtype=torch.bfloat16,
                                   generator=gen) for n in (h, hk, hk, h))
        scale = 1.0 / math.sqrt(d)
        o, lse2 = attention_forward(q, k, v, causal, scale)
        args = (do, q, k, v, o, lse2, causal, scale)
        calls = {name: functools.partial(fn, *args) for name, fn in cands.items()}
        if fa4:
            f4 = fa4_backward(q, k, v, do, causal)
            if f4 is None:
                print("(FA4 not importable: flash_attn.cute)", flush=True)
            else:
                calls["fa4"] = f4
        best = best_of_rounds(calls, rounds)
        flop = 2.5 * 4 * h * s * s * d / (2 if causal else 1)
        key = f"{h}/{hk}/{s}/{d}/{int(causal)}"
        results[key] = best
        print(f"{key}: " + "  ".join(f"{n} {ms:.3f} ms ({flop / ms / 1e9:.0f} TF)"
                                     for n, ms in best.items()), flush=True)
        del q, k, v, do, o, lse2, args, calls
        torch.cuda.empty_cache()
    return results


def summary(results: dict) -> str:
    """Per candidate: the base's time over its time at each shape (above 1: faster than the
    base) and the geometric mean of those ratios; the same against FA4 where it was timed."""
    names = list(next(iter(results.values())))
    lines = []
    for ref in ("base", "fa4"):
        others = [n for n in names if n not in (ref, "fa4")]
        if ref not in names or not others:
            continue
        lines += [f"speed against {ref} ({ref} ms / candidate ms)", "shape " + " ".join(others)]
        logs: dict[str, list[float]] = {n: [] for n in others}
        for key, best in results.items():
            row = []
            for n in others:
                r = best[ref] / best[n]
                row.append(f"{r:.3f}")
                logs[n].append(math.log(r))
            lines.append(f"{key} " + " ".join(row))
        lines.append("geomean " + " ".join(f"{math.exp(sum(v) / len(v)):.3f}"
                                           for v in logs.values()))
    return "\n".join(lines)


def require_hopper(what: str) -> None:
    """Refuse (SystemExit, saying why) unless a GPU of compute capability 9.x is here."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this times GPU kernels (compute capability 9.x)")
    if torch.cuda.get_device_capability()[0] != 9:
        raise SystemExit(f"the Hopper {what} needs compute capability 9.x; this GPU is "
                         f"{torch.cuda.get_device_name()}")


def best_of_rounds(calls: dict, rounds: int) -> dict[str, float]:
    """name -> the least of ``rounds`` do_bench medians (L2 flushed), the calls interleaved
    round by round so that a drift of the clocks reaches every candidate alike."""
    from triton.testing import do_bench

    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, call in calls.items():
            ms = do_bench(call, warmup=10, rep=50, return_mode="median")
            best[name] = min(best.get(name, math.inf), ms)
    return best


def add_timing_args(ap: argparse.ArgumentParser, what: str) -> None:
    """The options both A/B tools take after their shapes: rounds, FA4 beside, no check."""
    ap.add_argument("--rounds", type=int, choices=range(1, 11), default=3, metavar="1..10")
    ap.add_argument("--fa4", action="store_true", help=f"time FlashAttention-4's {what} too")
    ap.add_argument("--skip-check", action="store_true")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from attnmem.kernels.dev.profile_bwd import parse as parse_shape

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", type=parse_variant, action="append", default=[],
                    metavar="NAME:KEY=VAL[,KEY=VAL]")
    ap.add_argument("--against", metavar="COMMIT",
                    help="time attnmem/kernels/flash/bwd_sm90.py as it was at COMMIT as the base")
    ap.add_argument("--shapes", type=parse_shape, nargs="+", metavar="H/H_KV/S/D/CAUSAL",
                    default=[parse_shape(x) for x in DEFAULT_SHAPES])
    add_timing_args(ap, "backward")
    args = ap.parse_args(argv)
    if not args.variant and not args.against:
        ap.error("nothing to compare: give --variant and/or --against")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = load_at(args.against) if args.against else None  # a bad commit is refused first
    require_hopper("backward")
    cands = candidates(args.variant, base)
    if not args.skip_check and not check(cands):
        return 1
    print(summary(timing(cands, args.shapes, args.rounds, args.fa4)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
