"""Model configurations for measured training steps: real widths, few layers, no download.

Every entry is a Hugging Face ``config.json`` dict (the keys transformers reads) of a real
model, with ``num_hidden_layers`` cut to a few layers so that one step fits in seconds while
each layer, the embedding and the head keep the real model's widths. Sources: the fixture
configs in ``tests/fixtures/hf_configs/`` (copied from the Hub model cards' config.json) where
the model is there; otherwise the config.json of the model named in ``SOURCES`` (values
written here, and checked against calc's reading of them in the tests).
The architectures outside calc's rules (issue 42, item 6: OLMo-2, Granite, SmolLM3,
GLM-4.5-Air, MiniMax-M2, Llama 4 text, with Qwen3-Next from its fixture) come from
``attnmem.measure.unruled_models``: the installed transformers config classes' defaults, each
entry's description naming the class and the checkpoint its docstring names.

``hf_config(name)`` gives the dict, ``build_config(name)`` the transformers config object
(imports transformers), both as ``attnmem.measure.model_common.model_config`` and
``config_object`` make them for every model list (``model_common.sliding_layers`` reads a
built config's windowed layers).

No torch or transformers at import time.
"""

from __future__ import annotations

from typing import Any

from attnmem.measure import unruled_models as unruled
from attnmem.measure.model_common import TINY_LLAMA, Models, config_object, model_config

