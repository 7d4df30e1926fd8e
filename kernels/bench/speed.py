"""Speed of the bundled Triton kernel next to every SDPA backend, in one run.

    python -m kernels.bench                 # the full grid (a few minutes on an H200)
    python -m kernels.bench --quick         # fp16, d=128, s in {1024, 4096, 16384}
    python -m kernels.bench --dtypes bf16 --dims 64 --seqs 2048 8192 --modes fwd
    python -m kernels.bench --graphs --modes fwd_bwd --kv-heads 8   # GQA 4:1, GPU time only

For each (dtype, head dim, causal, forward | forward+backward, s) every implementation runs on
the same fresh random inputs (B=1, H=32 by default, as in ../shared/ANCHORS.md); time is the
median of ``triton.testing.do_bench`` (CUDA events, after warm-up and autotuning); with
``--rounds R`` every implementation is timed R times per shape, in turn, and the median of the
R medians is kept (on a shared host, load that drifts over seconds then hits every backend). TFLOP/s use
the project's convention (DESIGN.md): forward = 4*B*H*s^2*d, half when causal; the backward
counts 2.5 x forward, so forward+backward = 3.5 x forward. The table prints TFLOP/s and our
kernel's ratio to sdpa_cudnn and sdpa_flash; a CSV gets one row per measurement, stamped
with the GPU name, torch and triton versions and the time.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import math
import sys
from dataclasses import asdict, dataclass

# "triton" is what flash_attention runs by default (on Hopper: the Gluon forward,
# kernels/flash_attn_fwd_sm90.py, at d = 128, and at d = 64 past 2,048/4,096 with three
# warpgroups; with the Triton backward); "triton_generic" is the portable Triton forward on the
# same GPU; "triton_sm90_3wg" the three-warpgroup Gluon forward forced at every length (d = 64);
# "triton_sm90_persistent" the Gluon forward's persistent form (two warpgroups; opt-in).
IMPLS = ("triton", "triton_generic", "triton_sm90_3wg", "triton_sm90_persistent", "sdpa_cudnn",
         "sdpa_flash", "sdpa_efficient", "sdpa_math")
SM90_3WG = {"SM90": True, "SM90_CONSUMERS": 3, "SM90_STAGES": 2}
SM90_PERSISTENT = {"SM90": True, "SM90_PERSISTENT": True}
# what runs without --impls: not the persistent form (it measured 1-18% slower than the default
# forward on the H200 and is not a default path anywhere: NOTES step 9a)
DEFAULT_IMPLS = tuple(i for i in IMPLS if i != "triton_sm90_persistent")
SDPA = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION",
        "sdpa_efficient": "EFFICIENT_ATTENTION", "sdpa_math": "MATH"}
# Relative L2 error of our output against cuDNN's above which a timing is not reported: 16-bit
# rounding gives about 1e-3 (bf16) here; a kernel that skips keys gives O(1).
REL_ERR_MAX = 2e-2
MATH_MAX_SEQ = 8192  # sdpa_math keeps fp32 s x s scores: skipped above this length
GRAPHS = False  # --graphs: time calls as CUDA-graph replays (GPU time only)


@dataclass(frozen=True)
class Row:
    impl: str  # implementation name (kernels registry names; "triton" is ours)
    dtype: str  # fp16 | bf16
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    causal: bool
    mode: str  # fwd | fwd_bwd
    median_ms: float  # do_bench median, milliseconds (nan when not run)
    tflops: float  # TFLOP/s by the convention in the module docstring
    rel_err: float  # ||out - sdpa_ref|| / ||sdpa_ref|| of the forward output (nan if not checked)
    status: str  # ok | unsupported | oom | error: ...
    gpu: str
    torch_version: str
    triton_version: str
    timestamp: str  # UTC, ISO 8601
    kv_heads: int = 0  # key/value heads (GQA when < heads); read_rows gives CSVs from before
    # the column their `heads` here


def read_rows(path) -> list[Row]:
    """The rows of a CSV that run_grid wrote, typed back (for the app's kernel-speed page).
    Raises ValueError naming the file and the first column or value that does not fit."""
    types = {"batch": int, "heads": int, "seq_len": int, "head_dim": int, "median_ms": float,
             "tflops": float, "rel_err": float}
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = set(Row.__dataclass_fields__) - set(reader.fieldnames or ()) - {"kv_heads"}
        if missing:
            raise ValueError(f"{path}: not a kernels.bench.speed CSV, missing columns {sorted(missing)}")
        for n, raw in enumerate(reader, start=2):
            try:
                vals = {k: types.get(k, str)(raw[k]) for k in Row.__dataclass_fields__
                        if k != "kv_heads"}
                vals["kv_heads"] = int(raw.get("kv_heads") or vals["heads"])
                vals["causal"] = {"True": True, "False": False}[raw["causal"]]
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{path}, line {n}: bad value ({exc})") from None
            rows.append(Row(**vals))
    return rows


def flops(batch: int, heads: int, s: int, d: int, causal: bool, mode: str) -> float:
    """Forward 4*B*H*s^2*d (half if causal); forward+backward 3.5 x that (DESIGN.md)."""
    f = 4.0 * batch * heads * s * s * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwd_bwd" else 1.0)


def _impl_fn(name: str):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "triton":
        from kernels.flash.api import flash_attention

        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal)
    if name == "triton_generic":
        from kernels.flash.api import flash_attention

        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal,
                                                       config={"SM90": False})
    if name == "triton_sm90_3wg":
        from kernels.flash.api import flash_attention

        def three(q, k, v, causal):
            if q.shape[-1] != 64:
                raise RuntimeError("three consumer warpgroups: not supported at head dim "
                                   f"{q.shape[-1]} (d = 64 only)")
            return flash_attention(q, k, v, causal=causal, config=SM90_3WG)

        return three
    if name == "triton_sm90_persistent":
        from kernels.flash.api import flash_attention

        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal,
                                                       config=SM90_PERSISTENT)
    backend = getattr(SDPBackend, SDPA[name])

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                  enable_gqa=k.shape[1] != q.shape[1])

    del torch
    return run


def measure(name, q, k, v, do, causal, mode, ref):
    """(median_ms, rel_err, status) of one implementation on one shape."""
    import torch
    from triton.testing import do_bench

    fn = _impl_fn(name)
    try:
        with torch.no_grad():
            out = fn(q, k, v, causal)
        rel = float((out.float() - ref).norm() / ref.norm()) if ref is not None else math.nan
        if mode == "fwd":
            def call():
                with torch.no_grad():
                    fn(q, k, v, causal)
        else:
            def call():
                fn(q, k, v, causal).backward(do)
        if GRAPHS:
            # Replay of a CUDA graph holding one call: the GPU time of the kernels without the
            # host's share (Python, autograd, argument checks, launches), for every
            # implementation alike. Warm-up on a side stream first (autograd's lazy state),
            # and the gradients start unset so that the captured backward writes them afresh.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    call()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            for t in (q, k, v):
                t.grad = None
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            ms = do_bench(graph.replay, warmup=25, rep=100, return_mode="median")
        else:
            ms = do_bench(call, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")
        if ref is not None:  # the timed path must be right too, not only the first call
            with torch.no_grad():
                again = float((fn(q, k, v, causal).float() - ref).norm() / ref.norm())
            rel = max(rel, again)
            if not rel <= REL_ERR_MAX:
                return math.nan, rel, f"wrong: rel err {rel:.2g}"
        return ms, rel, "ok"
    except torch.OutOfMemoryError:
        return math.nan, math.nan, "oom"
    except RuntimeError as exc:
        msg = str(exc).splitlines()[0][:120]
        status = "unsupported" if "No available kernel" in msg or "not support" in msg else msg
        return math.nan, math.nan, status
    finally:
        torch.cuda.empty_cache()


def _combine(results: list[tuple[float, float, str]]) -> tuple[float, float, str]:
    """One (ms, rel_err, status) from the rounds of one implementation on one shape: the
    median of the rounds' times and the worst error; the first failing round's status (and
    no time) if any round failed."""
    for _ms, rel, status in results:
        if status != "ok":
            return math.nan, rel, status
    times = sorted(r[0] for r in results)
    mid = len(times) // 2
    ms = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    rels = [r[1] for r in results if not math.isnan(r[1])]
    return ms, (max(rels) if rels else math.nan), "ok"


def run_grid(args) -> list[Row]:
    import torch
    import triton

    stamp = dict(gpu=torch.cuda.get_device_name(), torch_version=torch.__version__,
                 triton_version=triton.__version__,
                 timestamp=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    rows: list[Row] = []
    B, H, H_kv = args.batch, args.heads, args.kv_heads or args.heads
    sink = open(args.csv, "w", newline="")  # rows are written as they come: a cut run keeps them
    writer = csv.DictWriter(sink, fieldnames=list(Row.__dataclass_fields__))
    writer.writeheader()
    for dname in args.dtypes:
        for d in args.dims:
            for causal in args.causal:
                for s in args.seqs:
                    gen = torch.Generator(device="cuda").manual_seed(s * 1000 + d)
                    q, k, v, do = (torch.randn(B, heads, s, d, device="cuda", generator=gen,
                                               dtype=dtypes[dname])
                                   for heads in (H, H_kv, H_kv, H))
                    for t in (q, k, v):
                        t.requires_grad_()
                    with torch.no_grad():  # the accuracy reference: cuDNN, else flash
                        ref = None
                        for r in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient"):
                            try:
                                ref = _impl_fn(r)(q, k, v, bool(causal)).float()
                                break
                            except RuntimeError:
                                continue
                    for mode in args.modes:
                        names = [n for n in args.impls
                                 if not (n == "sdpa_math" and s > MATH_MAX_SEQ)]
                        got: dict[str, list] = {n: [] for n in names}
                        for _ in range(args.rounds):  # interleaved: drift hits all alike
                            for name in names:
                                got[name].append(measure(
                                    name, q, k, v, do, bool(causal), mode,
                                    ref if name.startswith("triton") else None))
                        for name in names:
                            ms, rel, status = _combine(got[name])
                            tf = flops(B, H, s, d, bool(causal), mode) / (ms * 1e-3) / 1e12
                            rows.append(Row(name, dname, B, H, s, d, bool(causal), mode, ms,
                                            tf, rel, status, **stamp, kv_heads=H_kv))
                            writer.writerow(asdict(rows[-1]))
                            sink.flush()
                            print(f"{name:15s} {dname} d={d:3d} causal={int(causal)} "
                                  f"{mode:7s} s={s:6d} {ms:9.4f} ms {tf:7.1f} TFLOP/s {status}",
                                  flush=True)
                    del q, k, v, do, ref
                    torch.cuda.empty_cache()
    sink.close()
    return rows


def table(rows: list[Row]) -> str:
    """Markdown table: TFLOP/s per implementation, our ratio to sdpa_cudnn and sdpa_flash."""
    impls = [i for i in IMPLS if any(r.impl == i for r in rows)]
    keys = sorted({(r.dtype, r.head_dim, r.causal, r.mode, r.seq_len) for r in rows},
                  key=lambda k: (k[0], k[1], k[3], k[2], k[4]))
    by = {(r.impl, r.dtype, r.head_dim, r.causal, r.mode, r.seq_len): r for r in rows}
    head = ["dtype", "d", "causal", "pass", "s"] + impls + ["triton/cudnn", "triton/flash"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key in keys:
        cells = [key[0], str(key[1]), "yes" if key[2] else "no",
                 "fwd+bwd" if key[3] == "fwd_bwd" else "fwd", str(key[4])]
        vals = {}
        for i in impls:
            r = by.get((i, *key))
            vals[i] = r.tflops if r is not None and r.status == "ok" else math.nan
            cells.append("-" if r is None else (f"{r.tflops:.0f}" if r.status == "ok"
                                                else r.status[:12]))
        for other in ("sdpa_cudnn", "sdpa_flash"):
            ratio = vals.get("triton", math.nan) / vals.get(other, math.nan)
            cells.append("-" if math.isnan(ratio) else f"{ratio:.2f}")
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
        fn = _impl_fn(name)
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
    """What the autotuner chose in this process, per kernel and key (for NOTES.md)."""
    if "kernels.flash.fwd" not in sys.modules:
        return {}
    from kernels.flash import bwd as bwd
    from kernels.flash import fwd as fwd

    out = {}
    for name, tuner in (("fwd", fwd._fwd_kernel_tuned), ("dkdv", bwd._dkdv_tuned),
                        ("dq", bwd._dq_tuned)):
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
    if args.quick:
        args.dtypes, args.dims, args.seqs = ["fp16"], [128], [1024, 4096, 16384]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("kernels.bench.speed needs a CUDA GPU (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    global GRAPHS
    GRAPHS = args.graphs
    if args.overhead:
        print("host us/call:", {k: round(v, 1) for k, v in cpu_overhead_us().items()})
    rows = run_grid(args)
    if args.tuned_json:
        import json

        with open(args.tuned_json, "w") as f:
            json.dump(tuned_configs(), f, indent=1)
    md = table(rows)
    r0 = rows[0]
    header = (f"{r0.gpu}, torch {r0.torch_version}, triton {r0.triton_version}, {r0.timestamp}, "
              f"B={r0.batch}, H={r0.heads}, H_kv={r0.kv_heads}; TFLOP/s (fwd 4BHs^2d, /2 causal; fwd+bwd x3.5)")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + "\n\n" + md + "\n")
    print("\n" + header + "\n\n" + md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
