"""The Model memory page's answer for a model outside calc's rules (issue 42, item 5): its
parameters and weight bytes from the model transformers builds on the meta device
(attnmem.trace.weights.trace_weights) and generate()'s traced peak for one new token
(attnmem.pages.ui.traced.inference, shown by traced_view.show_inference, with the longest
prompt searched within the trace's time budget). Streamlit widgets.

Not available for such a model, and said so: the eager / FlashAttention comparison (the trace
runs SDPA, torch's choice), the formulas, MLA's expanded K/V and a hybrid's constant state
(calc's rules), and an attention dtype other than the weights' (the trace builds the model in
one dtype).
"""

from __future__ import annotations

import streamlit as st

from attnmem.pages.ui import traced
from attnmem.pages.ui import traced_view as tv
from attnmem.pages.ui.messages import warn
from attnmem.pages.ui.units import fmt
from attnmem.pages.ui.url_state import md_escape

#: The attention the page traces: what transformers runs by default (SDPA, torch choosing the
#: backend), as calc's model_memory falls back to where a forced backend has no kernel.
ATTENTION = "sdpa"
NOT_AVAILABLE = ("Not available for a model outside calc's rules: the eager / FlashAttention "
                 "comparison (the trace runs SDPA with torch's choice of backend), the "
                 "formulas, MLA's expanded K/V and a hybrid's constant state; these come from "
                 "calc's rules, which do not cover this model type.")


def weights(model: traced.Unruled):
    """attnmem.trace.weights.trace_weights for the model, or why not (a string)."""
    why = traced.missing() or traced.too_large(model.config)
    if why is not None:
        return why
    from attnmem.trace.weights import trace_weights

    try:
        with traced._LOCK:
            return trace_weights(model.config)
    except ValueError as err:
        return str(err)
    except Exception as err:  # the model's own code on meta: said, never a traceback
        return (f"the model's code failed on the meta device ({type(err).__name__}: "
                f"{' '.join(str(err).split())[:300]})")


def show(model: traced.Unruled, gpu: str, gpu_bytes: int, unit: str, batch: int, seq_len: int,
         weight_dtype: str, kv_dtype: str, act_dtype: str) -> None:
    """The traced weights and generate()'s traced peak for the page's inputs."""
    from attnmem.calc.units import dtype_bytes

    tv.model_caption(model)
    w = weights(model)
    if isinstance(w, str):
        warn(f"{model.name} cannot be traced: {w}. calc's rules refuse it too: {model.refusal}")
        return
    cols = st.columns(2)
    cols[0].metric("Parameters (traced)", f"{w.param_count / 1e9:,.3f} B",
                   help=f"{tv.TRACED}: attnmem.trace.weights.trace_weights, every parameter "
                        "once (tied weights once).")
    if weight_dtype in traced.TRACE_DTYPES:
        cols[1].metric(f"Weights at {weight_dtype} (traced)",
                       fmt(w.weight_bytes(float(dtype_bytes(weight_dtype))), unit),
                       help="Parameters at the dtype's width plus every buffer at its own.")
    else:
        cols[1].caption(md_escape(f"Weights at {weight_dtype}: not available (the trace "
                                  f"builds the model in {', '.join(traced.TRACE_DTYPES)})."))
    st.caption(md_escape(f"{w.model_class}: {w.param_count:,} parameters"
                         + (f", tied: {', '.join(w.tied)}" if w.tied else "") + "."))
    if act_dtype != weight_dtype:
        st.info(md_escape(f"Attention dtype {act_dtype} with {weight_dtype} weights: the trace "
                          f"runs the model in one dtype, so generate() below runs in "
                          f"{weight_dtype}."), icon=":material/info:")
    with st.spinner(tv.SPINNER):
        answer = traced.inference(model, batch, seq_len, 1, ATTENTION, weight_dtype,
                                  gpu_bytes=gpu_bytes, kv_dtype=kv_dtype)
    # no eager fallback here: a state-space model's torch fallback loops over the tokens,
    # which on meta takes minutes at the page's lengths
    tv.show_inference(answer, gpu, gpu_bytes, unit, 1, "SDPA (torch's choice)")
    st.info(NOT_AVAILABLE, icon=":material/info:")
