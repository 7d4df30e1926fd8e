"""DeepSeek-V2/V3 hold their MoE router weight in fp32 at any model dtype (DeepseekV2TopkRouter /
DeepseekV3TopkRouter create it with dtype=torch.float32; `_keep_in_fp32_modules_strict =
["gate.weight"]`): calc.weight_bytes at bf16 equals the bytes of every parameter of the model
transformers builds at bf16 on the meta device, and the fp32 router is all of the difference
from parameters x 2."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnmem.calc import MODELS, ModelConfig  # noqa: E402
from attnmem.calc.params import param_count  # noqa: E402
from attnmem.calc.weights import fp32_router_params, weight_bytes  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=4, vocab_size=1000, pad_token_id=None,
             moe_intermediate_size=32, num_experts_per_tok=2, n_routed_experts=8,
             first_k_dense_replace=1, num_hidden_layers=3, kv_lora_rank=16,
             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)


def _built_bytes(d: dict) -> int:
    cfg = transformers.AutoConfig.for_model(**d)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("model_type,extra", [
    ("deepseek_v2", {"q_lora_rank": None}),
    ("deepseek_v3", {"q_lora_rank": 16}),
])
def test_bf16_weights_count_the_router_in_fp32(model_type: str, extra: dict) -> None:
    d = {"model_type": model_type, **SMALL, **extra}
    model = ModelConfig.from_hf_config(d, name=model_type)
    router = fp32_router_params(model)
    assert router == 2 * 8 * 64  # two MoE layers (the first is dense) x experts x hidden
    assert weight_bytes(model, "bf16") == _built_bytes(d) == 2 * param_count(model) + 2 * router
    assert weight_bytes(model, "fp32") == 4 * param_count(model)  # nothing to add at fp32


def test_deepseek_v2_lite_gains_its_routers_6_8_mb() -> None:
    m = MODELS["DeepSeek-V2-Lite (MLA, MoE)"]
    assert weight_bytes(m, "bf16") - 2 * param_count(m) == 2 * 26 * 64 * 2048 == 6_815_744


def test_other_moe_routers_follow_the_model_dtype() -> None:
    d = {"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000,
         "pad_token_id": None, "num_experts": 8, "num_experts_per_tok": 2,
         "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
         "num_hidden_layers": 2}
    model = ModelConfig.from_hf_config(d, name="q2moe")
    assert fp32_router_params(model) == 0
    assert weight_bytes(model, "bf16") == _built_bytes(d) == 2 * param_count(model)
