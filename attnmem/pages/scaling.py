"""Scaling: attention memory against sequence length (log-log), one curve per implementation,
GPU capacities as lines, where each implementation runs out; and against batch or heads (linear).

Thin page: read widgets -> attnmem.calc.sweep (sweep_seq_len, sweep_param, oom_table over
attnmem.calc.max_seq_len, call_detail; cached, bounded) -> two plotly charts and an
out-of-memory table.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from attnmem.calc import (  # noqa: E402
    ALLOCATOR_NOTE,
    GPUS,
    IMPL_DTYPES,
    IMPL_KIND,
    IMPL_LABELS,
    IMPLEMENTATIONS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_SEQ_LEN,
    PEAK_MODEL_NOTES,
    default_seq_lens,
    dtype_name,
    sweep,
    sweep_param,
    sweep_seq_len,
)
from attnmem.calc.peak import IMPL_HEAD_DIMS, takes_head_dim  # noqa: E402
from attnmem.calc.units import DTYPE_ALIASES, short_len  # noqa: E402
from attnmem.pages.ui import charts, tables, widgets  # noqa: E402
from attnmem.pages.ui.labels import impl_color  # noqa: E402
from attnmem.pages.ui.messages import COMPUTED  # noqa: E402
from attnmem.pages.ui.pickers import gpu_options  # noqa: E402
from attnmem.pages.ui.state import cached, get_unit, kept, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.units import fmt, in_unit  # noqa: E402
from attnmem.pages.ui.url_state import BoolParam, ChoiceParam, IntParam, MultiChoiceParam  # noqa: E402

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
    "gpus": MultiChoiceParam(DEFAULT_GPUS, gpu_options(GPUS)),
    "smax": ChoiceParam("1048576", S_MAX_CHOICES),
    "by": ChoiceParam("batch", ("batch", "heads")),
    "s2": IntParam(4096, 1, MAX_SEQ_LEN),
}


@cached()
def seq_sweep(impls: tuple[str, ...], s_hi: int, b: int, h: int, d: int, dtype: str,
              causal: bool, bwd: bool) -> pd.DataFrame:
    return sweep_seq_len(impls, default_seq_lens(128, s_hi), b, h, d, dtype, causal, bwd)


@cached()
def oom_table(impls: tuple[str, ...], gpus: tuple[str, ...], b: int, h: int, d: int, dtype: str,
              causal: bool, bwd: bool) -> pd.DataFrame:
    return sweep.oom_table(impls, gpus, b, h, d, dtype, causal, bwd)


@cached()
def call_detail(impls: tuple[str, ...], s: int, b: int, h: int, d: int, dtype: str,
                causal: bool, bwd: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    return sweep.call_detail(impls, s, b, h, d, dtype, causal, bwd)


@cached()
def param_sweep(by: str, impls: tuple[str, ...], s: int, b: int, h: int, d: int, dtype: str,
                causal: bool, bwd: bool) -> pd.DataFrame:
    return sweep_param(by, sweep.param_values(by), impls, s, b, h, d, dtype, causal, bwd)


@kept(128)
def seq_view(impls: tuple[str, ...], gpus: tuple[str, ...], s_hi: int, b: int, h: int, d: int,
             dtype: str, causal: bool, bwd: bool, unit: str) -> dict:
    """What the sequence-length part draws, kept across runs and sessions by its inputs (shared
    read-only): the sweep ("df", the CSV), the headline metrics ((column, label, value)), the
    figure (a plotly dict) and the out-of-memory table by GPU ("wide", None without rows).
    Building them from the cached sweeps cost ~20 ms of CPU a run (issue 45 item 5)."""
    df = seq_sweep(impls, s_hi, b, h, d, dtype, causal, bwd)
    oom = oom_table(impls, gpus, b, h, d, dtype, causal, bwd)
    quad = [i for i in impls if IMPL_KIND[i] == "quadratic"]
    lin = [i for i in impls if IMPL_KIND[i] == "linear"]
    metrics = []
    if gpus:
        gpu0 = gpus[-1]
        found = {}
        for col, group in zip((0, 1), (quad, lin), strict=False):
            if group:
                impl = group[0]
                found[impl] = int(oom[(oom["gpu"] == gpu0) & (oom["impl"] == impl)]["max_seq_len"].iloc[0])
                metrics.append((col, f"{IMPL_LABELS.get(impl, impl)}: longest s", f"{found[impl]:,}"))
        if quad and lin and found[quad[0]]:
            metrics.append((0, "linear vs quadratic", f"×{found[lin[0]] / found[quad[0]]:,.0f} longer"))
    traces = []
    drawn: list[list[int]] = []  # curves already drawn (masked_fill and masked_fill_ often coincide)
    for impl, part in df.groupby("impl", sort=False):
        label = IMPL_LABELS.get(impl, impl)
        ys = part["peak_bytes"].tolist()
        under = any(charts.overlaps(ys, other) for other in drawn)  # dashed, open markers: both show
        drawn.append(ys)
        dash = "solid" if IMPL_KIND[impl] == "quadratic" else "dot"
        traces.append(dict(
            type="scatter", x=part["seq_len"].tolist(),
            y=[in_unit(v, unit) for v in ys],
            mode="lines+markers", name=label,
            line=dict(color=impl_color(impl), dash=("dash" if dash == "solid" else "dashdot") if under else dash,
                      width=2),
            marker=dict(symbol="circle-open", size=9) if under else {},
            customdata=[f"{v:,}" for v in ys],
            hovertemplate=f"<b>{label}</b><br>s = %{{x:,}}<br>%{{y:,.4g}} {unit}<br>%{{customdata}} bytes<extra></extra>",
        ))
    for gpu in gpus:
        traces.append(charts.capacity_dict(gpu, GPUS[gpu], 128, s_hi, unit))
    marks = [r for r in oom.itertuples(index=False) if 128 <= r.max_seq_len <= s_hi]
    if marks:
        traces.append(dict(  # every out-of-memory point in one trace
            type="scatter", x=[r.max_seq_len for r in marks],
            y=[in_unit(r.peak_bytes_at_max, unit) for r in marks],
            mode="markers", name="runs out of memory",
            marker=dict(symbol="x", size=13, color=[impl_color(r.impl) for r in marks], line=dict(width=2)),
            customdata=[[IMPL_LABELS.get(r.impl, r.impl), r.gpu, f"{r.max_seq_len:,}", f"{r.peak_bytes_at_max:,}"]
                        for r in marks],
            hovertemplate=("<b>%{customdata[0]}</b> runs out of memory on %{customdata[1]}<br>"
                           "longest s that fits: %{customdata[2]}<br>peak there: %{customdata[3]} bytes"
                           "<extra></extra>"),
        ))
    fig = charts.figure(
        traces, "sequence length s (tokens, log scale)", f"extra peak memory of one call ({unit}, log scale)",
        520, xaxis=charts.log_len_xaxis(128, s_hi), yaxis=dict(type="log", exponentformat="power"),
    )
    wide = None
    if len(oom):
        table = oom.assign(
            impl=oom["impl"].map(lambda i: IMPL_LABELS.get(i, i)),
            fits=[f"≥ {v:,}" if v >= MAX_SEQ_LEN else f"{v:,}" for v in oom["max_seq_len"]],
        )
        # one column per GPU, headed by its name without the vendor (the column fits at 1280 px)
        wide = table.pivot(index="impl", columns="gpu", values="fits").reset_index()
        wide = wide.rename(columns=lambda g: g.removeprefix("NVIDIA "))
    return {"df": df, "metrics": metrics, "figure": fig, "wide": wide}


@kept(128)
def param_view(by: str, impls: tuple[str, ...], s2: int, b: int, h: int, d: int, dtype: str,
               causal: bool, bwd: bool, unit: str) -> tuple[pd.DataFrame, dict]:
    """The batch or heads sweep and its figure (a plotly dict), kept as seq_view is."""
    df2 = param_sweep(by, impls, s2, b, h, d, dtype, causal, bwd)
    other = f"H = {h}" if by == "batch" else f"B = {b}"
    traces2 = []
    drawn2: list[list[int]] = []
    for impl, part in df2.groupby("impl", sort=False):
        ys = part["peak_bytes"].tolist()
        under = any(charts.overlaps(ys, o) for o in drawn2)
        drawn2.append(ys)
        traces2.append(dict(
            type="scatter", x=part[by].tolist(), y=[in_unit(v, unit) for v in ys],
            mode="lines+markers", name=IMPL_LABELS.get(impl, impl),
            line=dict(color=impl_color(impl), dash="dash" if under else "solid"),
            marker=dict(symbol="circle-open", size=9) if under else {},
            customdata=[f"{v:,}" for v in ys],
            hovertemplate=f"<b>{IMPL_LABELS.get(impl, impl)}</b><br>{by} = %{{x}}<br>%{{y:,.4g}} {unit}"
            "<br>%{customdata} bytes<extra></extra>",
        ))
    fig2 = charts.figure(
        traces2,
        f"{'batch size B' if by == 'batch' else 'heads H'} (s = {s2:,}, {other})", f"extra peak memory ({unit})", 400,
    )
    return df2, fig2


def param_table(df2: pd.DataFrame, by: str, unit: str) -> pd.DataFrame:
    """param_view's sweep as a table: one row per value of B (or H), one column per
    implementation, the extra peak in the unit."""
    out = df2.pivot(index=by, columns="impl", values="peak_bytes")
    out = out[list(dict.fromkeys(df2["impl"]))]  # the implementations in the sweep's order
    shown = pd.DataFrame({"B" if by == "batch" else "H": [f"{int(v):,}" for v in out.index]})
    for impl in out.columns:
        shown[IMPL_LABELS.get(impl, impl)] = [fmt(int(v), unit) for v in out[impl]]
    return shown


@kept(128)
def detail_summary(impls: tuple[str, ...], s2: int, b: int, h: int, d: int, dtype: str,
                   causal: bool, bwd: bool, unit: str) -> pd.DataFrame:
    """One call at s2, per implementation: what the allocator counts and reserves, in the unit
    (the caption names the torch.cuda function behind each column); kept as seq_view is."""
    summary, _ = call_detail(impls, s2, b, h, d, dtype, causal, bwd)

    def cell(n: int | None) -> str:
        return "not predicted" if n is None or n != n else fmt(int(n), unit)

    return pd.DataFrame({
        "implementation": summary["impl"].map(lambda i: IMPL_LABELS.get(i, i)),
        "peak allocated": [cell(v) for v in summary["allocated_peak_bytes"]],
        "of which rounding": [f"{int(v):,} B" for v in summary["rounding_bytes"]],
        "reserved growth": [cell(None if v is None or v != v else int(v))
                            for v in summary["reserved_growth_bytes"]],
    })


@kept(128)
def detail_terms(impls: tuple[str, ...], s2: int, b: int, h: int, d: int, dtype: str,
                 causal: bool, bwd: bool) -> list[tuple[str, pd.DataFrame]]:
    """Every tensor at each implementation's peak, with the allocator's rounding: (label,
    table) per implementation; kept as seq_view is."""
    _, terms = call_detail(impls, s2, b, h, d, dtype, causal, bwd)
    return [(IMPL_LABELS.get(impl, impl), pd.DataFrame({
        "tensors alive at the peak": part["term"],
        "count": part["tensors"],
        "tensor bytes": [f"{v:,}" for v in part["tensor_bytes"]],
        "counted by the allocator": [f"{v:,}" for v in part["counted_bytes"]],
        "rounding to allocator blocks": [f"+{v:,} B" if v else "none"
                                         for v in part["rounding_bytes"]],
    })) for impl, part in terms.groupby("impl", sort=False)]


page_setup("scaling")
charts.preload()  # plotly.js starts loading now, not after every element above the chart
st.title("Scaling with sequence length")
st.markdown(
    "**Why does attention run out of memory?** Standard attention stores the *s × s* scores, so "
    "its memory grows with *s²*: a straight line of slope 2 on these log-log axes. "
    "FlashAttention-style kernels keep only the output and a log-sum-exp per row: slope 1."
)

controls, main = st.columns([1.4, 2.8])  # wide enough for an implementation's chip at 1280 px
with controls:
    impls = widgets.multiselect(
        "Implementations", "impls", SPECS["impls"], format_func=lambda i: IMPL_LABELS.get(i, i)
    )
    cols = st.columns(2)
    b = widgets.int_input("Batch B", "b", SPECS["b"], where=cols[0])
    h = widgets.int_input("Heads H", "h", SPECS["h"], where=cols[1])
    d = widgets.int_input("Head dim d", "d", SPECS["d"], where=cols[0])
    dtype = widgets.select("dtype", "dtype", SPECS["dtype"], where=cols[1])
    causal = widgets.toggle("Causal mask", "causal", SPECS["causal"], where=cols[0])
    bwd = widgets.toggle("Forward + backward", "bwd", SPECS["bwd"], where=cols[1])
    gpus = widgets.multiselect("GPU capacity lines", "gpus", SPECS["gpus"])
    _init_smax = widgets.select(
        "Longest s on the chart", "smax", SPECS["smax"],
        format_func=lambda v: short_len(int(v)),
    )
s_hi = int(_init_smax)
unit = get_unit()

with main:
    # Only the implementations that run this dtype are drawn (attnmem.calc.IMPL_DTYPES): FlashAttention-2,
    # cuDNN and FlashAttention-4 take fp16/bf16 inputs only, so at fp32 they are named, not priced.
    idle = [i for i in impls if dtype_name(dtype) not in IMPL_DTYPES[i]]
    if idle:
        st.caption(f"Not drawn for {dtype} inputs, which they do not run: "
                   + ", ".join(IMPL_LABELS.get(i, i) for i in idle) + " (fp16 and bf16 only).")
    impls = [i for i in impls if i not in idle]
    # ... and only those that take this head dim (attnmem.calc.IMPL_HEAD_DIMS: the bundled kernel's)
    narrow = [i for i in impls if not takes_head_dim(i, d)]
    if narrow:
        st.caption(f"Not drawn at head dim {d:,}, which they do not take: " + ", ".join(
            f"{IMPL_LABELS.get(i, i)} ({IMPL_HEAD_DIMS[i][0]}-{IMPL_HEAD_DIMS[i][1]})"
            for i in narrow) + ".")
    impls = [i for i in impls if i not in narrow]
    if not impls:
        st.info("Pick at least one implementation that runs this dtype and head dim.")
        sync_url(SPECS)
        st.stop()

    what = "forward + backward" if bwd else "forward"
    view = seq_view(tuple(impls), tuple(gpus), s_hi, b, h, d, dtype, causal, bwd, unit)
    # The answer first (the longest s on the last GPU picked), above the chart: on screen at
    # 1280x800 without scrolling (issue 45, item 2).
    if not gpus:
        st.info("Pick one or more GPUs to see where each implementation runs out of memory.")
    if gpus:
        st.markdown(f"**On one {gpus[-1]}** (the attention call alone)")
        mcols = st.columns(2)  # two to a row: "SDPA memory-efficient: longest s" fits at 1280 px
        for i, name, value in view["metrics"]:
            mcols[i].metric(name, value, help=None if name == "linear vs quadratic" else
                            "Computed: exact integer search of attnmem.calc.attention_peak_bytes ≤ GPU memory.")

    st.subheader(f"Memory against sequence length ({what}{', causal' if causal else ''})")
    charts.chart(view["figure"], "scaling_chart", "scaling-seq-len", view["df"],
                 content_key=("scaling seq", tuple(impls), tuple(gpus), s_hi, b, h, d, dtype, causal, bwd, unit))
    st.caption(
        f"{COMPUTED}: attnmem.calc.attention_peak_bytes, the predicted extra peak of one attention call "
        "(inputs already allocated). × marks the longest s that fits each GPU (exact integer search, "
        "attnmem.calc.max_seq_len). Solid lines: quadratic (store s × s); dotted: linear (fused kernels)."
    )

    if view["wide"] is not None:
        st.markdown("**Where each implementation runs out of memory** (the attention call alone, nothing else on the GPU)")
        tables.table(view["wide"], hide_index=True,
                     content_key=("scaling oom", tuple(impls), tuple(gpus), b, h, d, dtype, causal, bwd))

st.subheader("Memory against batch or heads (linear axes)")
cols = st.columns([1, 1, 2])
by = widgets.radio("Vary", "by", SPECS["by"], where=cols[0])
s2 = widgets.int_input("at sequence length s", "s2", SPECS["s2"], where=cols[1])
df2, fig2 = param_view(by, tuple(impls), s2, b, h, d, dtype, causal, bwd, unit)
# The sweep as a table, its chart one click away: a second chart costs a direct load as much
# as the first (issue 45 item 3).
param_key = ("scaling param", by, tuple(impls), s2, b, h, d, dtype, causal, bwd, unit)
tables.table(param_table(df2, by, unit), hide_index=True, content_key=param_key)
charts.chart_on_open(f"Chart: extra peak against {'batch size B' if by == 'batch' else 'heads H'}",
                     fig2, "scaling_param_chart", f"scaling-{by}", df2, content_key=param_key)
st.caption(f"{COMPUTED}. Memory is linear in B and H for every implementation: only s enters squared.")

st.subheader(f"One call at s = {s2:,}: what PyTorch's allocator counts and reserves")
detail_key = (tuple(impls), s2, b, h, d, dtype, causal, bwd)
tables.table(detail_summary(*detail_key, unit), hide_index=True,
             content_key=("scaling detail", *detail_key, unit))
st.caption(
    f"{COMPUTED}. **Peak allocated**: what `torch.cuda.max_memory_allocated()` rises by during "
    "the call, above the inputs: every tensor counted as the block the caching allocator gives "
    "it (attnmem.calc.attention_peak_bytes); **of which rounding**: the bytes those blocks add to the "
    "tensors' own. **Reserved growth**: what `torch.cuda.memory_reserved()` "
    "rises by: the segments the allocator takes from the GPU for the call, freed temporaries "
    "included; this is what nvidia-smi's figure grows by (nvidia-smi also shows the CUDA context "
    "and memory outside PyTorch). Predicted when the cache is emptied before the call, as the "
    "measurement does, and every temporary is known (attnmem.calc.attention_reserved_bytes); "
    "\"not predicted\" where it is not. " + ALLOCATOR_NOTE
)
# Drawn only while open (Streamlit's lazy expander: a click on it reruns the page): one HTML
# table per implementation, ~3 ms of CPU each on every run that moved an input (issue 45 item 5).
terms_box = st.expander("Every tensor at the peak, with the allocator's rounding",
                        key="_scaling_terms", on_change="rerun")
if terms_box.open:
    with terms_box:
        for name, table in detail_terms(*detail_key):
            st.markdown(f"**{name}**")
            tables.text_table(table)

with st.expander("What each implementation's formula assumes"):
    st.markdown("\n\n".join(f"**{IMPL_LABELS.get(impl, impl)}** (`{impl}`): "
                             f"{PEAK_MODEL_NOTES.get(impl, '')}" for impl in impls))

sync_url(SPECS)
