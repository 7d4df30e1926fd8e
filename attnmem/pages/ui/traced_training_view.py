"""The Training step page's view of a traced step (attnmem.pages.ui.traced_training) for a model
outside calc's rules. Streamlit widgets.

Shown: what the trace built (traced_view.model_caption), the peak of each traced attention
with the memory before the step and whether it fits, the peak in parts, the largest tensors
alive at the peak (module and op), the "counted from" line; and, as warnings naming them, the
inputs the trace does not run, the attentions it could not trace and why, the ones left for
the time budget. What only calc's rules give (the moments, the activation terms, the longest
context, GPUs needed, the levers' cheapest combination, the side-by-side methods, measured
rows) is said to be left out, never filled with another model type's numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from attnmem.pages.ui import tables, traced
from attnmem.pages.ui import traced_training as ttr
from attnmem.pages.ui import traced_view as tv
from attnmem.pages.ui.messages import warn
from attnmem.pages.ui.units import fmt
from attnmem.pages.ui.url_state import md_escape

RULES_ONLY = ("For a model outside calc's rules the page shows the traced steps only: each "
              "moment of the step, every activation term, the longest trainable context and "
              "GPUs needed, the cheapest combination of levers, full / LoRA / QLoRA side by "
              "side and the measured rows come from calc's rules, which do not cover this "
              "model type. The longest context is not searched: each length is one trace.")


def refused(model: traced.Unruled, bad: list[str], top_answer) -> None:
    """Inputs the trace does not run: a warning naming each, and no number."""
    tv.model_caption(model)
    warn(f"{model.name} is outside calc's rules and is answered by a trace, which does not run "
         + "; ".join(bad) + f". {ttr.RUNS[0].upper()}{ttr.RUNS[1:]}. calc's rules refuse it "
         f"too: {model.refusal}")
    top_answer.markdown("**Not traced with these settings**: the reason is just below.")


def show(ans: ttr.TrainAnswers, gpu: str, gpu_bytes: int, unit: str, where: str,
         label: Callable[[str], str], top_answer, details: Any = None) -> None:
    """The traced steps for the page's inputs (`where`: "one H100 ..."; `label`: an attention's
    name on the page; `top_answer`: the container under the title for the one-line answer):
    the peaks and verdicts, then what the first peak holds and where, in `details` (a container
    further down the page) when given, else right below them."""
    tv.model_caption(ans.model)
    top_answer.markdown(ttr.headline(ans, gpu_bytes, md_escape(where),
                                     lambda b: fmt(b, unit), label))
    if ans.refused_all:
        warn(f"{ans.model.name} cannot be traced: {ans.refused_all}. calc's rules refuse it "
             f"too: {ans.model.refusal}")
        return
    reasons = {}
    for a, why in ans.refused.items():
        reasons.setdefault(why, []).append(label(a))
    for why, names in reasons.items():
        warn(f"Not traced: {', '.join(names)}: {why}")
    if ans.skipped:
        st.info(md_escape(
            f"Not traced within the {traced.SEARCH_BUDGET_S:g} s budget: "
            f"{', '.join(label(a) for a in ans.skipped)} (choose one alone, or first, to trace "
            "it; traces already made are kept)."), icon=":material/timer:")
    if not ans.steps:
        if not ans.refused:
            warn("No attention the trace runs is chosen.")
        return
    cols = st.columns(len(ans.steps))
    for col, (a, t) in zip(cols, ans.steps.items(), strict=True):
        with col:
            st.metric(f"{label(a)}: peak", fmt(t.peak_bytes, unit),
                      help=f"{tv.TRACED}: attnmem.trace.training.trace_training, one step "
                           "(forward and loss, backward, AdamW step, zero_grad).")
            st.caption(f"Before the step {fmt(t.before_step_bytes, unit)} (traced); "
                       f"{t.trainable_params:,} trainable parameters.")
            if t.peak_bytes <= gpu_bytes:
                st.success(f"Fits one {gpu} ({fmt(gpu_bytes - t.peak_bytes, unit)} free, "
                           "traced).", icon=":material/check_circle:")
            else:
                st.error(f"Does not fit one {gpu}: {fmt(t.peak_bytes - gpu_bytes, unit)} over "
                         "(traced).", icon=":material/cancel:")
    with details if details is not None else contextlib.nullcontext():
        _details(*next(iter(ans.steps.items())), unit, label)


def _details(a: str, t: Any, unit: str, label: Callable[[str], str]) -> None:
    """What the traced peak of attention `a` holds, where it is, what it was counted from."""
    st.markdown(f"**What the peak holds** ({md_escape(label(a))}, traced)")
    total = max(t.peak_bytes, 1)
    tables.table(pd.DataFrame(
        [{"part of the peak": p, "size (traced)": fmt(x, unit), "share": f"{x / total:.0%}",
          "bytes": f"{x:,}"} for p, x in ttr.parts(t).items()]
        + [{"part of the peak": "peak", "size (traced)": fmt(t.peak_bytes, unit),
            "share": "100%", "bytes": f"{t.peak_bytes:,}"}]), hide_index=True)
    st.markdown(f"**Where the peak is: the largest allocations alive at it** "
                f"({md_escape(label(a))}, traced)")
    tables.table(pd.DataFrame([{**r, "module": r["module"].replace(
        "(generate's own tensors)", "(the step's own tensors)"),
        "size (traced)": fmt(r["bytes"], unit), "bytes": f"{r['bytes']:,}"}
        for r in traced.where_rows(t)]), hide_index=True)
    st.caption("Each row is a module of the model (its dotted path) and the op that made the "
               "tensors, as the CUDA caching allocator's blocks.")
    st.caption(md_escape(traced.counted_from(t)) + f" Traced in {t.seconds:.1f} s.")
    st.info(RULES_ONLY, icon=":material/info:")
