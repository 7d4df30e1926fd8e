"""Will it fit? The one question most users bring, answered in one view.

Thin page: model (the model picker of attnmem/pages/ui/pickers.py: a preset, a Hugging Face Hub
id or an uploaded or pasted config.json), GPU, task, context
and batch -> attnmem/pages/ui/fit.py, which asks the one calc function that answers the task
everywhere else (inference: attnmem.calc.inference_step; serving: attnmem.calc.serving_capacity; training:
attnmem.calc.training_step) -> a verdict, the peak's parts and where it occurs, the longest context
that fits, the GPUs needed, and links to the pages that explain each part.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from typing import Any  # noqa: E402

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402
from streamlit.errors import StreamlitAPIException  # noqa: E402

from attnmem.calc import DTYPES, GPUS, MAX_SEQ_LEN, MODELS  # noqa: E402
from attnmem.calc.gpus import torch_total_bytes  # noqa: E402
from attnmem.calc.units import DTYPE_ALIASES  # noqa: E402
from attnmem.pages.ui import fit, pickers, tables, traced, widgets  # noqa: E402
from attnmem.pages.ui import hub_model as hub  # noqa: E402
from attnmem.pages.ui.custom_config import CUSTOM  # noqa: E402
from attnmem.pages.ui.messages import COMPUTED, trained_context_note  # noqa: E402
from attnmem.pages.ui.state import get_unit, kept, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.units import fmt  # noqa: E402
from attnmem.pages.ui.url_state import (  # noqa: E402
    ChoiceParam,
    IntParam,
    md_escape,
)

# The same specs as the pages that explain each task, so that values carry over between them.
SPECS = {
    "model": ChoiceParam("Llama 3.1 8B", (*MODELS, hub.HUB, CUSTOM)),
    "gpu": pickers.GPU_SPEC,
    "task": ChoiceParam("inference", fit.TASKS),
    "b": IntParam(1, 1, 65_536),
    "s": IntParam(8192, 1, MAX_SEQ_LEN),
    "new": IntParam(128, 1, MAX_SEQ_LEN),
    "wdtype": ChoiceParam("bf16", DTYPES, aliases=DTYPE_ALIASES),
}
#: Pages that explain each task's parts: (file, title, icon, what it explains).
LINKS: dict[str, list[tuple[str, str, str, str]]] = {
    "inference": [
        ("attnmem/pages/inference.py", "Inference", ":material/output:",
         "every part of generate()'s peak, prefill against decode, chunked prefill, measured rows"),
        ("attnmem/pages/model_memory.py", "Model memory", ":material/memory:",
         "weights + KV cache + the prefill peak, eager against FlashAttention"),
    ],
    "serving": [
        ("attnmem/pages/serving.py", "Serving", ":material/dns:",
         "vLLM's budget, KV blocks, concurrency and every setting"),
        ("attnmem/pages/many_gpus.py", "Many GPUs", ":material/hub:",
         "a context longer than one GPU holds, split over a ring of GPUs"),
    ],
    "training": [
        ("attnmem/pages/training.py", "Training step", ":material/model_training:",
         "every activation, each moment of the step, checkpointing, sharding, measured rows"),
        ("attnmem/pages/many_gpus.py", "Many GPUs", ":material/hub:",
         "context parallelism: a training context split over a ring of GPUs"),
    ],
}
for _t in ("lora", "qlora"):  # the Training step page explains fine-tuning too
    LINKS[_t] = [("attnmem/pages/training.py", "Training step", ":material/model_training:",
                  "adapters' rank and targets, the base's NF4 storage, checkpointing, measured rows")]
ATTENTION_LINKS = [
    ("attnmem/pages/score_matrix.py", "Score matrix", ":material/grid_on:",
     "why standard attention's s × s scores grow quadratically"),
    ("attnmem/pages/flash_explainer.py", "How FlashAttention works", ":material/bolt:",
     "why FlashAttention needs so little memory"),
]
#: What each task's verdict assumes, said under its table (calc's rules).
TASK_NOTES = {
    "inference": "transformers' generate() with a dynamic cache (bf16 KV cache), SDPA "
                 "attention with torch choosing its backend; measured within about 1% on "
                 "an H200.",
    "serving": "vLLM's accounting: the budget is 0.9 × the GPU; weights, the profiling "
               "run's activations, non-torch memory and CUDA graphs come off it first; "
               "the KV pool holds the requests (block size 16, bf16 cache).",
    "training": "bf16 parameters, gradients and AdamW's two moments, SDPA's "
                "FlashAttention-2, no activation checkpointing, one GPU; the Training step "
                "page changes each of these.",
    "lora": "a frozen bf16 base; LoRA adapters of rank 16 on every linear layer (fp32, "
            "peft's default), their gradients and AdamW state; SDPA's FlashAttention-2, no "
            "checkpointing, one GPU; measured within 0.3% on an H200.",
    "qlora": "a frozen base in 4-bit NF4 (bitsandbytes); LoRA adapters of rank 16 on every "
             "linear layer (fp32), their gradients and AdamW state; SDPA's "
             "FlashAttention-2, no checkpointing, one GPU; measured within 0.3% on an H200.",
}
UNITS_LABEL = {"inference": "Prompt length s (tokens)", "serving": "Context per request s (tokens)",
               "training": "Sequence length s (tokens)", "lora": "Sequence length s (tokens)",
               "qlora": "Sequence length s (tokens)"}
BATCH_LABEL = {"inference": "Batch (sequences)", "serving": "Concurrent requests",
               "training": "Batch (sequences per step)", "lora": "Batch (sequences per step)",
               "qlora": "Batch (sequences per step)"}


def link(path: str, title: str, icon: str, what: str, query: dict[str, str]) -> None:
    """st.page_link to another page of the app with this view's inputs; a plain link where
    the page runs without the app's router (a page run on its own, as in AppTest)."""
    try:
        st.page_link(path, label=f"{title}: {what}", icon=icon, query_params=query)
    except StreamlitAPIException:
        st.markdown(f"[{title}](/{Path(path).stem}): " + md_escape(what))


