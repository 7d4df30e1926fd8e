# Measured: split-KV decode, the first split rule (4 waves, combine kernel) vs the one-wave rule
# (fused combine at 2-4 chunks, the combine kernel from 5), per shape of the decode preset,
# against cuDNN and SDPA's flash; and either combine forced at the one-wave rule's chunks.
"""A/B timing of the split-KV decode path (attnmem/kernels/flash/decode.py): its split rules
and combines against each other and the fastest peers, per shape, in one process, on a GPU.

    python -m attnmem.kernels.dev.ab_decode [--shapes B/CACHE/NEW ...] [--rounds 3]
        [--fa4] [--rep-ms 25] [--out DIR]
    python -m attnmem.kernels.dev.ab_decode --predict ROWS.csv   # no GPU

Shapes are the decode preset's (attnmem.measure.bench.decode.DECODE_SHAPES: Llama-3-8B's
heads H = 32, H_kv = 8, d = 128, bf16, B 1-64, cache 1k-128k, 1 and 8 new queries, causal
bottom-right) unless ``--shapes`` names others. Candidates, each
`decode_attention(q, k, v, None, causal=True, ...)` on the same inputs:

- ``old``: the first rule (S = floor(4·132 / P), ``waves=4``) with the second combine
  kernel: the path as it was before the one-wave rule and the fused combine;
- ``new``: the default (S = floor(132 / P), the combine fused at 2-4 chunks where the tile
  allows, the combine kernel from 5: `attnmem.calc.decode_split.fused_combine`);
- ``new_kernel``: the new S with the combine kernel everywhere;
- ``new_fused``: the new S with the fused combine everywhere (the default before the
  chunk threshold): with ``new_kernel``, both sides of the threshold at every split shape;
- ``old_fused``: the old S with the fused combine (what the rule alone changes);
- ``s1``: no split (one program per (batch, key/value head), one launch), up to 8,192 keys:
  whether short caches should not be split at all (the alternative rule the one-wave rule
  was chosen over);
- peers ``sdpa_cudnn`` and ``sdpa_flash`` (the fastest peers of every shape of the preset's
  first run) and with ``--fa4`` FlashAttention-4 (automatic splits), built as the preset
  builds them (`attnmem.measure.bench.decode._callables`).

A candidate whose (chunks, combine) equals an earlier one's at a shape is not timed again
(its cell repeats that time, marked "="). Each output is checked against an fp32 reference
(relative L2 error <= 2e-2) before it is timed. Times: triton.testing.do_bench medians (L2
flushed before each call, ``--rep-ms`` of repeats), ``--rounds`` interleaved rounds (every
candidate in turn, per round), the median of the rounds, as the preset times. Then per
candidate the median and worst of (fastest peer / candidate) over the shapes and the count
at >= 1.00, and new / old per shape; and the wall time per call of back-to-back calls at
B = 1, 1k keys, one query (old, new_kernel, new: host-bound there, so it is the host
path's cost with one or two launches). ``--out DIR`` writes ab_decode.csv and ab_decode.txt.

``--predict ROWS.csv`` (no GPU) reads an earlier run's rows and prints, per shape, what the
default rule runs now (chunks, fused) and the time a row of that run measured for the same
(chunks, fused), so a change of the rule is predicted from measured columns before it is
timed (`predict`).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import time

#: candidate -> (waves of the split rule or None for no split, combine)
CANDIDATES = {"old": (4, "kernel"), "new": (1, None), "new_kernel": (1, "kernel"),
              "new_fused": (1, "fused"), "old_fused": (4, "fused"), "s1": (None, None)}
#: s1 is timed up to this many key tiles (8,192 keys at d <= 128): past it B·H_kv programs
#: alone would walk the cache at a few SMs' bandwidth, a known loss not worth GPU time
S1_MAX_TILES = 64
PEERS = ("sdpa_cudnn", "sdpa_flash")
REL_ERR_MAX = 2e-2


def parse_shape(text: str):
    """B/CACHE/NEW in whole numbers >= 1, as a DecodeShape (H = 32, H_kv = 8, d = 128, bf16)."""
    from attnmem.measure.bench.decode import DecodeShape

    try:
        b, c, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be B/CACHE/NEW in whole numbers, e.g. 4/1024/8; got {text!r}") from None
    if min(b, c, n) < 1 or n > c:
        raise argparse.ArgumentTypeError(
            f"shape {text!r}: B, CACHE, NEW >= 1 with NEW <= CACHE")
    return DecodeShape(b, c, n)


def candidates(sh) -> list[str]:
    """The candidates of shape ``sh``: all, s1 only up to S1_MAX_TILES key tiles."""
    from attnmem.calc.decode_split import decode_block_n

    long = -(-sh.cache // decode_block_n(sh.head_dim)) > S1_MAX_TILES
    return [c for c in CANDIDATES if not (c == "s1" and long)]


def candidate_kwargs(sh, name: str) -> tuple[dict, tuple[int, bool]]:
    """decode_attention's keywords for candidate ``name`` at shape ``sh``, and what it runs:
    (chunks, fused combine)."""
    from attnmem.kernels.flash.decode import plan_for

    waves, combine = CANDIDATES[name]
    kwargs: dict = {"splits": 1} if waves is None else {"waves": waves}
    if combine is not None:
        kwargs["combine"] = combine
    plan = plan_for(sh.batch, sh.heads, sh.kv_heads, sh.new, sh.cache, sh.head_dim, **kwargs)
    return kwargs, (plan.splits, plan.fused)


def time_call(call, ref, rep_ms: int) -> tuple[float, str]:
    """(µs, status) of one round: the output checked against ``ref``, then do_bench's median."""
    import torch
    from triton.testing import do_bench

    try:
        with torch.no_grad():
            got = call()
            rel = float((got.float() - ref).norm() / ref.norm())
            if not rel <= REL_ERR_MAX:
                return math.nan, f"wrong: rel err {rel:.2g}"
            ms = do_bench(call, warmup=5, rep=rep_ms, return_mode="median")
        return ms * 1e3, "ok"
    except torch.OutOfMemoryError:
        return math.nan, "oom"
    except Exception as exc:  # noqa: BLE001 - a refusal or a compile failure (Triton's
        # OutOfResources is no RuntimeError) is this candidate's status, not the run's end
        return math.nan, (f"unsupported: {type(exc).__name__}: "
                          + (str(exc).splitlines() or [""])[0][:80])


