"""Full training, LoRA and QLoRA as attnmem.calc.training_step keywords, shared by the Training step
page (attnmem/pages/ui/finetune.py) and `attnmem train`, so that both make the same calc call.

    calc_kwargs("qlora", rank=16, targets="all-linear", adapter_dtype="fp32", double_quant=True)
      -> {"adapters": LoRA(16, targets="all-linear", adapter_dtype="fp32"), "base_dtype": "nf4_dq"}

LoRA trains low-rank adapters beside a frozen base (Hu et al. 2021, arXiv 2106.09685); QLoRA
does so over a base stored in 4-bit NF4, optionally with its quantization constants quantized
again ("double quantization", Dettmers et al. 2023, arXiv 2305.14314, sec. 3). What each costs
in memory is attnmem.calc.training_step's (LoRA, BASE_DTYPES); this module only maps a method name to
those keywords.
"""

from __future__ import annotations

from typing import Any

from attnmem.calc.training_step import ADAPTER_DTYPES, LORA_TARGET_SETS, LoRA

#: The fine-tuning methods, as the page's URL key `ft` and `attnmem train --adapter` spell them
#: (the CLI's "none" is full training).
METHODS: tuple[str, ...] = ("full", "lora", "qlora")
TARGETS: tuple[str, ...] = tuple(LORA_TARGET_SETS)  # "attention", "all-linear"
ADAPTER_DTYPE_CHOICES: tuple[str, ...] = ADAPTER_DTYPES
DEFAULT_RANK = 16
DEFAULT_TARGETS = "all-linear"
DEFAULT_ADAPTER_DTYPE = "fp32"


def calc_kwargs(method: str, rank: int = DEFAULT_RANK, targets: str = DEFAULT_TARGETS,
                adapter_dtype: str = DEFAULT_ADAPTER_DTYPE, double_quant: bool = False,
                ) -> dict[str, Any]:
    """attnmem.calc.training_step's adapters/base_dtype keywords for a method (empty for full):
    LoRA keeps a bf16 base, QLoRA an NF4 one ("nf4_dq" with double quantization)."""
    if method in ("full", "none"):
        return {}
    if method not in METHODS:
        raise ValueError(f"unknown fine-tuning method {method!r}; accepted: "
                         f"{', '.join(METHODS)}")
    base = "bf16" if method == "lora" else ("nf4_dq" if double_quant else "nf4")
    return {"adapters": LoRA(rank, targets=targets, adapter_dtype=adapter_dtype),
            "base_dtype": base}
