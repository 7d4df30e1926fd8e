"""Command line for headless machines: measure a sweep, write the same rows as the page.

    python -m attnmem.measure --impl naive,sdpa_flash --seq-len 1024,2048 --batch 1 --heads 32 \
        --head-dim 128 --dtype fp16 --no-causal --both --out results.csv [--db results.sqlite]

Points run in a child process (attnmem.measure.child) under the GPU lock; each finished row is appended
to the CSV (and committed to the SQLite store with --db) at once, so an interrupted sweep keeps
what it measured. ``--profile`` also writes trace fingerprints (attnmem.measure.trace) to
``--trace-out``. Lists are comma-separated; ``--dtype fp16,bf16``, ``--head-dim 64,128``,
``--causal-both`` make cross products. With no --impl/--seq-len this is the default sweep: every
implementation of the registry (``fa4`` rows say 'unavailable', with the reason, where
FlashAttention-4 is not installed), s = 512 ... 16,384, forward and forward+backward.
"""

from __future__ import annotations

import argparse
import csv
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnmem.measure import registry
from attnmem.measure.child import GpuBusy, run_points, run_trace
from attnmem.measure.harness import COLUMNS, BenchOptions, PointConfig, PointResult, expand_points
from attnmem.measure.store import ResultStore, neutralise

DEFAULT_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1, got {text!r}")
    return vals


def _impl_list(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in registry.NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown implementation(s) {', '.join(bad) or text!r}; known: {', '.join(registry.NAMES)}")
    return names


def _dtype_list(text: str) -> list[str]:
    try:
        return [registry.canonical_dtype(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m attnmem.measure", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", type=_impl_list, default=list(registry.NAMES),
                    help="comma-separated implementation names (default: all of them: "
                         + ", ".join(registry.NAMES) + ")")
    ap.add_argument("--seq-len", type=_int_list, default=list(DEFAULT_SEQ_LENS),
                    help="comma-separated sequence lengths (default 512..16384)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA); default = heads")
    ap.add_argument("--head-dim", type=_int_list, default=[128], help="comma-separated head dims")
    ap.add_argument("--dtype", type=_dtype_list, default=["fp16"], help="fp16, bf16, fp32 (comma list)")
    causal = ap.add_mutually_exclusive_group()
    causal.add_argument("--causal", dest="causal", action="store_const", const="on")
    causal.add_argument("--no-causal", dest="causal", action="store_const", const="off")
    causal.add_argument("--causal-both", dest="causal", action="store_const", const="both")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--forward", dest="mode", action="store_const", const="fwd")
    mode.add_argument("--backward", dest="mode", action="store_const", const="bwd",
                      help="forward + backward")
    mode.add_argument("--both", dest="mode", action="store_const", const="both")
    ap.set_defaults(causal="off", mode="both")
    ap.add_argument("--out", type=Path, default=Path("results.csv"), help="CSV to write")
    ap.add_argument("--db", type=Path, default=None, help="also store the run in this SQLite file")
    ap.add_argument("--label", default="", help="label of the stored run")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per point")
    ap.add_argument("--warmup-ms", type=float, default=5.0,
                    help="do_bench warm-up, ms of GPU time (default 5)")
    ap.add_argument("--rep-ms", type=float, default=20.0,
                    help="do_bench repetitions, ms of GPU time (default 20; the median is kept)")
    ap.add_argument("--resume", type=Path, action="append", default=[],
                    help="skip points that already have a row in this results CSV (repeatable)")
    ap.add_argument("--max-gb", type=float, default=None,
                    help="skip points whose predicted peak exceeds this many GB (status skipped)")
    ap.add_argument("--order", choices=("grid", "length"), default="grid",
                    help="grid: each series short to long (default); length: every series at "
                         "one s before the next s (with --deadline, cuts only the longest)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds for the whole sweep; points not started by then are skipped")
    ap.add_argument("--lock-wait", type=float, default=0.0, help="seconds to wait for a busy GPU")
    ap.add_argument("--profile", action="store_true", help="also write trace fingerprints")
    ap.add_argument("--trace-out", type=Path, default=None,
                    help="trace CSV (default: <out>_trace.csv)")
    ap.add_argument("--trace-seq-len", type=int, default=2048)
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--train", action="store_true",
                    help="measure training steps of whole models instead (--train --help)")
    ap.add_argument("--infer", action="store_true",
                    help="measure generate() of whole models instead (--infer --help)")
    ap.add_argument("--repredict", type=Path, default=None, metavar="CSV",
                    help="measure nothing: recompute predicted_bytes and rel_error of CSV's rows "
                         "from the current calc model and write them to --out")
    return ap


class Progress:
    """tqdm when installed, else a plain one-line bar on stderr."""

    def __init__(self, total: int, quiet: bool = False) -> None:
        self.total, self.n, self.quiet = total, 0, quiet
        self.t0 = time.monotonic()
        self._tqdm = None
        if not quiet:
            try:
                from tqdm import tqdm

                self._tqdm = tqdm(total=total, unit="pt", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, text: str) -> None:
        self.n += 1
        if self.quiet:
            return
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(text[:60], refresh=False)
            self._tqdm.update(1)
            return
        width = 30
        done = int(width * self.n / max(1, self.total))
        el = time.monotonic() - self.t0
        sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {self.n}/{self.total} "
                         f"{el:6.1f}s {text[:60]:<60}")
        sys.stderr.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif not self.quiet:
            sys.stderr.write("\n")


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def summary_table(results: Sequence[PointResult], min_s: int = 1024) -> str:
    """Per implementation and mode: points, statuses, max |error| of the prediction at s >= min_s."""
    groups: dict[tuple[str, str], list[PointResult]] = {}
    for r in results:
        groups.setdefault((r.impl, r.mode), []).append(r)
    lines = [f"{'impl':<15}{'mode':<8}{'points':>7}{'ok':>5}{'oom':>5}{'other':>6}"
             f"{'max|err| s>=' + str(min_s):>18}{'best TFLOP/s':>14}"]
    for (impl, mode), rs in groups.items():
        ok = [r for r in rs if r.status == "ok"]
        errs = [abs(r.rel_error) for r in ok if r.rel_error is not None and r.seq_len >= min_s]
        tf = [r.tflops for r in ok if r.tflops]
        lines.append(f"{impl:<15}{mode:<8}{len(rs):>7}{len(ok):>5}"
                     f"{sum(r.status == 'oom' for r in rs):>5}"
                     f"{sum(r.status not in ('ok', 'oom') for r in rs):>6}"
                     f"{(f'{100 * max(errs):.2f}%' if errs else '-'):>18}"
                     f"{(f'{max(tf):.0f}' if tf else '-'):>14}")
    return "\n".join(lines)