@kept(256)
def verdict(key, task: str, gpu_bytes: int, batch: int, seq_len: int, new_tokens: int,
            wd: str) -> fit.Verdict:
    """The task's verdict from calc (attnmem.pages.ui.fit: a step and an exact search over s),
    kept across runs and sessions by the inputs, the model by its preset's name (or itself for
    a Hub id or config.json); ~5 ms of CPU a run before (issue 45 item 5)."""
    model = MODELS[key] if isinstance(key, str) else key
    if task == "inference":
        return fit.inference(model, gpu_bytes, batch, seq_len, new_tokens, wd)
    if task == "serving":
        return fit.serving(model, gpu_bytes, batch, seq_len, wd)
    return fit.training(model, gpu_bytes, batch, seq_len, task)


page_setup("will_it_fit")
st.title("Will it fit?")
st.markdown("**Does this model run this task at this context length on this GPU?** One answer, "
            "from the same function the task's own page uses.")

top = st.columns([1.7, 2, 2.3])  # the third choice's longest value fits at 1280 px
picked = pickers.model_picker(SPECS["model"], MODELS, where=top[0],
                              waiting="Upload or paste a config.json to see whether it fits; "
                                      "until then, the default model is shown.", traceable=True)
choice, model = picked.choice, picked.model
used: dict[str, Any] = dict(SPECS) | picked.specs  # a Hub id goes into the URL, never the file
gpu = pickers.gpu_picker(SPECS["gpu"], where=top[1])
task = widgets.select("Task", "task", SPECS["task"], where=top[2], format_func=fit.TASK_LABELS.get,
                      help="LoRA and QLoRA here use the Training step page's defaults (rank 16, all "
                           "linear layers, fp32 adapters); that page changes each of them.")
row = st.columns(3)
batch = widgets.int_input(BATCH_LABEL[task], "b", SPECS["b"], where=row[0])
new_tokens = 1
if task == "inference":
    new_tokens = widgets.int_input("New tokens", "new", SPECS["new"], where=row[1])
else:
    del used["new"]
if task in ("inference", "serving"):
    # a quantized checkpoint opens "as stored", as on the task pages (attnmem/pages/ui/pickers.py)
    wd, used["wdtype"] = pickers.weight_dtype("Weights dtype / quantization", model, where=row[2])
else:
    del used["wdtype"]
    wd = "bf16"
seq_len = widgets.seq_len_input(UNITS_LABEL[task], "s", SPECS["s"], hi_pow2=1 << 24)

