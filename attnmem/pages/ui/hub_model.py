"""A model from the Hugging Face Hub, by id, for the model pickers (attnmem.pages.ui.pickers).
Streamlit widgets.

The id (owner/name) is an input like any other: it lives in the URL (key `hub`, a TextParam
with huggingface_hub's validate_repo_id rules), so a link reproduces the view of any Hub model;
config.json itself is never put in the URL. The file is fetched by attnmem.hub (HF_ENDPOINT,
HF_TOKEN, the local cache and HF_HUB_OFFLINE honoured, size checked before download) and the
answer is cached per id, endpoint and token: successes for an hour, refusals for a minute (a
network failure or a licence just accepted is retried soon), both bounded in entries. Every
failure is one st.error that says what went wrong and what to do; the page then shows its
default preset and says so (the same view as the link gives on a fresh load).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from attnmem.calc import ModelConfig
from attnmem.calc.quant import describe
from attnmem.hub import (
    MAX_REPO_ID_LEN,
    REPO_ID_RULE,
    HubError,
    cache_key,
    fetch_config_dict,
    fetch_model,
)
from attnmem.pages.ui import traced
from attnmem.pages.ui.state import init
from attnmem.pages.ui.url_state import TextParam, md_escape, show_raw

#: The model-selector choice that opens the id box.
HUB = "Hugging Face Hub id"
KEY = "hub"
SPEC = TextParam(
    "", REPO_ID_RULE, MAX_REPO_ID_LEN,
    what="a Hugging Face model id, owner/name (letters, digits, '.', '_', '-'; no '--' or '..')",
    example="deepseek-ai/DeepSeek-V3",
)
_BOX = "_hub_box"  # the text box (not in the URL); KEY holds the last valid id typed or linked
EXAMPLE = "deepseek-ai/DeepSeek-V3"


@st.cache_data(max_entries=64, ttl=3600, show_spinner=False)
def _fetch(repo_id: str, where: tuple[str, bool, str, str]) -> ModelConfig:
    """The model, or HubError (not cached). `where` (endpoint, offline flag, token
    fingerprint, cache folder: attnmem.hub.cache_key) is part of the cache key only."""
    return fetch_model(repo_id)


@st.cache_data(max_entries=64, ttl=60, show_spinner=False)
def fetch_outcome(repo_id: str, where: tuple[str, bool, str, str]) -> tuple[ModelConfig | None, str | None]:
    """(model, None) or (None, the message): refusals are cached too, for a minute."""
    try:
        return _fetch(repo_id, where), None
    except HubError as err:
        return None, str(err)


@st.cache_data(max_entries=64, ttl=60, show_spinner=False)
def unruled_outcome(repo_id: str, where: tuple[str, bool, str, str], refusal: str
                    ) -> traced.Unruled | None:
    """The Hub model as attnmem.pages.ui.traced.Unruled where calc refused it (`refusal`) for a
    model type it has no rules for and the trace can run here; else None. config.json comes
    from huggingface_hub's cache, which the failed read has just filled."""
    if traced.missing() is not None:
        return None
    try:
        d = fetch_config_dict(repo_id)
    except HubError:
        return None
    return traced.Unruled.of(d, repo_id, refusal) if traced.outside_rules(d) else None


def id_input(where: Any = st) -> str:
    """The id box; returns the valid id in use ("" for none). A typed value that is not a Hub
    id is refused with st.error naming it; the last valid id stays in use (and in the URL)."""
    init(KEY, SPEC)
    current: str = st.session_state[KEY]
    if _BOX not in st.session_state:
        st.session_state[_BOX] = current
    typed = where.text_input(
        "Hugging Face model id (owner/name)", key=_BOX, max_chars=MAX_REPO_ID_LEN,
        placeholder=EXAMPLE,
        help="config.json is fetched from the Hub (HF_ENDPOINT if set) and cached. Gated models "
             "(e.g. meta-llama/*) need HF_TOKEN set where the app runs, for an account that has "
             "accepted the licence. With HF_HUB_OFFLINE=1 only the local cache is read.",
    )
    text = (typed or "").strip()
    if text != current:
        parsed = SPEC.parse(KEY, text)
        if parsed.warning is None:
            st.session_state[KEY] = current = parsed.value
        else:
            st.error(md_escape(f"{show_raw(text)} is not a Hugging Face model id; accepted: "
                               f"{SPEC.accepted()}. Still using {current or 'none'}."),
                     icon=":material/block:")
    return current


def hub_model(where: Any = st, traceable: bool = False) -> ModelConfig | traced.Unruled | None:
    """The id box and the model it names; None (after an st.error saying why, or with no id
    typed yet) when there is none. With `traceable` (a page that answers models outside calc's
    rules by the trace), such a model comes back as attnmem.pages.ui.traced.Unruled instead of
    being refused; where the trace cannot run here, the refusal says why."""
    repo_id = id_input(where)
    if not repo_id:
        return None
    with st.spinner(f"Fetching config.json of {repo_id} from the Hub…"):
        model, error = fetch_outcome(repo_id, cache_key())
        if error is not None and traceable:
            unruled = unruled_outcome(repo_id, cache_key(), error)
            if unruled is not None:
                return unruled
            if traced.missing() is not None and "'model_type'" in error:
                error = f"{error} ({traced.missing()})"
    if error is not None:
        st.error(md_escape(error), icon=":material/block:")  # HubError names the id
    if model is not None:
        notes(model, where)
    return model


def notes(model: ModelConfig, where: Any = st) -> None:
    """What the page should say about how a config was read: read through another type's rules
    (model.read_as, e.g. Kimi-K2's kimi_k2 as DeepSeek-V3), values its transformers config
    class supplied (model.defaults_from), or quantized as stored."""
    if model.read_as:
        where.info(md_escape(f"Read as: {model.read_as}."), icon=":material/info:")
    if model.defaults_from:  # values config.json leaves out, from its transformers class
        where.caption(md_escape(f"Not in config.json, so taken from {model.defaults_from}."))
    if model.quantization is not None:
        where.caption(md_escape(
            f"Checkpoint quantization: {describe(model.quantization)}; 'as stored' weights "
            f"price it (attnmem.calc.weight_bytes(model, 'checkpoint'))."))


def fallback(default: ModelConfig) -> ModelConfig:
    """The preset shown while no Hub model has loaded (said in an st.info), so that the page,
    like its URL, shows the same view on every load."""
    st.info(md_escape(f"Until a Hub model loads, the default model is shown: {default.name}."))
    return default


def source(model: ModelConfig) -> str:
    """Where the model's shapes came from, for a page's Sources caption: the Hub address for
    the model this box loaded (its name is the id), the preset's own source otherwise."""
    if model.name == st.session_state.get(KEY):
        return source_of(model.name)
    return model.source


def source_of(repo_id: str) -> str:
    """The Hub address of a model's config.json."""
    return f"{cache_key()[0]}/{repo_id}, config.json"

