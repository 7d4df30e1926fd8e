"""Inference: what transformers' generate() holds at its peak, where, and what would change it.

Thin page: widgets (the model picker of attnmem/pages/ui/pickers.py: a preset, a Hugging Face
Hub id or a measured shape) -> attnmem.calc.inference_step for every attention implementation (attnmem/pages/ui/inference.py runs
them and keeps each refusal's reason) -> the verdict for the chosen one with the longest prompt
that fits (attnmem.calc.max_inference_seq_len), stacked bars of the parts at each peak, prefill against
decode, what chunked prefill saves; and the bundled H200 measurements
(data/inference_steps_h200.csv) beside the current prediction.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from attnmem.calc import DTYPES, MAX_SEQ_LEN, MODELS  # noqa: E402
from attnmem.calc.inference_step import (  # noqa: E402
    CACHES,
    INFER_ATTENTION_LABELS,
    INFER_ATTENTIONS,
    max_inference_seq_len,
)
from attnmem.calc.units import DTYPE_ALIASES  # noqa: E402
from attnmem.measure import on_this_gpu as gpu_run  # noqa: E402
from attnmem.pages.ui import charts, measure_here, pickers, tables, traced, widgets  # noqa: E402
from attnmem.pages.ui import hub_model as hub  # noqa: E402
from attnmem.pages.ui import inference as inf  # noqa: E402
from attnmem.pages.ui import traced_view as tv  # noqa: E402
from attnmem.pages.ui.custom_config import CUSTOM  # noqa: E402
from attnmem.pages.ui.labels import FALLBACK_COLOR  # noqa: E402
from attnmem.pages.ui.messages import COMPUTED, trained_context_note  # noqa: E402
from attnmem.pages.ui.state import cached, get_unit, kept, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.units import fmt, in_unit  # noqa: E402
from attnmem.pages.ui.url_state import (  # noqa: E402
    ChoiceParam,
    IntParam,
    md_escape,
)
from attnmem.pages.ui.weights import usable_bytes  # noqa: E402

MEASURED_PREFIX = "measured shape: "
MEASURED = ("Measured on one NVIDIA H200 (torch 2.11, transformers 5.17) by "
            "`python -m attnmem.measure --infer --plan h200`: `max_memory_allocated()` over "
            "`generate()`, random weights from the real configs, bf16.")


@kept(None)
def measured_models() -> tuple[dict, dict]:
    """The measured configs by name, and those no preset has (frozen configs: shared, not copied)."""
    shapes = inf.measured_shapes()
    return shapes, {MEASURED_PREFIX + n: m for n, m in shapes.items()
                    if inf.same_shape(m, dict(MODELS)) is None}


SHAPES, EXTRA = measured_models()
PRESETS = {**MODELS, **EXTRA}  #: the models a choice names (`of`)
#: EXTRA: measured configs no preset has (layer cuts), offered as models of their own, so that
#: every bundled row can be shown beside its prediction.

SPECS = {
    "model": ChoiceParam("Llama 3.1 8B", (*MODELS, hub.HUB, CUSTOM, *EXTRA)),
    "gpu": pickers.GPU_SPEC,  # the same specs as Model memory:
    "b": IntParam(1, 1, 65_536),  # these carry over between the pages
    "s": IntParam(8192, 1, MAX_SEQ_LEN),
    "wdtype": ChoiceParam("bf16", DTYPES, aliases=DTYPE_ALIASES),
    "kvdtype": ChoiceParam("bf16", DTYPES, aliases=DTYPE_ALIASES),
    "new": IntParam(128, 1, MAX_SEQ_LEN),
    "attn": ChoiceParam("sdpa", INFER_ATTENTIONS),
    "cache": ChoiceParam("dynamic", CACHES),
    "chunk": IntParam(0, 0, MAX_SEQ_LEN),  # 0: the prompt in one forward
    "mcols": tables.ALL_COLUMNS,  # every column of the measured rows, not only MEASURED_FIRST
}
#: The parts of the peak that outlive a forward (the rest are its transients), in the first
#: of the two tables of parts.
HELD_PARTS = ("weights", "KV cache")
#: Shorter headers of the measured rows' inputs (the section's title says what they are).
MEASURED_SHORT = {"new tokens": "new", "prefill chunk": "chunk", "peak (measured)": "measured peak",
                  "peak (computed)": "computed peak", "peak error": "error"}
#: The measured rows' columns shown by default: the inputs that identify a row and the peak
#: against its prediction (the prefill's peak, timings and where fall under "show all").
MEASURED_FIRST = ("model", "batch", "prompt", "new", "attention", "cache", "chunk",
                  "measured peak", "computed peak", "error")
CACHE_HELP = ("dynamic: transformers' DynamicCache, grows by concatenation; static: StaticCache, "
              "allocated whole for prompt + new tokens.")


def label(a: str) -> str:
    return INFER_ATTENTION_LABELS.get(a, a)


def of(key):
    """The model a cache key names: a preset's or measured config's name (hashing a ModelConfig
    costs more than a search), or the model itself (a Hub id's, a config.json's). The names
    are looked up here, not in a page global: a cached function runs the first run's code
    (attnmem.pages.ui.state.kept), whose globals another run does not update."""
    return ({**MODELS, **measured_models()[1]}[key]) if isinstance(key, str) else key


@cached(max_entries=128)
def longest_prompt(key, gpu_bytes: int, batch: int, new_tokens: int, kw: tuple) -> int:
    """Exact integer search over the prompt (attnmem.calc.max_inference_seq_len), cached by the
    model's key (`of`)."""
    return max_inference_seq_len(of(key), gpu_bytes, batch, new_tokens, **dict(kw))


