"""How FlashAttention works: the score matrix as tiles, one tile on chip at a time, the online
softmax's running max and sum, causal tiles skipped; and the HBM bytes each approach moves.

Thin page: read widgets -> attnmem.calc.io_model (tile schedule, online-softmax trace, IO counts) ->
a heatmap with tile shapes, a table of (m, ℓ) per row, and a stacked bar of HBM bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from attnmem.calc import MAX_HEAD_DIM, MAX_HEADS, MAX_SEQ_LEN, dtype_bytes  # noqa: E402
from attnmem.calc.io_model import (  # noqa: E402
    example_scores,
    flash_io,
    online_softmax_trace,
    standard_io,
    tile_onchip_bytes,
    tile_schedule,
)
from attnmem.calc.units import DTYPE_ALIASES  # noqa: E402
from attnmem.pages.ui import charts, tables, widgets  # noqa: E402
from attnmem.pages.ui.messages import COMPUTED  # noqa: E402
from attnmem.pages.ui.state import cached, get_unit, init, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.units import fmt, in_unit  # noqa: E402
from attnmem.pages.ui.url_state import BoolParam, ChoiceParam, IntParam  # noqa: E402

SPECS = {
    "n": ChoiceParam("16", ("8", "12", "16", "24", "32")),
    "blk": ChoiceParam("4", ("2", "4", "8")),
    "causal": BoolParam(True),
    "step": IntParam(0, 0, 10_000),
    "b": IntParam(1, 1, 65_536),
    "h": IntParam(32, 1, MAX_HEADS),
    "s": IntParam(4096, 1, MAX_SEQ_LEN),
    "d": IntParam(128, 1, MAX_HEAD_DIM),
    "dtype": ChoiceParam("fp16", ("fp16", "bf16", "fp32"), aliases=DTYPE_ALIASES),
    "br": ChoiceParam("128", ("16", "32", "64", "128", "256")),
    "bc": ChoiceParam("64", ("16", "32", "64", "128", "256")),
}
TILE_LINE = "rgba(128,128,128,0.7)"
CURRENT = "#D55E00"


@cached()
def demo(n: int, blk: int, causal: bool) -> tuple[list[list[float]], list, list]:
    scores = example_scores(n)
    return scores, tile_schedule(n, blk, blk, causal), online_softmax_trace(scores, blk, blk, causal)


page_setup("flash")
charts.preload()  # plotly.js starts loading now, not after every element above the chart
st.title("How FlashAttention works")
st.markdown(
    "**Why does FlashAttention need so little memory?** It never writes the *s × s* score "
    "matrix to GPU memory (HBM). It walks the matrix **one tile at a time**: a block of queries "
    "meets a block of keys inside the chip's fast on-chip memory (SRAM), and a **running max** "
    "*m* and **running sum** *ℓ* per row make the softmax come out exact without ever seeing "
    "the whole row at once."
)
# The answer for the user's shape (what each approach moves, how much less) comes first, on
# screen at 1280x800 without scrolling (issue 45, item 2); its inputs are in section 2 below.
headline = st.container()

st.subheader("1 · The score matrix, tile by tile (a small worked example)")
cols = st.columns([1, 1, 1, 3])
n = int(widgets.select("tokens (s)", "n", SPECS["n"], where=cols[0]))
blk = int(widgets.select("tile size", "blk", SPECS["blk"], where=cols[1]))
causal = widgets.toggle("causal mask", "causal", SPECS["causal"], where=cols[2])
scores, tiles, trace = demo(n, blk, causal)
n_steps = len(trace)
init("step", SPECS["step"])
if st.session_state["step"] > n_steps - 1:
    st.session_state["step"] = n_steps - 1
with cols[3]:
    if n_steps > 1:
        step = st.slider(f"step (tile computed), 0 … {n_steps - 1}", 0, n_steps - 1, key="step")
    else:
        step = 0
state = trace[step]
tile = state.tile
skipped = sum(t.skipped for t in tiles)

z = [[None if causal and j > i else scores[i][j] for j in range(n)] for i in range(n)]
heat = dict(
    type="heatmap", z=z, x=list(range(n)), y=list(range(n)), colorscale="RdBu", reversescale=True,
    zmid=0, showscale=False,  # + 0.0: a score that rounds to zero reads 0.0, not -0.0
    text=[[("" if v is None else f"{round(v, 1) + 0.0:.1f}") for v in row] for row in z],
    hovertemplate="query %{y}, key %{x}<br>score %{z:.2f}<extra></extra>",
)
if n <= 16:
    heat["texttemplate"] = "%{text}"
shapes = []  # built as one list: fig.add_shape re-validates every shape on each call
for t in tiles:
    box = dict(type="rect", x0=t.k_start - 0.5, x1=t.k_end - 0.5, y0=t.q_start - 0.5, y1=t.q_end - 0.5,
               line=dict(color=TILE_LINE, width=1))
    if t.skipped:
        box["fillcolor"] = "rgba(128,128,128,0.55)"
    elif t.step is not None and t.step < step:
        box["fillcolor"] = "rgba(0,158,115,0.18)"
    shapes.append(box)
shapes.append(dict(type="rect", x0=tile.k_start - 0.5, x1=tile.k_end - 0.5, y0=tile.q_start - 0.5,
                   y1=tile.q_end - 0.5, line=dict(color=CURRENT, width=4)))
fig = {"data": [heat], "layout": dict(
    shapes=shapes,
    annotations=[dict(x=(tile.k_start + tile.k_end - 1) / 2, y=tile.q_start - 0.5, text="in SRAM",
                      showarrow=False, yshift=10, font=dict(color=CURRENT, size=13))],
    yaxis=dict(autorange="reversed", title=dict(text="query i (rows)"), dtick=blk, scaleanchor="x"),
    xaxis=dict(title=dict(text="key j (columns)"), dtick=blk, side="top"),
    height=560, margin=dict(l=10, r=10, t=30, b=10),
)}

left, right = st.columns([1.2, 1])
with left:
    charts.chart(fig, "tiles_chart", "flash-tiles")
    st.caption(
        f"{n}×{n} scores (a deterministic example), tiles of {blk}×{blk}. Orange: the tile on chip "
        "now; green: done; grey: skipped by the causal mask (keys after the query: never loaded "
        "or computed); empty cells: masked inside a diagonal tile."
    )
with right:
    tr = -(-n // blk)
    st.markdown(
        f"**Step {step} of {n_steps - 1}**: query block {tile.qi} (rows {tile.q_start}–"
        f"{tile.q_end - 1}) meets key block {tile.kj} (keys {tile.k_start}–{tile.k_end - 1}). "
        f"On chip: Q block, K and V blocks, the {tile.q_end - tile.q_start}×"
        f"{tile.k_end - tile.k_start} score tile, and per row *m*, *ℓ* and the output "
        "accumulator. Nothing *s × s* goes to HBM."
    )
    rows_df = pd.DataFrame([
        {"row": r.row, "running max m": round(r.m, 4), "running sum ℓ": round(r.l, 4)} for r in state.rows
    ])
    tables.table(rows_df, hide_index=True)
    # The update rules as text, not st.latex: KaTeX's bundle and fonts cost a direct load
    # 0.5-1 s on the 2-core machine (issue 45 item 3); one rule a line.
    st.markdown(
        "*m′* = max(*m*, maxⱼ *S*ᵢⱼ)  \n"
        "*ℓ′* = exp(*m* − *m′*) · *ℓ* + Σⱼ exp(*S*ᵢⱼ − *m′*)  \n"
        "*O′* = exp(*m* − *m′*) · *O* + Σⱼ exp(*S*ᵢⱼ − *m′*) · *V*ⱼ  \n"
        "output: *O* / *ℓ*  (*j*: the keys of the tile)")
    st.caption(
        f"{tr} query blocks × {tr} key blocks = {len(tiles)} tiles"
        + (f", {skipped} skipped by the causal mask" if causal else "")
        + ". After a row's last tile, m is the row's max and ℓ its softmax denominator exactly "
        "(Milakov & Gimelshein 2018; Dao et al. 2022, Algorithm 1). Computed in pure Python."
    )

st.subheader("2 · What each approach moves to and from GPU memory (HBM), for your shape")
cols = st.columns(7)
b = widgets.int_input("batch B", "b", SPECS["b"], where=cols[0])
h = widgets.int_input("heads H", "h", SPECS["h"], where=cols[1])
s = widgets.int_input("sequence s", "s", SPECS["s"], where=cols[2])
d = widgets.int_input("head dim d", "d", SPECS["d"], where=cols[3])
dtype = widgets.select("dtype", "dtype", SPECS["dtype"], where=cols[4])
br = int(widgets.select("query block B_r", "br", SPECS["br"], where=cols[5]))
bc = int(widgets.select("key block B_c", "bc", SPECS["bc"], where=cols[6]))
unit = get_unit()
e = dtype_bytes(dtype)
std = standard_io(b, h, s, d, e)
fl = flash_io(b, h, s, d, e, br, bc, causal)

m = headline.columns([1.15, 1, 0.9, 0.95])  # "Standard attention moves (GB)" fits at 1280 px
m[0].metric(f"Standard attention moves ({unit})", fmt(std.total_bytes, unit), help="Computed: (4·N·d + 4·N²)·e per batch and head.")
m[1].metric(f"FlashAttention moves ({unit})", fmt(fl.total_bytes, unit),
            help="Computed: Q read once, O and log-sum-exp written once, K and V read once per query block.")
onchip = tile_onchip_bytes(br, bc, d, e)
m[3].metric("On chip per step", fmt(onchip, unit),
            help=(f"Q_i ({br}×{d}), K_j and V_j ({bc}×{d} each) in {dtype}; the {br}×{bc} score tile, the "
                  f"output accumulator ({br}×{d}) and m, ℓ in fp32. Independent of s. An H100 has "
                  "228 KB of shared memory per SM, plus registers."))
m[2].metric("Less traffic", f"×{std.total_bytes / fl.total_bytes:,.3g}",
            help=f"K and V are read T_r = ceil(s / B_r) = {fl.kv_passes:,} times by FlashAttention.")
headline.caption(
    f"{COMPUTED}: HBM traffic of one forward pass at B = {b:,}, H = {h:,}, s = {s:,}, d = {d:,}, "
    f"{dtype}, tiles {br}×{bc}{', causal' if causal else ''}; the shape is set in section 2 "
    "below, the causal mask in section 1.")

rows = [
    {"what": label, "standard": a, "flash": f}
    for (label, a), (_, f) in zip(std.rows(), fl.rows(), strict=True)
]
io_df = pd.DataFrame(rows)
palette = ["#0072B2", "#56B4E9", "#D55E00", "#E69F00", "#009E73"]
fig2 = charts.figure(
    [
        dict(
            type="bar", name=row["what"], y=["standard attention", "FlashAttention"],
            x=[in_unit(row["standard"], unit), in_unit(row["flash"], unit)], orientation="h",
            marker=dict(color=color), customdata=[f"{row['standard']:,}", f"{row['flash']:,}"],
            hovertemplate="%{y}<br>" + row["what"] + ": %{x:,.4g} " + unit + " (%{customdata} bytes)<extra></extra>",
        )
        for color, row in zip(palette, rows, strict=True)
    ],
    f"bytes moved to/from HBM, one forward pass ({unit})", "", 300, barmode="stack",
)
# The numbers as a table, the chart one click away: a second plotly chart costs a direct load
# as much as the first (issue 45 item 3); the tiles above stay drawn.
tables.table(pd.DataFrame([{"what": row["what"], "standard attention": fmt(row["standard"], unit),
                            "FlashAttention": fmt(row["flash"], unit)} for row in rows]
                          + [{"what": "total", "standard attention": fmt(std.total_bytes, unit),
                              "FlashAttention": fmt(fl.total_bytes, unit)}]), hide_index=True)
charts.chart_on_open("Chart: bytes moved, stacked by part", fig2, "io_chart", "hbm-traffic",
                     io_df.assign(batch=b, heads=h, seq_len=s, head_dim=d, dtype=dtype,
                                  block_q=br, block_k=bc, causal=causal))
st.caption(
    f"{COMPUTED}. Standard attention (Dao et al. 2022, arXiv 2205.14135, Algorithm 0) writes S "
    "and P = softmax(S) to HBM and reads them back: Θ(N·d + N²). FlashAttention (FlashAttention-2 "
    f"loop order) reads K and V once per query block, {fl.kv_passes:,} times here: Θ(N²·d²/M) for "
    "SRAM size M (Theorem 2). Counts of the algorithms, not measurements: real kernels add mask "
    "and dropout passes (standard) or hit the L2 cache on K/V re-reads (flash). The causal switch "
    "above applies to both sections."
)

sync_url(SPECS)
