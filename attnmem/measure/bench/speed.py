"""Speed of the bundled Triton kernel next to every SDPA backend and FlashAttention-4, in one run.

    python -m attnmem.measure.bench                 # the full grid (a few minutes on an H200)
    python -m attnmem.measure.bench --quick         # fp16, d=128, s in {1024, 4096, 16384}
    python -m attnmem.measure.bench --dtypes bf16 --dims 64 --seqs 2048 8192 --modes fwd
    python -m attnmem.measure.bench --graphs --modes fwd_bwd --kv-heads 8   # GQA 4:1, GPU time only
    python -m attnmem.measure.bench --impls triton sdpa_cudnn sdpa_flash fa4 --preset anchors --rounds 3
    python -m attnmem.measure.bench --impls triton sdpa_cudnn sdpa_flash fa4 --preset training --rounds 3
    python -m attnmem.measure.bench --preset training --packed-only --impls triton triton_generic \
        sdpa_cudnn fa4 --rounds 3        # the 4 packed batches only: Hopper vs portable forward
    python -m attnmem.measure.bench --summarize part1.csv part2.csv   # tables + summary, no GPU

For each (dtype, head dim, H_kv, causal, forward | forward+backward, s) every implementation
runs on the same fresh random inputs (B=1, H=32 by default, as in the H200 anchor figures); time
is the median of ``triton.testing.do_bench`` (CUDA events, after warm-up and autotuning); with
``--rounds R`` every implementation is timed R times per shape, in turn, and the median of the
R medians is kept (on a shared host, load that drifts over seconds then hits every backend).
The shapes are the cross product of --dtypes, --dims, --causal and --seqs (one --kv-heads), or
a list given with --shapes, or a named list (--preset; "training" adds packed batches and
ends with the geometric mean and median of our ratio to each peer: attnmem.measure.bench.training). TFLOP/s are ``attnmem.calc.attention_flops``
over the time: forward = 4*B*H*s^2*d, half when causal; forward+backward = 3.5 x forward
(FlashAttention-2's convention). The table prints TFLOP/s and our kernel's ratio to sdpa_cudnn, sdpa_flash and
FlashAttention-4 (``fa4``, from the optional flash-attn-4 package, when it ran); a CSV gets one
row per measurement (``attnmem.measure.speed_results.Row``), stamped with the GPU name, torch
and triton versions and the time.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import math
import sys
from dataclasses import asdict, dataclass

from attnmem.measure import registry
from attnmem.measure.bench import impls, training
from attnmem.measure.bench.impls import IMPLS, NATIVE_BSHD
from attnmem.measure.speed_results import OURS, PEERS, Row, ratios, read_rows
from attnmem.measure.store import neutralise

__all__ = ["IMPLS", "PRESETS", "Row", "Shape", "flops", "main", "parse_args",
           "read_rows", "run_grid", "table"]

DEFAULT_IMPLS = IMPLS
#: Implementations whose output is checked against the reference (a wrong one gets no time).
CHECKED = ("triton", "triton_generic", "triton_sm90", "triton_sm90_3wg", "triton_sm90_bwd",
           "triton_portable_bwd", "fa4")
MATH_MAX_SEQ = 8192  # sdpa_math keeps fp32 s x s scores: skipped above this length


@dataclass(frozen=True)
class Shape:
    """One shape of the grid: every implementation and pass runs on its inputs."""

    dtype: str  # fp16 | bf16
    head_dim: int  # d
    seq_len: int  # s (queries = keys)
    causal: bool
    kv_heads: int | None = None  # H_kv (GQA when < heads); None: the run's --kv-heads or heads
    batch: int | None = None  # B; None: the run's --batch

    def spec(self) -> str:
        """The --shapes spelling of this shape."""
        extra = (("/causal" if self.causal else "") + (f"/kv={self.kv_heads}" if self.kv_heads else "")
                 + (f"/b={self.batch}" if self.batch else ""))
        return f"{self.dtype}/{self.head_dim}/{self.seq_len}{extra}"


def parse_shape(text: str) -> Shape:
    """``DTYPE/D/S[/causal][/kv=H_KV][/b=B]``, e.g. ``bf16/128/8192/causal/kv=8/b=2``;
    argparse error naming the value and the form otherwise."""
    form = "DTYPE/D/S[/causal][/kv=H_KV][/b=B], e.g. bf16/128/8192/causal/kv=8/b=2"
    parts = [p.strip() for p in str(text).split("/")]
    try:
        if len(parts) < 3 or parts[0] not in ("fp16", "bf16"):
            raise ValueError
        d, s = int(parts[1]), int(parts[2])
        causal, kv, b = False, None, None
        for extra in parts[3:]:
            if extra == "causal" and not causal:
                causal = True
            elif extra.startswith("kv=") and kv is None:
                kv = int(extra[3:])
            elif extra.startswith("b=") and b is None:
                b = int(extra[2:])
            else:
                raise ValueError
        if d < 1 or s < 1 or (kv is not None and kv < 1) or (b is not None and b < 1):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be {form} (dtype fp16 or bf16, whole "
                                         f"numbers >= 1), got {text!r}") from None
    return Shape(parts[0], d, s, causal, kv, b)


#: Named shape lists. "anchors": the attention-kernel shapes of the H200 anchor figures (bf16,
#: d = 128 at s = 4,096 and 16,384 causal and not, d = 64 at 8,192 causal, GQA H_kv = 8 at
#: d = 128, s = 8,192 causal), plus fp16 at d = 128, s = 4,096 causal and not. "targets": the
#: backward's whole target grid of the kernel issue (forward+backward >= 1.0x FA4 at d = 64 and
#: 128, s >= 4,096, causal and not, bf16 and fp16, MHA and GQA 4:1): both dtypes x both head
#: dims x s = 4,096 and 16,384 x causal and not x H_kv = 32 and 8, 32 shapes.
PRESETS: dict[str, tuple[Shape, ...]] = {
    "anchors": tuple(parse_shape(x) for x in (
        "bf16/128/4096", "bf16/128/4096/causal", "bf16/128/16384", "bf16/128/16384/causal",
        "bf16/64/8192/causal", "bf16/128/8192/causal/kv=8", "fp16/128/4096",
        "fp16/128/4096/causal")),
    "targets": tuple(parse_shape(f"{dt}/{d}/{s}{'/causal' if c else ''}{kv}")
                     for dt in ("bf16", "fp16") for d in (128, 64) for s in (4096, 16384)
                     for c in (False, True) for kv in ("", "/kv=8")),
    # "training": issue 31's grid (attnmem.measure.bench.training): 36 dense shapes with their own
    # batch, and (not listed here) its 4 packed batches, training.PACKED
    "training": tuple(parse_shape(x) for x in training.DENSE),
}


def flops(batch: int, heads: int, s: int, d: int, causal: bool, mode: str) -> int:
    """FLOPs of one call: attnmem.calc.attention_flops (forward 4*B*H*s^2*d, half if causal;
    forward+backward, ``mode == "fwd_bwd"``, 3.5 x that)."""
    from attnmem.calc import attention_flops

    return attention_flops(batch, heads, s, d, causal=bool(causal), backward=mode == "fwd_bwd")


def shapes_of(args) -> list[Shape]:
    """The run's shapes: --shapes or --preset as given, else the cross product of --dtypes,
    --dims, --causal and --seqs (in that nesting), each with --kv-heads."""
    if args.shapes is not None:
        return list(args.shapes)
    return [Shape(dname, d, s, bool(causal), args.kv_heads)
            for dname in args.dtypes for d in args.dims for causal in args.causal
            for s in args.seqs]


def _fa4_note(impls) -> str:
    """'' or why fa4, asked for, will not run here (said once, before the grid)."""
    if "fa4" not in impls:
        return ""
    try:
        registry._fa4_func()  # the ~10 s import, done before anything is timed
    except ImportError as exc:
        return f"fa4 is unavailable: {exc}; its rows say 'unavailable'"
    return ""


def run_grid(args, device: str = "cuda") -> list[Row]:
    """Time every implementation on every shape and pass of args (``device='cpu'`` only for
    tests of this procedure), writing each row to args.csv as it comes; returns the rows."""
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if device == "cuda" else device
    stamp = dict(gpu=gpu, torch_version=torch.__version__,
                 triton_version=triton.__version__,
                 timestamp=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    rows: list[Row] = []
    B, H = args.batch, args.heads
    note = _fa4_note(args.impls)
    if note:
        print(note, file=sys.stderr, flush=True)
    versions = {"fa4": registry.fa4_version()}  # per implementation, beyond torch and triton
    packed = getattr(args, "packed", None) or []
    sink = open(args.csv, "w", newline="")  # rows are written as they come: a cut run keeps them
    # packed batches add a column of their lengths (training.run_packed); read_rows ignores it
    writer = csv.DictWriter(sink, fieldnames=list(Row.__dataclass_fields__)
                            + (["packed_lengths"] if packed else []), restval="")
    writer.writeheader()
    for shape in shapes_of(args):
        dname, d, s, causal = shape.dtype, shape.head_dim, shape.seq_len, shape.causal
        H_kv = shape.kv_heads or H
        B = shape.batch or args.batch
        gen = torch.Generator(device=device).manual_seed(s * 1000 + d)
        q, k, v, do = (torch.randn(B, heads, s, d, device=device, generator=gen,
                                   dtype=registry.torch_dtype(dname))
                       for heads in (H, H_kv, H_kv, H))  # (B, H or H_kv, s, d)
        for t in (q, k, v):
            t.requires_grad_()
        # the same values as contiguous (B, s, H, d) leaves, for NATIVE_BSHD implementations;
        # dO stays (B, H, s, d): its transposed view is what their backward receives
        bshd = tuple(t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        with torch.no_grad():  # the accuracy reference: cuDNN, else flash
            ref = None
            for r in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient"):
                try:
                    ref = impls.impl_fn(r)(q, k, v, causal).float()
                    break
                except RuntimeError:
                    continue
        for mode in args.modes:
            names = [n for n in args.impls if not (n == "sdpa_math" and s > MATH_MAX_SEQ)]
            got: dict[str, list] = {n: [] for n in names}
            for _ in range(args.rounds):  # interleaved: drift hits all alike
                for name in names:
                    qkv = bshd if name in NATIVE_BSHD else (q, k, v)
                    got[name].append(impls.measure(name, *qkv, do, causal, mode,
                                                   ref if name in CHECKED else None))
            for name in names:
                ms, rel, status = impls.combine(got[name])
                tf = flops(B, H, s, d, causal, mode) / (ms * 1e-3) / 1e12
                rows.append(Row(name, dname, B, H, s, d, causal, mode, ms, tf, rel, status,
                                **stamp, kv_heads=H_kv, impl_version=versions.get(name, "")))
                writer.writerow({col: neutralise(val) for col, val in asdict(rows[-1]).items()})
                sink.flush()
                print(f"{name:15s} {dname} d={d:3d} H_kv={H_kv:3d} causal={int(causal)} "
                      f"{mode:7s} B={B:3d} s={s:6d} {ms:9.4f} ms {tf:7.1f} TFLOP/s {status}",
                      flush=True)
        del q, k, v, do, ref, bshd
        torch.cuda.empty_cache()
    if packed:
        rows += training.run_packed(args, writer, sink, stamp, versions, device)
    sink.close()
    return rows


def table(rows: list[Row]) -> str:
    """Markdown table: TFLOP/s per implementation, then our kernel's ratio to sdpa_cudnn,
    sdpa_flash and (when it ran) fa4 (``speed_results.ratios``). An H_kv column appears when
    any row has fewer key/value heads than query heads."""
    impls = [i for i in IMPLS if any(r.impl == i for r in rows)]
    peers = [p for p in PEERS if p != "fa4" or "fa4" in impls]
    gqa = any(r.key[2] != r.heads for r in rows)
    batches = {r.key: r.batch for r in rows}  # a B column when the shapes have their own
    show_b = len(set(batches.values())) > 1
    # (dtype, head_dim, kv_heads, causal, mode, seq_len), ordered dtype, d, H_kv, pass, causal, s
    keys = sorted({r.key for r in rows}, key=lambda k: (k[0], k[1], -k[2], k[4], k[3], k[5]))
    by = {(r.impl, *r.key): r for r in rows}
    ratio = ratios(rows, OURS, peers)
    short = {"sdpa_cudnn": "cudnn", "sdpa_flash": "flash", "fa4": "fa4"}
    head = (["dtype", "d"] + (["H_kv"] if gqa else []) + ["causal", "pass"]
            + (["B"] if show_b else []) + ["s"] + impls + [f"{OURS}/{short[p]}" for p in peers])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key in keys:
        dname, d, kv, causal, mode, s = key
        cells = ([dname, str(d)] + ([str(kv)] if gqa else [])
                 + ["yes" if causal else "no", "fwd+bwd" if mode == "fwd_bwd" else "fwd"]
                 + ([str(batches[key])] if show_b else []) + [str(s)])
        for i in impls:
            r = by.get((i, *key))
            cells.append("-" if r is None else (f"{r.tflops:.0f}" if r.status == "ok"
                                                else r.status[:12]))
        for p in peers:
            x = ratio[key][p]
            cells.append("-" if math.isnan(x) else f"{x:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def host_us_per_call(call, n: int, warmup: int = 20) -> float:
    """Wall microseconds per call of ``call`` over n back-to-back calls (after warm-up), the
    GPU drained before and after: on shapes whose GPU work is short, this is host time."""
    import time

    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def cpu_overhead_us(n: int = 300) -> dict[str, float]:
    """Host microseconds per call on a tiny shape (the GPU idles; Python and launches cost).
    A call whose host time exceeds its GPU time is launch-bound at that size."""
    import torch

    q, k, v, do = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16)
                   for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    out = {}
    for name in ("triton", "triton_generic", "sdpa_flash", "sdpa_cudnn"):
        fn = impls.impl_fn(name)
        for mode in ("fwd", "fwd_bwd"):
            def call(fn=fn, mode=mode):
                if mode == "fwd":
                    with torch.no_grad():
                        fn(q, k, v, False)
                else:
                    fn(q, k, v, False).backward(do)
            try:
                out[f"{name}_{mode}"] = host_us_per_call(call, n)
            except RuntimeError:
                out[f"{name}_{mode}"] = math.nan
    return out


def tuned_configs() -> dict[str, dict[str, str]]:
    """What the autotuner chose in this process, per kernel and key."""
    if "attnmem.kernels.flash.fwd" not in sys.modules:
        return {}
    from attnmem.kernels.flash import bwd as bwd
    from attnmem.kernels.flash import fwd as fwd

    out = {}
    for name, module, attr in (("fwd", fwd, "_fwd_kernel_tuned"), ("dkdv", bwd, "_dkdv_tuned"),
                               ("dq", bwd, "_dq_tuned")):
        tuner = getattr(module, attr, None)  # absent: that kernel has no autotuner here
        out[name] = {str(k): str(c) for k, c in getattr(tuner, "cache", {}).items()}
    return out


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def _parse_part(text: str, p: argparse.ArgumentParser) -> tuple[int, int]:
    """(K, N) of ``--part K/N`` with 1 <= K <= N; a parser error naming the value otherwise."""
    try:
        k, n = (int(x) for x in str(text).split("/"))
        if not 1 <= k <= n:
            raise ValueError
    except ValueError:
        p.error(f"--part must be K/N with whole numbers 1 <= K <= N (e.g. 1/2), got {text!r}")
    return k, n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="fp16, d=128, s in {1024, 4096, 16384}, causal and not, both passes")
    p.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=["fp16", "bf16"])
    p.add_argument("--dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--seqs", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--causal", nargs="+", type=int, default=[0, 1], choices=[0, 1])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd_bwd"], choices=["fwd", "fwd_bwd"])
    p.add_argument("--impls", nargs="+", default=list(DEFAULT_IMPLS), choices=list(IMPLS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None,
                   help="key/value heads, a divisor of --heads (grouped-query attention; SDPA "
                        "backends run with enable_gqa); default: --heads")
    p.add_argument("--shapes", nargs="+", type=parse_shape, default=None, metavar="SHAPE",
                   help="run exactly these shapes instead of the cross product of --dtypes, "
                        "--dims, --causal, --seqs and --kv-heads; each DTYPE/D/S[/causal]"
                        "[/kv=H_KV], e.g. bf16/128/8192/causal/kv=8")
    p.add_argument("--preset", choices=sorted(PRESETS) + ["decode", "random"], default=None,
                   help="a named list of shapes (anchors: the kernel table of the H200 anchor "
                        "figures plus fp16 at d=128, s=4096; targets: the backward's "
                        "32 target shapes; training: issue 31's 36 dense shapes with their own "
                        "batch and 4 packed batches, then the summary over the grid); decode "
                        "and random take their own options (--out, --seed, --rounds, "
                        "--budget-s: --preset decode --help)")
    p.add_argument("--packed-only", action="store_true",
                   help="with --preset training: time its packed batches only, not the dense "
                        "shapes (triton_generic there is the portable packed forward, "
                        "triton_sm90_3wg the Hopper one with three warpgroups at d = 64)")
    p.add_argument("--part", default=None, metavar="K/N",
                   help="run only part K of N of the shapes (every N-th, from the K-th; packed "
                        "batches alike), e.g. 1/2 and 2/2 in two calls; --summarize joins them")
    p.add_argument("--summarize", nargs="+", default=None, metavar="CSV",
                   help="print the tables and the summary over the grid from CSVs this bench "
                        "wrote (the parts of one run), without timing anything")
    p.add_argument("--csv", default="bench_flash_attn.csv", help="where to write the rows")
    p.add_argument("--markdown", default=None, help="also write the table to this file")
    p.add_argument("--tuned-json", default=None, help="write the autotuner's choices here")
    p.add_argument("--graphs", action="store_true",
                   help="time calls (forward, and forward+backward) as CUDA-graph replays: "
                        "GPU time without host cost")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="time every implementation this many times per shape, interleaved, "
                        "and report the median (host-load drift then falls on all alike)")
    p.add_argument("--overhead", action="store_true",
                   help="first print host microseconds per call on a tiny shape")
    args = p.parse_args(argv)
    if args.kv_heads is not None and (args.kv_heads < 1 or args.heads % args.kv_heads):
        p.error(f"--kv-heads {args.kv_heads}: must be a positive divisor of --heads {args.heads}")
    if args.batch < 1 or args.heads < 1:
        p.error(f"--batch and --heads must be whole numbers >= 1, got {args.batch} and {args.heads}")
    if args.shapes and args.preset:
        p.error("--shapes and --preset both name the shapes: give one of them")
    args.packed = []
    if args.preset:
        args.shapes = list(PRESETS[args.preset])
        if args.preset == "training":
            args.packed = list(training.PACKED)
    if args.packed_only:
        if not args.packed:
            p.error("--packed-only keeps the packed batches of --preset training: give "
                    "--preset training")
        args.shapes = []
    if args.part is not None:
        k, n = _parse_part(args.part, p)
        if args.shapes is None:
            p.error("--part K/N splits a --preset or --shapes list: give one of them")
        args.shapes = args.shapes[k - 1::n]
        args.packed = args.packed[k - 1::n]
        if not args.shapes and not args.packed:
            p.error(f"--part {args.part}: no shape falls in that part; N is larger than the list")
    if any(sh.batch for sh in args.shapes or ()) and args.batch != p.get_default("batch"):
        p.error(f"--batch {args.batch}: these shapes give their own batch (b=...); drop --batch")
    if args.shapes is not None:  # a list (--shapes, --preset), not the cross product
        crossed = [f"--{n.replace('_', '-')}" for n in ("dtypes", "dims", "seqs", "causal",
                                                        "kv_heads", "quick")
                   if getattr(args, n) != p.get_default(n)]
        if crossed:
            p.error(f"--shapes/--preset replace the cross product: drop {', '.join(crossed)}")
        for sh in args.shapes:
            if sh.kv_heads is not None and args.heads % sh.kv_heads:
                p.error(f"shape {sh.spec()}: kv={sh.kv_heads} must divide --heads {args.heads}")
        for b in args.packed:
            if b.kv_heads is not None and args.heads % b.kv_heads:
                p.error(f"packed batch {b.name}: kv={b.kv_heads} must divide --heads {args.heads}")
    if args.quick:
        args.dtypes, args.dims, args.seqs = ["fp16"], [128], [1024, 4096, 16384]
    return args


def header(rows: list[Row], args) -> str:
    """The line above the table: where and how it was measured."""
    r0 = rows[0]
    kvs = ", ".join(str(x) for x in sorted({r.key[2] for r in rows}, reverse=True))
    bs = sorted({r.batch for r in rows})
    b_text = f"B={bs[0]}" if len(bs) == 1 else f"B={bs[0]}..{bs[-1]} (per shape)"
    fa4 = sorted({r.impl_version for r in rows if r.impl == "fa4" and r.impl_version})
    fa4_text = f", flash-attn-4 {', '.join(fa4)}" if fa4 else ""
    return (f"{r0.gpu}, torch {r0.torch_version}, triton {r0.triton_version}{fa4_text}, "
            f"{r0.timestamp}, {b_text}, H={r0.heads}, H_kv={kvs}; "
            f"{'CUDA-graph replays' if args.graphs else 'eager calls'}, "
            f"{args.rounds} round(s) (median); TFLOP/s (fwd 4BHs^2d, /2 causal; fwd+bwd x3.5)")


def report(rows: list[Row], packed_ids: set[tuple], head: str) -> str:
    """What a run prints at its end: the header, the dense table, the packed table (rows of
    ``packed_ids``, ``training._shape_id``: B = sequences, s = packed total) and, when the run
    has packed batches or more than one batch size (the training preset), the summary over
    the grid last (``training.summary_lines``)."""
    dense = [r for r in rows if training._shape_id(r) not in packed_ids]
    packed = [r for r in rows if training._shape_id(r) in packed_ids]
    parts = [head]
    if dense:
        parts.append(table(dense))
    if packed:
        parts.append("Packed batches (B = sequences, s = tokens in the batch; TFLOP/s from "
                     "each sequence's FLOPs):\n\n" + table(packed))
    if packed or len({r.batch for r in rows}) > 1:
        impls = {r.impl for r in rows}
        peers = [p for p in PEERS if p in impls]
        parts.append("\n".join(training.summary_lines(rows, packed_ids, peers)))
    return "\n\n".join(parts)


def summarize_csvs(paths: list[str]) -> str:
    """``report`` of the rows of bench CSVs (the parts of one run), packed rows told by their
    ``packed_lengths`` column. Raises ValueError naming a file that is not a bench CSV."""
    rows: list[Row] = []
    ids: set[tuple] = set()
    for path in paths:
        got = read_rows(path)
        for r, lengths in zip(got, training.read_packed_column(path), strict=True):
            if lengths:
                ids.add(training._shape_id(r))
        rows += got
    if not rows:
        raise ValueError(f"no rows in {', '.join(paths)}")
    r0 = rows[0]
    head = f"{r0.gpu}, torch {r0.torch_version}, triton {r0.triton_version}, {r0.timestamp}; " \
           f"{len(rows)} rows from {len(paths)} CSV(s)"
    return report(rows, ids, head)


def main(argv: list[str] | None = None) -> int:
    from attnmem.measure.bench import preset_cli

    routed = preset_cli.route(sys.argv[1:] if argv is None else list(argv))
    if routed is not None:  # --preset decode / random: their own runs (bench.preset_cli)
        return routed
    args = parse_args(argv)
    if args.summarize:
        try:
            print(summarize_csvs(args.summarize))
        except (OSError, ValueError) as exc:
            print(f"--summarize: {exc}", file=sys.stderr)
            return 2
        return 0
    import torch

    if not torch.cuda.is_available():
        print("attnmem.measure.bench.speed needs a CUDA GPU (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    impls.GRAPHS = args.graphs
    if args.overhead:
        print("host us/call:", {k: round(v, 1) for k, v in cpu_overhead_us().items()})
    import time

    est = training.estimate_seconds(shapes_of(args), args.packed, args.impls, args.modes,
                                    args.rounds, args.heads)
    print(f"estimate: about {est:.0f} s ({len(shapes_of(args))} dense shapes, "
          f"{len(args.packed)} packed batches, {len(args.impls)} implementations, "
          f"{args.rounds} round(s); {training.EST_TFLOPS:.0f} TFLOP/s, do_bench's fixed cost "
          "and compiles: attnmem.measure.bench.training.estimate_seconds)", flush=True)
    t0 = time.perf_counter()
    rows = run_grid(args)
    wall_s = time.perf_counter() - t0
    if args.tuned_json:
        import json

        with open(args.tuned_json, "w") as f:
            json.dump(tuned_configs(), f, indent=1)
    text = report(rows, training.packed_ids(args.packed, args.heads), header(rows, args))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    # the summary (a table) stays last: the count of rows goes above it
    print(f"\n{len(rows)} rows in {wall_s:.0f} s (estimated {est:.0f} s); CSV: {args.csv}")
    print("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