@kept(128)
def run_all(key, batch: int, seq_len: int, new_tokens: int, kw: tuple) -> tuple[dict, dict]:
    """inf.run_all (one generate() per attention implementation), kept across runs and
    sessions by its inputs (issue 45 item 5); shared read-only."""
    return inf.run_all(of(key), batch, seq_len, new_tokens, **dict(kw))


@kept(128)
def parts_view(key, batch: int, seq_len: int, new_tokens: int, kw: tuple, gpu: str,
               gpu_bytes: int, unit: str) -> dict:
    """What the "at each peak" and "prefill against decode" parts draw (two figures as plotly
    dicts, their CSVs, two tables), kept as run_all is: built from its steps."""
    model = of(key)
    steps, _ = run_all(key, batch, seq_len, new_tokens, kw)
    names = [label(a) for a in steps]
    parts = list(inf.PART_COLORS) + sorted({p for m in steps.values() for p in m.parts}
                                           - set(inf.PART_COLORS))
    parts = [p for p in parts if any(m.parts.get(p) for m in steps.values())]  # the ones present
    cap = in_unit(gpu_bytes, unit)
    dash = dict(color="rgba(128,128,128,0.9)", dash="dash", width=1.5)
    traces = []
    for part in parts:
        ys = [m.parts.get(part, 0) for m in steps.values()]
        traces.append(dict(
            type="bar", name=part, x=names, y=[in_unit(y, unit) for y in ys],
            marker=dict(color=inf.PART_COLORS.get(part, FALLBACK_COLOR)),
            customdata=[fmt(y, unit) for y in ys],
            hovertemplate="%{x}<br>" + part + ": %{customdata}<extra></extra>"))
    traces.append(dict(type="scatter", mode="lines", x=names, y=[cap] * len(names), line=dash,
                       name=f"{gpu} ({fmt(gpu_bytes, unit)})", zorder=1,  # above the bars
                       hovertemplate=f"{gpu}: {fmt(gpu_bytes, unit)}<extra></extra>"))
    fig = charts.figure(traces, "", f"memory at the peak ({unit})", 460, barmode="stack", shapes=[dict(
        type="line", xref="paper", x0=0, x1=1, yref="y", y0=cap, y1=cap, line=dash, layer="above")])
    parts_table = pd.DataFrame([{"attention": a, **{p: m.parts.get(p, 0) for p in parts},
                                 "peak": m.peak_bytes, "peak phase": m.peak_phase}
                                for a, m in steps.items()])
    # Two tables of the same rows, so that each fits a 1280 px window beside the sidebar: the
    # peak, where it occurs and what outlives the step; then the transients alive at that moment.
    held = [p for p in parts if p in HELD_PARTS]
    held_table = pd.DataFrame([{"implementation": label(a), "peak": fmt(m.peak_bytes, unit),
                                "where": m.peak_phase, **{p: fmt(m.parts.get(p, 0), unit) for p in held}}
                               for a, m in steps.items()])
    transients = pd.DataFrame([{"implementation": label(a), **{p: fmt(m.parts.get(p, 0), unit)
                                                               for p in parts if p not in held}}
                               for a, m in steps.items()])
    pd_traces = [
        dict(type="bar", name=phase, x=names,
             y=[in_unit(getattr(m, f"{k}_peak_bytes"), unit) for m in steps.values()],
             customdata=[fmt(getattr(m, f"{k}_peak_bytes"), unit) for m in steps.values()],
             marker=dict(color=color), hovertemplate="%{x}<br>" + phase + ": %{customdata}<extra></extra>")
        for phase, k, color in (("prefill peak", "prefill", "#E69F00"), ("decode peak", "decode", "#0072B2"))]
    pd_traces.append(dict(type="scatter", mode="lines", x=names, y=[cap] * len(names), line=dash,
                          name=f"{gpu} ({fmt(gpu_bytes, unit)})", hoverinfo="skip", zorder=1))
    return {
        "figure": fig,
        "csv": parts_table.assign(model=model.name, batch=batch, prompt=seq_len,
                                  new_tokens=new_tokens),
        "held": held_table, "transients": transients,
        "phases": charts.figure(pd_traces, "", f"peak ({unit})", 380, barmode="group"),
        "phases_csv": pd.DataFrame([{"attention": a, "prefill peak": m.prefill_peak_bytes,
                                     "decode peak": m.decode_peak_bytes} for a, m in steps.items()]),
        # the same numbers as the page shows them (the chart is drawn only when opened)
        "phases_table": pd.DataFrame([{"implementation": label(a),
                                       "prefill peak": fmt(m.prefill_peak_bytes, unit),
                                       "decode peak": fmt(m.decode_peak_bytes, unit)}
                                      for a, m in steps.items()]),
    }


