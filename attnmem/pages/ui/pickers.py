"""The model, weight-dtype and GPU pickers the pages share. Streamlit widgets.

The model picker is a selector of the page's presets and, where the page's spec offers them,
"Hugging Face Hub id" (attnmem.pages.ui.hub_model: the id box under the selector, the id in
the URL) and "Custom config.json" (attnmem.pages.ui.custom_config: upload or paste, kept for
the session, never in the URL). Until a Hub model or a config has loaded, the page shows its
default preset and says so, the same view as its link gives on a fresh load.

The GPU picker offers attnmem.calc.GPUS ordered by memory, each with its memory in the user's
unit; `gpu_note` says under it which memory figure "fits" uses. The weight-dtype picker offers
"as stored (checkpoint)" first for a quantized checkpoint (attnmem.pages.ui.weights).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from attnmem.calc import DEFAULT_GPU, GPUS, ModelConfig
from attnmem.pages.ui import custom_config, hub_model, traced, widgets
from attnmem.pages.ui.state import Spec, current_page
from attnmem.pages.ui.units import fmt
from attnmem.pages.ui.url_state import ChoiceParam, md_escape
from attnmem.pages.ui.weights import gpu_caption, weight_label, weight_spec


def gpu_options(gpus: Mapping[str, int]) -> tuple[str, ...]:
    """GPU names ordered by memory size."""
    return tuple(sorted(gpus, key=lambda name: (gpus[name], name)))


#: The GPU input of the pages whose default GPU is calc's (one spec, so the value carries over).
GPU_SPEC = ChoiceParam(DEFAULT_GPU, gpu_options(GPUS))


@dataclass(frozen=True)
class Picked:
    """The model picker's answer."""

    choice: str  #: the selector's value
    model: ModelConfig  #: the model the page computes with
    origin: str  #: where its shapes came from, for the page's sources caption
    specs: dict[str, Spec] = field(default_factory=dict)  #: URL specs the choice adds (the Hub id)
    #: A model outside calc's rules, on a page that passed `traceable`: the page answers it by
    #: the trace (attnmem.pages.ui.traced); `model` is then the default preset, not this model.
    traced: traced.Unruled | None = None


def model_select(spec: ChoiceParam, where: Any = st) -> str:
    """The model selector (URL key `model`)."""
    return widgets.select("Model", "model", spec, where=where)


def pick_model(choice: str, presets: Mapping[str, ModelConfig], default: str, where: Any = st,
               waiting: str = "Upload or paste a config.json; until then, the default model is shown.",
               custom_origin: str = "the config.json given here", traceable: bool = False) -> Picked:
    """The model a selector's choice names: a preset, the Hub id box's model (drawn in `where`,
    under the selector) or the uploaded config's (the boxes drawn below the page's first row).
    Until either has loaded, the preset `default`, with an st.info saying so (`waiting` for an
    upload). With `traceable`, a Hub or uploaded model outside calc's rules comes back in
    `Picked.traced` (its `model` the preset `default`) instead of being refused."""
    if choice == hub_model.HUB:
        model = hub_model.hub_model(where=where, traceable=traceable)
        specs = {hub_model.KEY: hub_model.SPEC} if st.session_state.get(hub_model.KEY) else {}
        if isinstance(model, traced.Unruled):
            return Picked(choice, presets[default], hub_model.source_of(model.name), specs,
                          traced=model)
        if model is None:
            model = hub_model.fallback(presets[default])
        return Picked(choice, model, hub_model.source(model), specs)
    if choice == custom_config.CUSTOM:
        model = custom_config.custom_model(traceable=traceable)
        if isinstance(model, traced.Unruled):
            return Picked(choice, presets[default], custom_origin, traced=model)
        if model is None:
            st.info(waiting)
            model = presets[default]
            return Picked(choice, model, model.source)
        return Picked(choice, model, custom_origin)
    model = presets[choice]
    return Picked(choice, model, model.source)


def model_picker(spec: ChoiceParam, presets: Mapping[str, ModelConfig], where: Any = st,
                 **kw: Any) -> Picked:
    """The model selector and the model its choice names (pick_model; kw: its keywords)."""
    return pick_model(model_select(spec, where), presets, spec.default, where, **kw)


def gpu_picker(spec: ChoiceParam = GPU_SPEC, where: Any = st) -> str:
    """The GPU selector (URL key `gpu`), each GPU with its spec-sheet memory."""
    return widgets.select("GPU", "gpu", spec, where=where, format_func=lambda g: f"{g} ({fmt(GPUS[g])})")


def gpu_note(gpu: str, unit: str, what: str = "\"Fits\" and the longest context",
             where: Any = st) -> None:
    """A caption under the GPU choice: the memory "fits" uses, the spec figure beside it."""
    where.caption(md_escape(gpu_caption(gpu, unit, what)))


def weight_dtype(label: str, model: ModelConfig, where: Any = st, key: str = "wdtype"
                 ) -> tuple[str, ChoiceParam]:
    """The weight-dtype selector for this model (attnmem.pages.ui.weights): "as stored (checkpoint)"
    offered first and the default for a quantized checkpoint. When the model changes and the
    value was the previous model's default, it follows the new model's default, so that a
    quantized checkpoint opens as stored and a plain one at bf16; a value the user picked
    stays. Returns the value and the spec to put in the page's URL specs."""
    spec = weight_spec(model)
    mark = f"_{key}_default@{current_page()}"
    before = st.session_state.get(mark)
    if before is not None and before != spec.default and st.session_state.get(key) == before:
        st.session_state[key] = spec.default
    st.session_state[mark] = spec.default
    value = widgets.select(label, key, spec, where=where, format_func=lambda v: weight_label(v, model))
    return value, spec
