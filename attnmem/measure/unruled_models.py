"""Base configs of the architectures outside calc's rules (issue 42, item 6), for the model
lists (``attnmem.measure.infer_models``, ``attnmem.measure.train_models``).

Where the fixtures (``tests/fixtures/hf_configs/``, the Hub model cards' config.json) have the
model, the lists name the fixture (gpt-oss-20b, Qwen3-Next-80B-A3B-Instruct). The others are
written here from the installed transformers (5.25.0) config class's defaults
(``<Class>().to_diff_dict()``), never from guessed widths; tests/measure/test_unruled_models.py
checks every value against the installed class. Each class's docstring names the checkpoint
its defaults are "similar" to; those names are quoted below as the docstring gives them, not
checked against the checkpoints' own config.json (no download here). Left out, so that the
class derives them for the cut depth: ``layer_types``, ``no_rope_layers`` (SmolLM3,
Llama 4: every 4th layer without RoPE), ``moe_layers`` (Llama 4); also the router-loss and
init keys, which hold no memory.

No torch or transformers at import time.
"""

from __future__ import annotations

from typing import Any

#: Olmo2Config defaults, which describe allenai/OLMo-2-1124-7B per its docstring: MHA 32/32,
#: q/k RMSNorm over all heads, post-norm blocks, 50k vocabulary (the class default), untied.
OLMO2 = {
    "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "vocab_size": 50304,
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu",
    "max_position_embeddings": 2048, "pad_token_id": 1, "bos_token_id": None,
    "eos_token_id": 50279, "tie_word_embeddings": False,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "attention_bias": False, "attention_dropout": 0.0, "rms_norm_eps": 1e-05,
}

#: GraniteConfig defaults, which describe ibm-granite/granite-3.0-8b-base per its docstring:
#: MHA 32/32, 32k vocabulary, every multiplier 1.0 (the multiplications still run).
GRANITE = {
    "architectures": ["GraniteForCausalLM"], "model_type": "granite", "vocab_size": 32000,
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-06, "pad_token_id": None,
    "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
    "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0,
    "attention_multiplier": 1.0,
}

#: SmolLM3Config defaults, which describe HuggingFaceTB/SmolLM3-3B per its docstring: GQA
#: 16/4, every 4th layer without RoPE, 128k vocabulary, tied.
SMOLLM3 = {
    "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "vocab_size": 128256,
    "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 4, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "pad_token_id": 128004,
    "bos_token_id": 128000, "eos_token_id": 128001,
    "rope_parameters": {"rope_theta": 2000000.0, "rope_type": "default"},
    "use_sliding_window": False, "sliding_window": None, "no_rope_layer_interval": 4,
    "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
    "tie_word_embeddings": True,
}

#: Glm4MoeConfig defaults, which describe zai-org/GLM-4.5 per its docstring, although the
#: values (46 layers, 128 routed experts of 1,408, top 8, a shared expert, first layer dense
#: of 10,944, GQA 96/8) are GLM-4.5-Air's layout; plus ``head_dim`` 128: the class has no
#: head_dim default, so without it the model takes hidden // heads = 4096 // 96 = 42, and
#: GLM-4.5-Air's config.json gives 128 (as quoted in public code; not read from the Hub here).
GLM4_MOE = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": 151552,
    "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
    "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
    "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                        "rope_type": "default"},
    "attention_bias": False, "attention_dropout": 0.0, "moe_intermediate_size": 1408,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "n_routed_experts": 128,
    "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "norm_topk_prob": True, "use_qk_norm": False, "bos_token_id": None, "eos_token_id": None,
    "pad_token_id": None, "num_nextn_predict_layers": 1,
}

#: MiniMaxM2Config defaults; its docstring names MiniMaxAI/MiniMax-Text-01-hf (a line shared
#: with MiniMaxConfig), but the class is transformers' MiniMax-M2 and its values are a
#: full-attention MoE: 256 experts of 1,536, top 8, GQA 48/8, d = 128, q/k RMSNorm over all
#: heads, 200k vocabulary, untied (the released checkpoint's partial RoPE, ``rotary_dim``, is
#: not a default and changes no tensor size beyond the rotary tables).
MINIMAX_M2 = {
    "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
    "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536,
    "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 196608,
    "rms_norm_eps": 1e-06, "pad_token_id": None, "bos_token_id": 200034,
    "eos_token_id": 200020, "tie_word_embeddings": False, "attention_dropout": 0.0,
    "num_experts_per_tok": 8, "num_local_experts": 256,
    "rope_parameters": {"rope_theta": 5000000.0, "rope_type": "default"},
}

#: Llama4TextConfig defaults, which describe meta-llama/Llama-4-Scout-17B-16E per its
#: docstring: every layer MoE, 16 experts of 8,192, top 1, a shared expert, GQA 40/8, q/k
#: L2 norm, every 4th layer full attention without RoPE, the others chunked (8,192), 202k
#: vocabulary, untied.
LLAMA4_TEXT = {
    "architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "vocab_size": 202048,
    "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False, "attention_dropout": 0.0, "num_experts_per_tok": 1,
    "num_local_experts": 16, "interleave_moe_layer_step": 1, "use_qk_norm": True,
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
    "no_rope_layer_interval": 4, "attention_chunk_size": 8192, "attn_temperature_tuning": True,
    "floor_scale": 8192, "attn_scale": 0.1, "attention_bias": False,
}

#: The class-default configs above: model_type -> (dict, the values added to the class's
#: defaults, which the test does not compare with the class).
CLASS_DEFAULTS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "olmo2": (OLMO2, ()),
    "granite": (GRANITE, ()),
    "smollm3": (SMOLLM3, ()),
    "glm4_moe": (GLM4_MOE, ("head_dim",)),
    "minimax_m2": (MINIMAX_M2, ()),
    "llama4_text": (LLAMA4_TEXT, ()),
}