def host_wall_us(call, n: int = 400) -> float:
    """Wall time per call of ``n`` back-to-back calls (one synchronisation at the end)."""
    import torch

    with torch.no_grad():
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def run(shapes, rounds: int, fa4: bool, rep_ms: int, log=print, device: str = "cuda",
        timer=None) -> list[dict]:
    """One row per (shape, candidate or peer): µs (median of rounds), status, chunks, fused.
    ``timer(call, ref)`` -> (µs, status) replaces `time_call` (the CPU test of this probe
    under Triton's interpreter, which checks every candidate's output instead)."""
    import torch

    from attnmem.kernels.flash.decode import decode_attention
    from attnmem.measure import registry
    from attnmem.measure.bench.decode import _callables, _reference

    fa4_state: dict = {} if fa4 else {"fa4": "not asked (--fa4)"}
    peers = PEERS + (("fa4",) if fa4 else ())
    rows: list[dict] = []
    for sh in shapes:
        dtype = registry.torch_dtype(sh.dtype)
        g = torch.Generator(device=device).manual_seed(sh.batch * 7919 + sh.cache + sh.new)
        q = torch.randn(sh.batch, sh.heads, sh.new, sh.head_dim, device=device, dtype=dtype,
                        generator=g)
        k, v = (torch.randn(sh.batch, sh.kv_heads, sh.cache, sh.head_dim, device=device,
                            dtype=dtype, generator=g) for _ in range(2))
        ref = _reference(q, k, v, True)
        built = _callables(sh, q, k, v, fa4_state)
        calls: dict[str, object] = {p: built[p] if isinstance(built[p], str) else built[p][0]
                                    for p in peers}
        runs: dict[str, tuple[int, bool]] = {}
        alias: dict[str, str] = {}  # candidate -> the earlier one that runs the same
        first: dict[tuple[int, bool], str] = {}
        for name in candidates(sh):
            kw, what = candidate_kwargs(sh, name)
            runs[name] = what
            if what in first:
                alias[name] = first[what]
                continue
            first[what] = name
            calls[name] = (lambda kw=kw, q=q, k=k, v=v:
                           decode_attention(q, k, v, None, causal=True, **kw))
        got: dict[str, list] = {name: [] for name in calls}
        for _ in range(rounds):
            for name, call in calls.items():
                got[name].append((math.nan, call) if isinstance(call, str)
                                 else timer(call, ref) if timer is not None
                                 else time_call(call, ref, rep_ms))
        for name in (*candidates(sh), *peers):
            src = alias.get(name, name)
            res = got[src]
            bad = next((r for r in res if r[1] != "ok"), None)
            us = math.nan if bad else statistics.median(r[0] for r in res)
            chunks, fused = runs.get(name, (None, None))
            rows.append(dict(batch=sh.batch, cache=sh.cache, new=sh.new, impl=name, us=us,
                             status=bad[1] if bad else "ok", chunks=chunks, fused=fused,
                             same_as=alias.get(name, "")))
            log(f"{name:11s} B={sh.batch:<3d} cache={sh.cache:<7d} new={sh.new} "
                f"{us:9.1f} us  S={chunks} fused={fused} {rows[-1]['status']}"
                + (f" (= {alias[name]})" if name in alias else ""))
        del q, k, v, ref, calls, built
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def timing_plan(shapes, rounds: int, fa4: bool) -> tuple[list[str], int]:
    """Without a GPU: per shape the chunks of old and new and the candidates timed (the rest
    repeat one of them), and the number of do_bench calls a run makes."""
    peers = len(PEERS) + (1 if fa4 else 0)
    lines, calls = [], 0
    for sh in shapes:
        first: dict = {}
        timed = []
        for name in candidates(sh):
            _, what = candidate_kwargs(sh, name)
            if what not in first:
                first[what] = name
                timed.append(f"{name} (S={what[0]}{', fused' if what[1] else ''})")
        calls += (len(timed) + peers) * rounds
        lines.append(f"{sh.label()}: " + ", ".join(timed))
    return lines, calls


