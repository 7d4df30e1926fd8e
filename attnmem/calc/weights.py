"""Bytes of a model's weights: its parameter count at a width, or as its checkpoint stores them.

`weight_bytes` is the one function here. A width (a number of bytes per parameter or a dtype
name) multiplies the exact parameter count of attnmem/calc/params.py and rounds up to whole
bytes; the argument `CHECKPOINT` ("checkpoint") prices the quantized checkpoint through
attnmem/calc/quant.py, whose formulas and sources (OCP Microscaling v1.0, DeepSeek-V3's fp8
blocks, AutoGPTQ, AutoAWQ, QLoRA's NF4) are in its docstring. The checkpoint model counts
parameters itself, so it sits between the two: params <- quant <- weights, imports one way.

At a width below fp32, DeepSeek-V2/V3's MoE router weight stays fp32: transformers creates it
as `torch.zeros(num_experts, hidden, dtype=torch.float32)` (DeepseekV2TopkRouter in
transformers/models/deepseek_v2/modeling_deepseek_v2.py, DeepseekV3TopkRouter in
modeling_deepseek_v3.py) and keeps it there (`_keep_in_fp32_modules_strict = ["gate.weight"]`
on both PreTrainedModels), so those parameters count 4 bytes each (`fp32_router_params`):
+6.8 MB on DeepSeek-V2-Lite at bf16.
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
    fp32 = fp32_router_params(model) if per_param < 4 else 0  # held at 4 bytes (docstring)
    return ceil_bytes((param_count(model) - fp32) * per_param) + 4 * fp32


#: Model types whose MoE router weight transformers holds in fp32 (module docstring).
FP32_ROUTER_TYPES = ("deepseek_v2", "deepseek_v3")


def fp32_router_params(model: ModelConfig) -> int:
    """Router parameters held in fp32 whatever the model's dtype: hidden x routed experts in
    each MoE layer of DeepSeek-V2/V3 (module docstring); 0 for other types."""
    check_model(model)
    if model.model_type not in FP32_ROUTER_TYPES or model.num_experts <= 1:
        return 0
    mlp_layers = model.num_layers if model.mlp_layers is None else model.mlp_layers
    return (mlp_layers - model.dense_mlp_layers) * model.num_experts * model.hidden_size
