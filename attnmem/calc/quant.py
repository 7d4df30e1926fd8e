"""Quantized checkpoints: what a config.json's `quantization_config` says, and the bytes the
checkpoint's weights take as stored.

A quantized checkpoint stores some weight matrices in a low-bit format with its metadata
(scales, zero points, block scales) and every other tensor (embeddings, lm_head, norms, biases,
routers, whatever the format or the config leaves out) at the checkpoint's `torch_dtype`.
`checkpoint_weight_bytes` adds those up, module by module, from the shapes of
`linear_modules` (the nn.Linear-style weight matrices transformers builds for the architecture,
named as in its state dicts so that `modules_to_not_convert` patterns can be matched).

Storage per quantized matrix of `out` x `in` weights (n = out·in), by format:

- **mxfp4** (OCP Microscaling spec v1.0, sec. 5: FP4 E2M1 elements in blocks of 32 sharing one
  8-bit E8M0 scale; transformers integrations/mxfp4.py stores gpt-oss experts as `*_blocks`
  uint8 [.., in/32, 16] and `*_scales` uint8 [.., in/32]): n/2 + out·ceil(in/32) bytes. Only
  the MoE expert matrices are stored so (modules_to_not_convert of the gpt-oss configs names
  attention, router, embeddings and lm_head); their biases stay at torch_dtype.
- **fp8** (DeepSeek-V3 report, arXiv 2412.19437, sec. 3.3.1: 128x128 weight blocks; the
  checkpoints store `weight` as float8_e4m3fn and `weight_scale_inv` as float32 of shape
  [ceil(out/128), ceil(in/128)]): n + 4·ceil(out/b0)·ceil(in/b1) bytes with
  weight_block_size [b0, b1]; without a block size one fp32 scale per tensor (n + 4). The
  linear layers of the decoder blocks are fp8; the MoE router ("gate", not an nn.Linear in
  DeepSeek's own modeling_deepseek.py), embeddings, lm_head and norms are not.
- **gptq** (AutoGPTQ's QuantLinear buffers, auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py;
  the format transformers loads through optimum): qweight int32 [in·bits/32, out], qzeros int32
  [ceil(in/g), out·bits/32], scales fp16 [ceil(in/g), out], g_idx int32 [in]:
  n·bits/8 + ceil(in/g)·out·(bits/8 + 2) + 4·in bytes (g = group_size; -1 = one group).
- **awq** (AutoAWQ's WQLinear_GEMM buffers, awq/modules/linear/gemm.py): qweight int32
  [in, out·bits/32], qzeros int32 [in/g, out·bits/32], scales fp16 [in/g, out], no g_idx:
  n·bits/8 + ceil(in/g)·out·(bits/8 + 2) bytes. GPTQ and AWQ quantize the attention and MLP
  linear layers of the decoder blocks (the routers of MoE models are left out by both tools'
  model definitions); lm_head and embeddings stay at torch_dtype.
- **bitsandbytes** 4-bit (Dettmers et al., "QLoRA", arXiv 2305.14314, sec. 3: NF4 with one
  absmax per block of 64 weights, and double quantization: those absmax as 8-bit in blocks of
  256 with one fp32 constant each; the serialized Params4bit of bitsandbytes/nn/modules.py holds
  `weight` uint8 [ceil(n/2), 1], `absmax`, `quant_map` fp32 [16] and, with double quant,
  `nested_absmax` fp32 and `nested_quant_map` fp32 [256]): ceil(n/2) + (absmax: 4·ceil(n/64),
  or with double quant ceil(n/64) + 4·ceil(ceil(n/64)/256) + 1,024) + 64 bytes, plus a small
  JSON `quant_state` tensor (tens of bytes, not counted). 8-bit (LLM.int8, arXiv 2208.07339):
  int8 weight n + one fp32 row scale `SCB` per output row. Every nn.Linear is quantized except
  lm_head (transformers' get_keys_to_not_convert) and llm_int8_skip_modules.

Anything else (compressed-tensors, HQQ, GGUF, EETQ, ...) is refused with a ValueError naming the
method and the accepted list, rather than priced at a guessed width.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from fractions import Fraction

from attnmem.calc.models import _QUANT_METHODS, ModelConfig, QuantConfig, check_model
from attnmem.calc.params import param_count
from attnmem.calc.units import ceil_bytes, dtype_bytes

#: quant_method values this module prices (lower case, as config.json spells them).
QUANT_METHODS = _QUANT_METHODS


@dataclass(frozen=True)
class LinearModule:
    """`count` weight matrices of `out` x `in` sharing one name pattern and one kind."""

    name: str  # state-dict module name, layer index as '*', e.g. model.layers.*.self_attn.q_proj
    kind: str  # "attention", "mlp", "expert", "shared_expert", "router", "lm_head"
    count: int  # how many such matrices the model has (layers x experts)
    out_features: int
    in_features: int

    @property
    def params(self) -> int:
        return self.count * self.out_features * self.in_features


def _attention_linears(model: ModelConfig, layers: int) -> list[LinearModule]:
    h, d, heads = model.hidden_size, model.head_dim, model.num_heads
    p = "model.layers.*.self_attn."
    if model.is_mla:  # modeling_deepseek_v3.py DeepseekV3Attention
        nope = d - model.qk_rope_head_dim
        out = []
        if model.q_lora_rank:
            out += [LinearModule(p + "q_a_proj", "attention", layers, model.q_lora_rank, h),
                    LinearModule(p + "q_b_proj", "attention", layers, heads * d,
                                 model.q_lora_rank)]
        else:
            out.append(LinearModule(p + "q_proj", "attention", layers, heads * d, h))
        out += [
            LinearModule(p + "kv_a_proj_with_mqa", "attention", layers,
                         model.kv_lora_rank + model.qk_rope_head_dim, h),
            LinearModule(p + "kv_b_proj", "attention", layers,
                         heads * (nope + model.v_head_dim), model.kv_lora_rank),
            LinearModule(p + "o_proj", "attention", layers, h, heads * model.v_head_dim),
        ]
        return out
    q_out = heads * d * (2 if model.attention_output_gate else 1)
    kv = model.num_kv_heads * d
    return [LinearModule(p + "q_proj", "attention", layers, q_out, h),
            LinearModule(p + "k_proj", "attention", layers, kv, h),
            LinearModule(p + "v_proj", "attention", layers, kv, h),
            LinearModule(p + "o_proj", "attention", layers, h, heads * d)]


def _mlp_linears(model: ModelConfig, prefix: str, kind: str, count: int,
                 width: int) -> list[LinearModule]:
    h = model.hidden_size
    names = ("gate_proj", "up_proj", "down_proj") if model.gated_mlp else ("up_proj",
                                                                            "down_proj")
    return [LinearModule(prefix + n, kind, count, h if n == "down_proj" else width,
                         width if n == "down_proj" else h) for n in names]


def linear_modules(model: ModelConfig) -> list[LinearModule]:
    """The weight matrices of the decoder blocks and lm_head, with the names transformers'
    state dicts use (modeling_llama.py, modeling_qwen2_moe.py, modeling_deepseek_v3.py,
    modeling_gpt_oss.py). gpt-oss keeps its experts as fused parameters, gate_up_proj
    [E, hidden, 2·I] and down_proj [E, I, hidden]: listed as E matrices of 2·I x hidden and
    hidden x I. Biases, norms, sinks and embeddings are not matrices here (`other_params`).
    ValueError for hybrids (their mixers' quantized layout is not modelled)."""
    check_model(model)
    if model.state_mixer is not None:
        raise ValueError(
            f"the checkpoint layout of {model.name!r}, a hybrid with {model.state_mixer.kind} "
            "layers, is not modelled: give a dtype instead of 'checkpoint'")
    h = model.hidden_size
    mods = _attention_linears(model, model.kv_layers)
    mlp_layers = model.num_layers if model.mlp_layers is None else model.mlp_layers
    if model.num_experts > 1:
        moe = mlp_layers - model.dense_mlp_layers
        e, width = model.num_experts, model.intermediate_size
        if model.model_type == "gpt_oss":
            mods += [LinearModule("model.layers.*.mlp.experts.gate_up_proj", "expert", moe * e,
                                  2 * width, h),
                     LinearModule("model.layers.*.mlp.experts.down_proj", "expert", moe * e,
                                  h, width),
                     LinearModule("model.layers.*.mlp.router", "router", moe, e, h)]
        else:
            mods += _mlp_linears(model, "model.layers.*.mlp.experts.*.", "expert", moe * e,
                                 width)
            mods.append(LinearModule("model.layers.*.mlp.gate", "router", moe, e, h))
        if model.shared_expert_intermediate_size:
            name = "shared_experts" if model.is_mla else "shared_expert"
            mods += _mlp_linears(model, f"model.layers.*.mlp.{name}.", "shared_expert", moe,
                                 model.shared_expert_intermediate_size)
            if model.shared_expert_gate:
                mods.append(LinearModule("model.layers.*.mlp.shared_expert_gate", "router",
                                         moe, 1, h))
        if model.dense_mlp_layers:
            mods += _mlp_linears(model, "model.layers.*.mlp.", "mlp", model.dense_mlp_layers,
                                 model.dense_intermediate_size)
    else:
        mods += _mlp_linears(model, "model.layers.*.mlp.", "mlp", mlp_layers,
                             model.intermediate_size)
    if not model.tie_embeddings:
        mods.append(LinearModule("lm_head", "lm_head", 1, model.vocab_size, h))
    return mods


def other_params(model: ModelConfig) -> int:
    """Parameters that are not in `linear_modules`: embeddings, positions, norms, biases,
    sinks (attnmem.calc.params.param_count minus the matrices)."""
    return param_count(model) - sum(m.params for m in linear_modules(model))


#: Which kinds of matrices each method quantizes before modules_to_not_convert (module doc).
_QUANTIZED_KINDS = {
    "mxfp4": {"expert"},
    "fp8": {"attention", "mlp", "expert", "shared_expert"},
    "gptq": {"attention", "mlp", "expert", "shared_expert"},
    "awq": {"attention", "mlp", "expert", "shared_expert"},
    "bitsandbytes": {"attention", "mlp", "expert", "shared_expert", "router"},
}


def _skipped(name: str, patterns: tuple[str, ...]) -> bool:
    """True when a modules_to_not_convert entry names this module: a pattern with '*' matches
    the name or a parent of it (gpt-oss: model.layers.*.self_attn); a plain entry matches as a
    substring, as transformers' quantizers test `key in module_name`."""
    for p in patterns:
        if "*" in p:
            if fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, p + ".*"):
                return True
        elif p and p in name:
            return True
    return False


