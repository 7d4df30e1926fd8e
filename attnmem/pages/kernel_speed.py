"""Kernel speed: the bundled attention kernels against PyTorch's SDPA backends (and
FlashAttention-4 where the data has it), measured side by side on an H200.

Thin page: the CSVs that `python -m attnmem.measure.bench` wrote on the H200 (data/kernel_speed_*_h200.csv,
offered and read by attnmem.measure.speed_runs) -> one chart of TFLOP/s against s per
implementation and a table with our kernel's ratio to cuDNN, FlashAttention-2 and, when the
run has it, FlashAttention-4. Everything here is measured; the page names the run (GPU,
versions, time) it shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from attnmem.measure import speed_runs  # noqa: E402
from attnmem.measure.speed_results import OURS  # noqa: E402
from attnmem.pages.ui import charts, tables, widgets  # noqa: E402
from attnmem.pages.ui.labels import impl_color, impl_label, peer_headline, peer_label  # noqa: E402
from attnmem.pages.ui.state import kept, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.url_state import (  # noqa: E402
    BoolParam,
    ChoiceParam,
    md_escape,
)

# timing choice -> ({pass: CSV}, how it was timed); the grouped-query CSVs (ATTNMEM_BENCH_DIR
# points the page at another folder of them)
SOURCES, GQA_SOURCES = speed_runs.sources()
KV_WORDS = {"32": "32 (MHA)", "8": "8 (GQA 4:1)"}
# What flash_attention runs by default on a Hopper GPU: "triton" in the bench is that path
# (attnmem.kernels.flash's default schedule): the Gluon forward at d = 128; at d = 64 the portable
# Triton forward up to s = 2,048 (4,096 causal), the three-warpgroup Gluon forward above.
DEFAULT_IMPL = OURS
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


@kept(12)  # the bundled CSVs, shared read-only
def load(path: str) -> pd.DataFrame:
    return speed_runs.load_frame(path)


def _stamp() -> tuple:
    """Every CSV the timing choices name (path, modification time, size; ATTNMEM_BENCH_DIR can
    point them elsewhere): the views below are kept while none of them changes."""
    paths = [p for ps, _ in SOURCES.values() for p in ps.values()]
    paths += [p for ps in GQA_SOURCES.values() for p in ps.values()]
    out = []
    for p in dict.fromkeys(paths):
        try:
            st_ = p.stat()
            out.append((str(p), st_.st_mtime_ns, st_.st_size))
        except OSError:
            out.append((str(p), 0, 0))
    return tuple(out)


@kept(64)
def speed_view(dtype: str, d: int, causal: bool, want: str, timing: str, kv: str,
               stamp: tuple, _sources: dict, _gqa_sources: dict) -> dict:
    """What the page shows for these choices, kept across runs and sessions while the bundled
    CSVs are the same (`stamp`: every path of `_sources` and `_gqa_sources`, the timing
    choices over them, with its modification time and size), shared read-only: {"error":
    text} or {"info": text} where it stops, else the caption, the figure (a plotly dict), the
    table of speeds and ratios, and the headline (s, our speed, [(label, ratio, help)], a note
    on FlashAttention-4) or None. Selecting and pivoting the rows cost ~25 ms of CPU a run
    (issue 45 item 5)."""
    SOURCES, GQA_SOURCES = _sources, _gqa_sources  # noqa: N806 - the page's names for them
    paths, how = SOURCES[timing]
    kv_heads = int(kv)
    if kv != "32":
        paths = GQA_SOURCES.get(timing, {})
        how += (" Grouped-query attention: 8 key/value heads shared by the 32 query heads "
                "(SDPA backends called with enable_gqa=True).")
    df = None
    if want in paths:
        source = paths[want]
        try:
            df = load(str(source))
        except (OSError, ValueError) as exc:
            return {"error": f"The bundled benchmark data could not be read: {md_escape(str(exc))}"}
        df = df[df["kv_heads"] == kv_heads]
    if kv != "32" and (df is None or df[(df["dtype"] == dtype) & (df["mode"] == want)].empty):
        return {"info": "Grouped-query attention (8 key/value heads) was measured for: "
                + "; ".join(speed_runs.gqa_where(GQA_SOURCES, kv_heads, load))
                + ". Choose one of those to see it."}
    sel = (df[(df["dtype"] == dtype) & (df["head_dim"] == d) & (df["causal"] == causal)
              & (df["mode"] == want) & (df["status"] == "ok")] if df is not None else pd.DataFrame())
    if sel.empty:
        return {"info": "No measurement for this choice."}

    r0 = sel.iloc[0]
    fa4_versions = sorted({v for v in sel.loc[sel["impl"] == "fa4", "impl_version"] if v})
    caption = (
        f"Measured {r0['timestamp']} on {r0['gpu']}, torch {r0['torch_version']}, triton "
        f"{r0['triton_version']}"
        + (f", flash-attn-4 {', '.join(fa4_versions)}" if fa4_versions else "")
        + f"; source `{source.relative_to(ROOT) if source.is_relative_to(ROOT) else source.name}`. "
        + how
    )
    default = DEFAULT_IMPL
    impls, refs = speed_runs.shown_order(set(sel["impl"]), default)
    traces = []
    for impl in impls:
        got = sel[sel["impl"] == impl].sort_values("seq_len")
        name = impl_label(impl) + (" · default" if impl == default else "")
        traces.append(dict(
            type="scatter", mode="lines+markers", x=got["seq_len"].tolist(), y=got["tflops"].tolist(),
            name=name, line=dict(color=impl_color(impl), width=3 if impl == default else 2),
            hovertemplate=f"<b>{name}</b><br>s = %{{x:,}}<br>%{{y:.0f}} TFLOP/s<extra></extra>",
        ))
    lo, hi = int(sel["seq_len"].min()), int(sel["seq_len"].max())
    fig = charts.figure(traces, "sequence length s (log scale)", "TFLOP/s (measured)", 430,
                        xaxis=charts.log_len_xaxis(lo, hi), yaxis=dict(rangemode="tozero"))

    wide = speed_runs.tflops_by_length(sel, impls)
    table = pd.DataFrame({"s": wide.index})
    for impl in impls:
        table[impl_label(impl)] = wide[impl].round(0).tolist()
    for ref in refs:
        if default in wide:
            table[f"default / {peer_label(ref)}"] = (wide[default] / wide[ref]).round(2).tolist()
    headline = None
    if default in wide:
        # Headlines: our default's speed, and its ratio to each peer at the longest s where both
        # ran. FlashAttention-4, the fastest peer, is headlined even when this timing did not run
        # it, from the bundled run that timed it beside ours (named in the label).
        top = int(wide[default].dropna().index.max())
        heads = [(f"÷ {peer_headline(ref)} at s = {r[0]:,}", f"{r[1]:.2f}×", None)
                 for ref in refs if (r := speed_runs.ratio_at_top(wide, ref, default))]
        fa4_note = ""
        if "fa4" not in refs:
            other = speed_runs.fa4_elsewhere(SOURCES, dtype, d, causal, want, kv_heads, load)
            if other:
                run_name, s_fa4, ratio = other
                heads.append((f"÷ {peer_headline('fa4')} at s = {s_fa4:,}", f"{ratio:.2f}×",
                              f"From the run '{run_name}', which timed FlashAttention-4 and our "
                              "default side by side; this timing did not run FlashAttention-4."))
            else:
                fa4_note = ("FlashAttention-4 was not measured for this dtype, head dim, mask, pass "
                            "and key/value heads.")
        headline = (top, f"{wide.loc[top, default]:.0f} TFLOP/s", heads, fa4_note)
    return {"caption": caption, "figure": fig, "table": table, "heads": headline}


page_setup("kernel_speed")
charts.preload()  # plotly.js starts loading now, not after every element above the chart
st.title("Kernel speed")
st.markdown(
    "**How fast is each attention kernel on a real GPU?** Our bundled kernels and PyTorch's "
    "SDPA backends, run in one process on the same inputs (B = 1, H = 32 query heads), on an "
    "NVIDIA H200. "
    "All figures are **measured** (`python -m attnmem.measure.bench`); TFLOP/s count the forward as "
    "4·B·H·s²·d (half when causal) and forward + backward as 3.5× that."
)
# The answer comes first on screen, above the inputs (issue 45 item 2: the first number on
# screen at 1280x800 without scrolling, with room to spare; the six radios stand 315 px tall):
# our default's speed and its ratios to the peers, filled once the choices below are read.
answer = st.container()

cols = st.columns(6)
dtype = widgets.radio("dtype", "kdtype", SPECS["kdtype"], where=cols[0])
d = int(widgets.radio("head dim d", "kd", SPECS["kd"], where=cols[1]))
mode = widgets.radio("pass", "kpass", SPECS["kpass"], where=cols[2])
timing = widgets.radio("timing", "ktiming", SPECS["ktiming"], where=cols[3])
kv = widgets.radio("key/value heads", "kkv", SPECS["kkv"], where=cols[4], format_func=KV_WORDS.get)
causal = widgets.toggle("Causal mask", "kcausal", SPECS["kcausal"], where=cols[5])
sync_url(SPECS)

want = "fwd_bwd" if mode == "fwd+bwd" else "fwd"
stamp = _stamp()
view = speed_view(dtype, d, causal, want, timing, kv, stamp, SOURCES, GQA_SOURCES)
if "error" in view:
    st.error(view["error"])
    st.stop()
if "info" in view:
    st.info(view["info"])
    st.stop()
st.caption(view["caption"])
if view["heads"] is not None:
    with answer:
        top, speed, heads, fa4_note = view["heads"]
        mcols = st.columns([1] + [1.15 if why else 1 for _, _, why in heads])  # room for a help icon
        mcols[0].metric(f"default at s = {top:,} (measured)", speed)
        for col, (label, value, why) in zip(mcols[1:], heads, strict=True):
            col.metric(label, value, help=why)
        if fa4_note:
            st.caption(fa4_note)
table = view["table"]
key = ("kernel speed", dtype, d, causal, want, timing, kv, stamp)
charts.chart(view["figure"], "kernel_speed_chart", f"kernel-speed-{dtype}-d{d}-{mode}", table,
             content_key=key)
# Speeds, then the ratios to the peers: two tables, each fits a 1280 px window.
ratios = [col for col in table.columns if col.startswith("default / ")]
tables.table(table.drop(columns=ratios), hide_index=True, width="stretch", content_key=(key, "speed"))
if ratios:
    tables.table(table[["s", *ratios]], hide_index=True, content_key=(key, "ratios"))
st.markdown(
    f"*default*: what `flash_attention` runs on a Hopper GPU at d = {d}: {DEFAULT_WORDS[d]}. "
    "The forward+backward rows add our backward. On a Hopper GPU, from 4,096 queries with at "
    "least 256 dK/dV programs of 128 keys (B·H_kv·⌈s/128⌉), that is the Gluon backward: one "
    "program per 128 keys walks every query head of its group and adds dQ into an fp32 "
    "buffer with the copy engine's bulk reduce-adds. Elsewhere it is the Triton backward: "
    "two kernels (dQ, then dK/dV) up to s = 2,048 and on small grids, else one dK/dV kernel "
    "that also adds dQ into the fp32 buffer; with grouped-query attention on a small grid "
    "each group of query heads is split over several dK/dV programs whose partial dK, dV "
    "are summed afterwards. The FlashAttention-4 run times that default; the other bundled "
    "runs are older and time the Triton backward, and *Gluon backward (forced)* is the "
    "Gluon one on the same inputs. Full tables and the tuning notes: "
    "`attnmem/measure/bench/BENCH_H200.md`, `attnmem/kernels/flash/NOTES.md`."
)
