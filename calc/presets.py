"""Model presets: the public Hugging Face config.json of each model, parsed by from_hf_config.

Each entry of PRESET_HF_CONFIGS is (Hugging Face repository, the architecture keys of its
config.json as published there: https://huggingface.co/<repo>/blob/main/config.json). The same
dicts are stored as tests/fixtures/hf_configs/<repo name>.json, which double as example uploads
for the app. Keys that do not change the memory model (token ids, dropout, dtype, ...) are kept
where the published file has them so that the fixtures look like the real files.
"""

from __future__ import annotations

from dataclasses import replace

from calc.models import ModelConfig

_LLAMA_31 = {  # meta-llama/Llama-3.1-8B; 70B and 405B differ only in their sizes
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

_LLAMA_32 = {  # Llama 3.2 1B/3B: explicit head_dim, tied embeddings, rope factor 32
    **_LLAMA_31,
    "rope_scaling": {**_LLAMA_31["rope_scaling"], "factor": 32.0},
    "tie_word_embeddings": True,
}

_MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32000,
}

_MIXTRAL_8X7B = {
    **_MISTRAL_7B,
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "num_experts_per_tok": 2,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
}

_QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}

_QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

_GEMMA2_9B = {  # no tie_word_embeddings key: Gemma ties by default
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "sliding_window_size": 4096,
    "torch_dtype": "float32",
    "use_cache": True,
    "vocab_size": 256000,
}

_GEMMA3_27B = {  # text settings nested; vocab_size, pattern (6) and context left to defaults
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}

_PHI3_MINI = {
    "architectures": ["Phi3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "embd_pdrop": 0.0,
    "eos_token_id": 32000,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "model_type": "phi3",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096,
    "pad_token_id": 32000,
    "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "sliding_window": 2047,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32064,
}

_GPT2 = {  # GPT-2 keys: no intermediate size (n_inner absent = 4 x n_embd), tied by default
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "vocab_size": 50257,
}

#: Display name -> (Hugging Face repository, its config.json).
PRESET_HF_CONFIGS: dict[str, tuple[str, dict]] = {
    "Llama 3.1 8B": ("meta-llama/Llama-3.1-8B", _LLAMA_31),
    "Llama 3.1 70B": (
        "meta-llama/Llama-3.1-70B",
        {
            **_LLAMA_31,
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_attention_heads": 64,
            "num_hidden_layers": 80,
        },
    ),
    "Llama 3.1 405B": (
        "meta-llama/Llama-3.1-405B",
        {
            **_LLAMA_31,
            "hidden_size": 16384,
            "intermediate_size": 53248,
            "num_attention_heads": 128,
            "num_hidden_layers": 126,
        },
    ),
    "Llama 3.2 1B": (
        "meta-llama/Llama-3.2-1B",
        {
            **_LLAMA_32,
            "head_dim": 64,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_attention_heads": 32,
            "num_hidden_layers": 16,
        },
    ),
    "Llama 3.2 3B": (
        "meta-llama/Llama-3.2-3B",
        {
            **_LLAMA_32,
            "head_dim": 128,
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_attention_heads": 24,
            "num_hidden_layers": 28,
        },
    ),
    "Mistral 7B v0.1": ("mistralai/Mistral-7B-v0.1", _MISTRAL_7B),
    "Mixtral 8x7B": ("mistralai/Mixtral-8x7B-v0.1", _MIXTRAL_8X7B),
    "Qwen2.5 7B": ("Qwen/Qwen2.5-7B", _QWEN25_7B),
    "Qwen2.5 72B": (
        "Qwen/Qwen2.5-72B",
        {
            **_QWEN25_7B,
            "hidden_size": 8192,
            "intermediate_size": 29568,
            "max_window_layers": 80,
            "num_attention_heads": 64,
            "num_hidden_layers": 80,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05,
        },
    ),
    "Qwen3 30B-A3B (MoE)": ("Qwen/Qwen3-30B-A3B", _QWEN3_30B_A3B),
    "Gemma 2 9B": ("google/gemma-2-9b", _GEMMA2_9B),
    "Gemma 2 27B": (
        "google/gemma-2-27b",
        {
            **_GEMMA2_9B,
            "head_dim": 128,
            "hidden_size": 4608,
            "intermediate_size": 36864,
            "num_attention_heads": 32,
            "num_hidden_layers": 46,
            "num_key_value_heads": 16,
            "query_pre_attn_scalar": 144,
        },
    ),
    "Gemma 3 27B (text)": ("google/gemma-3-27b-it", _GEMMA3_27B),
    "Phi-3 mini (3.8B)": ("microsoft/Phi-3-mini-4k-instruct", _PHI3_MINI),
    "GPT-2 (124M)": ("openai-community/gpt2", _GPT2),
    "GPT-2 XL (1.5B)": (
        "openai-community/gpt2-xl",
        {**_GPT2, "n_embd": 1600, "n_head": 25, "n_layer": 48},
    ),
}


def fixture_name(repo: str) -> str:
    """File name of a preset's config.json under tests/fixtures/hf_configs/."""
    return repo.rsplit("/", 1)[-1] + ".json"


def _build() -> dict[str, ModelConfig]:
    models = {}
    for name, (repo, config) in PRESET_HF_CONFIGS.items():
        parsed = ModelConfig.from_hf_config(config, name=name)
        source = f"https://huggingface.co/{repo}/blob/main/config.json"
        models[name] = replace(parsed, source=source)
    return models


#: Display name -> ModelConfig, in the order the app lists them.
MODELS: dict[str, ModelConfig] = _build()
