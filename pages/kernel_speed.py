"""Kernel speed: the bundled attention kernels against PyTorch's SDPA backends, measured side by
side on an H200.

Thin page: the CSVs that `python -m kernels.bench` wrote on the H200 (data/kernel_speed_*_h200.csv,
read by kernels.bench.speed.read_rows) -> one chart of TFLOP/s against s per implementation and a
table with our kernel's ratio to cuDNN and FlashAttention-2. Everything here is measured; the
page names the run (GPU, versions, time) it shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from kernels.bench.speed import read_rows  # noqa: E402
from pages import common as c  # noqa: E402
from pages.ui.url_state import BoolParam, ChoiceParam  # noqa: E402

BENCH = ROOT / "data"
# timing choice -> ({pass: bundled CSV}, what the caption says about how it was timed). The
# forward+backward rows come from session-7 runs (the atomic-dQ backward on large grids), the
# forward rows from session 5's.
SOURCES = {
    "eager calls": ({"fwd": BENCH / "kernel_speed_fwd_eager_h200.csv",
                     "fwd_bwd": BENCH / "kernel_speed_fwdbwd_eager_h200.csv"}, (
        "Eager calls, as a user makes them: at s ≤ 2,048 a forward is 15–90 µs of GPU work "
        "(forward + backward 70–600 µs), and host time (Python, autograd, launches, on a shared "
        "host) weighs in for every backend; switch *timing* to see the GPU time alone, or the "
        "median of three interleaved rounds.")),
    "eager, median of 3 rounds": ({"fwd": BENCH / "kernel_speed_fwd_eager_rounds_h200.csv",
                                   "fwd_bwd": BENCH / "kernel_speed_fwdbwd_eager_rounds_h200.csv"}, (
        "Eager calls at s ≤ 2,048 only, each implementation timed three times per shape, in "
        "turn, and the median kept (`kernels.bench.speed --rounds 3`): slow drift in the shared host's "
        "load then falls on every backend alike, which one round does not ensure.")),
    "GPU time (CUDA graphs)": ({"fwd": BENCH / "kernel_speed_fwd_graphs_h200.csv",
                                "fwd_bwd": BENCH / "kernel_speed_fwdbwd_graphs_h200.csv"}, (
        "Each call captured in a CUDA graph and replayed: the kernels' GPU time, without the "
        "host's share.")),
}
# Grouped-query attention (H_kv = 8 key/value heads for H = 32 query heads): measured for
# forward+backward in GPU time only (bf16), the backward being where GQA changes the work.
GQA_SOURCES = {"GPU time (CUDA graphs)": {"fwd_bwd": BENCH / "kernel_speed_fwdbwd_gqa_graphs_h200.csv"}}
KV_WORDS = {"32": "32 (MHA)", "8": "8 (GQA 4:1)"}
LABELS = {
    "triton": "ours: default path",
    "triton_generic": "ours: portable Triton forward",
    "triton_sm90_3wg": "ours: Gluon forward, 3 warpgroups",
    "triton_sm90_persistent": "ours: Gluon forward, persistent",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_flash": "SDPA FlashAttention-2",
    "sdpa_efficient": "SDPA memory-efficient",
    "sdpa_math": "SDPA math",
}
COLORS = {"triton": "#0072B2", "triton_generic": "#56B4E9", "triton_sm90_3wg": "#D55E00",
          "triton_sm90_persistent": "#F0E442",
          "sdpa_cudnn": "#8C8C8C",
          "sdpa_flash": "#009E73", "sdpa_efficient": "#E69F00", "sdpa_math": "#CC79A7"}
# What flash_attention runs by default on a Hopper GPU: "triton" in the bench is that path
# (kernels/flash_attn_fwd_sm90.default_schedule): the Gluon forward at d = 128; at d = 64 the
# portable Triton forward up to s = 2,048 (4,096 causal), the three-warpgroup Gluon forward above.
DEFAULT_IMPL = "triton"
DEFAULT_WORDS = {
    128: "the Gluon forward (two consumer warpgroups) at every length",
    64: "the portable Triton forward up to s = 2,048 (4,096 with a causal mask), the Gluon "
        "forward with three consumer warpgroups above",
}

SPECS = {
    "kdtype": ChoiceParam("bf16", ("fp16", "bf16")),
    "kd": ChoiceParam("128", ("64", "128")),
    "kcausal": BoolParam(False),
    "kpass": ChoiceParam("fwd", ("fwd", "fwd+bwd")),
    "ktiming": ChoiceParam("eager calls", tuple(SOURCES)),
    "kkv": ChoiceParam("32", tuple(KV_WORDS)),
}


@st.cache_data(show_spinner=False, max_entries=8)  # six bundled CSVs
def load(path: str) -> pd.DataFrame:
    return pd.DataFrame([vars(r) for r in read_rows(path)])


c.page_setup("kernel_speed")
st.title("Kernel speed")
st.markdown(
    "**How fast is each attention kernel on a real GPU?** Our bundled kernels and PyTorch's "
    "SDPA backends, run in one process on the same inputs (B = 1, H = 32 query heads), on an "
    "NVIDIA H200. "
    "All figures are **measured** (`python -m kernels.bench`); TFLOP/s count the forward as "
    "4·B·H·s²·d (half when causal) and forward + backward as 3.5× that."
)

cols = st.columns(6)
dtype = c.radio("dtype", "kdtype", SPECS["kdtype"], where=cols[0])
d = int(c.radio("head dim d", "kd", SPECS["kd"], where=cols[1]))
mode = c.radio("pass", "kpass", SPECS["kpass"], where=cols[2])
timing = c.radio("timing", "ktiming", SPECS["ktiming"], where=cols[3])
kv = c.radio("key/value heads", "kkv", SPECS["kkv"], where=cols[4], format_func=KV_WORDS.get)
causal = c.toggle("Causal mask", "kcausal", SPECS["kcausal"], where=cols[5])
c.sync_url(SPECS)

want = "fwd_bwd" if mode == "fwd+bwd" else "fwd"
paths, how = SOURCES[timing]
if kv != "32":
    paths = GQA_SOURCES.get(timing, {})
    if want not in paths or dtype != "bf16":
        st.info("Grouped-query attention (8 key/value heads) was measured for **forward + "
                "backward** in **GPU time (CUDA graphs)**, **bf16**: choose those to see it.")
        st.stop()
    how += (" Grouped-query attention: 8 key/value heads shared by the 32 query heads "
            "(SDPA backends called with enable_gqa=True).")
source = paths[want]
try:
    df = load(str(source))
except (OSError, ValueError) as exc:
    st.error(f"The bundled benchmark data could not be read: {c.md_escape(str(exc))}")
    st.stop()

sel = df[(df["dtype"] == dtype) & (df["head_dim"] == d) & (df["causal"] == causal)
         & (df["mode"] == want) & (df["status"] == "ok")]
if sel.empty:
    st.info("No measurement for this choice.")
    st.stop()

r0 = sel.iloc[0]
st.caption(
    f"Measured {r0['timestamp']} on {r0['gpu']}, torch {r0['torch_version']}, triton "
    f"{r0['triton_version']}; source `{source.relative_to(ROOT)}`. " + how
)

default = DEFAULT_IMPL
impls = [i for i in LABELS if i in set(sel["impl"])]
traces = []
for impl in impls:
    got = sel[sel["impl"] == impl].sort_values("seq_len")
    name = LABELS[impl] + (" · default" if impl == default else "")
    traces.append(dict(
        type="scatter", mode="lines+markers", x=got["seq_len"].tolist(), y=got["tflops"].tolist(),
        name=name, line=dict(color=COLORS.get(impl, "#7F7F7F"), width=3 if impl == default else 2),
        hovertemplate=f"<b>{name}</b><br>s = %{{x:,}}<br>%{{y:.0f}} TFLOP/s<extra></extra>",
    ))
lo, hi = int(sel["seq_len"].min()), int(sel["seq_len"].max())
fig = c.figure(traces, "sequence length s (log scale)", "TFLOP/s (measured)", 430,
               xaxis=c.log_len_xaxis(lo, hi), yaxis=dict(rangemode="tozero"))

wide = sel.pivot_table(index="seq_len", columns="impl", values="tflops").reindex(columns=impls)
table = pd.DataFrame({"s": wide.index})
for impl in impls:
    table[LABELS[impl]] = wide[impl].round(0).tolist()
for ref in ("sdpa_cudnn", "sdpa_flash"):
    if default in wide and ref in wide:
        table[f"default / {LABELS[ref].removeprefix('SDPA ')}"] = (wide[default] / wide[ref]).round(2).tolist()
if default in wide:
    top = int(wide.index.max())
    mcols = st.columns(3)
    mcols[0].metric(f"default at s = {top:,} (measured)", f"{wide.loc[top, default]:.0f} TFLOP/s")
    for col, ref in zip(mcols[1:], ("sdpa_cudnn", "sdpa_flash"), strict=True):
        if ref in wide and wide.loc[top, ref] == wide.loc[top, ref]:
            col.metric(f"÷ {LABELS[ref].removeprefix('SDPA ')} at s = {top:,}",
                       f"{wide.loc[top, default] / wide.loc[top, ref]:.2f}×")
c.chart(fig, "kernel_speed_chart", f"kernel-speed-{dtype}-d{d}-{mode}", table)
st.dataframe(table, hide_index=True, width="stretch")
st.markdown(
    f"*default*: what `flash_attention` runs on a Hopper GPU at d = {d}: {DEFAULT_WORDS[d]}. "
    "The forward+backward rows add our Triton backward: two kernels (dQ, then dK/dV) up to "
    "s = 2,048 and where the dK/dV grid has fewer than 2,048 programs (here: d = 128 up to "
    "s = 4,096), else one dK/dV kernel that also adds dQ into an fp32 buffer (bulk "
    "reduce-adds of the copy engine). With grouped-query attention on a small grid each "
    "group of query heads is split over several dK/dV programs whose partial dK, dV are "
    "summed afterwards. Full tables, the targets and the tuning log: "
    "`kernels/BENCH_H200.md`, `kernels/NOTES.md`."
)
