"""The Serving page's answer for a model outside calc's rules (issue 42, item 5): vLLM's KV pool
counted from transformers' own modules (attnmem.trace.serving.traced_serving): weights and the
cache layers traced, the profile run's activation peak a traced upper bound (or not counted,
with the reason). Streamlit widgets.

Each figure says where it came from (trace / bound / not counted / the page's settings), and
the three metrics say "at least" or "at most" where a bound makes them so. Not available for
such a model, and said so: the prefill/decode attention table per implementation (calc's
rules) and quantized weights.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from attnmem.pages.ui import tables, traced
from attnmem.pages.ui import traced_view as tv
from attnmem.pages.ui.messages import warn
from attnmem.pages.ui.units import fmt
from attnmem.pages.ui.url_state import md_escape

NOT_AVAILABLE = ("Not available for a model outside calc's rules: the prefill/decode attention "
                 "of one layer per implementation (calc's rules) and quantized weights (the "
                 "trace prices bf16, fp16 and fp32).")


def answer(model: traced.Unruled, gpu_bytes: int, seq_len: int, **kw: Any):
    """attnmem.trace.serving.traced_serving for the page's inputs, or why not (a string).
    kw: its keywords (dtypes and vLLM's settings). Its traces are cached by their inputs."""
    why = traced.missing() or traced.too_large(model.config)
    if why is not None:
        return why
    from attnmem.trace.serving import traced_serving

    try:
        return traced_serving(model.config, gpu_bytes, seq_len, **kw)
    except ValueError as err:
        return str(err)
    except Exception as err:  # the model's own code failed on meta: said, never a traceback
        return (f"the trace failed in the model's code ({type(err).__name__}: "
                f"{' '.join(str(err).split())[:300]})")


def _at(r: Any) -> str:
    return "≤ " if r.capacity_is_upper_bound else "≥ " if r.capacity_is_lower_bound else ""


def show(model: traced.Unruled, r: Any, seq_len: int, max_num_seqs: int, unit: str,
         details: Any) -> None:
    """The metrics and verdicts (here), then the parts with their sources (in `details`)."""
    if isinstance(r, str):
        warn(f"Serving cannot be counted for {model.name}: {r}. calc's rules refuse it too: "
             f"{model.refusal}")
        return
    cap, at = r.capacity, _at(r)
    how = {"≤ ": "at most: the activation peak is not in the budget",
           "≥ ": "at least: counted with an upper bound",
           "": "counted"}[at]
    m1, m2, m3 = st.columns(3)
    m1.metric("KV blocks available", f"{at}{cap.num_blocks:,}",
              help=f"{traced.TRACED}: pool // page (vLLM's get_num_blocks); {how}.")
    m2.metric(f"Concurrent requests of {seq_len:,} tokens",
              f"{'' if cap.concurrent_sequences < cap.max_concurrency else at}"
              f"{cap.concurrent_sequences:,}",
              help=f"{traced.TRACED}: pool // bytes per request ({at}{cap.max_concurrency:,} by "
                   f"KV memory; capped by max_num_seqs = {max_num_seqs:,}); {how}.")
    m3.metric("Longest context of one request (tokens)", f"{at}{cap.max_context:,}",
              help=f"{traced.TRACED}: exact search over the traced layout; {how}.")
    if cap.kv_pool_bytes == 0:
        st.error("Nothing is left for the KV cache: weights, activations and overheads exceed "
                 "the budget.", icon=":material/cancel:")
    elif cap.concurrent_sequences == 0:
        st.error(f"Not one request of {seq_len:,} tokens fits: it needs "
                 f"{fmt(cap.bytes_per_sequence, unit)} and the pool holds "
                 f"{fmt(cap.kv_pool_bytes, unit)}.", icon=":material/cancel:")
    if r.capacity_is_upper_bound:
        warn(f"The activation peak of vLLM's profile run could not be traced: "
             f"{r.activation_refused}. The figures above leave it out, so they are upper bounds; "
             "the command line's --activation-bytes takes the figure of vLLM's start-up log.")
    with details:
        _parts(r, unit)


def _parts(r: Any, unit: str) -> None:
    cap, src = r.capacity, r.sources
    rows = [("budget (GPU × utilization)", cap.budget_bytes, "settings"),
            ("weights", cap.weights_bytes, src["weights"]),
            ("activation peak of the profile run", cap.activation_bytes,
             src["activation peak"]),
            ("non-torch memory", cap.non_torch_bytes, "settings (vLLM's start-up log)"),
            ("CUDA graphs" + ("" if cap.cuda_graphs_in_budget else " (outside the budget)"),
             cap.cuda_graph_bytes, "settings (vLLM's start-up log)"),
            ("KV cache pool", cap.kv_pool_bytes, "what is left"),
            ("one KV block (all layers)", cap.page_bytes, src["KV cache"]),
            ("one request of s tokens (KV blocks + state)", cap.bytes_per_sequence,
             src["KV cache"] + ("; " + src["state"] if "state" in src else ""))]
    tables.table(pd.DataFrame([{"part": p, "size": fmt(b, unit), "from": s.split(":")[0],
                                "bytes": f"{b:,}"} for p, b, s in rows]), hide_index=True)
    lay = r.layout.layout
    st.caption(md_escape(
        f"{r.layout.model_class}: {lay.attention_layers} attention layers "
        f"({lay.sliding_layers} with a {lay.window:,}-token window)" if lay.sliding_layers else
        f"{r.layout.model_class}: {lay.attention_layers} attention layers")
        + (f", {lay.state_layers} state layers" if lay.state_layers else "") + ".")
    st.markdown("**Counted from**")
    for part, text in src.items():
        st.caption(md_escape(f"{part}: {text}."))
    st.caption(md_escape("Budget, blocks and requests: vLLM's accounting "
                         "(attnmem.calc.serving_layout, the same arithmetic as calc's rules use); "
                         "no figure here comes from calc's hand-written rules."))
    st.info(NOT_AVAILABLE, icon=":material/info:")


SPINNER = tv.SPINNER