def host_rows(log=print) -> list[dict]:
    """Back-to-back wall time per call at B = 1, 1k keys, one query (host-bound there)."""
    import torch

    from attnmem.kernels.flash.decode import decode_attention
    from attnmem.measure.bench.decode import DecodeShape

    sh = DecodeShape(1, 1024, 1)
    q = torch.randn(1, sh.heads, 1, sh.head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, sh.kv_heads, sh.cache, sh.head_dim, device="cuda",
                        dtype=torch.bfloat16) for _ in range(2))
    out = []
    for name in ("old", "new_kernel", "new"):
        kw, (chunks, fused) = candidate_kwargs(sh, name)
        walls = [host_wall_us(lambda kw=kw: decode_attention(q, k, v, None, causal=True, **kw))
                 for _ in range(3)]
        out.append(dict(impl=name, wall_us=min(walls), chunks=chunks, fused=fused))
        log(f"host {name:11s} S={chunks} fused={fused}: {min(walls):.1f} us per call "
            "back to back")
    return out


def ratios(rows: list[dict]) -> dict[tuple, dict[str, float]]:
    """(B, cache, new) -> candidate -> fastest peer's time / candidate's."""
    by: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r["status"] == "ok":
            by.setdefault((r["batch"], r["cache"], r["new"]), {})[r["impl"]] = r["us"]
    out = {}
    for key, t in by.items():
        best = min((x for p, x in t.items() if p not in CANDIDATES), default=math.nan)
        out[key] = {c: best / t[c] for c in CANDIDATES if c in t}
    return out