unit = get_unit()
# "Fits" uses the memory torch can allocate on this GPU where it is sourced (attnmem.calc.gpus), as the
# task pages do; the spec-sheet figure is shown beside it.
gpu_bytes = torch_total_bytes(gpu)
st.caption(f"{gpu}: \"fits\" uses {fmt(gpu_bytes, unit)}"
           + (f", what torch can allocate (attnmem.calc.gpus.torch_total_bytes); the spec sheet says "
              f"{fmt(GPUS[gpu], unit)}." if gpu_bytes != GPUS[gpu] else
              ", the spec sheet's figure (no torch figure sourced for it)."))
unruled = picked.traced  # a model outside calc's rules: the trace answers (inference only)
trained = None if unruled else model.max_position_embeddings
if unruled:
    st.caption(md_escape(f"{unruled.name}: model type '{unruled.model_type}', which calc's rules "
                         f"do not cover: traced on the meta device; config from {picked.origin}."))
else:
    st.caption(f"**{md_escape(model.name)}**: {model.num_layers} layers, {model.num_heads} query / "
               f"{model.num_kv_heads} KV heads, trained context "
               f"{f'{trained:,} tokens' if trained else 'not stated'}; shapes from "
               f"{md_escape(picked.origin)}.")
    trained_context_note(model, seq_len)
if trained and seq_len <= trained < seq_len + new_tokens - 1:  # the prompt fits, the answer not
    st.info(f"The prompt and the new tokens ({seq_len + new_tokens - 1:,} positions) pass the "
            f"{trained:,} tokens this model was trained for.")

if unruled:
    with st.spinner("Tracing transformers' own modules on the meta device…"):
        v = traced.fit_verdict(unruled, task, gpu_bytes, batch, seq_len, new_tokens, wd)
else:
    v = verdict(choice if choice in MODELS else model, task, gpu_bytes, batch, seq_len,
                new_tokens if task == "inference" else 0, wd)

query = {"model": choice, "gpu": gpu, "s": str(seq_len), "b": str(batch)}
if hub.KEY in picked.specs:
    query[hub.KEY] = st.session_state[hub.KEY]
if task == "inference":
    query |= {"new": str(new_tokens), "wdtype": wd}
elif task == "serving":
    query = {k: x for k, x in query.items() if k != "b"} | {"wdtype": wd}
else:
    query["ft"] = fit.TRAIN_METHODS[task]  # the Training page opens on the same method
    if choice not in MODELS or v.refused or unruled:  # the Training page offers the models it can count
        del query["model"]

if v.refused:  # calc does not model this model for this task: its reason, no numbers
    name = unruled.name if unruled else model.name
    if unruled and task == "inference":  # the trace could not answer: a warning naming why
        st.warning(md_escape(f"{fit.TASK_LABELS[task]} cannot be traced for {name}: "
                             f"{v.refused}"), icon=":material/warning:")
    else:
        st.error(md_escape(f"{fit.TASK_LABELS[task]} is not modelled for {name}: "
                           f"{v.refused}"), icon=":material/block:")