#: Where each base config comes from: a fixture file name, or a dict written here.
_QWEN3_4B = {  # Qwen/Qwen3-4B config.json
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 9728,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
_LLAMA2_7B = {  # meta-llama/Llama-2-7b-hf config.json (multi-head attention: 32 KV heads)
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "float16", "use_cache": True,
    "vocab_size": 32000,
}

#: name -> (base config: fixture file stem or a dict, layers, what it stands for)
MODELS: Models = {
    "llama3-8b-2l": ("Llama-3.1-8B", 2, "Llama 3.1 8B widths, GQA 32/8, 128k vocab, untied"),
    "llama3-8b-4l": ("Llama-3.1-8B", 4, "the same with 4 layers (per-layer cost: 4l - 2l)"),
    "llama3.2-1b-2l": ("Llama-3.2-1B", 2, "Llama 3.2 1B widths, GQA 32/8, d = 64, tied"),
    "llama2-7b-2l": (_LLAMA2_7B, 2, "Llama 2 7B widths, multi-head (32/32), 32k vocab"),
    "qwen2.5-7b-2l": ("Qwen2.5-7B", 2, "Qwen2.5 7B widths, GQA 28/4, q/k/v bias, 152k vocab"),
    "qwen3-4b-2l": (_QWEN3_4B, 2, "Qwen3 4B widths, GQA 32/8, q/k norm, tied, 152k vocab"),
    "mistral-7b-2l": ("Mistral-7B-v0.1", 2, "Mistral 7B v0.1, GQA 32/8, sliding window 4,096"),
    "phi3-mini-2l": ("Phi-3-mini-4k-instruct", 2,
                     "Phi-3 mini, multi-head (32/32), d = 96, sliding window 2,047"),
    "gemma2-9b-2l": ("gemma-2-9b", 2, "Gemma 2 9B, d = 256, soft-capped logits, layer 0 "
                     "sliding (4,096), layer 1 global, 256k vocab, tied"),
    "gemma3-27b-2l": ("gemma-3-27b-it", 2, "Gemma 3 27B text widths, GQA 32/16, both layers "
                      "sliding (1,024; the 6th layer is the first global one), 262k vocab, tied"),
    # Mixture of experts (issue 34): every layer keeps the real model's experts.
    "mixtral-8x7b-2l": ("Mixtral-8x7B-v0.1", 2, "Mixtral 8x7B widths, 8 experts of 14,336, top 2, "
                        "GQA 32/8, 32k vocab"),
    "qwen3-30b-a3b-4l": ("Qwen3-30B-A3B", 4, "Qwen3-30B-A3B widths, 128 experts of 768, top 8, "
                         "GQA 32/4, q/k norm, 152k vocab"),
    "gpt-oss-20b-2l": ("gpt-oss-20b", 2, "gpt-oss-20b in bf16 (no MXFP4), 32 experts of 2,880, "
                       "top 4, GQA 64/8, d = 64, sinks, layer 0 sliding (128), 201k vocab"),
    # Outside calc's rules (issue 42, item 6): predicted by the meta-device trace
    # (attnmem.measure.train.predict). Real widths (attnmem.measure.unruled_models says where
    # each comes from), every expert kept, layers cut so that weights, gradients and AdamW's
    # two moments (8 bytes a parameter in bf16) leave an 80 GB H100 room for activations.
    "olmo2-7b-2l": (unruled.OLMO2, 2, "Olmo2Config defaults, which describe "
                    "allenai/OLMo-2-1124-7B per its docstring: MHA 32/32, q/k norm, post-norm "
                    "blocks, 50k vocab, untied"),
    "granite-7b-2l": (unruled.GRANITE, 2, "GraniteConfig defaults, which describe "
                      "ibm-granite/granite-3.0-8b-base per its docstring: MHA 32/32, 32k vocab, "
                      "the multipliers"),
    "smollm3-3b-4l": (unruled.SMOLLM3, 4, "SmolLM3Config defaults, which describe "
                      "HuggingFaceTB/SmolLM3-3B per its docstring, 4 layers (the 4th without "
                      "RoPE): GQA 16/4, 128k vocab, tied"),
    "glm4.5-air-2l": (unruled.GLM4_MOE, 2, "Glm4MoeConfig defaults, which describe "
                      "zai-org/GLM-4.5 per its docstring (GLM-4.5-Air's layout), with head_dim "
                      "128 from GLM-4.5-Air's config.json; 2 layers: 1 dense + 1 MoE of 128 "
                      "experts (1,408), top 8, a shared expert, GQA 96/8, 152k vocab"),
    "minimax-m2-1l": (unruled.MINIMAX_M2, 1, "MiniMaxM2Config defaults, which describe "
                      "MiniMaxAI/MiniMax-Text-01-hf per its docstring (a line shared with "
                      "MiniMaxConfig; the values are MiniMax-M2's layout); 1 layer (4.9B "
                      "parameters: 2 would need 64 GiB before activations): 256 experts of "
                      "1,536, top 8, GQA 48/8, q/k norm, 200k vocab"),
    "llama4-scout-2l": (unruled.LLAMA4_TEXT, 2, "Llama4TextConfig defaults, which describe "
                        "meta-llama/Llama-4-Scout-17B-16E per its docstring; 2 layers (both "
                        "chunked, 8,192: full causal up to 8k tokens): 16 experts of 8,192, "
                        "top 1, a shared expert, GQA 40/8, 202k vocab"),
    "qwen3-next-80b-4l": ("Qwen3-Next-80B-A3B-Instruct", 4, "Qwen3-Next-80B-A3B-Instruct "
                          "(fixture config.json), 4 layers: 3 gated-DeltaNet linear attention + "
                          "1 gated full attention (GQA 16/2, d = 256), 512 experts of 512, top "
                          "10, a shared expert, 152k vocab"),
    "tiny-llama": (TINY_LLAMA, 2, "CPU tests only: hidden 64, 4 heads, 2 KV heads, vocab 128"),
}

NAMES: tuple[str, ...] = tuple(MODELS)

def hf_config(name: str, layers: int | None = None) -> dict[str, Any]:
    """The config.json dict of ``name`` (MODELS), with its layer count (or ``layers``, a whole
    number >= 1) and no KV cache (training); ``model_common.model_config``."""
    return model_config(MODELS, name, layers, what="training", use_cache=False)


def build_config(name_or_dict: str | dict[str, Any]) -> Any:
    """The transformers config object (AutoConfig.for_model) of a MODELS name or a dict."""
    return config_object(hf_config(name_or_dict) if isinstance(name_or_dict, str)
                         else name_or_dict)
