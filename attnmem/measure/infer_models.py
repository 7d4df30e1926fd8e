"""Model configurations for measured inference (``generate()``): real configs, no download.

Every entry is a Hugging Face ``config.json`` dict (the keys transformers reads) of a real
model with a stated layer count: the full depth where one H200 holds the model in bf16
(Llama 3.1 8B, Qwen2.5 7B, Mistral 7B, Llama 3.2 1B, DeepSeek-V2-Lite), a cut where it does not
or where a few layers show everything (Gemma 3 27B, Qwen3-30B-A3B: ``-<n>l`` in the name).
Sources: the fixture configs in ``tests/fixtures/hf_configs/`` (the Hub model cards'
config.json, ``attnmem.measure.model_common.FIXTURES``); a multimodal config (Gemma 3) gives
its ``text_config``, as ``Gemma3ForCausalLM`` is built from it.
The architectures outside calc's rules (issue 42, item 6: OLMo-2, Granite, SmolLM3,
GLM-4.5-Air, MiniMax-M2, Llama 4 text, with gpt-oss and Qwen3-Next from the fixtures) come from
``attnmem.measure.unruled_models``: the installed transformers config classes' defaults, each
entry's description naming the class and the checkpoint its docstring names.

Layer cuts keep the architecture's layer pattern because ``layer_types`` is dropped and
re-derived by the config class for the new depth (``Gemma3TextConfig.__init__``: layer i is
"sliding_attention" unless (i + 1) % sliding_window_pattern == 0, pattern 6: five local
layers, then one global). Gemma 3 is cut to 12 layers, two whole periods: 10 sliding, 2
global, the real model's 5:1 ratio.

The ``tiny-*`` entries are not real models: small widths of the same architectures (Llama,
Mistral's sliding window, Gemma 3's interleaving, Qwen3-MoE, DeepSeek-V2's MLA) for the CPU
tests.

``hf_config(name, layers=None)`` gives the dict (``use_cache`` on: generation),
``build_config`` the transformers config object, both as ``attnmem.measure.model_common``'s
``model_config`` and ``config_object`` make them for every model list. No torch or
transformers at import time.
"""

from __future__ import annotations

from typing import Any

from attnmem.measure import unruled_models as unruled
from attnmem.measure.model_common import TINY_LLAMA, Models, config_object, model_config

#: Not real models: tiny widths of the measured architectures, for the CPU tests (and
#: model_common.TINY_LLAMA).
_TINY_MISTRAL = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 256,
    "sliding_window": 16, "tie_word_embeddings": False, "hidden_act": "silu",
}
_TINY_GEMMA3 = {
    "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_hidden_layers": 6, "vocab_size": 128, "max_position_embeddings": 256,
    "sliding_window": 16, "query_pre_attn_scalar": 16,
}
_TINY_QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
    "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 256,
    "tie_word_embeddings": False, "use_sliding_window": False, "norm_topk_prob": True,
}
_TINY_DEEPSEEK_V2 = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 4,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 32,
    "q_lora_rank": None, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 256,
    "tie_word_embeddings": False, "n_group": 1, "topk_group": 1, "topk_method": "greedy",
}

#: Qwen2-MoE at Qwen1.5-MoE-A2.7B's published widths (written out: no fixture file): 60 routed
#: experts of 1,408, top 4, a shared expert of 5,632, MHA 16/16, 152k vocabulary.
_QWEN2_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
    "intermediate_size": 5632, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
    "norm_topk_prob": False, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_hidden_layers": 24, "vocab_size": 151936, "max_position_embeddings": 8192,
    "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 4096,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
}