else:
    said = traced.TRACED if v.counted_from else COMPUTED  # what counted the numbers
    for note in v.notes:
        st.caption(md_escape(note))
    limit_name = gpu if v.limit_bytes == gpu_bytes else f"vLLM's budget on the {gpu}"
    if v.fits:
        free = v.limit_bytes - v.peak_bytes
        st.success(f"**Fits** on one {gpu}: peak {fmt(v.peak_bytes, unit)} of "
                   f"{fmt(v.limit_bytes, unit)} ({limit_name}), {fmt(free, unit)} free. "
                   f"Computed by {v.source}.", icon=":material/check_circle:")
    else:
        st.error(f"**Does not fit** on one {gpu}: peak {fmt(v.peak_bytes, unit)} against "
                 f"{fmt(v.limit_bytes, unit)} ({limit_name}), "
                 f"{fmt(v.peak_bytes - v.limit_bytes, unit)} over. Computed by {v.source}.",
                 icon=":material/cancel:")
    m1, m2, m3 = st.columns(3)
    m1.metric("Peak", fmt(v.peak_bytes, unit),
              help=f"{said}: {v.source}" + (f", attention {v.attention}" if v.attention else "")
              + f"; at {v.where}.")
    if v.longest_unknown:  # a traced search stopped at its time budget: the bracket, no guess
        m2.metric("Longest context that fits (tokens)", "not searched to the token",
                  help=f"{said}: {v.longest_source}. The traces made give: {v.longest_unknown}.")
        st.caption(md_escape(f"Longest context not searched to the token for a traced model: "
                             f"the traces made within the time budget give {v.longest_unknown}."))
    else:
        longest = ("none" if v.longest == 0 else
                   f"≥ {v.longest:,}" if v.longest_at_bound else f"{v.longest:,}")
        m2.metric("Longest context that fits (tokens)", longest,
                  help=f"{said}: {v.longest_source}, an exact integer search"
                  + (f" (it stops at {MAX_SEQ_LEN:,}, the longest calc accepts)"
                     if v.longest_at_bound else "") + ".")
    if v.gpus is None:
        shown = "not modelled"
    elif v.gpus == 0:
        shown = "never fits"
    else:
        shown = f"{v.gpus:,}"
    m3.metric(f"{gpu.removeprefix('NVIDIA ')} GPUs needed at s = {seq_len:,}", shown,
              help=f"{said}: {v.gpus_how}.")
    st.caption(f"Peak at **{md_escape(v.where)}** (computed, {v.source}).")
    if v.longest == 0 and v.nothing_fits:
        st.error(f"Nothing fits: {v.nothing_fits}.", icon=":material/block:")
    elif trained and v.longest + new_tokens - 1 > trained:
        st.info(f"The longest context that fits, {v.longest:,} tokens"
                + (f" + {new_tokens - 1:,} new" if new_tokens > 1 else "")
                + f", passes the {trained:,} tokens this model was trained for: the memory "
                "fits, the model may not work that far.", icon=":material/warning:")
    if v.gpus == 0:
        why = ("not one request of this length fits one GPU's KV pool, and serving_capacity "
               "does not split a model over GPUs" if task == "serving" else
               f"even over {fit.MANY_GPUS:,} GPUs one replica's activations exceed the GPU")
        st.error(f"Never fits at any number of {gpu} GPUs: {why}.", icon=":material/block:")

    total = max(v.peak_bytes, 1)
    table = pd.DataFrame([{"part of the peak": p, "size (computed)": fmt(x, unit),
                           "share": f"{x / total:.0%}", "bytes": f"{x:,}"}
                          for p, x in v.parts.items()]
                         + [{"part of the peak": "peak", "size (computed)": fmt(v.peak_bytes, unit),
                             "share": "100%", "bytes": f"{v.peak_bytes:,}"}])
    tables.table(table, hide_index=True)
    if v.counted_from:  # traced: where the peak is, and what it was counted from
        st.markdown(f"**Where the peak is: the largest allocations alive at {md_escape(v.where)}**")
        tables.table(pd.DataFrame([{**r, "size (computed)": fmt(r["bytes"], unit),
                                    "bytes": f"{r['bytes']:,}"} for r in v.at_peak]),
                     hide_index=True)
        st.caption(md_escape(v.counted_from))
    else:
        st.caption(traced.rules_from(v.source))
    note = (f"transformers' generate() with a dynamic cache (K/V in the weights' dtype), "
            f"{v.attention} attention; every tensor from the model's own code."
            if v.counted_from else TASK_NOTES[task])
    st.caption(f"{said}: {v.source}. {note}")

st.markdown("**What each part is, and what changes it**")
for path, title, icon, what in LINKS[task] + ATTENTION_LINKS:
    q = query if path in (LINKS[task][0][0], "attnmem/pages/model_memory.py") else {}
    takes = (("attnmem/pages/inference.py",) if unruled else  # the trace answers it there only
             ("attnmem/pages/model_memory.py", "attnmem/pages/inference.py"))
    if choice == CUSTOM and path not in takes:  # the others take no config.json
        q = {k: x for k, x in q.items() if k != "model"}
    link(path, title, icon, what, q)
if choice == CUSTOM:
    st.caption("The config.json given here carries over to Inference (traced there too)"
               if unruled else "The config.json given here carries over to Model memory and "
               "Inference; the other pages take a preset or a Hub id, so they open with their "
               "own model.")

sync_url(used)