def point_key(p: PointConfig | dict[str, Any]) -> tuple:
    """(impl, B, H, H_kv, s, d, dtype, causal, backward) of a config or a CSV row."""
    if isinstance(p, PointConfig):
        return (p.impl, p.batch, p.heads, p.h_kv, p.seq_len, p.head_dim,
                registry.canonical_dtype(p.dtype), bool(p.causal), bool(p.backward))
    return (p["impl"], int(p["batch"]), int(p["heads"]), int(p.get("kv_heads") or p["heads"]),
            int(p["seq_len"]), int(p["head_dim"]), registry.canonical_dtype(p["dtype"]),
            str(p["causal"]).lower() in ("true", "1"), str(p["backward"]).lower() in ("true", "1"))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--train" in argv:  # training steps of whole models: attnmem.measure.train
        from attnmem.measure.train.cli import main as train_main

        return train_main([a for a in argv if a != "--train"])
    if "--infer" in argv:  # generate() of whole models: attnmem.measure.infer
        from attnmem.measure.infer.cli import main as infer_main

        return infer_main([a for a in argv if a != "--infer"])
    args = build_parser().parse_args(argv)
    if args.repredict is not None:
        try:
            n = repredict_csv(args.repredict, args.out)
        except (OSError, ValueError) as e:
            # a training-step CSV (--train --out) is re-predicted by the training harness
            hint = " (a training-step CSV: re-predict it with --train --repredict)" \
                if "predicted_peak_bytes" in str(e) else ""
            print(f"--repredict: cannot re-predict {args.repredict}: {e}{hint}",
                  file=sys.stderr)
            return 2
        print(f"{n} rows re-predicted from attnmem.calc into {args.out}")
        return 0
    causals = {"on": (True,), "off": (False,), "both": (False, True)}[args.causal]
    backwards = {"fwd": (False,), "bwd": (True,), "both": (False, True)}[args.mode]
    points = expand_points(args.impl, args.seq_len, batch=args.batch, heads=args.heads,
                           head_dims=args.head_dim, dtypes=args.dtype, causals=causals,
                           backwards=backwards, kv_heads=args.kv_heads)
    if args.order == "length":
        points.sort(key=lambda p: p.seq_len)  # stable: the grid order within one length
    if args.resume:
        done = set()
        for path in args.resume:
            with open(path, newline="") as fh_in:
                done |= {point_key(r) for r in csv.DictReader(fh_in)}
        points = [p for p in points if point_key(p) not in done]
    options = BenchOptions(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                           max_predicted_bytes=int(args.max_gb * 1e9) if args.max_gb else None)
    store = ResultStore(args.db) if args.db else None
    run_id: int | None = None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fh = open(args.out, "w", newline="")  # noqa: SIM115 - closed in finally
    writer = csv.writer(fh, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    fh.flush()
    bar = Progress(len(points), args.quiet)

    def on_result(res: PointResult, i: int, n: int) -> None:
        nonlocal run_id
        row = res.to_row()
        writer.writerow(["" if row[c] is None else neutralise(row[c]) for c in COLUMNS])
        fh.flush()
        if store is not None:
            if run_id is None:
                run_id = store.new_run(gpu_name=res.gpu_name, driver=res.driver,
                                       torch_version=res.torch_version,
                                       triton_version=res.triton_version,
                                       label=args.label or "command line", source="measured")
            store.add_row(run_id, row)
        ms = f"{res.median_ms:.3f} ms" if res.median_ms else ""
        bar.update(f"{res.impl} {res.mode} s={res.seq_len} {res.status} {ms}")

    t0 = time.monotonic()
    try:
        summary = run_points(points, options=options, on_result=on_result,
                             timeout_s=args.timeout, lock_wait_s=args.lock_wait,
                             deadline_s=args.deadline)
    except GpuBusy as exc:
        bar.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        bar.close()
        print(f"interrupted: the rows measured so far are in {args.out}", file=sys.stderr)
        return 130
    except (sqlite3.Error, OSError) as exc:  # database locked or full, disk full, ...
        bar.close()
        where = f"{args.db} (database)" if isinstance(exc, sqlite3.Error) else str(args.out)
        print(f"error: could not save a result to {where}: {exc}. The sweep stopped; the rows "
              f"saved before it are in {args.out}" + (f" and {args.db}" if store else ""),
              file=sys.stderr)
        return 3
    finally:
        try:
            fh.close()
        except OSError:  # a full disk fails the final flush too; the error is reported above
            pass
    bar.close()
    wall = time.monotonic() - t0
    print(summary_table(summary.results))
    print(f"{len(summary.results)} points in {wall:.1f} s wall ({summary.children_started} child "
          f"process(es)); rows in {args.out}" + (f"; run {run_id} in {args.db}" if run_id else ""))
    if args.profile:
        trace_out = args.trace_out or args.out.with_name(args.out.stem + "_trace.csv")
        write_trace(args, trace_out)
    return 0


def repredict_csv(src: Path, dst: Path) -> int:
    """Rewrite predicted_bytes and rel_error of a results CSV from the current calc model."""
    from attnmem.measure.harness import predict_bytes, rel_error
    from attnmem.measure.store import read_csv_rows

    rows = read_csv_rows(src)
    for r in rows:
        cfg = PointConfig(r["impl"], r["batch"], r["heads"], r["seq_len"], r["head_dim"],
                          r["dtype"], bool(r["causal"]), bool(r["backward"]), r["kv_heads"])
        r["predicted_bytes"], _ = predict_bytes(cfg)
        r["rel_error"] = rel_error(r["predicted_bytes"], r["peak_extra_bytes"])
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\r\n")
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow(["" if r.get(c) is None else neutralise(r.get(c)) for c in COLUMNS])
    return len(rows)


def write_trace(args: argparse.Namespace, path: Path) -> None:
    from attnmem.measure.trace import TRACE_COLUMNS

    cfgs = [PointConfig(name, args.batch, args.heads, args.trace_seq_len, hd, dt, causal, bwd,
                        args.kv_heads)
            for dt in args.dtype for hd in args.head_dim for bwd in (False, True)
            for causal in (False, True) for name in args.impl]
    rows = run_trace(cfgs, lock_wait_s=args.lock_wait)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\r\n")
        w.writerow(TRACE_COLUMNS)
        for r in rows:
            w.writerow(["" if r.get(c) is None else neutralise(r.get(c)) for c in TRACE_COLUMNS])
    print(f"trace fingerprints of {len(cfgs)} calls: {len(rows)} rows in {path}")


if __name__ == "__main__":
    sys.exit(main())
