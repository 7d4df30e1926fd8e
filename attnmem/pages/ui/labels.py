"""One table of implementation colours and labels for every page (pure: calc only).

Labels are attnmem.calc.IMPL_LABELS (the analytic model names the implementations it models); the
benchmark's extra series, variants of our kernel that only the Kernel speed page shows, get
theirs here. Colours: one fixed colour per name on every page and in the measurement overlay,
from Okabe & Ito's colour-blind-safe palette for the registry's implementations (quadratic ones
warm, linear ones cool), and from Paul Tol's muted palette for FlashAttention-4 and our kernel's
variants, so that no two names that can share a chart share a colour; all read on light and
dark backgrounds.
"""

from __future__ import annotations

from attnmem.calc import IMPL_LABELS as CALC_LABELS

__all__ = ["FALLBACK_COLOR", "IMPL_COLORS", "IMPL_LABELS", "MEMORY_PART_COLORS",
           "TRAINING_PART_COLORS", "impl_color", "impl_label", "peer_headline", "peer_label"]

IMPL_COLORS: dict[str, str] = {
    "naive": "#D55E00",  # vermillion
    "naive_inplace": "#E69F00",  # orange
    "sdpa_math": "#CC79A7",  # reddish purple
    "sdpa_efficient": "#56B4E9",  # sky blue
    "sdpa_flash": "#009E73",  # bluish green
    "sdpa_cudnn": "#8C8C8C",  # grey
    "triton": "#0072B2",  # blue
    "fa4": "#882255",  # wine
    # the benchmark's variants of our kernel (Kernel speed page)
    "triton_generic": "#332288",  # indigo
    "triton_sm90": "#88CCEE",  # cyan
    "triton_sm90_3wg": "#999933",  # olive
    "triton_sm90_bwd": "#117733",  # green
    "triton_portable_bwd": "#44AA99",  # teal
}
FALLBACK_COLOR = "#7F7F7F"

#: Parts of a model's memory on the Model memory page (weights, KV cache, attention, and the
#: recurrent state of hybrid models).
MEMORY_PART_COLORS: dict[str, str] = {
    "weights": "#0072B2",
    "KV cache": "#56B4E9",
    "attention": "#D55E00",
    "recurrent state": "#009E73",
}
#: Parts of a training step on the Training step page (weights and attention as above).
TRAINING_PART_COLORS: dict[str, str] = {
    "weights": "#0072B2", "optimizer state": "#56B4E9", "buffers": "#999999",
    "attention": "#D55E00", "projections": "#E69F00", "MLP": "#CC79A7", "norms": "#F0E442",
    "residuals": "#8C8C8C", "rotary": "#009E73", "embeddings": "#000000",
    "logits and loss": "#882255", "weight copies (autocast)": "#44AA99",
}

#: Labels of the benchmark's series that calc does not model, and FlashAttention-4's for as
#: long as attnmem.calc.IMPL_LABELS does not list it (calc's label wins when it does).
_SERIES_LABELS: dict[str, str] = {
    "fa4": "FlashAttention-4",
    "triton_generic": "Our kernel: portable Triton forward",
    "triton_sm90": "Our kernel: Gluon forward (forced)",
    "triton_sm90_3wg": "Our kernel: Gluon forward, 3 warpgroups",
    "triton_sm90_bwd": "Our kernel: Gluon backward (forced)",
    "triton_portable_bwd": "Our kernel: portable Triton backward (forced)",
}
IMPL_LABELS: dict[str, str] = {**_SERIES_LABELS, **CALC_LABELS}


def impl_color(impl: str) -> str:
    """The fixed colour of an implementation name (grey for names not in IMPL_COLORS)."""
    return IMPL_COLORS.get(impl, FALLBACK_COLOR)


def impl_label(impl: str) -> str:
    """The display label of an implementation name (the name itself if none is known)."""
    return IMPL_LABELS.get(impl, impl)


def peer_label(impl: str) -> str:
    """A peer's label without the 'SDPA ' prefix, for ratio columns ('cuDNN', 'FlashAttention-2')."""
    return impl_label(impl).removeprefix("SDPA ")


def peer_headline(impl: str) -> str:
    """peer_label() without a parenthesis ('FlashAttention-4', not 'FlashAttention-4 (CuTe)'): a
    metric label fits a quarter of a 1280 px wide page."""
    return peer_label(impl).split(" (")[0]
