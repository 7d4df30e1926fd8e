"""Full training, LoRA and QLoRA as calc.training_step keywords (issue 34, item 4), shared by
the Training step page and `attnmem train` so that both make the same calc call. Pure Python:
no streamlit import.

    calc_kwargs("qlora", rank=16, targets="all-linear", adapter_dtype="fp32", double_quant=True)
      -> {"adapters": LoRA(16, targets="all-linear", adapter_dtype="fp32"), "base_dtype": "nf4_dq"}

``side_by_side`` answers "which of these fits on my GPU, at what length": one row per method
with calc's peak at the current length, whether it fits, the longest length that fits
(calc.max_train_seq_len with the same keywords) and, for full training only, the GPUs needed
(calc.train_gpus_needed); a method calc refuses gets its reason instead of numbers.
"""

from __future__ import annotations

from typing import Any

from calc.training_step import (
    ADAPTER_DTYPES,
    LORA_TARGET_SETS,
    LoRA,
    max_train_seq_len,
    train_gpus_needed,
    training_step,
)

#: The fine-tuning methods, as the page's URL key `ft` and `attnmem train --adapter` spell them
#: (the CLI's "none" is full training).
METHODS: tuple[str, ...] = ("full", "lora", "qlora")
METHOD_LABELS = {"full": "full training", "lora": "LoRA (frozen bf16 base)",
                 "qlora": "QLoRA (frozen 4-bit NF4 base)"}
TARGETS: tuple[str, ...] = tuple(LORA_TARGET_SETS)  # "attention", "all-linear"
#: Short enough for the narrow column at 1280 px; the modules are in the select's help.
TARGET_LABELS = {"attention": "attention", "all-linear": "all-linear"}
ADAPTER_DTYPE_CHOICES: tuple[str, ...] = ADAPTER_DTYPES
DEFAULT_RANK = 16
DEFAULT_TARGETS = "all-linear"
DEFAULT_ADAPTER_DTYPE = "fp32"
MAX_GPUS = 1024  # the GPUs-needed search's bound, as on the page


def calc_kwargs(method: str, rank: int = DEFAULT_RANK, targets: str = DEFAULT_TARGETS,
                adapter_dtype: str = DEFAULT_ADAPTER_DTYPE, double_quant: bool = False,
                ) -> dict[str, Any]:
    """calc.training_step's adapters/base_dtype keywords for a method (empty for full)."""
    if method in ("full", "none"):
        return {}
    if method not in METHODS:
        raise ValueError(f"unknown fine-tuning method {method!r}; accepted: "
                         f"{', '.join(METHODS)}")
    base = "bf16" if method == "lora" else ("nf4_dq" if double_quant else "nf4")
    return {"adapters": LoRA(rank, targets=targets, adapter_dtype=adapter_dtype),
            "base_dtype": base}


def side_by_side(model: Any, gpu_bytes: int, batch: int, seq_len: int, step_kw: dict[str, Any],
                 rank: int = DEFAULT_RANK, targets: str = DEFAULT_TARGETS,
                 adapter_dtype: str = DEFAULT_ADAPTER_DTYPE, double_quant: bool = False,
                 ) -> list[dict[str, Any]]:
    """One row per METHODS: the raw numbers (bytes, tokens, GPUs; None where not applicable)
    and, where calc refuses the method with these settings, its reason.

    step_kw: the page's other training_step keywords (attention, precision, checkpointing,
    optimizer, gpus, tp, sharding). GPUs needed is searched for full training only (LoRA is
    modelled on one GPU), under the page's sharding or ZeRO-3 when it shards nothing."""
    rows = []
    for method in METHODS:
        kw = {**step_kw, **calc_kwargs(method, rank, targets, adapter_dtype, double_quant)}
        row: dict[str, Any] = {"method": method, "peak_bytes": None, "peak_phase": None,
                               "fits": None, "longest_context": None, "gpus_needed": None,
                               "refused": None}
        try:
            m = training_step(model, batch, seq_len, **kw)
            row.update(peak_bytes=m.peak_bytes, peak_phase=m.peak_phase,
                       fits=m.peak_bytes <= gpu_bytes,
                       longest_context=max_train_seq_len(model, gpu_bytes, batch, **kw))
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
            except ValueError:
                row["gpus_needed"] = None
        rows.append(row)
    return rows
