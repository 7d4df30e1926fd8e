"""Model memory: weights + KV cache + attention for a real model, and whether it fits a GPU.

Thin page: read widgets (preset, a Hugging Face Hub id, or an uploaded/pasted config.json) ->
attnmem.calc.memory_parts (attnmem.calc.model_memory by part), attnmem.calc.model_max_seq_len -> verdict, stacked bars,
table; for MLA models the expanded K/V beside the latent (attnmem.calc.kv.mla_expanded_kv_bytes), for
hybrids the constant state of their non-attention layers (attnmem.calc.kv.state_bytes). Training memory
is the Training step page's (attnmem.calc.training_step), linked from here: one answer per question.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd  # noqa: E402
import plotly.graph_objects as go  # noqa: E402
import streamlit as st  # noqa: E402
from streamlit.errors import StreamlitAPIException  # noqa: E402

from attnmem.calc import (  # noqa: E402
    DTYPES,
    IMPL_DTYPES,
    MAX_SEQ_LEN,
    MODELS,
    ModelConfig,
    active_param_count,
    gpus_needed,
    model_max_seq_len,
    param_count,
)
from attnmem.calc.kv import mla_expanded_kv_bytes, state_bytes  # noqa: E402
from attnmem.calc.memory_parts import (  # noqa: E402
    FLASH,
    NAIVE,
    STATE,
    kv_formula,
    memory_parts,
    state_formula,
)
from attnmem.calc.units import DTYPE_ALIASES  # noqa: E402
from attnmem.pages.ui import charts, pickers, tables, widgets  # noqa: E402
from attnmem.pages.ui import hub_model as hub  # noqa: E402
from attnmem.pages.ui import traced_memory_view as tmv  # noqa: E402
from attnmem.pages.ui.custom_config import CUSTOM  # noqa: E402
from attnmem.pages.ui.labels import MEMORY_PART_COLORS  # noqa: E402
from attnmem.pages.ui.messages import COMPUTED, trained_context_note  # noqa: E402
from attnmem.pages.ui.state import cached, get_unit, kept, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.units import fmt, in_unit  # noqa: E402
from attnmem.pages.ui.url_state import (  # noqa: E402
    ChoiceParam,
    IntParam,
    md_escape,
)
from attnmem.pages.ui.weights import usable_bytes  # noqa: E402

IMPL_NAMES = {NAIVE: "eager attention with masked_fill", FLASH: "PyTorch SDPA, FlashAttention-2 backend"}
ACT_DTYPES = ("bf16", "fp16", "fp32")

SPECS = {
    "model": ChoiceParam("Llama 3.1 8B", (*MODELS, hub.HUB, CUSTOM)),
    "wdtype": ChoiceParam("bf16", DTYPES, aliases=DTYPE_ALIASES),
    "kvdtype": ChoiceParam("bf16", DTYPES, aliases=DTYPE_ALIASES),
    "adtype": ChoiceParam("bf16", ACT_DTYPES, aliases=DTYPE_ALIASES),
    "b": IntParam(1, 1, 65_536),
    "s": IntParam(8192, 1, MAX_SEQ_LEN),
    "gpu": pickers.GPU_SPEC,
}


def of(key) -> ModelConfig:
    """The model a cache key names: a preset's name (hashing a ModelConfig costs more than the
    work), or the model itself (a Hub id's, a config.json's)."""
    return MODELS[key] if isinstance(key, str) else key


@cached(max_entries=128)
def longest_context(key, gpu_bytes: int, batch: int, wd: str, kvd: str, ad: str, impl: str) -> int:
    """Exact integer search over s (attnmem.calc.model_max_seq_len); cached by the model's key
    (`of`): ~30 model evaluations."""
    return model_max_seq_len(of(key), gpu_bytes, batch, wd, kvd, ad, impl)


@kept(128)
def parts_view(key, batch: int, seq_len: int, wd: str, kvd: str, ad: str,
               impls: tuple[tuple[str, str], ...], gpu: str, gpu_bytes: int, unit: str) -> dict:
    """calc's parts of memory for each implementation ((impl, label) pairs) and what the page
    draws of them: the stacked bars (a go.Figure, ~10 ms of CPU to build), the table of bytes
    (its CSV), the same in the unit, and the formulas as a list; kept across runs and
    sessions by the inputs (issue 45 item 5), shared read-only.
    A ValueError from calc is raised again on every run (Streamlit keeps no exception)."""
    model = of(key)
    impls_d = dict(impls)
    parts, formulas = memory_parts(model, batch, seq_len, wd, kvd, ad, tuple(impls_d))
    totals = {impl: sum(p.values()) for impl, p in parts.items()}
    fig = go.Figure()
    names = list(parts[NAIVE])
    for part in names:
        fig.add_trace(go.Bar(
            name=part, x=[impls_d[i] for i in impls_d], y=[in_unit(parts[i][part], unit) for i in impls_d],
            marker_color=MEMORY_PART_COLORS[part],
            customdata=[fmt(parts[i][part], unit) for i in impls_d],
            hovertemplate="%{x}<br>" + part + ": %{customdata}<extra></extra>",
        ))
    fig.add_hline(y=in_unit(gpu_bytes, unit), line_dash="dash", layer="above",
                  annotation_text=f"{gpu}: {fmt(gpu_bytes, unit)}", annotation_position="top left")
    fig.update_layout(barmode="stack")
    charts.style(fig, "", f"memory ({unit})", 420)
    table = pd.DataFrame(
        [{"part": p, **{impls_d[i]: parts[i][p] for i in impls_d}, "formula (computed)": formulas[p]}
         for p in names]
        + [{"part": "total", **{impls_d[i]: totals[i] for i in impls_d}, "formula (computed)": "sum"}]
    )
    # The formulas go under the grid, not in it: the attention one is longer than a 1920 px
    # page is wide, and the grid cuts a cell off (the CSV download keeps them in a column).
    shown = table.drop(columns="formula (computed)")
    for i in impls_d:
        shown[impls_d[i]] = shown[impls_d[i]].map(lambda b: fmt(b, unit))
    return {"parts": parts, "totals": totals, "figure": fig,
            "csv": table.assign(model=model.name, batch=batch, seq_len=seq_len), "shown": shown,
            "formulas": "\n".join(f"- **{md_escape(p)}** (computed): {md_escape(formulas[p])}"
                                  for p in names)}


page_setup("model")
charts.preload()  # plotly.js starts loading now, not after every element above the chart


def training_link(where) -> None:
    """Training memory lives on the Training step page (attnmem.calc.training_step, as `attnmem train`):
    this page used to show attention-only training memory, which disagreed with it (issue 32)."""
    try:
        where.page_link("attnmem/pages/training.py", label="Training? The Training step page",
                        icon=":material/model_training:",
                        help="Weights, gradients, AdamW state and every activation of a step "
                             "(attnmem.calc.training_step).")
    except StreamlitAPIException:  # the page run without the app's router (AppTest)
        where.markdown("Training? [The Training step page](/training)")
    if st.query_params.get("mode") == "training":  # a link from before the view moved
        st.info("Training memory is on the Training step page (weights, gradients, AdamW "
                "state and every activation, attnmem.calc.training_step); this page answers inference.",
                icon=":material/model_training:")


st.title("Model memory")
st.markdown(
    "**Does my model fit, and at what context length?** Weights, KV cache and the attention "
    "scores of one layer, for standard (eager) attention and for FlashAttention."
)

top = st.columns([1.6, 1.2, 1.2])  # the GPU's value ("NVIDIA H100 80GB (85.52 GB)") fits at 1280 px
choice = pickers.model_select(SPECS["model"], where=top[0])
training_link(top[1])
gpu = pickers.gpu_picker(SPECS["gpu"], where=top[2])
picked = pickers.pick_model(choice, MODELS, SPECS["model"].default, where=top[0],
                            waiting="Upload or paste a config.json to see its memory; until "
                                    "then, the default model is shown.",
                            custom_origin="uploaded", traceable=True)
model = picked.model
used = dict(SPECS) | picked.specs  # a Hub id goes into the URL, never the file

row = st.columns(5)
wd, used["wdtype"] = pickers.weight_dtype("Weights dtype / quantization", model, where=row[0])
kvd = widgets.select("KV cache dtype", "kvdtype", SPECS["kvdtype"], where=row[1])
ad = widgets.select("Attention (activation) dtype", "adtype", SPECS["adtype"], where=row[2])
batch = widgets.int_input("Batch size", "b", SPECS["b"], where=row[3])
row[4].caption(" ")
seq_len = widgets.seq_len_input("Context length s (tokens)", "s", SPECS["s"], hi_pow2=1 << 24)

unit = get_unit()
gpu_bytes = usable_bytes(gpu)  # what torch can use where sourced (attnmem.calc.gpus), else the spec sheet
pickers.gpu_note(gpu, unit)
if picked.traced is not None:  # outside calc's rules: transformers' own modules, traced
    tmv.show(picked.traced, gpu, gpu_bytes, unit, batch, seq_len, wd, kvd, ad)
    sync_url(used)
    st.stop()
params = param_count(model)
st.caption(
    f"**{md_escape(model.name)}**: {params / 1e9:,.2f} B parameters, {model.num_layers} layers"
    + (f" ({model.kv_layers} with attention)" if model.kv_layers != model.num_layers else "")
    + f", {model.num_heads} query heads, "
    + (f"MLA latent {model.kv_lora_rank} + RoPE key {model.qk_rope_head_dim}, qk head dim "
       f"{model.head_dim}, v head dim {model.v_head_dim}" if model.is_mla else
       f"{model.num_kv_heads} KV heads, head dim {model.head_dim}")
    + (f", trained for {model.max_position_embeddings:,} tokens" if model.max_position_embeddings else "")
    + "."
    + (f" Active per token: {active_param_count(model) / 1e9:,.2f} B with the input embedding "
       f"(Mixtral card convention), {active_param_count(model, include_embedding=False) / 1e9:,.2f} B "
       "without it (DeepSeek, gpt-oss card convention)." if model.num_experts > 1 else "")
)
trained_context_note(model, seq_len)

# The implementations that run this attention dtype (attnmem.calc.IMPL_DTYPES): FlashAttention-2 takes
# fp16/bf16 only, so at fp32 the page shows eager alone and says why.
impls = {i: label for i, label in {NAIVE: "Standard (eager)", FLASH: "FlashAttention"}.items()
         if ad in IMPL_DTYPES[i]}
if FLASH not in impls:
    st.caption(f"FlashAttention-2 runs fp16 and bf16 inputs only (PyTorch's SDPA flash backend): "
               f"not shown for {ad} attention.")
key = choice if choice in MODELS else model  # the caches' key for the model (`of`)
view_key = (key, batch, seq_len, wd, kvd, ad, tuple(impls.items()), gpu, gpu_bytes, unit)
try:
    view = parts_view(*view_key)
except ValueError as err:  # a config that parses but that the model cannot size: say so
    st.error(md_escape(f"These settings cannot be computed for this model: {err}"), icon=":material/block:")
    sync_url(used)
    st.stop()
parts, totals = view["parts"], view["totals"]
state = parts[NAIVE].get(STATE, 0)  # constant in s: the longest context fits in what it leaves

summary, picture = st.columns([1, 1.25])
with summary:
    cols = st.columns(len(impls))
    for col, (impl, label) in zip(cols, impls.items(), strict=True):
        total = totals[impl]
        with col:
            st.metric(f"{label}: total", fmt(total, unit), help=f"{COMPUTED}: {' + '.join(parts[impl])} ({IMPL_NAMES[impl]}).")
            if total <= gpu_bytes:
                head = gpu_bytes - total
                st.success(f"Fits on one {gpu}: headroom {fmt(head, unit)} ({head / gpu_bytes:.0%} free).", icon=":material/check_circle:")
            else:
                n = gpus_needed(total, gpu_bytes)
                st.error(
                    f"Does not fit on one {gpu}: {fmt(total - gpu_bytes, unit)} over. "
                    f"Needs {n} of them (ideal split of the total).",
                    icon=":material/cancel:",
                )
            try:
                longest: int | None = longest_context(key, max(gpu_bytes - state, 0), batch, wd, kvd, ad, impl)
            except ValueError:
                longest = None
            shown = "n/a" if longest is None else (f"{longest:,}" if longest else "none")
            st.metric("Longest context (tokens)", shown,
                      help="Exact integer search over s of generate()'s prefill peak"
                      + (" + recurrent state" if state else "") + " ≤ GPU memory (computed).")
            trained = model.max_position_embeddings
            if longest and trained and longest > trained:
                st.info(f"Past the {trained:,} tokens this model was trained for: the "
                        "memory fits, the model may not work that far.",
                        icon=":material/warning:")
            elif longest == 0:
                st.info("Nothing fits: " + (
                    "the weights alone exceed the GPU." if parts[impl]["weights"] > gpu_bytes
                    else "the weights fit, but not a prompt of one token."),
                    icon=":material/block:")

with picture:
    charts.chart(view["figure"], "model_chart", "model-memory", view["csv"], content_key=view_key)
if model.is_mla:
    latent_col, expanded_col = st.columns(2)
    latent = parts[NAIVE]["KV cache"]
    expanded = mla_expanded_kv_bytes(model, batch, seq_len, kvd)
    latent_col.metric("KV cache: MLA latent (in the totals)", fmt(latent, unit),
                      help=f"{COMPUTED}: {kv_formula(model)}. What vLLM and SGLang keep.")
    expanded_col.metric("K/V expanded per head (eager)", fmt(expanded, unit),
                        help=f"{COMPUTED}: L·B·s·H·(qk_nope + qk_rope + v_head_dim)·e; transformers' "
                             "modeling_deepseek_v3.py caches per-head keys and values.")
    st.caption(
        f"{COMPUTED}. Multi-head latent attention caches one latent of "
        f"{model.kv_lora_rank} + {model.qk_rope_head_dim} elements per token per layer for all "
        f"{model.num_heads} heads; an eager implementation that expands it into per-head K "
        f"({model.head_dim}) and V ({model.v_head_dim}) holds {expanded / max(latent, 1):,.1f}× "
        "more. The totals above count the latent."
    )
if state:
    st.caption(
        f"{COMPUTED}. Hybrid: {model.kv_layers} of {model.num_layers} layers are attention "
        f"with a KV cache; the other {model.state_layers} hold a constant state of "
        f"{fmt(state_bytes(model, 1, ad), unit)} per sequence ({fmt(state, unit)} for B = {batch:,}): "
        f"{state_formula(model)}."
    )
with st.container():
    # The formulas go under the grid (parts_view), not in it.
    tables.table(view["shown"], hide_index=True, content_key=("model memory", view_key))
    st.markdown(view["formulas"])
    st.caption(
        "Inference prefill of s tokens, causal. Attention is one layer's peak: layers run "
        "one after another, so only one layer's scores exist at a time."
    )
st.caption(f"{COMPUTED}. Formulas: the list above (attnmem.calc.model_memory); KV cache {kv_formula(model)}; model shapes from each model's config.json ({md_escape(picked.origin)}).")

sync_url(used)
