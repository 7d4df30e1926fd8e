"""What the pages say beside their numbers: the "computed" label, warnings whose text may hold
user input (escaped), and the notes where a context passes the one the model was trained for.
Streamlit widgets."""

from __future__ import annotations

from typing import Any

import streamlit as st

from attnmem.pages.ui.url_state import md_escape

#: The label of every number the analytic model computes (in help texts and captions).
COMPUTED = "Computed (analytic model, not measured)"


def warn(message: str) -> None:
    """Show a warning whose text may contain user-controlled parts, escaped (no markdown)."""
    st.warning(md_escape(message), icon=":material/warning:")


def trained_context_note(model: Any, seq_len: int, where: Any = st) -> None:
    """A note where s is longer than the context the model was trained for (its config's
    max_position_embeddings): the memory still follows, but the model may not work there."""
    if model.max_position_embeddings and seq_len > model.max_position_embeddings:
        where.info(f"s = {seq_len:,} is longer than the {model.max_position_embeddings:,} "
                   "tokens this model was trained for.")


def longest_past_trained_note(model: Any, longest: int, where: Any = st) -> None:
    """A note where a longest context that fits passes the context the model was trained for:
    the memory fits that far, the model may not work there."""
    trained = model.max_position_embeddings
    if trained and longest > trained:
        where.caption(f"A longest context above passes the {trained:,} tokens this model was "
                      "trained for: the memory fits that far, the model may not work there.")