@kept(128)
def chunk_view(key, batch: int, seq_len: int, new_tokens: int, attention: str, kw: tuple,
               unit: str) -> tuple[pd.DataFrame, int]:
    """What chunked prefill saves (inf.chunk_savings: one generate() per chunk size) as the
    page shows it, and how many rows; kept across runs and sessions by its inputs."""
    savings = inf.chunk_savings(of(key), batch, seq_len, new_tokens, attention=attention, **dict(kw))
    shown = savings.assign(**{
        "prefill chunk": savings["prefill chunk"].map(
            lambda x: "whole prompt" if x is None or pd.isna(x) else f"{int(x):,}"),
        **{col: savings[col].map(lambda b: fmt(b, unit)) for col in
           ("prefill peak", "decode peak", "peak")},
        "saved": savings["saved"].map(lambda b: "—" if b == 0 else fmt(b, unit)),
    })
    return shown, len(savings)


@kept(64)
def measured_view(shape: str | None, model_name: str, unit: str) -> tuple[str, pd.DataFrame, str]:
    """The measured section for this model: its lead-in, the rows as shown (sizes in the unit,
    errors in %) and the caption; kept across runs and sessions (the rows are read once)."""
    compared = measured_table()
    if shape:
        view = compared[compared["model"] == shape]
        said = f"Rows measured on this model's shape ({shape}):"
    else:
        view = compared
        said = (f"{model_name} was not measured; every bundled row with its prediction. "
                f"Measured models: {', '.join(sorted(set(compared['model'])))}.")
    shown_m = view.copy()
    for col in ("measured peak", "predicted peak", "measured prefill peak", "predicted prefill peak"):
        shown_m[col] = shown_m[col].map(lambda b: "—" if b is None or pd.isna(b) else fmt(b, unit))
    for col in ("peak error", "prefill error"):
        shown_m[col] = shown_m[col].map(lambda e: "—" if e is None or pd.isna(e) else f"{e:+.2%}")
    shown_m["prefill chunk"] = shown_m["prefill chunk"].map(
        lambda x: "—" if x is None or pd.isna(x) else f"{int(x):,}")
    shown_m = shown_m.rename(columns={
        "measured peak": "peak (measured)", "predicted peak": "peak (computed)",
        "measured prefill peak": "prefill peak (measured)",
        "predicted prefill peak": "prefill peak (computed)",
        "predicted where": "where (computed)", "prefill ms": "prefill ms (measured)", "decode ms/token": "decode ms/token (measured)"})
    errs = compared["peak error"].dropna().abs()
    by_model = compared.groupby("model")["peak error"].apply(lambda e: e.abs().max())
    caption = (f"{MEASURED} Computed: attnmem.calc.inference_step for each row's inputs, now. "
               f"{len(compared)} rows; largest |error| of the peak {errs.max():.2%} ("
               + ", ".join(f"{k} {v:.2%}" for k, v in by_model.items()) + ").")
    return said, shown_m.rename(columns=MEASURED_SHORT), caption