def quantized_matrix_bytes(q: QuantConfig, out_features: int, in_features: int) -> Fraction:
    """Bytes of one out x in matrix stored in the format of q (formulas in the module doc)."""
    n, o, i = out_features * in_features, out_features, in_features
    if q.method == "mxfp4":
        return Fraction(n, 2) + o * -(-i // 32)
    if q.method == "fp8":
        if q.weight_block_size is None:
            return Fraction(n + 4)
        b0, b1 = q.weight_block_size
        return Fraction(n + 4 * -(-o // b0) * -(-i // b1))
    if q.method in ("gptq", "awq"):
        g = i if q.group_size in (None, -1) else q.group_size
        groups = -(-i // g)
        packed = Fraction(n * q.bits, 8) + groups * o * (Fraction(q.bits, 8) + 2)
        return packed + (4 * i if q.method == "gptq" else 0)
    # bitsandbytes
    if q.bits == 8:
        return Fraction(n + 4 * o)
    blocks = -(-n // 64)
    if q.double_quant:
        absmax = blocks + 4 * -(-blocks // 256) + 256 * 4
    else:
        absmax = 4 * blocks
    return Fraction(-(-n // 2) + absmax + 16 * 4)


def checkpoint_breakdown(model: ModelConfig) -> dict[str, int]:
    """Bytes of the checkpoint's weights by storage: "quantized (<method>)" (the matrices in the
    format, metadata included) and "unquantized (<dtype>)" (all else at torch_dtype).
    A model without quantization_config is all at its torch_dtype. ValueError when neither a
    quantization_config nor a torch_dtype says what the checkpoint holds."""
    check_model(model)
    q = model.quantization
    dtype = model.torch_dtype or (q.default_dtype if q is not None else "")
    if not dtype:
        raise ValueError(
            f"{model.name!r} has no quantization_config and no torch_dtype, so what its "
            "checkpoint stores is unknown: give a dtype (e.g. 'bf16') instead of 'checkpoint'")
    e = dtype_bytes(dtype)
    if q is None:
        return {f"unquantized ({dtype})": ceil_bytes(param_count(model) * e)}
    kinds = _QUANTIZED_KINDS[q.method]
    skip = q.modules_to_not_convert
    quantized, plain = Fraction(0), other_params(model)
    for m in linear_modules(model):
        if m.kind in kinds and not _skipped(m.name, skip):
            quantized += m.count * quantized_matrix_bytes(q, m.out_features, m.in_features)
        else:
            plain += m.params
    return {f"quantized ({q.label})": ceil_bytes(quantized),
            f"unquantized ({dtype})": ceil_bytes(plain * e)}


def checkpoint_weight_bytes(model: ModelConfig) -> int:
    """Bytes of the weights as the checkpoint stores them (checkpoint_breakdown, summed)."""
    return sum(checkpoint_breakdown(model).values())


def quantized_param_count(model: ModelConfig) -> int:
    """Parameters the checkpoint stores in its quantized format (0 without quantization)."""
    q = check_model(model).quantization
    if q is None:
        return 0
    kinds = _QUANTIZED_KINDS[q.method]
    return sum(m.params for m in linear_modules(model)
               if m.kind in kinds and not _skipped(m.name, q.modules_to_not_convert))


def describe(q: QuantConfig | None) -> str:
    """One line for pages: method, bits, group or block, and what stays unquantized."""
    if q is None:
        return "not quantized"
    parts = [q.label]
    if q.modules_to_not_convert:
        parts.append("not converted: " + ", ".join(q.modules_to_not_convert))
    return "; ".join(parts)
