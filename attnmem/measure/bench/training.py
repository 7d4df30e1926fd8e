"""``python -m attnmem.measure.bench --preset training``: the shapes training runs at (issue 31, item 4),
packed batches beside dense ones, and the summary over the grid.

The grid (``DENSE``, 36 shapes, and ``PACKED``, 4 batches) spreads over what a training step
feeds attention: head dim 64 and 128, MHA (H_kv = 32) and GQA 4:1 (H_kv = 8) at H = 32, causal
and not, bf16 and fp16, s from 512 to 32,768 with B = tokens / s for B*s of 8k to 128k tokens,
lengths that are not powers of two (1,536, 3,000, 6,000), and the six anchor shapes of the
issue and the H200 anchor figures (B = 1, s >= 4,096; two of them 4k tokens, the only shapes
under 8k). ``attnmem.measure.bench.speed`` parses the dense ones into its ``Shape``; every
(dtype, d, H_kv, causal, s) appears once, so ``speed_results.Row.key`` (which has no batch)
names each row's shape alone.

Packed batches (``PackedBatch``): sequences of mixed lengths drawn with a fixed seed from
``LENGTH_POOL`` until they reach a target total, concatenated into one (total, H, d) tensor
with int32 cumulative starts, causal, bf16. Each implementation runs its own variable-length
path on the same tensors:

- ours: ``flash_attention(q, k, v, causal, cu_seqlens=cu)`` in FlashAttention's (total, H, d)
  varlen layout (attnmem/kernels/flash/api.py); ``triton_generic`` forces the portable packed forward
  (``KernelConfig(sm90=False)``) beside the route's choice, ``triton_sm90_3wg`` the Hopper
  packed forward with three warpgroups (d = 64), ``triton_sm90_bwd`` / ``triton_portable_bwd``
  the Hopper / the portable packed backward (``KernelConfig(sm90_bwd=True / False)``);
  ``--packed-only`` times these batches
  without the dense grid;
- ``fa4``: ``flash_attn.cute.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
  max_seqlen_q, max_seqlen_k, causal=...)`` (``registry.fa4_varlen``; signature from
  Dao-AILab/flash-attention, flash_attn/cute/interface.py);
- SDPA backends: nested tensors with the jagged layout
  (``torch.nested.nested_tensor_from_jagged`` on the same values and offsets, seen as
  (B, H, j, d)) under ``sdpa_kernel(backend)``, as torch/nested/_internal/sdpa.py dispatches
  them: flash and memory-efficient take ``is_causal``, the math backend refuses causal nested
  inputs, cuDNN depends on the torch build. A backend that refuses gets an "unavailable: ..."
  row with its reason; GQA goes through ``enable_gqa`` and, where a backend refuses that, with
  k and v repeated to H heads inside the timed call (said on stdout).

Every output is checked against the reference run on each sequence alone (dense SDPA, else
eager) before it gets a time, as the dense rows are. In the CSV a packed row has batch = the
number of sequences, seq_len = the packed total, and its lengths in the extra column
``packed_lengths`` (empty for dense rows; ``speed_results.read_rows`` ignores it); its TFLOP/s
are the sum over sequences of attnmem.calc.attention_flops.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from attnmem.measure.bench import impls

__all__ = ["ANCHORS", "DENSE", "LENGTH_POOL", "PACKED", "PackedBatch", "estimate_seconds",
           "packed_flops", "read_packed_column", "summarize", "summary_lines"]

#: The anchor shapes (B = 1), as ``speed.Shape.spec`` writes them: issue 31's table and the
#: kernel table of the H200 anchor figures (bf16).
ANCHORS: tuple[str, ...] = (
    "bf16/128/4096/b=1", "bf16/128/4096/causal/b=1", "bf16/128/16384/b=1",
    "bf16/128/16384/causal/b=1", "bf16/64/8192/causal/b=1", "bf16/128/8192/causal/kv=8/b=1")

#: The 30 training shapes beyond the anchors: every (dtype, d, MHA | GQA, causal) cell of the
#: 2 x 2 x 2 x 2 cube has one to three, s and B = tokens / s spread over 512..32,768 and
#: 8k..128k tokens (cost, B * s^2, kept near that of s = 16,384 at B = 1 or below).
_TRAINING: tuple[str, ...] = (
    # bf16, d = 128
    "bf16/128/1024/b=16", "bf16/128/3000/b=8",
    "bf16/128/1024/causal/b=8", "bf16/128/32768/causal/b=1",
    "bf16/128/2048/kv=8/b=16", "bf16/128/6000/kv=8/b=4",
    "bf16/128/1536/causal/kv=8/b=32", "bf16/128/4096/causal/kv=8/b=16",
    # bf16, d = 64
    "bf16/64/512/b=64", "bf16/64/8192/b=4",
    "bf16/64/1024/causal/b=128", "bf16/64/3000/causal/b=16",
    "bf16/64/2048/kv=8/b=8",
    "bf16/64/512/causal/kv=8/b=256", "bf16/64/4096/causal/kv=8/b=4",
    # fp16, d = 128
    "fp16/128/2048/b=8",
    "fp16/128/1536/causal/b=8", "fp16/128/8192/causal/b=8",
    "fp16/128/1024/kv=8/b=32", "fp16/128/3000/kv=8/b=32",
    "fp16/128/512/causal/kv=8/b=128", "fp16/128/16384/causal/kv=8/b=2",
    # fp16, d = 64
    "fp16/64/6000/b=2", "fp16/64/1024/b=64",
    "fp16/64/2048/causal/b=64", "fp16/64/8192/causal/b=2",
    "fp16/64/4096/kv=8/b=8", "fp16/64/512/kv=8/b=16",
    "fp16/64/1536/causal/kv=8/b=16", "fp16/64/6000/causal/kv=8/b=16",
)

#: The dense shapes of the preset, in run order (anchors first).
DENSE: tuple[str, ...] = ANCHORS + _TRAINING

#: Sequence lengths a packed batch draws from: short chat turns to long documents, with lengths
#: on and off the kernels' tile edges (64, 128).
LENGTH_POOL: tuple[int, ...] = (97, 128, 256, 384, 512, 700, 1024, 1536, 2048, 3000, 4096,
                                6000, 8192)


@dataclass(frozen=True)
class PackedBatch:
    """One packed batch: sequences of ``lengths`` back to back, attention inside each."""

    name: str
    dtype: str  # fp16 | bf16
    head_dim: int
    kv_heads: int | None  # None: MHA (the run's --heads)
    lengths: tuple[int, ...]
    causal: bool = True

    @property
    def total(self) -> int:
        return sum(self.lengths)

    def starts(self) -> list[int]:
        """cu_seqlens as a list: 0, then the running sums (n + 1 entries)."""
        out = [0]
        for n in self.lengths:
            out.append(out[-1] + n)
        return out

    def describe(self) -> str:
        kv = f", H_kv={self.kv_heads}" if self.kv_heads else ""
        return (f"{self.name}: {self.dtype} d={self.head_dim}{kv}, {len(self.lengths)} sequences, "
                f"{self.total} tokens, longest {max(self.lengths)}"
                f"{', causal' if self.causal else ''}")


def draw_lengths(seed: int, target: int, longest: int) -> tuple[int, ...]:
    """Lengths drawn (``random.Random(seed)``, uniform over ``LENGTH_POOL`` entries up to
    ``longest``) until their sum reaches ``target``: a total from target to target + longest - 1.
    """
    pool = [n for n in LENGTH_POOL if n <= longest]
    if target < 1 or not pool:
        raise ValueError(f"target must be >= 1 and longest >= {LENGTH_POOL[0]}, got target="
                         f"{target}, longest={longest}")
    rng = random.Random(seed)
    out: list[int] = []
    while sum(out) < target:
        out.append(rng.choice(pool))
    return tuple(out)


#: The four packed batches: causal bf16, d = 128 and 64, MHA and GQA 4:1, 16k to 64k tokens.
PACKED: tuple[PackedBatch, ...] = (
    PackedBatch("packed-a", "bf16", 128, None, draw_lengths(1, 16_000, 4096)),
    PackedBatch("packed-b", "bf16", 128, 8, draw_lengths(2, 32_000, 8192)),
    PackedBatch("packed-c", "bf16", 64, None, draw_lengths(3, 56_000, 8192)),
    PackedBatch("packed-d", "bf16", 64, 8, draw_lengths(4, 24_000, 2048)),
)


def packed_flops(batch: PackedBatch, heads: int, mode: str) -> int:
    """FLOPs of one packed call: attnmem.calc.attention_flops of each sequence alone, summed."""
    from attnmem.calc import attention_flops

    return sum(attention_flops(1, heads, n, batch.head_dim, causal=batch.causal,
                               backward=mode == "fwd_bwd") for n in batch.lengths)


# --------------------------------------------------------------------------------------------
# The packed implementations: fn(q, k, v, causal) -> out on (total, H, d) tensors.
# --------------------------------------------------------------------------------------------


def packed_fn(name: str, cu, lengths: Sequence[int], device: str = "cuda"):
    """fn(q, k, v, causal) -> out for implementation ``name`` on one packed batch: q (total, H,
    d), k and v (total, H_kv, d), ``cu`` the int32 starts on their device. KeyError for a
    name with no packed path here."""
    from attnmem.measure import registry

    longest = max(lengths)
    if name in impls.CONFIGS:
        from attnmem.kernels.flash.api import flash_attention

        # "triton": the route's forward and backward (the Hopper packed ones where they
        # apply); "triton_generic": the portable packed forward; "triton_sm90_3wg": the Hopper
        # packed forward with three warpgroups (d = 64 only: the call refuses other head
        # dims); "triton_sm90_bwd" / "triton_portable_bwd": the route's forward with the
        # Hopper / the portable packed backward forced
        config = impls.CONFIGS[name]
        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal, cu_seqlens=cu,
                                                       config=config)
    if name == "fa4":
        return lambda q, k, v, causal: registry.fa4_varlen(q, k, v, cu, longest, causal)
    if name in registry.SDPA_BACKENDS:
        return _nested_sdpa(name, cu, lengths)
    raise KeyError(f"no packed path for {name!r}")


def _nested_sdpa(name: str, cu, lengths: Sequence[int], expand_kv: bool = False):
    """SDPA backend ``name`` on nested (jagged) views of packed (total, H, d) tensors, each
    call building the views from the same offsets (so they share one ragged size), under
    ``sdpa_kernel``; returns the (total, H, d) values. ``expand_kv`` repeats k, v to H heads
    (inside the call) instead of ``enable_gqa``."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnmem.measure import registry

    backend = getattr(SDPBackend, registry.SDPA_BACKENDS[name])
    offsets = cu.to(torch.int64)
    lo, hi = min(lengths), max(lengths)

    def nest(t):  # (total, h, d) -> nested (B, h, j, d), a view of t
        return torch.nested.nested_tensor_from_jagged(t, offsets, min_seqlen=lo,
                                                      max_seqlen=hi).transpose(1, 2)

    def fn(q, k, v, causal):
        gqa = k.shape[1] != q.shape[1]
        if gqa and expand_kv:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            gqa = False
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(nest(q), nest(k), nest(v), is_causal=causal,
                                                 enable_gqa=gqa)
        return out.transpose(1, 2).values()  # (total, H, d)

    return fn


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text[:160]


