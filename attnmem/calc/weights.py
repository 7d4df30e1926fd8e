"""Bytes of a model's weights: its parameter count at a width, or as its checkpoint stores them.

`weight_bytes` is the one function here. A width (a number of bytes per parameter or a dtype
name) multiplies the exact parameter count of attnmem/calc/params.py and rounds up to whole
bytes; the argument `CHECKPOINT` ("checkpoint") prices the quantized checkpoint through
attnmem/calc/quant.py, whose formulas and sources (OCP Microscaling v1.0, DeepSeek-V3's fp8
blocks, AutoGPTQ, AutoAWQ, QLoRA's NF4) are in its docstring. The checkpoint model counts
parameters itself, so it sits between the two: params <- quant <- weights, imports one way.
"""

from __future__ import annotations

from fractions import Fraction

from attnmem.calc.models import ModelConfig, check_model
from attnmem.calc.params import CHECKPOINT, param_count
from attnmem.calc.quant import checkpoint_weight_bytes
from attnmem.calc.units import ceil_bytes, check_bytes_per_element


def weight_bytes(model: ModelConfig, bytes_per_param: float | str) -> int:
    """Bytes to store every weight: param_count x bytes_per_param, rounded up to whole bytes.

    bytes_per_param is a number (4 fp32, 2 bf16/fp16, 1 fp8/int8, 0.5 int4) or a dtype name
    ("bf16", "int4", "float16", ...); then quantization scales and zero points are not counted.
    "checkpoint" gives the bytes as the checkpoint stores them: the quantized modules in their
    format with scales, zeros and block metadata, the rest at torch_dtype
    (attnmem.calc.quant.checkpoint_weight_bytes; ValueError when config.json says neither).
    """
    check_model(model)
    if isinstance(bytes_per_param, str) and bytes_per_param.strip().lower() == CHECKPOINT:
        return checkpoint_weight_bytes(model)
    per_param: Fraction = check_bytes_per_element(bytes_per_param)
    return ceil_bytes(param_count(model) * per_param)