@kept(None)
def measured_table() -> pd.DataFrame:
    """The bundled rows with the current prediction (~70 inference_step calls), once per
    process, shared read-only (a copy per call cost ~2 ms, twice a run)."""
    return inf.compared_rows(inf.read_measured())


page_setup("inference")
charts.preload()  # plotly.js starts loading now, not after every element above the chart
st.title("Inference")
st.markdown("**What does `generate()` hold at its peak, where, and what would change it?** "
            "Weights, the KV cache and everything the prompt's prefill and each decode step "
            "allocate, per attention implementation, as transformers runs them.")
# The answer (fits or not, the peak, the longest prompt) is drawn here, above the inputs, so it
# is on screen at 1280x800 without scrolling (issue 45, item 2); the inputs follow it.
answer = st.container()
measure_box = st.container()  # "Measure on this GPU", collapsed, under the answer

top = st.columns([1.6, 1.2, 1.2])  # the GPU's value ("NVIDIA H100 80GB (85.52 GB)") fits at 1280 px
picked = pickers.model_picker(SPECS["model"], {**MODELS, **EXTRA}, where=top[0], traceable=True)
model = picked.model
used = dict(SPECS) | picked.specs  # a Hub id goes into the URL, never the file
gpu = pickers.gpu_picker(SPECS["gpu"], where=top[1])
attn = widgets.select("Attention", "attn", SPECS["attn"], where=top[2], format_func=label)
row = st.columns(5)
batch = widgets.int_input("Batch size", "b", SPECS["b"], where=row[0])
new_tokens = widgets.int_input("New tokens", "new", SPECS["new"], where=row[1])
wd, used["wdtype"] = pickers.weight_dtype("Weights dtype / quantization", model, where=row[2])
kvd = widgets.select("KV cache dtype", "kvdtype", SPECS["kvdtype"], where=row[3])
cache = widgets.select("Cache", "cache", SPECS["cache"], where=row[4], help=CACHE_HELP)
seq_len = widgets.seq_len_input("Prompt length (tokens)", "s", SPECS["s"], hi_pow2=1 << 24)
chunk_in = widgets.int_input("Prefill chunk (tokens; 0 = the whole prompt in one forward)", "chunk",
                             SPECS["chunk"], help="generate(prefill_chunk_size=C): the prompt is fed "
                             "C tokens at a time through the same cache.")
chunk = chunk_in or None

unit = get_unit()
gpu_bytes = usable_bytes(gpu)  # what torch can use where sourced (attnmem.calc.gpus), else the spec sheet
pickers.gpu_note(gpu, unit, what="\"Fits\" and the longest prompt")
kw = dict(weight_dtype=wd, kv_dtype=kvd, cache=cache, prefill_chunk=chunk)
if picked.traced is not None:  # outside calc's rules: transformers' own modules, traced
    below = st.container()  # the traced peak's parts and tensors, under the inputs
    with answer:
        tv.model_caption(picked.traced)
        with st.spinner(tv.SPINNER):
            traced_answer = traced.inference(picked.traced, batch, seq_len, new_tokens, attn, wd,
                                             gpu_bytes=gpu_bytes, kv_dtype=kvd, cache=cache,
                                             prefill_chunk=chunk)
        tv.show_inference(traced_answer, gpu, gpu_bytes, unit, new_tokens, label(attn),
                          details=below)
    sync_url(used)
    st.stop()
key = picked.choice if picked.choice in PRESETS else model  # the caches' key for the model (`of`)
kw_key = tuple(sorted(kw.items()))
steps, refused = run_all(key, batch, seq_len, new_tokens, kw_key)
ctx = model.max_position_embeddings

