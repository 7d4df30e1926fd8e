"""The view of a traced answer (attnmem.pages.ui.traced) on the Inference page. Streamlit widgets.

A model outside calc's rules gets: what the trace built, the peak, whether it fits the GPU, the
longest prompt (searched over cached traces within a time budget, or the bracket found), the
parts of the peak, the largest tensors alive at the peak (module and op) and the "counted from"
line. Whatever the trace cannot answer is said as a warning naming the reason; never a number
from the rules of another model type.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pandas as pd
import streamlit as st

from attnmem.calc import MAX_SEQ_LEN
from attnmem.pages.ui import tables, traced
from attnmem.pages.ui.messages import warn
from attnmem.pages.ui.units import fmt
from attnmem.pages.ui.url_state import md_escape

TRACED = traced.TRACED
SPINNER = "Tracing transformers' own modules on the meta device (a first model takes a few seconds)…"


def model_caption(model: traced.Unruled, where: Any = st) -> None:
    """What the model is and why it is traced, not counted by the rules."""
    where.caption(md_escape(
        f"{model.name}: model type '{model.model_type}', which calc's rules do not cover; its "
        "figures come from transformers' own modules, traced on the meta device."))


def longest_text(lg: traced.Longest, new_tokens: int) -> tuple[str, str]:
    """The metric's value and its help for a longest-prompt search result."""
    how = (f"{TRACED}: {lg.traces} trace(s) in {lg.seconds:.1f} s ({lg.note}); the budget is "
           f"{traced.SEARCH_BUDGET_S:g} s of tracing per input change, cached traces are free.")
    if lg.exact:
        if lg.fits == 0:
            return "none", how
        bound = lg.fits >= MAX_SEQ_LEN - new_tokens
        return (f"≥ {lg.fits:,} tokens" if bound else f"{lg.fits:,} tokens"), how
    if lg.fits == 0:
        return f"< {lg.fails:,} tokens (not searched further)", how
    if lg.fails is None:
        return f"≥ {lg.fits:,} tokens (not searched further)", how
    return f"{lg.fits:,}–{lg.fails - 1:,} tokens (not searched further)", how


def show_inference(ans: traced.Answer, gpu: str, gpu_bytes: int, unit: str, new_tokens: int,
                   label: str, details: Any = None) -> None:
    """The Inference page's answer for a traced model (`label`: the attention's name): the
    verdict, then what the peak holds and where, in `details` (a container further down the
    page) when given, else right below it."""
    if ans.traced is None:
        warn(f"{label} cannot be traced for {ans.model.name}: {ans.refused}. calc's rules "
             f"refuse it too: {ans.model.refusal}")
        return
    t, longest = ans.traced, ans.longest
    for note in ans.notes:
        st.info(md_escape(note), icon=":material/info:")
    cols = st.columns(3)
    cols[0].metric(f"{label}: peak", fmt(t.peak_bytes, unit),
                   help=f"{TRACED}: attnmem.trace.generate.trace_inference, at '{t.peak_phase}'.")
    cols[0].caption(f"Peak at **{t.peak_phase}** (traced). Prefill peak "
                    f"{fmt(t.prefill_peak_bytes, unit)}, decode peak "
                    f"{fmt(t.decode_peak_bytes, unit) if t.decode_peak_bytes else 'none (1 new token)'}.")
    if t.peak_bytes <= gpu_bytes:
        free = gpu_bytes - t.peak_bytes
        cols[1].success(f"Fits one {gpu}: {fmt(free, unit)} free ({free / gpu_bytes:.0%}), "
                        "traced.", icon=":material/check_circle:")
    else:
        cols[1].error(f"Does not fit one {gpu}: {fmt(t.peak_bytes - gpu_bytes, unit)} over "
                      "(traced).", icon=":material/cancel:")
    if longest is not None:
        value, how = longest_text(longest, new_tokens)
        cols[2].metric(f"Longest prompt (+{new_tokens:,} new)", value, help=how)
        if not longest.exact:
            cols[2].caption("Not searched to the token: the traces this search could make within "
                            f"{traced.SEARCH_BUDGET_S:g} s bracket it ({md_escape(longest.note)}).")
    with details if details is not None else contextlib.nullcontext():
        _inference_details(t, unit)


def _inference_details(t: Any, unit: str) -> None:
    """What a traced peak holds, where it is, and what it was counted from."""
    st.markdown("**What the peak holds** (traced)")
    total = max(t.peak_bytes, 1)
    tables.table(pd.DataFrame(
        [{"part of the peak": p, "size (traced)": fmt(x, unit), "share": f"{x / total:.0%}",
          "bytes": f"{x:,}"} for p, x in traced.parts(t).items()]
        + [{"part of the peak": "peak", "size (traced)": fmt(t.peak_bytes, unit),
            "share": "100%", "bytes": f"{t.peak_bytes:,}"}]), hide_index=True)
    st.markdown(f"**Where the peak is: the largest allocations alive at {md_escape(t.peak_phase)}** "
                "(traced)")
    tables.table(pd.DataFrame([{**r, "size (traced)": fmt(r["bytes"], unit),
                                "bytes": f"{r['bytes']:,}"} for r in traced.where_rows(t)]),
                 hide_index=True)
    st.caption("Each row is a module of the model (its dotted path) and the op that made the "
               "tensors, as the CUDA caching allocator's blocks; the cache's K/V come from the "
               "attention modules' `cat`.")
    st.caption(md_escape(traced.counted_from(t)) + f" Traced in {t.seconds:.1f} s.")
    st.info("For this model the page shows the chosen attention only: the comparison of every "
            "implementation, chunked prefill and the measured rows use calc's rules, which do "
            "not cover this model type.", icon=":material/info:")
