"""Scaling: attention memory against sequence length (log-log), one curve per implementation,
GPU capacities as lines, where each implementation runs out; and against batch or heads (linear).

Thin page: read widgets -> calc.sweep_seq_len / calc.sweep_param / calc.max_seq_len (cached,
bounded) -> two plotly charts and an out-of-memory table.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402
import plotly.graph_objects as go  # noqa: E402
import streamlit as st  # noqa: E402

from calc import (  # noqa: E402
    GPUS,
    IMPL_KIND,
    IMPL_LABELS,
    IMPLEMENTATIONS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_SEQ_LEN,
    PEAK_MODEL_NOTES,
    attention_peak_bytes,
    default_seq_lens,
    max_seq_len,
    sweep_param,
    sweep_seq_len,
)
from calc.units import DTYPE_ALIASES  # noqa: E402
from calc.urlparams import BoolParam, ChoiceParam, IntParam, MultiChoiceParam  # noqa: E402
from pages import common as c  # noqa: E402

S_MAX_CHOICES = tuple(str(1 << p) for p in range(10, 25))  # 1K .. 16M
DEFAULT_GPUS = tuple(g for g in ("NVIDIA RTX 4090 24GB", "NVIDIA H100 80GB", "NVIDIA H200 141GB") if g in GPUS)

SPECS = {
    "impls": MultiChoiceParam(IMPLEMENTATIONS, IMPLEMENTATIONS),
    "b": IntParam(1, 1, 65_536),
    "h": IntParam(32, 1, MAX_HEADS),
    "d": IntParam(128, 1, MAX_HEAD_DIM),
    "dtype": ChoiceParam("fp16", ("fp16", "bf16", "fp32"), aliases=DTYPE_ALIASES),
    "causal": BoolParam(False),
    "bwd": BoolParam(False),
    "gpus": MultiChoiceParam(DEFAULT_GPUS, c.gpu_options(GPUS)),
    "smax": ChoiceParam("1048576", S_MAX_CHOICES),
    "by": ChoiceParam("batch", ("batch", "heads")),
    "s2": IntParam(4096, 1, MAX_SEQ_LEN),
}


@c.cached()
def seq_sweep(impls: tuple[str, ...], s_hi: int, b: int, h: int, d: int, dtype: str,
              causal: bool, bwd: bool) -> pd.DataFrame:
    return sweep_seq_len(impls, default_seq_lens(128, s_hi), b, h, d, dtype, causal, bwd)


@c.cached(max_entries=256)
def oom_len(impl: str, budget: int, b: int, h: int, d: int, dtype: str, causal: bool, bwd: bool) -> int:
    return max_seq_len(impl, budget, b, h, d, dtype, causal, bwd)


@c.cached()
def param_sweep(by: str, impls: tuple[str, ...], s: int, b: int, h: int, d: int, dtype: str,
                causal: bool, bwd: bool) -> pd.DataFrame:
    values = list(range(1, 65)) if by == "batch" else list(range(1, 129))
    return sweep_param(by, values, impls, s, b, h, d, dtype, causal, bwd)


c.page_setup("scaling")
st.title("Scaling with sequence length")
st.markdown(
    "**Why does attention run out of memory?** Standard attention stores the *s × s* scores, so "
    "its memory grows with *s²*: a straight line of slope 2 on these log-log axes. "
    "FlashAttention-style kernels keep only the output and a log-sum-exp per row: slope 1."
)

controls, main = st.columns([1, 2.8])
with controls:
    impls = c.multiselect(
        "Implementations", "impls", SPECS["impls"], format_func=lambda i: IMPL_LABELS.get(i, i)
    )
    cols = st.columns(2)
    b = c.int_input("Batch B", "b", SPECS["b"], where=cols[0])
    h = c.int_input("Heads H", "h", SPECS["h"], where=cols[1])
    d = c.int_input("Head dim d", "d", SPECS["d"], where=cols[0])
    dtype = c.select("dtype", "dtype", SPECS["dtype"], where=cols[1])
    causal = c.toggle("Causal mask", "causal", SPECS["causal"], where=cols[0])
    bwd = c.toggle("Forward + backward", "bwd", SPECS["bwd"], where=cols[1])
    gpus = c.multiselect("GPU capacity lines", "gpus", SPECS["gpus"])
    _init_smax = c.select(
        "Longest s on the chart", "smax", SPECS["smax"],
        format_func=lambda v: c.short_len(int(v)),
    )
s_hi = int(_init_smax)
unit = c.get_unit()

with main:
    if not impls:
        st.info("Pick at least one implementation.")
        c.sync_url(SPECS)
        st.stop()

    what = "forward + backward" if bwd else "forward"
    st.subheader(f"Memory against sequence length ({what}{', causal' if causal else ''})")
    df = seq_sweep(tuple(impls), s_hi, b, h, d, dtype, causal, bwd)
    fig = go.Figure()
    for impl in impls:
        part = df[df["impl"] == impl]
        fig.add_trace(go.Scatter(
            x=part["seq_len"], y=[c.in_unit(v, unit) for v in part["peak_bytes"]],
            mode="lines+markers", name=IMPL_LABELS.get(impl, impl),
            line=dict(color=c.impl_color(impl), dash="solid" if IMPL_KIND[impl] == "quadratic" else "dot"),
            customdata=[f"{v:,}" for v in part["peak_bytes"]],
            hovertemplate=(
                f"<b>{IMPL_LABELS.get(impl, impl)}</b><br>s = %{{x:,}}<br>%{{y:,.4g}} {unit}"
                "<br>%{customdata} bytes<extra></extra>"
            ),
        ))

    oom_rows = []
    for gpu in gpus:
        cap = GPUS[gpu]
        c.capacity_line(fig, gpu, cap, 128, s_hi, unit)
        for impl in impls:
            s_max = oom_len(impl, cap, b, h, d, dtype, causal, bwd)
            oom_rows.append({"gpu": gpu, "impl": impl, "longest s that fits": s_max,
                             "capped": s_max >= MAX_SEQ_LEN})
            if 128 <= s_max <= s_hi:
                peak = attention_peak_bytes(impl, b, h, s_max, d, dtype, causal, bwd)
                fig.add_trace(go.Scatter(
                    x=[s_max], y=[c.in_unit(peak, unit)], mode="markers", showlegend=False,
                    marker=dict(symbol="x", size=13, color=c.impl_color(impl), line=dict(width=2)),
                    hovertemplate=(
                        f"<b>{IMPL_LABELS.get(impl, impl)}</b> runs out of memory on {gpu}<br>"
                        f"longest s that fits: {s_max:,}<br>peak there: {peak:,} bytes<extra></extra>"
                    ),
                ))
    c.log_len_axis(fig, 128, s_hi)
    fig.update_yaxes(type="log", exponentformat="power")
    c.style(fig, "sequence length s (tokens, log scale)", f"extra peak memory of one call ({unit}, log scale)", 520)
    c.chart(fig, "scaling_chart", "scaling-seq-len", df)
    st.caption(
        f"{c.COMPUTED}: calc.attention_peak_bytes, the predicted extra peak of one attention call "
        "(inputs already allocated). × marks the longest s that fits each GPU (exact integer search, "
        "calc.max_seq_len). Solid lines: quadratic (store s × s); dotted: linear (fused kernels)."
    )

    quad = [i for i in impls if IMPL_KIND[i] == "quadratic"]
    lin = [i for i in impls if IMPL_KIND[i] == "linear"]
    if gpus:
        gpu0 = gpus[-1]
        st.markdown(f"**On one {gpu0}** (the attention call alone)")
        mcols = st.columns(3)
        found = {}
        for col, group in zip(mcols, (quad, lin), strict=False):
            if group:
                impl = group[0]
                found[impl] = oom_len(impl, GPUS[gpu0], b, h, d, dtype, causal, bwd)
                col.metric(f"{IMPL_LABELS.get(impl, impl)}: longest s", f"{found[impl]:,}",
                           help="Computed: exact integer search of calc.attention_peak_bytes ≤ GPU memory.")
        if quad and lin and found[quad[0]]:
            mcols[2].metric("linear vs quadratic", f"×{found[lin[0]] / found[quad[0]]:,.0f} longer")

    if oom_rows:
        oom = pd.DataFrame(oom_rows)
        shown = oom.assign(
            impl=oom["impl"].map(lambda i: IMPL_LABELS.get(i, i)),
            **{"longest s that fits": [
                (f"≥ {v:,}" if cap else f"{v:,}") for v, cap in zip(oom["longest s that fits"], oom["capped"], strict=True)
            ]},
        ).drop(columns="capped")
        st.markdown("**Where each implementation runs out of memory** (the attention call alone, nothing else on the GPU)")
        st.dataframe(shown.pivot(index="impl", columns="gpu", values="longest s that fits"))

st.subheader("Memory against batch or heads (linear axes)")
cols = st.columns([1, 1, 2])
by = c.radio("Vary", "by", SPECS["by"], where=cols[0])
s2 = c.int_input("at sequence length s", "s2", SPECS["s2"], where=cols[1])
df2 = param_sweep(by, tuple(impls), s2, b, h, d, dtype, causal, bwd)
fig2 = go.Figure()
for impl in impls:
    part = df2[df2["impl"] == impl]
    fig2.add_trace(go.Scatter(
        x=part[by], y=[c.in_unit(v, unit) for v in part["peak_bytes"]], mode="lines",
        name=IMPL_LABELS.get(impl, impl), line=dict(color=c.impl_color(impl)),
        customdata=[f"{v:,}" for v in part["peak_bytes"]],
        hovertemplate=f"<b>{IMPL_LABELS.get(impl, impl)}</b><br>{by} = %{{x}}<br>%{{y:,.4g}} {unit}"
        "<br>%{customdata} bytes<extra></extra>",
    ))
other = f"H = {h}" if by == "batch" else f"B = {b}"
c.style(fig2, f"{'batch size B' if by == 'batch' else 'heads H'} (s = {s2:,}, {other})", f"extra peak memory ({unit})", 400)
c.chart(fig2, "scaling_param_chart", f"scaling-{by}", df2)
st.caption(f"{c.COMPUTED}. Memory is linear in B and H for every implementation: only s enters squared.")

with st.expander("What each implementation's formula assumes"):
    for impl in impls:
        st.markdown(f"**{IMPL_LABELS.get(impl, impl)}** (`{impl}`): {PEAK_MODEL_NOTES.get(impl, '')}")

c.sync_url(SPECS)