#: The heading torch/nested/_internal/sdpa.py logs before each backend's reasons for refusing.
_NESTED_HEADINGS = {"sdpa_flash": "Flash attention", "sdpa_efficient": "Memory efficient",
                    "sdpa_math": "Math attention", "sdpa_cudnn": "cuDNN attention"}


def _refusal(name: str, said: Sequence[str]) -> list[str]:
    """From what a refused nested SDPA call logged and warned, in order, the lines under
    ``name``'s heading ("<backend> kernel not used because:"); all of them for other names."""
    heading = _NESTED_HEADINGS.get(name)
    if heading is None:
        return list(said)
    out, inside = [], False
    for line in said:
        if line.endswith("not used because:"):
            inside = line.startswith(heading)
        elif inside:
            out.append(line)
    return out


def _probe(fn, q, k, v, causal: bool, name: str = "") -> str:
    """'' when one forward call of ``fn`` runs, else why not: the error's first line and what
    the call logged or warned about ``name`` (torch's nested SDPA says why a backend refused
    through its logger and through warnings)."""
    import logging
    import warnings

    import torch

    said: list = []  # the warnings' list once recording starts: log lines join it in order

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    logger, keep = logging.getLogger("torch.nested._internal.sdpa"), Keep()
    try:
        with warnings.catch_warnings(record=True) as said, torch.no_grad():
            warnings.simplefilter("always")
            logger.addHandler(keep)
            try:
                fn(q, k, v, causal)
                return ""
            except ImportError as exc:  # fa4 not installed
                return _first_line(exc)
            except (RuntimeError, ValueError, AssertionError, NotImplementedError) as exc:
                text = [str(getattr(x, "message", x)).strip() for x in said]
                lines = [x.splitlines()[0] for x in text if x]
                return "; ".join([_first_line(exc)] + _refusal(name, lines)[:3])[:300]
    finally:
        logger.removeHandler(keep)


