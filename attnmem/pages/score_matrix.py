"""Score matrix: how much memory one layer's s × s attention scores take, B·H·s²·e bytes.

Thin page: read widgets -> attnmem.calc.scores (score_matrix_bytes, score_curve,
score_doublings) -> metrics, formula, table, chart.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from attnmem.calc import (  # noqa: E402
    DEFAULT_GPU,
    DTYPE_BYTES,
    DTYPES,
    GPUS,
    MAX_HEADS,
    MAX_SEQ_LEN,
    score_matrix_bytes,
)
from attnmem.calc.allocator import fresh_block_bytes, get_allocation_size, round_size  # noqa: E402
from attnmem.calc.scores import CURVE_LENS, score_curve, score_doublings  # noqa: E402
from attnmem.calc.units import DTYPE_ALIASES  # noqa: E402
from attnmem.pages.ui import charts, tables, widgets  # noqa: E402
from attnmem.pages.ui.labels import impl_color  # noqa: E402
from attnmem.pages.ui.messages import COMPUTED  # noqa: E402
from attnmem.pages.ui.state import cached, get_unit, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.units import fmt, in_unit  # noqa: E402
from attnmem.pages.ui.url_state import ChoiceParam, FloatParam, IntParam  # noqa: E402

CUSTOM = "custom"
SPECS = {
    "b": IntParam(1, 1, 65_536),  # the same spec as the other pages: B carries over
    "h": IntParam(32, 1, MAX_HEADS),
    "s": IntParam(4096, 1, MAX_SEQ_LEN),
    "dtype": ChoiceParam("fp16", (*DTYPES, CUSTOM), aliases=DTYPE_ALIASES),
    "e": FloatParam(2.0, 0.125, 64.0),
}


def dtype_label(name: str) -> str:
    if name == CUSTOM:
        return "custom bytes per element…"
    e = DTYPE_BYTES[name]
    return f"{name} ({float(e):g} byte{'s' if e != 1 else ''})"


@cached()
def curve(batch: int, heads: int, e: float | str) -> pd.DataFrame:
    return score_curve(batch, heads, e)


page_setup("score")
charts.preload()  # plotly.js starts loading now, not after every element above the chart
st.title("Score matrix memory")
st.markdown(
    "**How much memory does one attention layer's score matrix take?** Standard attention "
    "computes one score for every (query, key) pair: an *s × s* matrix per head and batch "
    "element. FlashAttention never stores it."
)

cols = st.columns([1, 1, 1.3])
batch = widgets.int_input("Batch size B", "b", SPECS["b"], where=cols[0])
heads = widgets.int_input("Attention heads H", "h", SPECS["h"], where=cols[1])
dtype = widgets.select(
    "Score dtype (bytes per element e)", "dtype", SPECS["dtype"], where=cols[2],
    format_func=dtype_label,
)
used = dict(SPECS)
if dtype == CUSTOM:
    raw_e = widgets.float_input(
        "Custom bytes per element e", "e", SPECS["e"], where=cols[2], step=0.125, format="%.3f",
        help="Rounded to a multiple of 1/8 byte (one bit): 0.5 for 4-bit, 0.75 for 6-bit.",
    )
    e: float | str = max(0.125, round(raw_e * 8) / 8)
    e_value = e
else:
    del used["e"]
    e = dtype
    e_value = float(DTYPE_BYTES[dtype])
seq_len = widgets.seq_len_input("Sequence length s", "s", SPECS["s"])

n_bytes = score_matrix_bytes(batch, heads, seq_len, e)
unit = get_unit()

m1, m2, m3 = st.columns(3)
other = "GiB" if unit == "GB" else "GB"
# fmt switches to MB/KB (MiB/KiB) below one GB (GiB): a small shape never shows '0.00 GB'
m1.metric(f"Score matrix, one layer ({unit})", fmt(n_bytes, unit), help=COMPUTED + ": B·H·s²·e.")
m2.metric(f"same, in {other}", fmt(n_bytes, other))
if 2 * seq_len <= MAX_SEQ_LEN:
    doubled = score_matrix_bytes(batch, heads, 2 * seq_len, e)
    m3.metric(
        f"×2 length (s = {2 * seq_len:,})", fmt(doubled, unit),
        delta=f"×{doubled / n_bytes:g} memory", delta_color="off",
        help="Twice the sequence length, four times the memory: s appears squared.",
    )

# The formula with the numbers substituted, as text: st.latex would load KaTeX's bundle and
# fonts, 0.5-1 s of a direct load on the 2-core machine (issue 45 item 3).
st.markdown(f"*B* · *H* · *s*² · *e* = {batch:,} · {heads:,} · {seq_len:,}² · {e_value:g} bytes "
            f"= **{n_bytes:,} bytes**")
st.caption(
    f"{COMPUTED}. Formula: Vaswani et al. 2017 (arXiv 1706.03762), eq. 1: Q·Kᵀ holds one "
    "score per query-key pair. GB = 10⁹ bytes, GiB = 2³⁰ bytes. This is one layer and only the "
    "scores: standard attention also keeps the softmax output of the same size (see Scaling)."
)
counted, segment = fresh_block_bytes(n_bytes), get_allocation_size(round_size(n_bytes))
st.caption(
    f"{COMPUTED}, what PyTorch shows for this one tensor on an emptied cache: "
    f"**allocated** (`torch.cuda.memory_allocated()`) {counted:,} bytes, the caching allocator's "
    f"block ({counted - n_bytes:+,} bytes: rounded up to 512 B, and a leftover of at most 1 MiB in "
    f"its segment is not split off); **reserved** (`torch.cuda.memory_reserved()`, what nvidia-smi "
    f"grows by) {segment:,} bytes, the segment taken from the GPU (1 MiB or less: shared 2 MiB "
    "segments; under 10 MiB: shared 20 MiB segments; larger: rounded up to 2 MiB). Source: "
    "c10/cuda/CUDACachingAllocator.cpp round_size, get_allocation_size, should_split."
)

table = score_doublings(batch, heads, seq_len, e)
left, right = st.columns([1.3, 1.2])  # the table's columns (attnmem.pages.ui.tables.fit_widths) fit at 1280 px
with left:
    st.markdown("**Double the length, quadruple the memory**")
    tables.table(  # as text: byte counts can exceed 64-bit integers (B = 10^6, s = 10^8)
        pd.DataFrame({
            "s": [f"{s:,}" for s in table["seq_len"]],
            "bytes": [f"{b:,}" for b in table["bytes"]],
            "GB": [f"{x:,.3f}" for x in table["GB"]],
            "GiB": [f"{x:,.3f}" for x in table["GiB"]],
            "× memory": [f"×{x:g}" for x in table["× memory"]],
        }),
        hide_index=True,
    )

with right:
    df = curve(batch, heads, e)
    gpu_bytes = GPUS[DEFAULT_GPU]
    marks = [(seq_len, n_bytes, "your s")]
    if 2 * seq_len <= MAX_SEQ_LEN:
        marks.append((2 * seq_len, doubled, "2 s: ×4"))
    fig = charts.figure(
        [
            dict(
                type="scatter", x=df["seq_len"].tolist(), y=[in_unit(b, unit) for b in df["bytes"].tolist()],
                mode="lines+markers", name="B·H·s²·e", line=dict(color=impl_color("naive")),
                customdata=[f"{b:,} bytes" for b in df["bytes"].tolist()],
                hovertemplate="s = %{x:,}<br>%{y:,.4g} " + unit + " (%{customdata})<extra></extra>",
            ),
            dict(
                type="scatter", x=[m[0] for m in marks], y=[in_unit(m[1], unit) for m in marks],
                mode="markers+text", text=[m[2] for m in marks], textposition="top left", name="your shape",
                marker=dict(size=12, symbol="diamond", color=impl_color("triton")),
                hovertemplate="s = %{x:,}<br>%{y:,.4g} " + unit + "<extra></extra>",
            ),
            charts.capacity_dict(DEFAULT_GPU, gpu_bytes, CURVE_LENS[0], CURVE_LENS[-1], unit),
        ],
        "sequence length s (tokens, log scale)", f"score matrix, one layer ({unit}, log scale)", 380,
        xaxis=charts.log_len_xaxis(CURVE_LENS[0], CURVE_LENS[-1]), yaxis=dict(type="log", exponentformat="power"),
    )
    charts.chart(fig, "score_chart", "score-matrix", df.assign(batch=batch, heads=heads, bytes_per_element=e_value))

sync_url(used)
