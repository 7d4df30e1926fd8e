"""Reference measurements at awkward shapes (issue 16): batch 2-8, heads 12/20/40, lengths that are
not powers of two, GQA; every implementation, fp16 and bf16, forward and forward+backward.

    python -m attnmem.measure.awkward_sweep --out data/awkward        # ~400 points, < 5 min on an H200
    python -m attnmem.measure.awkward_sweep --expandable --out data/awkward   # ~64 points
    python -m attnmem.measure.awkward_sweep --check data/attention_calls_awkward_h200.csv

The first writes ``<out>/attention_calls_awkward_h200.csv``; ``--expandable`` runs a subset in a
child with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` and writes
``<out>/attention_calls_awkward_expandable_h200.csv`` (each row's message says so). Rows are the
harness's (``attnmem.measure.harness.COLUMNS``): the same procedure as ``python -m
attnmem.measure`` (``attnmem.measure.harness``), measured in one child process through
``attnmem.measure.child.run_points``; only the shape list is new. Memory only by default (the
point of this sweep is the allocator's rounding); ``--time`` also times each call. The child
first creates the cuBLAS workspaces (``attnmem.measure.prewarm``), so that the cache is really
empty before every point; ``--no-prewarm`` measures as the plain command line does (the first
run, data/attention_calls_awkward_h200.csv, did: its later points found a pinned free block).

Why these shapes: at B = 1, H = 32 and powers of two every tensor is a multiple of 2 MiB and the
caching allocator's rounding never shows; here tensor sizes land just above or below the 1 MiB,
10 MiB and 2 MiB boundaries of c10/cuda/CUDACachingAllocator.cpp (round_size,
get_allocation_size, should_split), and s is not a multiple of the kernels' tile sizes.
``fa4`` is measured when the registry has it (last, so a slow FlashAttention-4 compile is what a
deadline cuts, not the other implementations).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from attnmem.measure import registry
from attnmem.measure.child import GpuBusy, run_points
from attnmem.measure.harness import COLUMNS, BenchOptions, PointConfig, PointResult
from attnmem.measure.store import cached_free_bytes, neutralise

#: (batch, heads, kv_heads, seq_len, head_dim, causal): each is measured for every
#: implementation x (fp16, bf16) x (fwd, fwd+bwd). Chosen so that O = B*H*s*d*e and the s x s
#: tensors fall on both sides of the allocator's boundaries (1 MiB small pool, 10 MiB, the 1 MiB
#: no-split remainder of a 2 MiB-rounded segment) and s is not a multiple of 64 or 128.
SHAPES: tuple[tuple[int, int, int, int, int, bool], ...] = (
    (2, 16, 16, 3000, 64, False),   # the example: O = 11.7 MiB -> a 12 MiB block (+2.4%)
    (2, 12, 12, 1000, 64, False),   # O = 2.9 MiB (20 MiB segment, split), s x s 45.8 MiB
    (8, 12, 12, 1000, 64, True),    # O = 11.7 MiB, causal
    (4, 20, 20, 1000, 128, False),  # O = 19.5 MiB, s x s 152.6 MiB
    (1, 40, 40, 5000, 128, False),  # O = 48.8 MiB
    (5, 12, 12, 5000, 64, True),    # s x s 2.8 GiB, causal
    (3, 12, 12, 7777, 64, True),    # s = 7,777: no tile divides it
    (1, 12, 12, 12000, 128, False),  # long, few heads
    (2, 40, 8, 3000, 128, False),   # GQA 5:1
    (1, 20, 4, 12000, 64, True),    # GQA 5:1, long, causal
    (2, 32, 8, 7777, 128, True),    # GQA 4:1
    (6, 20, 5, 1000, 64, False),    # GQA 4:1, B = 6
    (3, 12, 4, 3000, 128, True),    # GQA 3:1
)

#: The expandable_segments subset (~64 points): four shapes, every implementation, bf16, both passes.
EXPANDABLE_SHAPES: tuple[tuple[int, int, int, int, int, bool], ...] = (
    (2, 16, 16, 3000, 64, False),
    (4, 20, 20, 1000, 128, False),
    (3, 12, 12, 7777, 64, True),
    (2, 40, 8, 3000, 128, False),
)

DTYPES = ("fp16", "bf16")
OUT_NAME = "attention_calls_awkward_h200.csv"
OUT_NAME_EXPANDABLE = "attention_calls_awkward_expandable_h200.csv"
EXPANDABLE_CONF = "expandable_segments:True"


def default_impls() -> list[str]:
    """Every registry implementation, fa4 last (it compiles slowest)."""
    names = [n for n in registry.NAMES if n != "fa4"]
    return names + (["fa4"] if "fa4" in registry.NAMES else [])


def points(impls: Sequence[str], shapes: Sequence[tuple[int, int, int, int, int, bool]],
           dtypes: Sequence[str] = DTYPES) -> list[PointConfig]:
    """The sweep's points: implementations in the given order (outermost, so that fa4 runs
    last), then shapes, dtypes, forward before forward+backward."""
    out = []
    for impl in impls:
        for b, h, hkv, s, d, causal in shapes:
            for dt in dtypes:
                for bwd in (False, True):
                    out.append(PointConfig(impl, b, h, s, d, dt, causal, bwd,
                                           None if hkv == h else hkv))
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m attnmem.measure.awkward_sweep",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("."),
                    help="directory for the CSV (default: the current one)")
    ap.add_argument("--expandable", action="store_true",
                    help=f"run the subset with PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE_CONF}")
    ap.add_argument("--impl", default=None,
                    help="comma-separated implementations (default: all in the registry)")
    ap.add_argument("--time", action="store_true", help="also time each call (do_bench)")
    ap.add_argument("--deadline", type=float, default=280.0,
                    help="seconds for the whole sweep; later points are recorded as skipped")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per point")
    ap.add_argument("--max-gb", type=float, default=120.0,
                    help="skip points predicted above this many GB")
    ap.add_argument("--lock-wait", type=float, default=0.0)
    ap.add_argument("--no-prewarm", action="store_true",
                    help="do not create the cuBLAS workspaces first (attnmem.measure.prewarm); "
                         "later points then find a pinned free block in the cache")
    ap.add_argument("--list", action="store_true", help="print the points and exit")
    ap.add_argument("--check", type=Path, default=None, metavar="CSV",
                    help="measure nothing: compare CSV's rows with calc (peak and reserved); "
                         "rows whose message names expandable_segments are predicted so")
    return ap


def check(path: Path) -> str:
    """Per implementation and pass: rows, worst |error| of attnmem.calc.attention_peak_bytes against
    peak_extra_bytes (s >= 1,024 and below), and of attnmem.calc.attention_reserved_bytes against
    reserved_extra_bytes where it predicts one, each given the row's cached free bytes
    (reserved before the call minus allocated before it); then the ten worst rows."""
    import attnmem.calc
    from attnmem.calc.allocator import CachingAllocator
    from attnmem.measure.store import read_csv_rows

    def input_slack(r: dict, exp: bool) -> int:
        """Free bytes in the segments that hold the inputs after empty_cache (what a call can
        use without growing the reservation)."""
        a = CachingAllocator(exp)
        e = 4 if r["dtype"] == "fp32" else 2
        q = r["batch"] * r["heads"] * r["seq_len"] * r["head_dim"] * e
        kv = r["batch"] * r["kv_heads"] * r["seq_len"] * r["head_dim"] * e
        for n in [q, kv, kv] + ([q] if r["backward"] else []):
            a.malloc(n)
        return a.reserved - a.allocated

    rows = [r for r in read_csv_rows(path) if r["status"] == "ok" and r["peak_extra_bytes"]]
    not_empty = 0
    out: dict[tuple[str, str], list[float]] = {}
    worst: list[tuple[float, str]] = []
    for r in rows:
        exp = "expandable_segments:True" in (r.get("message") or "")
        args = (r["impl"], r["batch"], r["heads"], r["seq_len"], r["head_dim"], r["dtype"],
                bool(r["causal"]), bool(r["backward"]), r["kv_heads"])
        free = cached_free_bytes(r)
        try:
            p = attnmem.calc.attention_peak_bytes(*args, expandable=exp, cached_free_bytes=free)
            q = attnmem.calc.attention_reserved_bytes(*args, expandable=exp, cached_free_bytes=free)
        except (ValueError, KeyError) as exc:
            worst.append((float("inf"), f"{r['impl']}: {exc}"))
            continue
        e = (p - r["peak_extra_bytes"]) / r["peak_extra_bytes"]
        re = None
        measured_res = r.get("reserved_extra_bytes")
        if measured_res is not None and measured_res + input_slack(r, exp) < r["peak_extra_bytes"]:
            not_empty += 1  # the call used cached segments: the cache was not empty before it
        if q is not None and measured_res:
            re = (q - measured_res) / max(measured_res, 1 << 20)
        key = (r["impl"], "fwd+bwd" if r["backward"] else "fwd")
        acc = out.setdefault(key, [0, 0.0, 0.0, 0.0, 0])
        acc[0] += 1
        if r["seq_len"] >= 1024:
            acc[1] = max(acc[1], abs(e))
        else:
            acc[2] = max(acc[2], abs(e))
        if re is not None:
            acc[3] = max(acc[3], abs(re))
            acc[4] += 1
        worst.append((abs(e), f"{r['impl']} {key[1]} B={r['batch']} H={r['heads']}/"
                              f"{r['kv_heads']} s={r['seq_len']} d={r['head_dim']} {r['dtype']}"
                              f"{' causal' if r['causal'] else ''}{' expandable' if exp else ''}: "
                              f"measured {r['peak_extra_bytes']:,} model {p:,} ({100 * e:+.3f}%)"
                              f"; reserved {r.get('reserved_extra_bytes') or 0:,} model "
                              f"{'-' if q is None else f'{q:,}'}"))
    lines = [f"{'impl':<15}{'mode':<8}{'rows':>5}{'peak s>=1024':>14}{'peak s<1024':>13}"
             f"{'reserved':>10}{'(rows)':>7}"]
    for (impl, mode), (n, big, small, res, nres) in out.items():
        lines.append(f"{impl:<15}{mode:<8}{n:>5}{100 * big:>13.3f}%{100 * small:>12.3f}%"
                     f"{100 * res:>9.2f}%{nres:>7}")
    lines.append(f"{not_empty} rows grew the reservation by less than they allocated beyond "
                 "the inputs' free segment space: the cache was not empty before their call "
                 "(predicted with cached_free_bytes = reserved before - allocated before); "
                 "reserved errors are relative to at least 1 MiB")
    lines.append("worst rows:")
    lines += [f"  {text}" for _, text in sorted(worst, reverse=True)[:10]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check is not None:
        print(check(args.check))
        return 0
    impls = default_impls() if args.impl is None else [x.strip() for x in args.impl.split(",")
                                                        if x.strip()]
    unknown = [n for n in impls if n not in registry.NAMES]
    if unknown:
        print(f"error: unknown implementation(s) {', '.join(unknown)}; known: "
              f"{', '.join(registry.NAMES)}", file=sys.stderr)
        return 2
    if args.expandable:
        pts = points(impls, EXPANDABLE_SHAPES, ("bf16",))
        env = {"PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE_CONF}
        path = args.out / OUT_NAME_EXPANDABLE
        note = f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE_CONF}"
    else:
        pts = points(impls, SHAPES)
        env = {"PYTORCH_CUDA_ALLOC_CONF": ""}  # the default allocator, whatever the caller set
        path = args.out / OUT_NAME
        note = ""
    if args.list:
        for p in pts:
            print(p.label())
        print(f"{len(pts)} points -> {path}")
        return 0
    options = BenchOptions(warmup_ms=2.0, rep_ms=5.0, time_it=args.time,
                           max_predicted_bytes=int(args.max_gb * 1e9))
    args.out.mkdir(parents=True, exist_ok=True)
    n_ok = 0
    t0 = time.monotonic()
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\r\n")
        w.writerow(COLUMNS)
        fh.flush()

        def on_result(res: PointResult, i: int, n: int) -> None:
            nonlocal n_ok
            row = res.to_row()
            if note:
                row["message"] = "; ".join(x for x in (note, row["message"]) if x)
            w.writerow(["" if row[c] is None else neutralise(row[c]) for c in COLUMNS])
            fh.flush()
            n_ok += res.status == "ok"
            err = f"{100 * res.rel_error:+.2f}%" if res.rel_error is not None else ""
            print(f"[{i + 1}/{n} {time.monotonic() - t0:6.1f}s] {res.impl} {res.mode} "
                  f"B={res.batch} H={res.heads}/{res.kv_heads} s={res.seq_len} d={res.head_dim} "
                  f"{res.dtype}{' causal' if res.causal else ''}: {res.status} {err}",
                  file=sys.stderr, flush=True)

        try:
            run_points(pts, options=options, on_result=on_result, timeout_s=args.timeout,
                       lock_wait_s=args.lock_wait, deadline_s=args.deadline, env=env,
                       skip_longer_after_oom=False,
                       impl_module=None if args.no_prewarm else "attnmem.measure.prewarm")
        except GpuBusy as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(f"{n_ok} of {len(pts)} points ok in {time.monotonic() - t0:.1f} s; rows in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