def run_packed(args, writer, sink, stamp: dict, versions: dict, device: str = "cuda") -> list:
    """Time every implementation of ``args.impls`` on every batch of ``args.packed`` and pass
    of ``args.modes`` (``args.rounds`` interleaved rounds, as the dense grid), writing each row
    to ``writer`` as it comes; returns the rows (``speed_results.Row``)."""
    import torch

    from attnmem.measure import registry
    from attnmem.measure.speed_results import Row
    from attnmem.measure.store import neutralise

    rows = []
    H = args.heads
    for batch in args.packed:
        d, causal, total = batch.head_dim, batch.causal, batch.total
        H_kv = batch.kv_heads or H
        lens = "+".join(str(n) for n in batch.lengths)
        print(batch.describe(), flush=True)
        gen = torch.Generator(device=device).manual_seed(total * 1000 + d)
        dt = registry.torch_dtype(batch.dtype)
        q, k, v, do = (torch.randn(total, h, d, device=device, generator=gen, dtype=dt)
                       for h in (H, H_kv, H_kv, H))
        for t in (q, k, v):
            t.requires_grad_()
        cu = torch.tensor(batch.starts(), dtype=torch.int32, device=device)
        ref = _reference(q, k, v, batch, device)
        fns, why = {}, {}
        for name in args.impls:
            try:
                fn = packed_fn(name, cu, batch.lengths, device)
            except KeyError as exc:
                fns[name], why[name] = None, str(exc)
                continue
            reason = _probe(fn, q, k, v, causal, name)
            if reason and name in registry.SDPA_BACKENDS and H_kv != H:
                expanded = _nested_sdpa(name, cu, batch.lengths, expand_kv=True)
                if not _probe(expanded, q, k, v, causal, name):
                    print(f"note: {name} refused enable_gqa on nested tensors ({reason}); timed "
                          "with k, v repeated to H heads inside the call", flush=True)
                    fn, reason = expanded, ""
            fns[name], why[name] = fn, reason
        for mode in args.modes:
            got: dict[str, list] = {n: [] for n in args.impls if fns[n] is not None
                                    and not why[n]}
            for _ in range(args.rounds):
                for name in got:
                    got[name].append(impls.measure(name, q, k, v, do, causal, mode, ref,
                                                   fn=fns[name]))
            for name in args.impls:
                if name in got:
                    ms, rel, status = impls.combine(got[name])
                else:
                    ms, rel, status = math.nan, math.nan, f"unavailable: {why[name]}"[:240]
                tf = packed_flops(batch, H, mode) / (ms * 1e-3) / 1e12
                rows.append(Row(name, batch.dtype, len(batch.lengths), H, total, d, causal, mode,
                                ms, tf, rel, status, **stamp, kv_heads=H_kv,
                                impl_version=versions.get(name, "")))
                record = {col: neutralise(val) for col, val in asdict(rows[-1]).items()}
                writer.writerow({**record, "packed_lengths": lens})
                sink.flush()
                print(f"{name:15s} {batch.name} {batch.dtype} d={d:3d} H_kv={H_kv:3d} "
                      f"{mode:7s} tokens={total:6d} {ms:9.4f} ms {tf:7.1f} TFLOP/s {status}",
                      flush=True)
        del q, k, v, do, ref
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def _reference(q, k, v, batch: PackedBatch, device: str):
    """The packed output computed on each sequence alone, fp32, (total, H, d): dense SDPA
    (cuDNN, else flash, else memory-efficient) on (1, H, s, d) slices, else eager."""
    import torch

    from attnmem.measure import registry

    starts = batch.starts()
    outs = []
    with torch.no_grad():
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            qs, ks, vs = (t[a:b].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            out = None
            for r in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient"):
                try:
                    out = impls.impl_fn(r)(qs, ks, vs, batch.causal)
                    break
                except RuntimeError:
                    continue
            if out is None:
                out = registry.naive(qs.float(), ks.float(), vs.float(), batch.causal)
            outs.append(out[0].transpose(0, 1).float())  # (s, H, d)
    return torch.cat(outs, dim=0)


# --------------------------------------------------------------------------------------------
# The summary over the grid.
# --------------------------------------------------------------------------------------------


def _shape_id(row) -> tuple:
    """A row's shape without the pass: (batch, dtype, head_dim, kv_heads, causal, seq_len)."""
    dtype, d, kv, causal, _mode, s = row.key
    return (row.batch, dtype, d, kv, causal, s)


def anchor_ids(heads: int = 32) -> set[tuple]:
    """The anchors as ``_shape_id`` tuples (batch 1; H_kv defaults to ``heads``)."""
    out = set()
    for spec in ANCHORS:
        parts = spec.split("/")
        kv = next((int(p[3:]) for p in parts if p.startswith("kv=")), heads)
        out.add((1, parts[0], int(parts[1]), kv, "causal" in parts, int(parts[2])))
    return out


def summarize(rows: Iterable, packed: set[tuple], peers: Sequence[str], ours: str = "triton",
              anchors: set[tuple] | None = None) -> list[dict]:
    """Our TFLOP/s over each peer's, per shape, grouped: one dict per (group, pass, peer) with
    ``n`` ratios (shapes where both rows are ok), ``of`` shapes in the group, their geometric
    mean, median, min and max (nan when n = 0). Groups: "dense" (shapes not in ``packed``),
    "packed" (``_shape_id`` in ``packed``), and "anchors" (in ``anchors``, also counted in
    dense). Order: dense, packed, anchors; fwd, fwd_bwd; peers as given."""
    rows = list(rows)
    anchors = anchor_ids(rows[0].heads if rows else 32) if anchors is None else anchors
    tf: dict[tuple, float] = {}
    shapes: dict[tuple, None] = {}
    for r in rows:
        sid = _shape_id(r)
        shapes[(sid, r.mode)] = None
        if r.status == "ok" and math.isfinite(r.tflops) and r.tflops > 0:
            tf[(r.impl, sid, r.mode)] = r.tflops
    out = []
    for group in ("dense", "packed", "anchors"):
        for mode in ("fwd", "fwd_bwd"):
            ids = [sid for sid, m in shapes if m == mode and (
                (sid in packed) if group == "packed" else
                (sid in anchors) if group == "anchors" else (sid not in packed))]
            if not ids:
                continue
            for peer in peers:
                vals = [tf[(ours, sid, mode)] / tf[(peer, sid, mode)] for sid in ids
                        if (ours, sid, mode) in tf and (peer, sid, mode) in tf]
                gm = math.exp(sum(math.log(x) for x in vals) / len(vals)) if vals else math.nan
                out.append(dict(group=group, mode=mode, peer=peer, n=len(vals), of=len(ids),
                                geomean=gm,
                                median=statistics.median(vals) if vals else math.nan,
                                min=min(vals, default=math.nan), max=max(vals, default=math.nan)))
    return out


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def summary_lines(rows: Sequence, packed: set[tuple], peers: Sequence[str],
                  ours: str = "triton") -> list[str]:
    """The run's last lines: each anchor's ratios, then the summary table (``summarize``)."""
    rows = list(rows)
    anchors = anchor_ids(rows[0].heads if rows else 32)
    tf = {(r.impl, _shape_id(r), r.mode): r.tflops for r in rows
          if r.status == "ok" and math.isfinite(r.tflops) and r.tflops > 0}
    lines = [f"Anchor shapes (B = 1), {ours} / peer, fwd | fwd+bwd:"]
    for sid in sorted(anchors, key=lambda s: (s[2], s[5], s[4], -s[3])):
        if not any(_shape_id(r) == sid for r in rows):
            continue
        cells = []
        for p in peers:
            pair = [tf[(ours, sid, m)] / tf[(p, sid, m)] if (ours, sid, m) in tf
                    and (p, sid, m) in tf else math.nan for m in ("fwd", "fwd_bwd")]
            cells.append(f"{p} {_fmt(pair[0])} | {_fmt(pair[1])}")
        _b, dtype, d, kv, causal, s = sid
        lines.append(f"  {dtype} d={d} H_kv={kv} s={s}{' causal' if causal else ''}: "
                     + ", ".join(cells))
    lines += ["", f"Over the grid, {ours} / peer (TFLOP/s ratio; n = shapes where both ran):", "",
              "| rows | pass | peer | n | geomean | median | min | max |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in summarize(rows, packed, peers, ours, anchors):
        lines.append(f"| {s['group']} | {'fwd+bwd' if s['mode'] == 'fwd_bwd' else 'fwd'} | "
                     f"{s['peer']} | {s['n']}/{s['of']} | {_fmt(s['geomean'])} | "
                     f"{_fmt(s['median'])} | {_fmt(s['min'])} | {_fmt(s['max'])} |")
    return lines


def packed_ids(batches: Iterable[PackedBatch], heads: int) -> set[tuple]:
    """``_shape_id`` of each packed batch's rows (batch = sequences, seq_len = total)."""
    return {(len(b.lengths), b.dtype, b.head_dim, b.kv_heads or heads, b.causal, b.total)
            for b in batches}


def read_packed_column(path) -> list[str]:
    """The ``packed_lengths`` column of a bench CSV, row by row ('' for dense rows and for
    CSVs without the column)."""
    import csv

    with open(path, newline="") as f:
        return [raw.get("packed_lengths") or "" for raw in csv.DictReader(f)]


# --------------------------------------------------------------------------------------------
# How long a run takes.
# --------------------------------------------------------------------------------------------

#: Assumptions of ``estimate_seconds``: the slowest peer's rate, host time per call, the
#: fixed cost of one ``do_bench`` (25 ms warm-up + 100 ms of timed calls, whatever the call's
#: length, plus setup), compile time per distinct kernel set, FA4's import (NOTES.md: about
#: 10 s). Compile times are set from the one run on record: the targets preset's bf16 half
#: (16 shapes, both passes, triton sdpa_cudnn sdpa_flash fa4, 3 rounds) took at most 142 s
#: on the H200 (2026-12-01, 17:39:43 to 17:42:05 UTC in data/kernel_speed_targets_eager_h200.csv,
#: import and compiles included); these constants give 145 s for it.
EST_TFLOPS = 400.0
EST_HOST_S = {"fwd": 1e-4, "fwd_bwd": 3e-4}
EST_BENCH_S = 0.15
EST_COMPILE_S = {"triton": 1.5, "triton_generic": 1.5, "fa4": 2.0}
EST_FA4_IMPORT_S = 10.0


def estimate_seconds(shapes: Sequence, packed: Sequence[PackedBatch], impls: Sequence[str],
                     modes: Sequence[str], rounds: int, heads: int = 32,
                     tflops: float = EST_TFLOPS) -> float:
    """Seconds a run should take: for each measurement, ``triton.testing.do_bench``'s calls
    (1 + 5 to estimate, then max(1, 25 ms / t) warm-up and max(1, 100 ms / t) timed; so
    about 7 t + max(t, 125 ms)) and the two checking forwards, each call at ``tflops``
    (attnmem.calc.attention_flops) plus host time; plus one compile per (implementation, dtype, d,
    causal, GQA, pass, packed) and FA4's import. ``shapes`` have .dtype, .head_dim, .seq_len,
    .causal, .kv_heads and .batch (None: 1)."""
    from attnmem.calc import attention_flops

    def call(flop, mode):
        return flop / (tflops * 1e12) + EST_HOST_S[mode]

    total = EST_FA4_IMPORT_S if "fa4" in impls else 0.0
    compiled = set()
    cases = []
    for sh in shapes:
        B, kv = sh.batch or 1, sh.kv_heads or heads
        cases.append((sh.dtype, sh.head_dim, sh.causal, kv != heads, False,
                      lambda m, sh=sh, B=B: attention_flops(B, heads, sh.seq_len, sh.head_dim,
                                                            causal=sh.causal,
                                                            backward=m == "fwd_bwd")))
    for b in packed:
        cases.append((b.dtype, b.head_dim, b.causal, (b.kv_heads or heads) != heads, True,
                      lambda m, b=b: packed_flops(b, heads, m)))
    for dtype, d, causal, gqa, is_packed, flop in cases:
        t_fwd = call(flop("fwd"), "fwd")
        for mode in modes:
            t = call(flop(mode), mode)
            per = 7 * t + max(t, EST_BENCH_S - 0.025) + 0.025 + 2 * t_fwd
            total += t_fwd + rounds * len(impls) * per  # + the reference forward
            for name in impls:
                key = (name, dtype, d, causal, gqa, mode, is_packed)
                if key not in compiled:
                    compiled.add(key)
                    total += EST_COMPILE_S.get(name, 0.0)
    return total