#: name -> (base config: fixture file stem or a dict, layers, what it stands for)
MODELS: Models = {
    "llama3.1-8b": ("Llama-3.1-8B", 32, "Llama 3.1 8B, full depth: GQA 32/8, 128k vocab"),
    "qwen2.5-7b": ("Qwen2.5-7B", 28, "Qwen2.5 7B, full depth: GQA 28/4, q/k/v bias, 152k vocab"),
    "mistral-7b": ("Mistral-7B-v0.1", 32, "Mistral 7B v0.1, full depth: sliding window 4,096 "
                   "on every layer"),
    "gemma3-27b-12l": ("gemma-3-27b-it", 12, "Gemma 3 27B text model cut to 12 layers (10 "
                       "local with a 1,024 window, 2 global: the real 5:1), 262k vocab, tied"),
    "qwen3-30b-a3b-8l": ("Qwen3-30B-A3B", 8, "Qwen3-30B-A3B cut to 8 layers: MoE, 128 experts, "
                         "8 active, GQA 32/4, 152k vocab"),
    "deepseek-v2-lite": ("DeepSeek-V2-Lite", 27, "DeepSeek-V2-Lite, full depth: MLA (latent "
                         "512 + rope 64), 64 routed + 2 shared experts, first layer dense"),
    "llama3.2-1b": ("Llama-3.2-1B", 16, "Llama 3.2 1B, full depth: GQA 32/8, d = 64, tied"),
    # Held out: added after calc's inference model was fitted to the rows above, to check it
    # on architectures it was not measured on (fused q/k/v and gate/up, MoE, alternating
    # windows with soft-capping).
    "phi3-mini": ("Phi-3-mini-4k-instruct", 32, "Phi-3 mini, full depth: fused qkv_proj and "
                  "gate_up_proj, MHA 32/32, d = 96"),
    "llama3.2-3b": ("Llama-3.2-3B", 28, "Llama 3.2 3B, full depth: GQA 24/8, tied"),
    "mixtral-8x7b-4l": ("Mixtral-8x7B-v0.1", 4, "Mixtral 8x7B cut to 4 layers: MoE, 8 experts, "
                        "2 active, GQA 32/8"),
    "gemma2-9b-14l": ("gemma-2-9b", 14, "Gemma 2 9B cut to 14 layers: local (window 4,096) and "
                      "global layers alternating, logit soft-capping (eager only), 256k vocab"),
    "qwen2-moe-8l": (_QWEN2_MOE, 8, "Qwen2-MoE (Qwen1.5-MoE-A2.7B widths) cut to 8 layers: "
                     "a shared expert beside 60 routed, top 4"),
    # Outside calc's rules (issue 42, item 6): predicted by the meta-device trace
    # (attnmem.measure.infer.predict). Real widths (attnmem.measure.unruled_models says where
    # each comes from), every expert kept, layers cut so that one 80 GB H100 holds the bf16
    # weights with room for an eager 8k prefill.
    "olmo2-7b": (unruled.OLMO2, 32, "Olmo2Config defaults, which describe "
                 "allenai/OLMo-2-1124-7B per its docstring; full depth: MHA 32/32, q/k norm, "
                 "post-norm blocks, 50k vocab"),
    "granite-7b": (unruled.GRANITE, 32, "GraniteConfig defaults, which describe "
                   "ibm-granite/granite-3.0-8b-base per its docstring; full depth, 6.7B "
                   "parameters: MHA 32/32, 32k vocab, embedding/residual/attention/logit multipliers"),
    "smollm3-3b": (unruled.SMOLLM3, 36, "SmolLM3Config defaults, which describe "
                   "HuggingFaceTB/SmolLM3-3B per its docstring; full depth: GQA 16/4, every "
                   "4th layer without RoPE, 128k vocab, tied"),
    "glm4.5-air-4l": (unruled.GLM4_MOE, 4, "Glm4MoeConfig defaults, which describe "
                      "zai-org/GLM-4.5 per its docstring (GLM-4.5-Air's layout), with head_dim "
                      "128 from GLM-4.5-Air's config.json; cut to 4 layers: 1 dense + 3 MoE of "
                      "128 experts (1,408), top 8, a shared expert, GQA 96/8, 152k vocab"),
    "minimax-m2-4l": (unruled.MINIMAX_M2, 4, "MiniMaxM2Config defaults, which describe "
                      "MiniMaxAI/MiniMax-Text-01-hf per its docstring (a line shared with "
                      "MiniMaxConfig; the values are MiniMax-M2's layout); cut to 4 layers: "
                      "256 experts of 1,536, top 8, GQA 48/8, q/k norm, 200k vocab"),
    "gpt-oss-20b-8l": ("gpt-oss-20b", 8, "gpt-oss-20b (fixture config.json) in bf16 (no "
                       "MXFP4) cut to 8 layers: sliding (128) and full alternating, sinks "
                       "(eager only: the class has no SDPA), 32 experts, top 4, 201k vocab"),
    "llama4-scout-4l": (unruled.LLAMA4_TEXT, 4, "Llama4TextConfig defaults, which describe "
                        "meta-llama/Llama-4-Scout-17B-16E per its docstring; cut to 4 layers: "
                        "3 chunked (8,192) + 1 full without RoPE, 16 experts of 8,192, top 1, "
                        "a shared expert, GQA 40/8, 202k vocab"),
    "qwen3-next-80b-4l": ("Qwen3-Next-80B-A3B-Instruct", 4, "Qwen3-Next-80B-A3B-Instruct "
                          "(fixture config.json) cut to 4 layers: 3 gated-DeltaNet linear "
                          "attention + 1 gated full attention (GQA 16/2, d = 256), 512 experts "
                          "of 512, top 10, a shared expert, 152k vocab"),
    "tiny-llama": (TINY_LLAMA, 2, "CPU tests: Llama, hidden 64, 4 heads, 2 KV heads"),
    "tiny-mistral": (_TINY_MISTRAL, 2, "CPU tests: Mistral, sliding window 16"),
    "tiny-gemma3": (_TINY_GEMMA3, 6, "CPU tests: Gemma 3 text, 5 local (window 16) + 1 global"),
    "tiny-qwen3-moe": (_TINY_QWEN3_MOE, 2, "CPU tests: Qwen3-MoE, 4 experts, 2 active"),
    "tiny-deepseek-v2": (_TINY_DEEPSEEK_V2, 2, "CPU tests: DeepSeek-V2 MLA, 1 dense + 1 MoE"),
}

NAMES: tuple[str, ...] = tuple(MODELS)

def hf_config(name: str, layers: int | None = None) -> dict[str, Any]:
    """The config.json dict of ``name`` (MODELS) with its layer count (or ``layers``, a whole
    number >= 1) and a KV cache (generation); ``model_common.model_config``."""
    return model_config(MODELS, name, layers, what="inference", use_cache=True)


def build_config(name_or_dict: str | dict[str, Any]) -> Any:
    """The transformers config object (AutoConfig.for_model) of a MODELS name or a dict."""
    return config_object(hf_config(name_or_dict) if isinstance(name_or_dict, str)
                         else name_or_dict)
