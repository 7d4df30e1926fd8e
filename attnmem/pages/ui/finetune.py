"""The Training step page's fine-tuning pieces: labels for the methods and targets, and the
side-by-side table. The methods themselves and their calc keywords (calc_kwargs) live in
attnmem.calc.finetune, which `attnmem train` shares. Pure Python: no streamlit import.

``side_by_side`` answers "which of these fits on my GPU, at what length": one row per method
with calc's peak at the current length, whether it fits, the longest length that fits
(attnmem.calc.max_train_seq_len with the same keywords) and, for full training only, the GPUs needed
(attnmem.calc.train_gpus_needed; attnmem.calc.training_step.never_fits where none up to the bound
fits); a method calc refuses gets its reason instead of numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnmem.calc.finetune import (
    ADAPTER_DTYPE_CHOICES,
    DEFAULT_ADAPTER_DTYPE,
    DEFAULT_RANK,
    DEFAULT_TARGETS,
    METHODS,
    TARGETS,
    calc_kwargs,
)
from attnmem.calc.training_step import (
    max_train_seq_len,
    never_fits,
    train_gpus_needed,
    training_step,
)

__all__ = ["ADAPTER_DTYPE_CHOICES", "DEFAULT_ADAPTER_DTYPE", "DEFAULT_RANK", "DEFAULT_TARGETS",
           "MAX_GPUS", "METHODS", "METHOD_LABELS", "TARGETS", "TARGET_LABELS", "calc_kwargs",
           "never_fits", "side_by_side"]

METHOD_LABELS = {"full": "full training", "lora": "LoRA (frozen bf16 base)",
                 "qlora": "QLoRA (frozen 4-bit NF4 base)"}
#: Short enough for the narrow column at 1280 px; the modules are in the select's help.
TARGET_LABELS = {"attention": "attention", "all-linear": "all-linear"}
MAX_GPUS = 1024  # the GPUs-needed search's bound, as on the page


def side_by_side(model: Any, gpu_bytes: int, batch: int, seq_len: int, step_kw: dict[str, Any],
                 rank: int = DEFAULT_RANK, targets: str = DEFAULT_TARGETS,
                 adapter_dtype: str = DEFAULT_ADAPTER_DTYPE, double_quant: bool = False,
                 longest: Callable[..., int] = max_train_seq_len) -> list[dict[str, Any]]:
    """One row per METHODS: the raw numbers (bytes, tokens, GPUs; None where not applicable)
    and, where calc refuses the method with these settings, its reason.

    step_kw: the page's other training_step keywords (attention, precision, checkpointing,
    optimizer, gpus, tp, sharding). GPUs needed is searched for full training only (LoRA is
    modelled on one GPU), under the page's sharding or ZeRO-3 when it shards nothing.
    `longest`: max_train_seq_len, or a function that answers as it does (the page's, kept
    across runs: the longest context does not depend on seq_len, so a new length need not
    search again)."""
    rows = []
    for method in METHODS:
        kw = {**step_kw, **calc_kwargs(method, rank, targets, adapter_dtype, double_quant)}
        row: dict[str, Any] = {"method": method, "peak_bytes": None, "peak_phase": None,
                               "fits": None, "longest_context": None, "gpus_needed": None,
                               "never_fits": False, "refused": None}
        try:
            m = training_step(model, batch, seq_len, **kw)
            row.update(peak_bytes=m.peak_bytes, peak_phase=m.peak_phase,
                       fits=m.peak_bytes <= gpu_bytes,
                       longest_context=longest(model, gpu_bytes, batch, **kw))
        except ValueError as err:
            row["refused"] = str(err)
            rows.append(row)
            continue
        if method == "full":
            need_kw = {k: v for k, v in kw.items() if k != "gpus"}
            if need_kw.get("sharding", "none") == "none":
                need_kw["sharding"] = "zero3"
            try:
                row["gpus_needed"] = train_gpus_needed(model, gpu_bytes, batch, seq_len,
                                                       max_gpus=MAX_GPUS, **need_kw)
                if row["gpus_needed"] == 0:  # none up to the bound: does any count fit?
                    row["never_fits"] = never_fits(model, gpu_bytes, batch, seq_len, need_kw)
            except ValueError:
                row["gpus_needed"] = None
        rows.append(row)
    return rows
