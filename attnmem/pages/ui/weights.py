"""The weight-dtype choice and the GPU memory the pages use (pure: calc and url_state only).

Weights: for a checkpoint with a `quantization_config` the choice offers "as stored
(checkpoint)" first and makes it the default: attnmem.calc.weight_bytes(model, "checkpoint") prices
each quantized module in its format (scales, zeros, block metadata) and the rest at
torch_dtype (attnmem/calc/quant.py). Other models keep the dtypes alone, bf16 by default.

GPU memory: "fits", the longest context and vLLM's serving budget use the total torch can use
(attnmem.calc.gpus.torch_total_bytes: measured on our H200, PyTorch's own message for the others where
a public report printed it); the spec-sheet figure (attnmem.calc.GPUS) is shown beside it, and where
no torch figure is sourced the spec figure is used and the caption says so.
"""

from __future__ import annotations

from attnmem.calc.gpus import GPU_TORCH_TOTAL, GPUS, torch_total_bytes, torch_total_note
from attnmem.calc.models import ModelConfig
from attnmem.calc.params import CHECKPOINT
from attnmem.calc.units import DTYPE_ALIASES, DTYPES, format_bytes
from attnmem.pages.ui.url_state import ChoiceParam

__all__ = ["CHECKPOINT", "gpu_caption", "usable_bytes", "weight_label", "weight_spec"]

#: URL spellings of "as stored" besides the choice's own name.
_STORED_ALIASES = {"as stored": CHECKPOINT, "as_stored": CHECKPOINT, "stored": CHECKPOINT}

PLAIN_SPEC = ChoiceParam("bf16", DTYPES, aliases=DTYPE_ALIASES)
QUANTIZED_SPEC = ChoiceParam(CHECKPOINT, (CHECKPOINT, *DTYPES),
                             aliases={**DTYPE_ALIASES, **_STORED_ALIASES})


def weight_spec(model: ModelConfig) -> ChoiceParam:
    """The weight-dtype spec for this model: "checkpoint" first and default for a quantized
    checkpoint; the dtypes alone, bf16 by default, otherwise."""
    return QUANTIZED_SPEC if model.quantization is not None else PLAIN_SPEC


def weight_label(choice: str, model: ModelConfig) -> str:
    """What the selector shows for a choice: "as stored (checkpoint: <format>)" or the dtype."""
    if choice == CHECKPOINT and model.quantization is not None:
        return f"as stored (checkpoint: {model.quantization.label})"
    return "as stored (checkpoint)" if choice == CHECKPOINT else choice


def usable_bytes(gpu: str) -> int:
    """The bytes "fits" uses for a GPU of attnmem.calc.GPUS: the total torch can use where sourced,
    else the spec-sheet figure (attnmem.calc.gpus.torch_total_bytes)."""
    return torch_total_bytes(gpu)


def gpu_caption(gpu: str, unit: str, what: str = "\"Fits\" and the longest context") -> str:
    """One sentence: which memory figure `what` uses for this GPU, the spec figure beside it,
    and where the figure comes from (attnmem.calc.gpus.torch_total_note)."""
    used, spec = torch_total_bytes(gpu), GPUS[gpu]
    note = torch_total_note(gpu)
    if GPU_TORCH_TOTAL[gpu] is None:
        return (f"{what} use the {gpu}'s spec-sheet memory, {format_bytes(spec, unit)}: {note}.")
    return (f"{what} use {format_bytes(used, unit)} ({used:,} bytes), {note}; the spec sheet "
            f"says {format_bytes(spec, unit)}, {format_bytes(spec - used, unit)} more than "
            "torch can allocate.")