# --- the verdict for the chosen attention (at the top of the page) ----------------------------
with answer:
    if not steps:  # calc refuses the model (or the inputs) for every implementation: say why
        reasons = sorted(set(refused.values()))
        st.error(md_escape("These settings cannot be computed: " + " / ".join(reasons)),
                 icon=":material/block:")
    elif attn not in steps:
        why = refused[attn]
        where = "this model"
        if "no kernel" in why:  # attnmem.calc.backends.NoKernel: "'<attention>' cannot run this ...: why"
            where, why = "these inputs", why.split(": ", 1)[-1]
        st.error(md_escape(f"{label(attn)} cannot run {where}: {why}. The chart "
                           f"below shows the implementations that can."), icon=":material/block:")
    else:
        m = steps[attn]
        cols = st.columns(3)
        cols[0].metric(f"{label(attn)}: peak", fmt(m.peak_bytes, unit),
                       help=f"{COMPUTED}: attnmem.calc.inference_step, at '{m.peak_phase}'.")
        cols[0].caption(f"Peak at **{m.peak_phase}** (computed). Prefill peak "
                        f"{fmt(m.prefill_peak_bytes, unit)}, decode peak "
                        f"{fmt(m.decode_peak_bytes, unit) if m.decode_peak_bytes else 'none (1 new token)'}.")
        if m.peak_bytes <= gpu_bytes:
            free = gpu_bytes - m.peak_bytes
            cols[1].success(f"Fits one {gpu}: {fmt(free, unit)} free ({free / gpu_bytes:.0%}), "
                            "computed.", icon=":material/check_circle:")
        else:
            cols[1].error(f"Does not fit one {gpu}: {fmt(m.peak_bytes - gpu_bytes, unit)} over "
                          "(computed).", icon=":material/cancel:")
        s_max = longest_prompt(key, gpu_bytes, batch, new_tokens,
                               tuple(sorted(dict(kw, attention=attn).items())))
        if s_max:
            # the label stays short enough for a third of a 1280 px page (issue 32: it was cut off)
            cols[2].metric(f"Longest prompt (+{new_tokens:,} new)", f"{s_max:,} tokens",
                           help=f"{COMPUTED}: attnmem.calc.max_inference_seq_len, an exact integer search "
                                f"over the prompt length, with {new_tokens:,} new "
                                f"token{'s' if new_tokens > 1 else ''} generated after it.")
            if ctx and s_max + new_tokens - 1 > ctx:
                cols[2].info(f"{s_max:,} + {new_tokens:,} tokens pass the {ctx:,} tokens this "
                             "model was trained for: the memory fits, the model may not work there.")
        elif m.weights_bytes + m.fixed_bytes >= gpu_bytes:
            cols[2].error(f"Nothing fits: the weights alone ({fmt(m.weights_bytes, unit)}, "
                          f"computed) exceed the {gpu}'s {fmt(gpu_bytes, unit)}.",
                          icon=":material/block:")
        else:
            cols[2].error(f"Nothing fits: not even a 1-token prompt with batch {batch:,} and "
                          f"{new_tokens:,} new tokens fits the {gpu} (computed).",
                          icon=":material/block:")
        st.caption(traced.rules_from())
    st.caption(
        f"**{md_escape(model.name)}**: {model.num_layers} layers, hidden {model.hidden_size:,}, "
        f"{model.num_heads} query / {model.num_kv_heads} KV heads of {model.head_dim}, vocabulary "
        f"{model.vocab_size:,}; trained context "
        f"{f'{model.max_position_embeddings:,} tokens' if model.max_position_embeddings else 'not stated'}.")
    trained_context_note(model, seq_len)
    if ctx and seq_len <= ctx < seq_len + new_tokens - 1:  # the prompt fits the context, the answer not
        st.info(f"The prompt and the new tokens ({seq_len + new_tokens - 1:,} positions) pass the "
                f"{ctx:,} tokens this model was trained for.")
if not steps:
    sync_url(used)
    st.stop()

with measure_box:  # this page's exact inputs through the bundled harness (attnmem.measure.on_this_gpu)
    measure_here.section(
        "infer", {attn: lambda: gpu_run.infer_request(
            model, batch=batch, prompt_len=seq_len, new_tokens=new_tokens, attention=attn,
            cache=cache, prefill_chunk=chunk, weight_dtype=wd, kv_dtype=kvd)},
        key="gpu_infer", unit=unit, compared=measured_table(), compared_key="infer: bundled",
        names=gpu_run.harness_models("infer", model), length_col="prompt", length=seq_len,
        batch=batch, label=label, also={"cache": cache, "new tokens": new_tokens},
        columns=("model", "batch", "prompt", "new tokens", "attention", "cache", "prefill chunk",
                 "measured peak", "predicted peak", "peak error"),
        predicted={attn: {"weights": steps[attn].weights_bytes}} if attn in steps else None)

