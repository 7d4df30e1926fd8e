"""A model from an uploaded or pasted Hugging Face config.json, for the model pickers
(attnmem.pages.ui.pickers) of the Model memory and Will it fit? pages. Streamlit widgets.

The file is parsed by the bounded JSON loader attnmem.calc.config_json (size, nesting depth, NaN, overflowing numbers and duplicate
keys refused before json.loads; never executed) and then by calc's ModelConfig.from_hf_config,
which names any missing or wrong key. The config is not put in the URL (a link carries the
choice "Custom config.json" only); the last valid config of the session is kept in session
state, so a bad upload after a good one keeps showing the good one (and says so), and the model
carries over between the pages that accept a config.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import streamlit as st

from attnmem.calc import ModelConfig
from attnmem.calc.config_json import MAX_CONFIG_BYTES, load_config_json
from attnmem.pages.ui import traced
from attnmem.pages.ui.url_state import md_escape

#: The model-selector choice that opens the upload box.
CUSTOM = "Custom config.json"
_LAST = "_custom_model"  # session-state key of the last valid config
_LAST_UNRULED = "_custom_unruled"  # the last config outside calc's rules, on a page that traces


def parse_config(source: str | bytes | IO[bytes], name: str) -> ModelConfig:
    """config.json (text, bytes or an upload) -> ModelConfig; ValueError says what is wrong.

    The loader reads at most MAX_CONFIG_BYTES + 1 bytes, refuses deep nesting, NaN and
    duplicate keys before json.loads; ModelConfig.from_hf_config names any missing or wrong key.
    """
    return ModelConfig.from_hf_config(load_config_json(source, max_bytes=MAX_CONFIG_BYTES), name=name)


def parse_or_unruled(source: str | bytes | IO[bytes], name: str) -> ModelConfig | traced.Unruled:
    """parse_config, except that a config whose model type calc has no rules for comes back as
    attnmem.pages.ui.traced.Unruled (calc's refusal kept) where the trace can run here; any
    other refusal is parse_config's ValueError."""
    d = load_config_json(source, max_bytes=MAX_CONFIG_BYTES)
    try:
        return ModelConfig.from_hf_config(d, name=name)
    except ValueError as err:
        if traced.outside_rules(d) and traced.missing() is None:
            return traced.Unruled.of(d, name, str(err))
        if traced.outside_rules(d):
            raise ValueError(f"{err} ({traced.missing()})") from None
        raise


def custom_model(where: Any = st, traceable: bool = False) -> ModelConfig | traced.Unruled | None:
    """The upload and paste boxes and the config they hold; the last valid one stays in use
    after a bad one (an st.error says what is wrong, an st.info that the old one is shown).
    None while no valid config has been given in this session. With `traceable` (a page that
    answers models outside calc's rules by the trace) such a config comes back as
    attnmem.pages.ui.traced.Unruled instead of being refused."""
    where.caption(
        f"Upload or paste a Hugging Face `config.json` (at most {MAX_CONFIG_BYTES // 1000:,} kB). "
        "It is parsed as JSON only, never executed. It is not stored in the URL."
    )
    up_col, paste_col = where.columns(2)
    uploaded = up_col.file_uploader("config.json", type=["json"], max_upload_size=1, key="cfg_file")
    pasted = paste_col.text_area("…or paste it here", height=120, max_chars=MAX_CONFIG_BYTES, key="cfg_text")
    text, name = None, "custom model"
    try:
        if uploaded is not None:
            if uploaded.size > MAX_CONFIG_BYTES:
                raise ValueError(f"file is {uploaded.size:,} bytes; the limit is {MAX_CONFIG_BYTES:,}")
            if hasattr(uploaded, "seek"):
                uploaded.seek(0)  # read from the start on every re-run
            text, name = uploaded, Path(uploaded.name).stem[:60]
        elif pasted.strip():
            text = pasted
        if text is not None:
            model = parse_or_unruled(text, name) if traceable else parse_config(text, name)
            if isinstance(model, traced.Unruled):
                st.session_state[_LAST_UNRULED] = model
            else:
                st.session_state[_LAST] = model
                st.session_state.pop(_LAST_UNRULED, None)
            return model
    except (ValueError, UnicodeDecodeError, TypeError) as err:
        st.error(md_escape(f"Could not use this config: {err}"), icon=":material/block:")
        if _LAST in st.session_state or (traceable and _LAST_UNRULED in st.session_state):
            st.info("Still showing the last config that was valid.")
    if traceable and _LAST_UNRULED in st.session_state:
        return st.session_state[_LAST_UNRULED]
    return st.session_state.get(_LAST)

