"""The bundled speed-benchmark runs as the Kernel speed page offers them, and what it reads
from them: which CSV holds each timing and pass (with how it was timed, for the caption),
each read into a DataFrame (attnmem.measure.speed_results.read_rows), our default's ratio to a
peer at the longest s both ran, FlashAttention-4 from the run that timed it, and where
grouped-query rows were measured.

The CSVs are ``python -m attnmem.measure.bench``'s (data/kernel_speed_*_h200.csv);
ATTNMEM_BENCH_DIR points at another folder of them (tests, or a run of your own named as these
are), read at each call of `sources`, not at import.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from attnmem.measure.speed_results import OURS, PEERS, read_rows

DATA = Path(__file__).resolve().parents[2] / "data"
#: timing choice -> ({pass: CSV}, what the caption says about how it was timed)
Sources = dict[str, tuple[dict[str, Path], str]]
#: timing choice -> {pass: CSV} of the grouped-query rows
GqaSources = dict[str, dict[str, Path]]
PASS_WORDS = {"fwd": "forward", "fwd_bwd": "forward + backward"}


def bench_dir() -> Path:
    """The folder of bench CSVs: ATTNMEM_BENCH_DIR, else the bundled data/."""
    return Path(os.environ.get("ATTNMEM_BENCH_DIR") or DATA)


def offer(sources: Sources, gqa: GqaSources, timing: str, path: Path, how: str) -> None:
    """A bundled run holding both passes and GQA rows in one file, as a timing choice of its
    own, when the checkout has the file."""
    if path.exists():
        sources[timing] = ({"fwd": path, "fwd_bwd": path}, how)
        gqa[timing] = {"fwd": path, "fwd_bwd": path}


def sources(bench: Path | None = None) -> tuple[Sources, GqaSources]:
    """The timing choices over the CSVs in `bench` (default `bench_dir()`): every pass's CSV
    and its caption, and the grouped-query CSVs (H_kv = 8 key/value heads for H = 32 query
    heads, the backward being where GQA changes the work)."""
    bench = bench_dir() if bench is None else bench
    # timing choice -> ({pass: bundled CSV}, what the caption says about how it was timed).
    sources: Sources = {
        "eager calls": ({"fwd": bench / "kernel_speed_fwd_eager_h200.csv",
                         "fwd_bwd": bench / "kernel_speed_fwdbwd_eager_h200.csv"}, (
            "Eager calls, as a user makes them: at s ≤ 2,048 a forward is 15–90 µs of GPU work "
            "(forward + backward 70–600 µs), and host time (Python, autograd, launches, on a shared "
            "host) weighs in for every backend; switch *timing* to see the GPU time alone, or the "
            "median of three interleaved rounds.")),
        "eager, median of 3 rounds": ({"fwd": bench / "kernel_speed_fwd_eager_rounds_h200.csv",
                                       "fwd_bwd": bench / "kernel_speed_fwdbwd_eager_rounds_h200.csv"}, (
            "Eager calls at s ≤ 2,048 only, each implementation timed three times per shape, in "
            "turn, and the median kept (`python -m attnmem.measure.bench --rounds 3`): slow drift in the shared host's "
            "load then falls on every backend alike, which one round does not ensure.")),
        "GPU time (CUDA graphs)": ({"fwd": bench / "kernel_speed_fwd_graphs_h200.csv",
                                    "fwd_bwd": bench / "kernel_speed_fwdbwd_graphs_h200.csv"}, (
            "Each call captured in a CUDA graph and replayed: the kernels' GPU time, without the "
            "host's share.")),
    }
    # Grouped-query attention (H_kv = 8 key/value heads for H = 32 query heads), the backward being
    # where GQA changes the work: timing choice -> {pass: bundled CSV}.
    gqa: GqaSources = {"GPU time (CUDA graphs)": {"fwd_bwd": bench / "kernel_speed_fwdbwd_gqa_graphs_h200.csv"}}
    # The run with FlashAttention-4 beside ours, cuDNN and FA2 (`python -m attnmem.measure.bench --preset
    # anchors --rounds 3`).
    offer(sources, gqa, "eager, 3 rounds, with FlashAttention-4", bench / "kernel_speed_peers_eager_h200.csv", (
        "Eager calls, each implementation timed three times per shape, in turn, in one process "
        "(`python -m attnmem.measure.bench --preset anchors --rounds 3`, 2026-12-01 17:55 UTC): the "
        "shapes of the project's kernel anchors, with FlashAttention-4 (flash-attn-4, its sm90 "
        "kernels) as a peer."))
    # The backward's whole target grid with FlashAttention-4 (both dtypes, d = 64 and 128, s = 4,096
    # and 16,384, causal and not, MHA and GQA 4:1).
    offer(sources, gqa, "eager, 3 rounds, FA4 target grid", bench / "kernel_speed_targets_eager_h200.csv", (
        "Eager calls, each implementation timed three times per shape, in turn, in one process "
        "per dtype (`python -m attnmem.measure.bench --impls triton sdpa_cudnn fa4 --rounds 3` over the "
        "kernel issue's 32 target shapes, 2026-12-01 17:39 and 17:42 UTC), before the anchors "
        "run's Hopper backward rebuilt its K and V descriptors every step (1.00-1.08x the "
        "backward alone; attnmem/kernels/flash/NOTES.md)."))
    return sources, gqa


def load_frame(path: str) -> pd.DataFrame:
    """One bench CSV as a DataFrame, one row per `Row` (ValueError, OSError: not readable)."""
    return pd.DataFrame([vars(r) for r in read_rows(path)])


def shown_order(present: set[str], ours: str = OURS) -> tuple[list[str], list[str]]:
    """The implementations measured in a run in the order the page shows them (ours first,
    then our kernel's other paths, the peers, and anything else by name), and the peers among
    them (what our TFLOP/s are divided by)."""
    order = [ours, *sorted(i for i in present if i.startswith("triton") and i != ours),
             *PEERS, *sorted(present - {ours, *PEERS})]
    return ([i for i in dict.fromkeys(order) if i in present],
            [p for p in PEERS if p in present])


def tflops_by_length(rows: pd.DataFrame, impls: list[str]) -> pd.DataFrame:
    """TFLOP/s indexed by s, one column per implementation of `impls` (in that order)."""
    return rows.pivot_table(index="seq_len", columns="impl", values="tflops").reindex(columns=impls)


def ratio_at_top(wide: pd.DataFrame, ref: str, ours: str = OURS) -> tuple[int, float] | None:
    """(s, ours / ref) at the longest s where both were measured in this run; None if never.
    `wide`: TFLOP/s indexed by s, one column per implementation."""
    if ours not in wide or ref not in wide:
        return None
    both = wide[[ours, ref]].dropna()
    if both.empty:
        return None
    top = int(both.index.max())
    return top, float(both.loc[top, ours] / both.loc[top, ref])


def fa4_elsewhere(sources: Sources, dtype: str, d: int, causal: bool, mode: str, kv_heads: int,
                  load: Callable[[str], pd.DataFrame] = load_frame,
                  ) -> tuple[str, int, float] | None:
    """FlashAttention-4 against our default for this choice from a bundled run that timed both
    side by side (the chosen timing may not have FA4): (timing, s, ours / FA4), or None.
    `load` reads one CSV (a caller may pass a cached one)."""
    for timing, (paths, _) in sources.items():
        path = paths.get(mode)
        if path is None or not path.exists():
            continue
        try:
            df = load(str(path))
        except (OSError, ValueError):
            continue
        got = df[(df["dtype"] == dtype) & (df["head_dim"] == d) & (df["causal"] == causal)
                 & (df["mode"] == mode) & (df["kv_heads"] == kv_heads) & (df["status"] == "ok")]
        if "fa4" not in set(got["impl"]):
            continue
        hit = ratio_at_top(got.pivot_table(index="seq_len", columns="impl", values="tflops"), "fa4")
        if hit:
            return timing, *hit
    return None


def gqa_where(gqa: GqaSources, kv_heads: int,
              load: Callable[[str], pd.DataFrame] = load_frame) -> list[str]:
    """Where rows with kv_heads key/value heads were measured (timing, pass, dtype), in words."""
    found = []
    for timing, paths in gqa.items():
        for path in dict.fromkeys(paths.values()):
            try:
                df = load(str(path))
            except (OSError, ValueError):
                continue
            got = df[df["kv_heads"] == kv_heads]
            for mode, dname in sorted(set(zip(got["mode"], got["dtype"], strict=True))):
                found.append(f"**{timing}**, {PASS_WORDS.get(mode, mode)}, {dname}")
    return found
