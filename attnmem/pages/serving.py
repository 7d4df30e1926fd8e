"""Serving: how many requests of length s fit on my GPU, and the longest context one can have.

Thin page: widgets (the model picker of attnmem/pages/ui/pickers.py: a preset, a Hugging Face Hub id or a config.json) -> attnmem.calc.serving_capacity (vLLM's accounting: vllm/v1/worker/gpu_worker.py
and vllm/v1/core/kv_cache_utils.py, see attnmem/calc/serving.py) -> metrics and a table; prefill vs
decode attention of one layer per implementation (attnmem.calc.serving.prefill_decode_attention).
A model type outside calc's rules is counted from transformers' own modules instead
(attnmem.trace.serving, shown by attnmem/pages/ui/traced_serving_view.py), its answer at the top.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from attnmem.calc import (  # noqa: E402
    DTYPES,
    GPUS,
    IMPL_LABELS,
    IMPLEMENTATIONS,
    MAX_SEQ_LEN,
    MODELS,
)
from attnmem.calc.gpus import GPU_TORCH_TOTAL  # noqa: E402
from attnmem.calc.serving import (  # noqa: E402
    BLOCK_SIZES,
    DEFAULT_CUDA_GRAPH_BYTES,
    DEFAULT_NON_TORCH_BYTES,
    prefill_decode_attention,
    serving_capacity,
)
from attnmem.calc.units import DTYPE_ALIASES  # noqa: E402
from attnmem.pages.ui import hub_model as hub  # noqa: E402
from attnmem.pages.ui import pickers, tables, widgets  # noqa: E402
from attnmem.pages.ui import traced_serving_view as tsv  # noqa: E402
from attnmem.pages.ui.custom_config import CUSTOM  # noqa: E402
from attnmem.pages.ui.messages import COMPUTED  # noqa: E402
from attnmem.pages.ui.state import get_unit, kept, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.units import fmt  # noqa: E402
from attnmem.pages.ui.url_state import (  # noqa: E402
    BoolParam,
    ChoiceParam,
    FloatParam,
    IntParam,
    md_escape,
)
from attnmem.pages.ui.weights import usable_bytes  # noqa: E402

MIB = 2**20
SPECS = {
    "model": ChoiceParam("Llama 3.1 8B", (*MODELS, hub.HUB, CUSTOM)),
    "gpu": pickers.GPU_SPEC,
    "s": IntParam(32768, 1, MAX_SEQ_LEN),
    "util": FloatParam(0.9, 0.0, 1.0, lo_open=True),
    "block": ChoiceParam("16", tuple(str(b) for b in BLOCK_SIZES)),
    "mnbt": IntParam(8192, 1, 1_048_576),
    "seqs": IntParam(256, 1, 65_536),
    "graphs_mib": IntParam(DEFAULT_CUDA_GRAPH_BYTES // MIB, 0, 1_000_000),
    "nontorch_mib": IntParam(DEFAULT_NON_TORCH_BYTES // MIB, 0, 1_000_000),
    "graphs_in": BoolParam(True),
    "wdtype": ChoiceParam("bf16", DTYPES, aliases=DTYPE_ALIASES),
    "kvdtype": ChoiceParam("bf16", DTYPES, aliases=DTYPE_ALIASES),
}

@kept(256)
def serving_view(key, gpu: str, gpu_bytes: int, seq_len: int, wd: str, kvd: str, util: float,
                 block: str, mnbt: int, seqs: int, graphs: int, nontorch: int, graphs_in: bool,
                 unit: str) -> tuple:
    """calc's serving capacity for these inputs (the model by its preset's name, or itself for
    a Hub id or config.json) and the page's two tables (where the memory goes; one layer's
    prefill and decode attention), kept across runs and sessions (issue 45 item 5), shared
    read-only. A ValueError from calc is raised again on every run."""
    model = MODELS[key] if isinstance(key, str) else key
    cap = serving_capacity(model, gpu_bytes, seq_len, weight_dtype=wd, kv_dtype=kvd,
                           gpu_memory_utilization=util, block_size=int(block),
                           max_num_batched_tokens=mnbt, max_num_seqs=seqs,
                           cuda_graph_bytes=graphs * MIB, non_torch_bytes=nontorch * MIB,
                           cuda_graphs_in_budget=graphs_in)
    attention = {impl: prefill_decode_attention(model, impl, seq_len) for impl in IMPLEMENTATIONS}
    # The memory the budget is taken from, and the spec figure beside it where the two differ.
    gpu_rows = ([{"part": "GPU memory torch can use (used)", "bytes": cap.gpu_bytes},
                 {"part": "GPU memory on the spec sheet (not used)", "bytes": GPUS[gpu]}]
                if GPU_TORCH_TOTAL[gpu] else
                [{"part": "GPU memory, spec sheet (no torch figure sourced)", "bytes": cap.gpu_bytes}])
    table = pd.DataFrame(gpu_rows + [
        {"part": "budget (GPU × utilization)", "bytes": cap.budget_bytes},
        {"part": "weights", "bytes": cap.weights_bytes},
        {"part": "activation peak of the profiling run" + (" (estimate)" if cap.activation_estimated else ""), "bytes": cap.activation_bytes},
        {"part": "non-torch memory", "bytes": cap.non_torch_bytes},
        {"part": "CUDA graphs" + ("" if cap.cuda_graphs_in_budget else " (outside the budget)"), "bytes": cap.cuda_graph_bytes},
        {"part": "KV cache pool", "bytes": cap.kv_pool_bytes},
        {"part": "one request of s tokens (KV blocks + state)", "bytes": cap.bytes_per_sequence},
    ])
    shown = table.assign(size=table["bytes"].map(lambda b: fmt(b, unit)))
    rows = [{"implementation": IMPL_LABELS[impl], "prefill": fmt(prefill, unit),
             "decode": fmt(decode, unit)} for impl, (prefill, decode) in attention.items()]
    return cap, shown[["part", "size", "bytes"]], pd.DataFrame(rows)


page_setup("serving")
st.title("Serving")
st.markdown("**How many requests of length s fit on my GPU, and what is the longest context one "
            "request can have?** KV blocks as vLLM allocates them.")
answer = st.container()  # a traced model's answer, above the inputs (on screen at 1280x800)

top = st.columns([1.6, 1.2, 1.2])  # the GPU's value ("NVIDIA H100 80GB (85.52 GB)") fits at 1280 px
picked = pickers.model_picker(SPECS["model"], MODELS, where=top[0], traceable=True)
model = picked.model
used = dict(SPECS) | picked.specs  # a Hub id goes into the URL, never the file
gpu = pickers.gpu_picker(SPECS["gpu"], where=top[1])
util = widgets.float_input("gpu_memory_utilization", "util", SPECS["util"], where=top[2])
row = st.columns(5)
block = widgets.select("Block size (tokens)", "block", SPECS["block"], where=row[0])
mnbt = widgets.int_input("max_num_batched_tokens", "mnbt", SPECS["mnbt"], where=row[1])
seqs = widgets.int_input("max_num_seqs", "seqs", SPECS["seqs"], where=row[2])
wd, used["wdtype"] = pickers.weight_dtype("Weights dtype", model, where=row[3])
kvd = widgets.select("KV cache dtype (fp8 halves it)", "kvdtype", SPECS["kvdtype"], where=row[4])
row2 = st.columns(3)
graphs = widgets.int_input("CUDA graphs (MiB)", "graphs_mib", SPECS["graphs_mib"], where=row2[0])
nontorch = widgets.int_input("Non-torch memory (MiB)", "nontorch_mib", SPECS["nontorch_mib"], where=row2[1])
graphs_in = widgets.toggle("CUDA graphs taken from the budget (vLLM ≥ 0.21)", "graphs_in", SPECS["graphs_in"], where=row2[2])
seq_len = widgets.seq_len_input("Context length per request s (tokens)", "s", SPECS["s"], hi_pow2=1 << 24)

unit = get_unit()
# vLLM's budget is gpu_memory_utilization x the total torch reports (torch.cuda.mem_get_info):
# attnmem.calc.gpus.torch_total_bytes, the spec-sheet figure only where no torch figure is sourced.
gpu_bytes = usable_bytes(gpu)
pickers.gpu_note(gpu, unit, what="The budget (× gpu_memory_utilization) and the KV pool")
if picked.traced is not None:  # outside calc's rules: transformers' own modules, traced
    below = st.container()  # its parts and sources, under the inputs
    with answer:
        tsv.tv.model_caption(picked.traced)
        with st.spinner(tsv.SPINNER):
            traced_answer = tsv.answer(
                picked.traced, gpu_bytes, seq_len, weight_dtype=wd, kv_dtype=kvd,
                gpu_memory_utilization=util, block_size=int(block), max_num_batched_tokens=mnbt,
                max_num_seqs=seqs, cuda_graph_bytes=graphs * MIB, non_torch_bytes=nontorch * MIB,
                cuda_graphs_in_budget=graphs_in)
        tsv.show(picked.traced, traced_answer, seq_len, seqs, unit, below)
    sync_url(used)
    st.stop()
key = picked.choice if picked.choice in MODELS else model  # the cache's key for the model
view_key = (key, gpu, gpu_bytes, seq_len, wd, kvd, util, block, mnbt, seqs, graphs, nontorch,
            graphs_in, unit)
try:
    cap, parts_table, attention_table = serving_view(*view_key)
except ValueError as err:
    st.error(md_escape(f"These settings cannot be computed for {model.name}: {err}"), icon=":material/block:")
    sync_url(used)
    st.stop()

m1, m2, m3 = st.columns(3)
m1.metric("KV blocks available", f"{cap.num_blocks:,}", help=f"{COMPUTED}: pool // (page per layer × attention layers), vllm/v1/core/kv_cache_utils.py get_num_blocks.")
m2.metric(f"Concurrent requests of {seq_len:,} tokens", f"{cap.concurrent_sequences:,}",
          help=f"{COMPUTED}: pool // bytes per request ({cap.max_concurrency:,} by KV memory; capped by max_num_seqs = {seqs:,}).")
m3.metric("Longest context of one request (tokens)", f"{cap.max_context:,}",
          help=f"{COMPUTED}: exact search, as vLLM's estimate_max_model_len.")
if cap.kv_pool_bytes == 0:
    st.error("Nothing is left for the KV cache: weights, activations and overheads exceed the budget.", icon=":material/cancel:")
elif cap.concurrent_sequences == 0:  # a pool, but not one whole request of s tokens in it
    st.error(f"Not one request of {seq_len:,} tokens fits: it needs {fmt(cap.bytes_per_sequence, unit)} "
             f"of KV cache and the pool holds {fmt(cap.kv_pool_bytes, unit)}. The longest request "
             f"that fits is {cap.max_context:,} tokens.", icon=":material/cancel:")
trained = model.max_position_embeddings
if trained and cap.max_context > trained:  # vLLM itself refuses max_model_len past the config's
    st.info(f"The KV pool holds {cap.max_context:,} tokens for one request, past the "
            f"{trained:,} this model was trained for: vLLM caps max_model_len at the trained "
            "context unless told otherwise, and the model may not work past it.",
            icon=":material/warning:")
if cap.headroom_bytes < 0:
    st.warning("CUDA graphs do not fit in the memory left outside the budget: lower gpu_memory_utilization.")

tables.table(parts_table, hide_index=True, content_key=("serving parts", view_key))

st.markdown("**Attention of one layer, prefill (s_q = s) against decode (s_q = 1)**")
tables.table(attention_table, hide_index=True, content_key=("serving attention", view_key))
st.caption(f"{COMPUTED}. Budget and blocks: vLLM's gpu_worker.py (determine_available_memory) and "
           "kv_cache_utils.py; overhead defaults from vLLM start-up logs (attnmem/calc/serving.py). "
           "Prefill: attnmem.calc.attention_peak_bytes; decode: the same terms with s_q = 1. "
           f"Model shapes: {md_escape(picked.origin)}.")
sync_url(used)