def report(rows: list[dict], host: list[dict]) -> str:
    """Markdown: µs per shape and candidate, fastest peer, fastest / candidate; a summary."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    by = {(r["batch"], r["cache"], r["new"], r["impl"]): r for r in rows}
    keys = sorted({(r["batch"], r["cache"], r["new"]) for r in rows})
    rat = ratios(rows)
    head = ["B", "cache", "new", "S old/new", *impls, "fastest/old", "fastest/new", "new/old"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key in keys:
        s_old = by.get((*key, "old"), {}).get("chunks")
        s_new = by.get((*key, "new"), {}).get("chunks")
        cells = [str(x) for x in key] + [f"{s_old}/{s_new}"]
        for name in impls:
            r = by.get((*key, name))
            cells.append("-" if r is None else (f"{r['us']:.1f}" + ("=" if r["same_as"] else ""))
                         if r["status"] == "ok" else r["status"].split(":")[0])
        x = rat.get(key, {})
        old, new = by.get((*key, "old")), by.get((*key, "new"))
        speed = old["us"] / new["us"] if old and new and old["status"] == new["status"] == "ok" \
            else math.nan
        cells += [f"{x.get('old', math.nan):.2f}", f"{x.get('new', math.nan):.2f}",
                  f"{speed:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for c in CANDIDATES:
        xs = sorted(v[c] for v in rat.values() if c in v and not math.isnan(v[c]))
        if xs:
            lines.append(f"- {c}: fastest peer / {c} over {len(xs)} shapes: median "
                         f"{statistics.median(xs):.2f}, worst {xs[0]:.2f}, "
                         f"{sum(x >= 1.0 for x in xs)} at >= 1.00")
    speed = [by[(*k, "old")]["us"] / by[(*k, "new")]["us"] for k in keys
             if by.get((*k, "old"), {}).get("status") == "ok"
             and by.get((*k, "new"), {}).get("status") == "ok"]
    if speed:
        gm = math.exp(sum(math.log(x) for x in speed) / len(speed))
        lines.append(f"- new / old speed: geometric mean {gm:.3f} over {len(speed)} shapes, "
                     f"range {min(speed):.2f}-{max(speed):.2f}")
    for h in host:
        lines.append(f"- host, B = 1, 1k keys, one query, back to back: {h['impl']} "
                     f"(S = {h['chunks']}, fused {h['fused']}) {h['wall_us']:.1f} µs per call")
    return "\n".join(lines)


def read_rows(path: str) -> list[dict]:
    """Rows of an earlier run's ab_decode.csv (or the bundled
    data/kernel_speed_decode_ab_h100.csv), typed as `run` returns them."""
    need = {"batch", "cache", "new", "impl", "us", "status", "chunks", "fused"}
    with open(path, newline="") as f:
        raw = list(csv.DictReader(f))
    if not raw or not need <= set(raw[0]):
        raise ValueError(f"{path}: not ab_decode rows (need columns {sorted(need)}, got "
                         f"{sorted(raw[0]) if raw else 'no rows'})")
    out = []
    for r in raw:
        out.append(dict(batch=int(r["batch"]), cache=int(r["cache"]), new=int(r["new"]),
                        impl=r["impl"], us=float(r["us"]) if r["us"] else math.nan,
                        status=r["status"], chunks=int(r["chunks"]) if r["chunks"] else None,
                        fused={"True": True, "False": False}.get(r["fused"]),
                        same_as=r.get("same_as", "")))
    return out


def predict(rows: list[dict]) -> tuple[list[dict], str]:
    """Per shape of ``rows`` (an earlier run, the preset's heads H = 32, H_kv = 8, d = 128):
    what the default rule runs now (`candidate_kwargs` of ``new``: chunks, fused) and the time
    a candidate of that run measured with the same (chunks, fused), the fastest peer, and
    fastest / predicted; then the median and worst over the shapes. A shape whose path no
    candidate timed is predicted as nan (named in the text)."""
    from attnmem.measure.bench.decode import DecodeShape

    by: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by.setdefault((r["batch"], r["cache"], r["new"]), {})[r["impl"]] = r
    out, lines = [], ["| B | cache | new | S | fused | from | then new µs | predicted µs "
                      "| fastest peer µs | fastest/predicted |", "|" + " --- |" * 10]
    for key in sorted(by):
        t = by[key]
        _, (chunks, fused) = candidate_kwargs(DecodeShape(*key), "new")
        src = next((c for c in CANDIDATES if c in t and t[c]["status"] == "ok"
                    and t[c]["chunks"] == chunks and bool(t[c]["fused"]) == fused), None)
        us = t[src]["us"] if src else math.nan
        best = min((r["us"] for p, r in t.items() if p not in CANDIDATES
                    and r["status"] == "ok"), default=math.nan)
        then = t["new"]["us"] if "new" in t and t["new"]["status"] == "ok" else math.nan
        out.append(dict(batch=key[0], cache=key[1], new=key[2], chunks=chunks, fused=fused,
                        source=src or "", us=us, then_new_us=then, fastest_us=best,
                        ratio=best / us))
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {chunks} | {fused} | {src or 'none'} "
                     f"| {then:.1f} | {us:.1f} | {best:.1f} | {best / us:.2f} |")
    xs = sorted(r["ratio"] for r in out if not math.isnan(r["ratio"]))
    was = sorted(r["fastest_us"] / r["then_new_us"] for r in out
                 if not math.isnan(r["fastest_us"] / r["then_new_us"]))
    lines.append("")
    if xs:
        lines.append(f"- predicted fastest peer / new over {len(xs)} shapes: median "
                     f"{statistics.median(xs):.2f}, worst {xs[0]:.2f}, "
                     f"{sum(x >= 1.0 for x in xs)} at >= 1.00")
    if was:
        lines.append(f"- measured then (that run's new): median {statistics.median(was):.2f}, "
                     f"worst {was[0]:.2f}, {sum(x >= 1.0 for x in was)} at >= 1.00")
    missing = [r for r in out if not r["source"]]
    if missing:
        lines.append("- not predicted (no candidate timed that path): " + ", ".join(
            f"B={r['batch']} cache={r['cache']} new={r['new']}" for r in missing))
    return out, "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=parse_shape, nargs="+", metavar="B/CACHE/NEW",
                    help="default: the decode preset's 30 shapes")
    ap.add_argument("--rounds", type=int, choices=range(1, 11), default=3, metavar="1..10")
    ap.add_argument("--rep-ms", type=int, choices=range(5, 201), default=25, metavar="5..200",
                    help="do_bench's repeat time per candidate and round (default 25 ms)")
    ap.add_argument("--fa4", action="store_true", help="time FlashAttention-4 too")
    ap.add_argument("--out", metavar="DIR", help="write ab_decode.csv and ab_decode.txt (the Markdown table) here")
    ap.add_argument("--plan", action="store_true",
                    help="print what would be timed per shape and the do_bench calls; no GPU")
    ap.add_argument("--predict", metavar="ROWS.csv",
                    help="predict the default rule's times from an earlier run's rows; no GPU")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import torch
    import triton

    from attnmem.measure.bench.decode import DECODE_SHAPES

    args = parse_args(argv)
    shapes = args.shapes or list(DECODE_SHAPES)
    if args.predict:
        try:
            print(predict(read_rows(args.predict))[1])
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--predict: {exc}") from None
        return 0
    if args.plan:
        lines, calls = timing_plan(shapes, args.rounds, args.fa4)
        print("\n".join(lines) + f"\n{calls} do_bench calls of about {args.rep_ms + 10} ms "
              "and more (a slow call repeats at least 5 times)")
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this times GPU kernels")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}; {len(shapes)} shapes, {args.rounds} rounds", flush=True)
    t0 = time.perf_counter()
    rows = run(shapes, args.rounds, args.fa4, args.rep_ms)
    host = host_rows()
    text = report(rows, host)
    print("\n" + text + f"\n\n({time.perf_counter() - t0:.0f} s)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ab_decode.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        with open(os.path.join(args.out, "ab_decode.txt"), "w") as f:
            f.write(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
                    f"{triton.__version__}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