# --- stacked parts at each implementation's peak --------------------------------------------
view = parts_view(key, batch, seq_len, new_tokens, kw_key, gpu, gpu_bytes, unit)
view_key = ("inference parts", key, batch, seq_len, new_tokens, kw_key, gpu, gpu_bytes, unit)
st.markdown("**What each implementation holds at its peak** (computed)")
charts.chart(view["figure"], "inference_parts", "inference-peak", view["csv"],
             content_key=(view_key, "parts"))
st.caption(f"{COMPUTED}: attnmem.calc.inference_step. Each bar is the moment of that "
           "implementation's peak: weights, the cuBLAS workspace and generate()'s inputs, the "
           "KV cache then, and the transients alive at that moment by part; the dashed line is "
           "the GPU's memory. attnmem/calc/inference_step.py lists every moment and tensor with its "
           "source.")
tables.table(view["held"], hide_index=True, content_key=(view_key, "held"))
st.markdown("**The transients alive at each peak** (computed)")
tables.table(view["transients"], hide_index=True, content_key=(view_key, "transients"))
for a, why in refused.items():
    st.markdown(md_escape(f"Not drawn: {label(a)}: {why}"))

# --- prefill against decode -------------------------------------------------------------------
st.markdown("**Prefill peak against decode peak** (computed)")
tables.table(view["phases_table"], hide_index=True, content_key=(view_key, "phases table"))
charts.chart_on_open("Chart: prefill and decode peaks against the GPU", view["phases"],
                     "inference_phases", "inference-prefill-decode", view["phases_csv"],
                     content_key=(view_key, "phases"))
st.caption(f"{COMPUTED}. The prefill runs the whole prompt (or one chunk) through every "
           "layer; a decode step runs one token per sequence against the full cache. With one "
           "new token there is no decode step (0).")

shown = steps.get(attn) or next(iter(steps.values()))
with st.expander(f"Each moment and every tensor at the peak of {label(shown.attention)}"):
    tables.table(pd.DataFrame([{"moment": k, "bytes then (computed)": fmt(v, unit)}
                               for k, v in shown.phases.items()]), hide_index=True)
    tables.table(  # bytes as text: very long prompts pass 64-bit integers in some terms
        pd.DataFrame([{"part": p, "tensor": t, "size (computed)": fmt(x, unit),
                       "bytes": f"{x:,}"} for p, t, x in shown.peak_terms]), hide_index=True)

# --- chunked prefill ------------------------------------------------------------------------
chosen = shown.attention
st.markdown(f"### What chunked prefill saves ({md_escape(label(chosen))}; computed)")
shown_sav, n_savings = chunk_view(key, batch, seq_len, new_tokens, chosen, kw_key, unit)
tables.table(shown_sav, hide_index=True,
             content_key=("inference chunks", key, batch, seq_len, new_tokens, chosen, kw_key, unit))
if n_savings == 1:
    st.caption(f"The prompt ({seq_len:,} tokens) is no longer than the smallest chunk: chunking "
               "changes nothing.")
st.caption(f"{COMPUTED}: attnmem.calc.inference_step with prefill_chunk = C (generate's "
           "prefill_chunk_size). The activations scale with C, the cache with the tokens so far; "
           "once the prefill is small the decode or the cache decides the peak.")

# --- measured rows --------------------------------------------------------------------------
st.markdown("### Measured on an H200 against the prediction")
compared = measured_table()
if compared.empty:
    st.info("No bundled inference measurements (data/inference_steps_h200.csv). Run "
            "`python -m attnmem.measure --infer --plan h200` on a GPU to make them.")
else:
    shape = inf.same_shape(model, SHAPES)
    said, shown_m, caption = measured_view(shape, model.name, unit)
    st.markdown(md_escape(said))
    tables.wide_table(shown_m, MEASURED_FIRST, "mcols", content_key=("inference measured", shape, model.name, unit))
    st.caption(caption)

sync_url(used)
