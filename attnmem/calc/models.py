"""Transformer model shapes: the ModelConfig dataclass and Hugging Face config.json parsing.

Everything the memory model needs to know about an architecture lives in ModelConfig; the
formulas that use it live in params.py (parameters), weights.py (their bytes) and kv.py (KV
cache); presets in presets.py; values a config.json leaves out come from hf_defaults.py.

`ModelConfig.from_hf_config` reads the keys that the Hugging Face `transformers` configuration
classes define (LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config, Qwen2MoeConfig,
Qwen3Config, Qwen3MoeConfig, GemmaConfig, Gemma2Config, Gemma3TextConfig, Phi3Config,
GPT2Config, the non-gated GPTNeoXConfig and PhiConfig, and since issue 19 DeepseekV2Config /
DeepseekV3Config (multi-head latent attention, shared experts, dense first layers),
JambaConfig, NemotronHConfig and Qwen3NextConfig (hybrids whose non-attention layers keep a
constant state, attnmem/calc/mixers.py)). Any other model_type is refused with a ValueError that names
it and lists KNOWN_MODEL_TYPES: reading it as Llama would give a plausible wrong number.
Per-architecture conventions that a config.json leaves implicit (tied embeddings,
which layers use the sliding window, biases, extra norms) follow the matching modeling_*.py
files of `transformers`; each rule below names its architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnmem.calc.hf_defaults import CLASS_HEAD_DIMS, Completed, complete
from attnmem.calc.mixers import Mixer, gated_deltanet, mamba1, mamba2
from attnmem.calc.units import MAX_HEAD_DIM, MAX_HEADS, MAX_SEQ_LEN, check_int, dtype_name


@dataclass(frozen=True)
class QuantConfig:
    """A checkpoint's `quantization_config` (config.json), as far as stored bytes go.

    method is the quant_method ("mxfp4", "fp8", "gptq", "awq", "bitsandbytes"); bits the
    stored width of a quantized weight; group_size the weights per scale (GPTQ/AWQ; -1: one
    group per column); weight_block_size the fp8 scale block [out, in] (None: per tensor);
    fmt the fp8 element format ("e4m3"); quant_type the bitsandbytes 4-bit type ("nf4",
    "fp4"); double_quant its nested absmax quantization; modules_to_not_convert the modules the
    config leaves at torch_dtype (also read from ignored_layers / llm_int8_skip_modules).
    The bytes are priced in attnmem/calc/quant.py."""

    method: str
    bits: int
    group_size: int | None = None
    weight_block_size: tuple[int, int] | None = None
    fmt: str = ""
    quant_type: str = ""
    double_quant: bool = False
    modules_to_not_convert: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """Short name for tables, e.g. "fp8 e4m3, 128x128 blocks", "gptq int4, group 128"."""
        if self.method == "mxfp4":
            return "MXFP4 (4-bit, one 8-bit scale per 32)"
        if self.method == "fp8":
            block = ("per-tensor scale" if self.weight_block_size is None else
                     f"{self.weight_block_size[0]}x{self.weight_block_size[1]} block scales")
            return f"fp8 {self.fmt or 'e4m3'}, {block}"
        if self.method in ("gptq", "awq"):
            group = "one group" if self.group_size in (None, -1) else f"group {self.group_size}"
            return f"{self.method.upper()} int{self.bits}, {group}"
        if self.bits == 8:
            return "bitsandbytes int8"
        return (f"bitsandbytes {self.quant_type or 'nf4'}"
                + (", double quant" if self.double_quant else ""))

    @property
    def default_dtype(self) -> str:
        """Dtype of the unquantized tensors when config.json names none: fp16 for GPTQ/AWQ
        (their scales and kernels are fp16), bf16 otherwise."""
        return "fp16" if self.method in ("gptq", "awq") else "bf16"


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only transformer, as far as memory is concerned."""

    name: str  # display name, e.g. "Llama 3.1 8B"
    num_layers: int  # L, transformer blocks
    hidden_size: int  # d_model
    num_heads: int  # H, query heads per layer
    num_kv_heads: int  # H_kv, key/value heads (= H for MHA, < H for GQA, 1 for MQA)
    head_dim: int  # d_head; from the config when given (Gemma: 256 with hidden 3584/16 heads)
    intermediate_size: int  # MLP hidden width (per expert for MoE)
    vocab_size: int  # embedding rows
    tie_embeddings: bool = False  # output projection shares the input embedding matrix
    gated_mlp: bool = True  # SwiGLU/GeGLU: gate, up, down (3 matrices); else up, down (2)
    num_experts: int = 1  # MoE experts per layer (1 = dense)
    experts_per_token: int = 1  # MoE experts active per token (weights of all are stored)
    sliding_window: int | None = None  # window length of sliding-window attention layers
    sliding_window_layers: int = 0  # how many of the L layers use the window (rest are global)
    attention_bias: bool = False  # biases on the q/k/v projections (Qwen2, GPT-2)
    mlp_bias: bool = False  # biases on the MLP matrices (GPT-2, Phi-2)
    norm_bias: bool = False  # LayerNorm with bias (GPT-2) vs RMSNorm (no bias)
    learned_positions: int = 0  # rows of a learned position embedding (GPT-2: 1024), else 0
    max_position_embeddings: int | None = None  # longest context the model was trained for
    source: str = ""  # where the numbers come from (model card / config.json)
    # --- added for exact parameter counts (params.py); defaults keep the Llama layout ---
    attention_out_bias: bool = False  # bias on the attention output projection o (GPT-2; Llama
    #   and Qwen3 with attention_bias=true put biases on q, k, v and o; Qwen2 only on q, k, v)
    norms_per_layer: int = 2  # norm weight vectors per block (Gemma 2/3: 4, pre and post norms)
    qk_norm: bool = False  # RMSNorm of width head_dim on queries and keys (Qwen3, Gemma 3)
    shared_expert_intermediate_size: int = 0  # MoE: width of an always-on shared expert with a
    #   hidden x 1 sigmoid gate (Qwen2-MoE); 0 = none
    dense_mlp_layers: int = 0  # MoE: layers with a plain dense MLP instead of experts
    #   (Qwen-MoE mlp_only_layers / decoder_sparse_step); the rest of the L layers are MoE
    dense_intermediate_size: int = 0  # MoE: MLP width of those dense layers (0 = none)
    # --- added for issue 19: MLA, hybrids, gated attention; defaults keep the Llama layout ---
    model_type: str = ""  # config.json model_type, lower case ("" when built by hand)
    attention_layers: int | None = None  # layers with attention and a KV cache (None: all L)
    mlp_layers: int | None = None  # layers with an MLP or MoE block (None: all L; Nemotron-H
    #   blocks hold one mixer each, so its '-' blocks are the MLP layers)
    shared_expert_gate: bool = True  # Qwen MoE gates its shared expert with hidden x 1;
    #   DeepSeek's shared experts are ungated (modeling_deepseek_v3.py DeepseekV3MoE)
    attention_output_gate: bool = False  # Qwen3-Next: q_proj also emits a sigmoid gate per
    #   query channel (2 x H·d wide, modeling_qwen3_next.py Qwen3NextAttention)
    kv_lora_rank: int = 0  # MLA (DeepSeek-V2/V3): width of the cached KV latent; 0 = not MLA
    q_lora_rank: int = 0  # MLA: width of the low-rank query (0: q projected directly, V2-Lite)
    qk_rope_head_dim: int = 0  # MLA: decoupled RoPE key width, one per token (cached)
    v_head_dim: int = 0  # MLA: value width per head (head_dim is the q·k width nope + rope)
    state_mixer: Mixer | None = None  # the non-attention block of a hybrid (attnmem/calc/mixers.py)
    state_layers: int = 0  # how many layers hold that block (a constant state per sequence)
    # --- added for issue 30: gpt-oss, quantized checkpoints, reading rules ---
    attention_sinks: bool = False  # one learned logit per query head per attention layer
    #   (gpt-oss: GptOssAttention.sinks, a parameter of num_attention_heads)
    router_bias: bool = False  # MoE router with a bias of num_experts (GptOssTopKRouter)
    torch_dtype: str = ""  # the checkpoint's dtype for unquantized tensors ("" unknown)
    quantization: QuantConfig | None = None  # the checkpoint's quantization_config
    read_as: str = ""  # how the config was read when not by its own model_type's rules, and
    #   what it leaves out (a vision tower): for pages to show; "" when nothing to say
    defaults_from: str = ""  # the values config.json left out that its transformers config
    #   class supplied, and that class (attnmem/calc/hf_defaults.py); "" when none were read

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, sec. 2.1)."""
        return self.kv_lora_rank > 0

    @property
    def kv_layers(self) -> int:
        """Layers that keep a KV cache: the attention layers (all L unless a hybrid)."""
        return self.num_layers if self.attention_layers is None else self.attention_layers

    @classmethod
    def from_hf_config(cls, d: dict, name: str | None = None, *,
                       with_transformers: bool = True) -> ModelConfig:
        """Build a ModelConfig from a Hugging Face `config.json` dict (already JSON-parsed).

        Where transformers is importable (and `with_transformers`), the file is first completed
        by its model type's config class: every value it leaves out is the class's
        (attnmem/calc/hf_defaults.py), and `defaults_from` names those calc read. Multimodal
        configs that nest the language model under `text_config` (Gemma 3, LLaVA, ...) are read
        from there, falling back to the top level for keys it lacks. Raises one ValueError
        naming the missing or wrong key and what is accepted. Nothing is evaluated.
        `with_transformers=False` reads the file as written (the bundled presets, whose files
        give every value the rules read; tests/calc/test_hf_defaults.py checks both reads agree).
        """
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name must be a text label or None, got {name!r}")
        return _parse_hf_config(d, name, with_transformers)


def check_model(model: object) -> ModelConfig:
    """Return model if it is a ModelConfig; else raise TypeError naming what was given."""
    if not isinstance(model, ModelConfig):
        raise TypeError(
            f"model must be a ModelConfig (a preset from attnmem.calc.MODELS or "
            f"ModelConfig.from_hf_config(...)), got {type(model).__name__} {model!r:.60}")
    return model


# --------------------------------------------------------------------------- parsing ----

_MISSING = object()
_MAX_LAYERS = 10_000
_MAX_WIDTH = 10_000_000  # hidden / intermediate sizes
_MAX_VOCAB = 100_000_000
_MAX_EXPERTS = 100_000

#: Model types whose config classes tie the output projection to the embedding by default
#: (`tie_word_embeddings` defaults to True in GemmaConfig, Gemma2Config, Gemma3TextConfig and
#: the base PretrainedConfig that GPT2Config uses). Every other type defaults to untied, as
#: LlamaConfig, MistralConfig, Qwen2Config and Phi3Config do.
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "gpt2"}
#: Non-gated families besides GPT-2: a 2-matrix MLP, LayerNorm with bias and biases on every
#: linear layer (modeling_gpt_neox.py for Pythia; modeling_phi.py for Phi-1/1.5/2, whose
#: parallel block has a single LayerNorm). Unknown model types are read as Llama-style.
_CLASSIC = {"gpt_neox", "phi"}
#: Gemma 2/3 blocks norm before and after both attention and MLP (4 RMSNorms per block).
_FOUR_NORMS = {"gemma2", "gemma3", "gemma3_text"}
#: Per-head RMSNorm on q and k (modeling_qwen3.py, modeling_gemma3.py: q_norm, k_norm).
_QK_NORM = {"qwen3", "qwen3_moe", "qwen3_next", "gemma3", "gemma3_text"}
#: Qwen2's q/k/v projections always carry a bias and its o projection never does
#: (modeling_qwen2.py); its config has no attention_bias key.
_QWEN2_QKV_BIAS = {"qwen2", "qwen2_moe"}
#: Qwen families: use_sliding_window switches the window on for layers >= max_window_layers.
_QWEN = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next"}
#: Multi-head latent attention (modeling_deepseek_v2.py / modeling_deepseek_v3.py).
_MLA = {"deepseek_v2", "deepseek_v3"}
#: Hybrids: attention in some layers, a constant-state mixer in the others (attnmem/calc/mixers.py).
_HYBRID = {"jamba", "nemotron_h", "qwen3_next"}
#: gpt-oss (modeling_gpt_oss.py): sinks, biases on q/k/v/o, router and expert biases.
_GPT_OSS = {"gpt_oss"}
#: Vision-language checkpoints whose language model is one of the families above; only the
#: language model is counted (read_as says so). Qwen2-VL / Qwen2.5-VL: a Qwen2 decoder
#: (modeling_qwen2_5_vl.py Qwen2_5_VLTextModel, q/k/v biases).
_VL_QWEN2 = {"qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"}
_VL_OUTER = {"gemma3": "Gemma 3", "mistral3": "Mistral 3 (Mistral-Small 3.1)",
             "llava": "LLaVA", **{t: "Qwen2-VL / Qwen2.5-VL" for t in _VL_QWEN2}}
#: Every model_type the parser has rules for; anything else is refused, not read as Llama.
KNOWN_MODEL_TYPES: tuple[str, ...] = tuple(sorted({
    "llama", "mistral", "mixtral", "gemma", "phi3", *_TIED_BY_DEFAULT, *_CLASSIC, *_FOUR_NORMS,
    *_QK_NORM, *_QWEN2_QKV_BIAS, *_QWEN, *_MLA, *_HYBRID, *_GPT_OSS, *_VL_QWEN2,
}))
#: Model classes of config.json's `architectures` -> the model_type whose rules read them, for
#: configs whose model_type is unknown, that ship their own modeling code (auto_map) and whose
#: class is one of these (Kimi-K2 ships model_type "kimi_k2", architectures
#: ["DeepseekV3ForCausalLM"] and auto_map to its modeling_deepseek.py, DeepSeek-V3's code).
ARCHITECTURE_TYPES: dict[str, str] = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral", "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3", "GPT2LMHeadModel": "gpt2",
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
}
#: Types with a transformers implementation whose memory-relevant parts are not modelled here:
#: refused with the reason instead of read as a neighbour.
_NOT_MODELLED = {
    "llama4": "Llama 4 interleaves MoE and dense layers (interleave_moe_layer_step) and uses "
              "chunked local attention (attention_chunk_size) in 3 of 4 layers with no RoPE in "
              "the others; neither the chunked KV nor that layer mix is modelled",
    "llama4_text": "Llama 4 interleaves MoE and dense layers (interleave_moe_layer_step) and "
                   "uses chunked local attention (attention_chunk_size); neither is modelled",
}
#: Sequence models without attention: there is no attention memory to compute.
_ATTENTION_FREE = {"mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "xlstm"}


#: Said where a value is missing and transformers, whose config class would supply its default,
#: is not installed.
HAND_HINT = ("; transformers is not installed here, so the default of this model's config "
             "class is unknown: install transformers (pip install 'attention-memory[gpu]') or "
             "give the value in config.json")


class _Reader:
    """Key lookup over a config dict, text_config first; every error names the key path."""

    def __init__(self, d: object, hand: bool = False, filled: frozenset[str] = frozenset()) -> None:
        #: read by hand rules alone (transformers absent): a missing value's class default
        #: is unknown here, and the error says so
        self.hand = hand
        self.filled = filled  # key paths the config class supplied (hf_defaults.complete)
        self.used: list[str] = []  # those of them this read used, in order
        if not isinstance(d, dict):
            raise ValueError(
                "config.json must be a JSON object of settings (a dict such as "
                f'{{"hidden_size": 4096, ...}}), got {type(d).__name__}'
            )
        self.scopes: list[tuple[str, dict]] = []
        inner = d.get("text_config")
        if inner is not None:
            if not isinstance(inner, dict):
                raise ValueError(
                    "config.json: 'text_config' must be a JSON object of the language model's "
                    f"settings, got {type(inner).__name__}"
                )
            self.scopes.append(("text_config.", inner))
        self.scopes.append(("", d))

    def find(self, *keys: str) -> tuple[str, object] | None:
        """(path, value) of the first key present in the innermost scope that has one."""
        for prefix, scope in self.scopes:
            for key in keys:
                if key in scope:
                    path = prefix + key
                    if (path in self.filled and scope[key] is not None and path not in self.used
                            and not key.startswith("_")):
                        self.used.append(path)
                    return path, scope[key]
        return None

    def get_int(
        self, *keys: str, lo: int = 1, hi: int | None = None, default: Any = _MISSING
    ) -> Any:
        """A whole number under the first present key (null counts as absent), else default."""
        found = self.find(*keys)
        if found is None or found[1] is None:
            if default is not _MISSING:
                return default
            also = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
            raise ValueError(f"config.json: missing '{keys[0]}'{also}, a whole number"
                             + (HAND_HINT if self.hand else ""))
        path, value = found
        if isinstance(value, str):  # JSON strings are never numbers here: say so plainly
            raise ValueError(
                f"config.json: '{path}' must be a whole number (a JSON number, not a string), "
                f"got {value!r}"
            )
        return check_int(f"config.json: '{path}'", value, lo, hi)

    def get_bool(self, key: str, default: bool) -> bool:
        found = self.find(key)
        if found is None or found[1] is None:
            return default
        path, value = found
        if not isinstance(value, bool):
            raise ValueError(f"config.json: '{path}' must be true or false, got {value!r}")
        return value

    def get_str(self, key: str, default: str = "") -> str:
        found = self.find(key)
        if found is None or found[1] is None:
            return default
        path, value = found
        if not isinstance(value, str):
            raise ValueError(f"config.json: '{path}' must be a string, got {value!r}")
        return value


def _sliding_layers(r: _Reader, model_type: str, layers: int, window: int | None) -> int:
    """How many of the L layers attend within the window (0 when there is no window)."""
    found = r.find("layer_types")
    if found is not None and found[1] is not None:  # transformers >= 4.53 lists every layer
        path, types = found
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ValueError(
                f"config.json: '{path}' must be a list of strings such as "
                f'"sliding_attention" / "full_attention", got {types!r}'
            )
        if len(types) != layers:
            raise ValueError(
                f"config.json: '{path}' lists {len(types)} layers but the model has {layers}"
            )
        return sum(t == "sliding_attention" for t in types) if window else 0
    if window is None:
        return 0
    if model_type == "gemma2":  # modeling_gemma2.py: even-indexed layers are local
        return (layers + 1) // 2
    if model_type in _GPT_OSS:  # GptOssConfig.__post_init__: even-indexed layers slide
        return (layers + 1) // 2
    if model_type in ("gemma3", "gemma3_text"):  # every p-th layer global, the rest local
        pattern = r.get_int("sliding_window_pattern", "_sliding_window_pattern", default=6)
        return layers - layers // pattern
    if model_type in _QWEN:  # Qwen2Config docstring: the first max_window_layers are global
        full = r.get_int("max_window_layers", lo=0, default=layers)
        return max(layers - full, 0)
    return layers  # Mistral v0.1, Phi-3: every layer uses the window


def _parse_hf_config(d: object, name: str | None, with_transformers: bool = True) -> ModelConfig:
    """Complete `d` by its transformers config class (hf_defaults.complete), then read it. A
    file the class refuses is read as written first, so that a wrong value in it is named in
    the file's words; if that read finds nothing, the class's reason is the answer."""
    done = complete(d) if with_transformers else Completed(d, "", frozenset(), "")  # type: ignore[arg-type]
    if done.refusal:
        _read(_Reader(d), name, done)
        raise ValueError(done.refusal)
    return _read(_Reader(done.config, hand=not done.transformers_version, filled=done.filled),
                 name, done)


def _read(r: _Reader, name: str | None, done: Completed) -> ModelConfig:
    """The ModelConfig of a config dict under reader `r` (the file, completed or as written)."""
    model_type = r.get_str("model_type").lower()
    gpt2 = model_type == "gpt2" or (r.find("n_embd") is not None and not model_type)
    read_as = ""
    if not gpt2:
        model_type, read_as = _resolve_type(r, model_type)

    layers = r.get_int("num_hidden_layers", "n_layer", hi=_MAX_LAYERS)
    hidden = r.get_int("hidden_size", "n_embd", hi=_MAX_WIDTH)
    heads = r.get_int("num_attention_heads", "n_head", hi=MAX_HEADS)
    kv_heads = r.get_int("num_key_value_heads", "num_kv_heads", hi=MAX_HEADS, default=heads)
    if heads % kv_heads:
        raise ValueError(
            f"config.json: 'num_attention_heads' ({heads}) must be a multiple of "
            f"'num_key_value_heads' ({kv_heads}): each key/value head serves a whole group "
            "of query heads"
        )
    head_dim = r.get_int("head_dim", "attention_head_dim", hi=MAX_HEAD_DIM, default=None)
    mla = _mla_dims(r) if model_type in _MLA else None
    if mla is not None:  # MLA: q·k width per head is nope + rope (modeling_deepseek_v3.py)
        head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    if head_dim is None and r.hand and model_type in CLASS_HEAD_DIMS:
        raise ValueError(
            f"config.json: missing 'head_dim'; {model_type}'s config class has its own default "
            f"({CLASS_HEAD_DIMS[model_type]} in the transformers this was written against), "
            f"not hidden_size / num_attention_heads" + HAND_HINT)
    if head_dim is None:
        if hidden % heads:
            raise ValueError(
                f"config.json: 'hidden_size' ({hidden}) is not divisible by "
                f"'num_attention_heads' ({heads}); give 'head_dim' explicitly"
            )
        head_dim = hidden // heads
    if gpt2:  # GPT2Config: n_inner null means 4 x n_embd
        intermediate = r.get_int("n_inner", "intermediate_size", hi=_MAX_WIDTH, default=4 * hidden)
    else:
        intermediate = r.get_int("intermediate_size", "n_inner", hi=_MAX_WIDTH)
    vocab = r.get_int("vocab_size", hi=_MAX_VOCAB, default=None)
    if vocab is None:
        if model_type not in ("gemma3", "gemma3_text"):
            raise ValueError("config.json: missing 'vocab_size'")
        vocab = 262_208  # Gemma3TextConfig default; google/gemma-3-*-it configs omit it
    positions = r.get_int(
        "max_position_embeddings", "n_positions", "n_ctx", hi=MAX_SEQ_LEN, default=None
    )
    if positions is None and model_type in ("gemma3", "gemma3_text"):
        positions = 131_072  # Gemma3TextConfig default (128K context), omitted by its configs

    # Mixture of experts (Mixtral: num_local_experts; Qwen-MoE: num_experts).
    # Mixture of experts (Mixtral: num_local_experts; Qwen-MoE, Jamba: num_experts; DeepSeek:
    # n_routed_experts).
    experts = r.get_int("num_local_experts", "num_experts", "n_routed_experts", lo=0,
                        hi=_MAX_EXPERTS, default=1)
    experts = max(experts, 1)
    if model_type == "nemotron_h":  # experts only in 'E' blocks, which _hybrid_layers refuses;
        experts = 1  # NemotronHConfig carries n_routed_experts = 8 for every model
    hybrid = _hybrid_layers(r, model_type, layers, hidden) if model_type in _HYBRID else {}
    mlp_count = hybrid.get("mlp_layers", layers)
    per_token, shared, dense_layers, dense_width = 1, 0, 0, 0
    if experts > 1:
        per_token = r.get_int("num_experts_per_tok", hi=experts)
        dense_width = intermediate
        intermediate = r.get_int("moe_intermediate_size", hi=_MAX_WIDTH, default=intermediate)
        if model_type in _MLA:  # DeepSeek: n_shared_experts ungated experts of the MoE width
            shared = intermediate * r.get_int("n_shared_experts", lo=0, hi=_MAX_EXPERTS, default=0)
            dense_layers = _deepseek_dense_layers(r, layers)
        elif model_type == "jamba":  # modeling_jamba.py: experts where i % period == offset
            dense_layers = layers - _every(r, "expert_layer_period", "expert_layer_offset", layers,
                                           period=2, offset=1)
        else:
            shared = r.get_int("shared_expert_intermediate_size", lo=0, hi=_MAX_WIDTH, default=0)
            dense_layers = _dense_mlp_layers(r, layers)
        if dense_layers == 0:
            dense_width = 0

    # Sliding window: Qwen configs carry a window that only counts when use_sliding_window.
    window = r.get_int("sliding_window", lo=0, hi=MAX_SEQ_LEN, default=None) or None  # 0: off
    if model_type in _QWEN and not r.get_bool("use_sliding_window", False):
        window = None
    windowed = _sliding_layers(r, model_type, layers, window)

    classic = gpt2 or model_type in _CLASSIC
    if classic:  # biases on every linear layer; GPTNeoXConfig can switch attention's off
        qkv_bias = out_bias = r.get_bool("attention_bias", True)
        mlp_bias = norm_bias = True
    else:
        attention_bias = r.get_bool("attention_bias", False)
        qkv_bias = attention_bias or model_type in _QWEN2_QKV_BIAS
        out_bias = attention_bias
        # gpt-oss experts carry gate_up and down biases (GptOssExperts); others per mlp_bias
        mlp_bias = model_type in _GPT_OSS or r.get_bool("mlp_bias", False)
        norm_bias = False
    learned = 0
    if gpt2:  # learned absolute positions (GPT-2 paper; modeling_gpt2.py: wpe)
        learned = positions if positions is not None else r.get_int("n_positions")
    norms = 4 if model_type in _FOUR_NORMS else 1 if model_type in ("phi", "nemotron_h") else 2
    if model_type == "nemotron_h":  # relu2 MLP: up and down only (modeling_nemotron_h.py)
        classic_mlp = True
    else:
        classic_mlp = classic

    if name is None:
        name = r.get_str("_name_or_path") or model_type or "custom model"
    return ModelConfig(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tie_embeddings=_tied(r, done, model_type in _TIED_BY_DEFAULT or gpt2),
        gated_mlp=not classic_mlp,
        num_experts=experts,
        experts_per_token=per_token,
        sliding_window=window if windowed else None,
        sliding_window_layers=windowed,
        attention_bias=qkv_bias,
        mlp_bias=mlp_bias,
        norm_bias=norm_bias,
        learned_positions=learned,
        max_position_embeddings=positions,
        source="config.json",
        attention_out_bias=out_bias,
        norms_per_layer=norms,
        qk_norm=model_type in _QK_NORM,
        shared_expert_intermediate_size=shared,
        dense_mlp_layers=dense_layers,
        dense_intermediate_size=dense_width,
        model_type=model_type or ("gpt2" if gpt2 else ""),
        attention_layers=hybrid.get("attention_layers"),
        mlp_layers=None if mlp_count == layers else mlp_count,
        shared_expert_gate=model_type not in _MLA,
        attention_output_gate=model_type == "qwen3_next",
        kv_lora_rank=mla["kv_lora_rank"] if mla else 0,
        q_lora_rank=mla["q_lora_rank"] if mla else 0,
        qk_rope_head_dim=mla["qk_rope_head_dim"] if mla else 0,
        v_head_dim=mla["v_head_dim"] if mla else 0,
        state_mixer=hybrid.get("mixer"),
        state_layers=hybrid.get("state_layers", 0),
        attention_sinks=model_type in _GPT_OSS,
        router_bias=model_type in _GPT_OSS,
        torch_dtype=_torch_dtype(r),
        quantization=_quant_config(r),
        read_as=read_as,
        defaults_from=(f"{done.config_class} defaults (transformers {done.transformers_version}): "
                       + ", ".join(r.used)) if r.used else "",
    )


def _dense_mlp_layers(r: _Reader, layers: int) -> int:
    """Qwen-MoE: layer i has experts unless listed in mlp_only_layers or (i+1) % step != 0."""
    step = r.get_int("decoder_sparse_step", default=1)
    found = r.find("mlp_only_layers")
    only: list = []
    if found is not None and found[1] is not None:
        path, only = found
        if not isinstance(only, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers for i in only
        ):
            raise ValueError(
                f"config.json: '{path}' must be a list of layer indices from 0 to {layers - 1}, "
                f"got {only!r}"
            )
    dense_set = set(only)
    sparse = sum(1 for i in range(layers) if i not in dense_set and (i + 1) % step == 0)
    return layers - sparse


def _tied(r: _Reader, done: Completed, default: bool) -> bool:
    """Whether lm_head shares the embedding. A wrapper built by its transformers class (LLaVA,
    Gemma 3) decides at the top level: PreTrainedModel reads its own config's
    tie_word_embeddings, which LlavaConfig.__post_init__ sets from text_config's when only
    that one is true; a file read as written says it in text_config or at the top."""
    if done.config_class and len(r.scopes) > 1:
        outer = {k: v for k, v in r.scopes[-1][1].items() if k != "text_config"}
        return _Reader(outer).get_bool("tie_word_embeddings", default)
    return r.get_bool("tie_word_embeddings", default)


def _check_known(model_type: str) -> None:
    """Refuse a config whose model_type has no rules here, naming it and the known ones."""
    if model_type in KNOWN_MODEL_TYPES:
        return
    known = ", ".join(KNOWN_MODEL_TYPES)
    if not model_type:
        raise ValueError(
            f"config.json: missing 'model_type', so the architecture is unknown; give one of: "
            f"{known}")
    shown = model_type if len(model_type) <= 60 else model_type[:60] + "…"
    if model_type in _ATTENTION_FREE:
        raise ValueError(
            f"config.json: 'model_type' is {shown!r}, a sequence model without attention layers "
            f"(no KV cache, no score matrix): this calculator models attention. Known types: "
            f"{known}")
    raise ValueError(
        f"config.json: 'model_type' {shown!r} is not one this calculator has rules for (reading "
        f"it as Llama could give a plausible wrong number). Known types: {known}")


def _mla_dims(r: _Reader) -> dict[str, int]:
    """The latent-attention widths of DeepseekV2Config / DeepseekV3Config (all required but
    q_lora_rank, which is null in DeepSeek-V2-Lite: its queries are projected directly)."""
    dims = {key: r.get_int(key, hi=MAX_HEAD_DIM * 64)
            for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    dims["q_lora_rank"] = r.get_int("q_lora_rank", lo=0, hi=_MAX_WIDTH, default=0)
    if dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"] > MAX_HEAD_DIM:
        raise ValueError(
            f"config.json: 'qk_nope_head_dim' + 'qk_rope_head_dim' must be at most "
            f"{MAX_HEAD_DIM:,}, got {dims['qk_nope_head_dim'] + dims['qk_rope_head_dim']:,}")
    return dims


def _deepseek_dense_layers(r: _Reader, layers: int) -> int:
    """DeepSeek-V2/V3 (modeling_deepseek.py of the model repos, DeepseekV2DecoderLayer):
    layer i has experts iff i >= first_k_dense_replace and i % moe_layer_freq == 0."""
    first = r.get_int("first_k_dense_replace", lo=0, hi=layers, default=0)
    freq = r.get_int("moe_layer_freq", hi=layers, default=1)
    return layers - sum(1 for i in range(first, layers) if i % freq == 0)


def _every(r: _Reader, period_key: str, offset_key: str, layers: int, *, period: int,
           offset: int) -> int:
    """How many layers i satisfy i % period == offset (JambaConfig's layer rule)."""
    p = r.get_int(period_key, hi=_MAX_LAYERS, default=period)
    o = r.get_int(offset_key, lo=0, hi=_MAX_LAYERS, default=offset)
    if o >= p:
        raise ValueError(f"config.json: '{offset_key}' ({o}) must be below '{period_key}' ({p})")
    return sum(1 for i in range(layers) if i % p == o)


def _hybrid_layers(r: _Reader, model_type: str, layers: int, hidden: int) -> dict[str, Any]:
    """Which layers of a hybrid attend (and keep a KV cache) and which hold a state mixer."""
    if model_type == "jamba":  # modeling_jamba.py: attention where i % 8 == 4 (defaults)
        attention = _every(r, "attn_layer_period", "attn_layer_offset", layers, period=8,
                           offset=4)
        d_inner = r.get_int("mamba_expand", hi=64, default=2) * hidden
        found = r.find("mamba_dt_rank")
        if found is None or found[1] in (None, "auto"):  # JambaConfig: ceil(hidden / 16)
            dt_rank = -(-hidden // 16)
        else:
            dt_rank = r.get_int("mamba_dt_rank", hi=_MAX_WIDTH)
        mixer = mamba1(hidden, d_inner, r.get_int("mamba_d_state", hi=4096, default=16),
                       r.get_int("mamba_d_conv", hi=64, default=4), dt_rank,
                       conv_bias=r.get_bool("mamba_conv_bias", True),
                       proj_bias=r.get_bool("mamba_proj_bias", False), inner_norms=True)
        return _hybrid(layers, attention, layers - attention, layers, mixer)
    if model_type == "qwen3_next":
        found = r.find("layer_types")
        if found is not None and found[1] is not None:
            path, types = found
            allowed = ("full_attention", "linear_attention")
            if (not isinstance(types, list) or len(types) != layers
                    or not all(t in allowed for t in types)):
                raise ValueError(
                    f"config.json: '{path}' must list {layers} entries, each "
                    f'"full_attention" or "linear_attention"')
            attention = types.count("full_attention")
        else:  # Qwen3NextConfig: layer i is full attention iff (i + 1) % interval == 0
            interval = r.get_int("full_attention_interval", hi=_MAX_LAYERS, default=4)
            attention = layers // interval
        mixer = gated_deltanet(
            hidden, r.get_int("linear_num_key_heads", hi=MAX_HEADS),
            r.get_int("linear_num_value_heads", hi=MAX_HEADS),
            r.get_int("linear_key_head_dim", hi=MAX_HEAD_DIM),
            r.get_int("linear_value_head_dim", hi=MAX_HEAD_DIM),
            r.get_int("linear_conv_kernel_dim", hi=64, default=4))
        return _hybrid(layers, attention, layers - attention, layers, mixer)
    # nemotron_h: one mixer per block, hybrid_override_pattern M (Mamba-2), * (attention),
    # - (MLP); E (MoE blocks of Nemotron 3) has no rules here and is refused.
    found = r.find("hybrid_override_pattern")
    if found is None or not isinstance(found[1], str):
        raise ValueError(
            "config.json: 'hybrid_override_pattern' must be a string of M (Mamba-2), "
            "* (attention) and - (MLP), one character per layer")
    path, pattern = found
    if len(pattern) != layers or set(pattern) - set("M*-"):
        bad = sorted(set(pattern) - set("M*-"))
        raise ValueError(
            f"config.json: '{path}' must have {layers} characters ('num_hidden_layers'), each "
            f"M, * or -; got {len(pattern)}" + (f" with {''.join(bad)!r}" if bad else ""))
    heads = r.get_int("mamba_num_heads", hi=MAX_HEADS)
    mixer = mamba2(hidden, heads, r.get_int("mamba_head_dim", hi=MAX_HEAD_DIM),
                   r.get_int("n_groups", hi=heads, default=1),
                   r.get_int("ssm_state_size", hi=4096),
                   r.get_int("conv_kernel", hi=64, default=4),
                   conv_bias=r.get_bool("use_conv_bias", True),
                   proj_bias=r.get_bool("use_bias", False))
    return _hybrid(layers, pattern.count("*"), pattern.count("M"), pattern.count("-"), mixer)


def _hybrid(layers: int, attention: int, state: int, mlp: int, mixer: Mixer) -> dict[str, Any]:
    if attention < 1:
        raise ValueError(
            "config.json: the layer pattern has no attention layer (no KV cache, no score "
            "matrix): this calculator models attention")
    return {"attention_layers": None if attention == layers else attention,
            "state_layers": state, "mlp_layers": mlp, "mixer": mixer}


def _resolve_type(r: _Reader, model_type: str) -> tuple[str, str]:
    """(the model_type whose rules read this config, a note for read_as). Vision-language
    wrappers are read for their language model; an unknown type whose `architectures` names a
    class in ARCHITECTURE_TYPES is read with that class's rules; anything else is refused."""
    top = r.scopes[-1][1].get("model_type")
    note = ""
    if isinstance(top, str) and top.lower() in _VL_OUTER:
        note = (f"{_VL_OUTER[top.lower()]} checkpoint: the language model only; the vision "
                "encoder and projector weights are not counted")
    if model_type in _NOT_MODELLED or (isinstance(top, str) and top.lower() in _NOT_MODELLED):
        which = model_type if model_type in _NOT_MODELLED else str(top).lower()
        raise ValueError(f"config.json: 'model_type' {which!r} is refused: "
                         f"{_NOT_MODELLED[which]}")
    if model_type in _VL_QWEN2:  # Qwen2_5_VLTextModel is a Qwen2 decoder (q/k/v biases)
        return "qwen2", (note + "; " if note else "") + (
            f"read with the qwen2 rules ({model_type!r} has a Qwen2 language model)")
    if model_type in KNOWN_MODEL_TYPES or model_type in _ATTENTION_FREE or not model_type:
        _check_known(model_type)
        return model_type, note
    found = r.find("architectures")
    classes = found[1] if found is not None and isinstance(found[1], list) else []
    # Only a config that ships its own code (auto_map, loaded with trust_remote_code) is read
    # by its class: transformers itself refuses an unknown model_type without one, and so do we.
    auto_map = r.find("auto_map")
    if auto_map is None or not isinstance(auto_map[1], dict):
        classes = []
    for cls in classes:
        if isinstance(cls, str) and cls in ARCHITECTURE_TYPES:
            rules = ARCHITECTURE_TYPES[cls]
            shown = model_type if len(model_type) <= 60 else model_type[:60] + "…"
            return rules, (note + "; " if note else "") + (
                f"model_type {shown!r} has no rules here; read with the {rules} rules because "
                f"'architectures' names {cls}")
    _check_known(model_type)  # raises, naming the type and the known ones
    return model_type, note


def _torch_dtype(r: _Reader) -> str:
    """The checkpoint's dtype (torch_dtype, or dtype in transformers >= 4.56 configs) as a calc
    dtype name; "" when absent or not a dtype calc knows (e.g. "auto")."""
    for key in ("torch_dtype", "dtype"):
        found = r.find(key)
        if found is not None and isinstance(found[1], str):
            try:
                return dtype_name(found[1].removeprefix("torch."))
            except ValueError:
                return ""
    return ""


_QUANT_METHODS = ("mxfp4", "fp8", "gptq", "awq", "bitsandbytes")


def _quant_config(r: _Reader) -> QuantConfig | None:
    """Read `quantization_config` (key layouts of transformers' utils/quantization_config.py:
    Mxfp4Config, FineGrainedFP8Config, GPTQConfig, AwqConfig, BitsAndBytesConfig). None when
    absent; ValueError for a method attnmem/calc/quant.py does not price, naming it and the accepted."""
    found = r.find("quantization_config")
    if found is None or found[1] is None:
        return None
    path, q = found
    if not isinstance(q, dict):
        raise ValueError(f"config.json: '{path}' must be a JSON object, got {type(q).__name__}")
    method = q.get("quant_method")
    if not isinstance(method, str) or method.lower() not in _QUANT_METHODS:
        raise ValueError(
            f"config.json: '{path}.quant_method' {str(method)[:60]!r} is not a format calc "
            f"prices; accepted: {', '.join(_QUANT_METHODS)}")
    method = method.lower()

    def whole(key: str, default: int | None, lo: int = 1, hi: int = 1 << 20) -> int | None:
        v = q.get(key, default)
        if v is None:
            return default
        return check_int(f"config.json: '{path}.{key}'", v, lo, hi)

    skip: list = []
    for key in ("modules_to_not_convert", "ignored_layers", "llm_int8_skip_modules"):
        v = q.get(key)
        if v is None:
            continue
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ValueError(f"config.json: '{path}.{key}' must be a list of module names, "
                             f"got {v!r:.80}")
        skip += v
    common = {"modules_to_not_convert": tuple(skip)}
    if method == "mxfp4":
        return QuantConfig("mxfp4", 4, group_size=32, fmt="e2m1", **common)
    if method == "fp8":
        block = q.get("weight_block_size")
        if block is not None:
            if (not isinstance(block, list) or len(block) != 2
                    or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                               for b in block)):
                raise ValueError(f"config.json: '{path}.weight_block_size' must be two positive "
                                 f"whole numbers such as [128, 128], got {block!r:.60}")
            block = (block[0], block[1])
        fmt = q.get("fmt", "e4m3")
        return QuantConfig("fp8", 8, weight_block_size=block,
                           fmt=fmt if isinstance(fmt, str) else "e4m3", **common)
    if method in ("gptq", "awq"):
        bits = whole("bits", 4, 2, 8)
        if bits not in (2, 4, 8):
            raise ValueError(f"config.json: '{path}.bits' must be 2, 4 or 8 (packed into int32 "
                             f"words), got {bits}")
        group = q.get("group_size", 128)
        group = -1 if group == -1 else whole("group_size", 128)
        if method == "awq":
            version = str(q.get("version", "gemm")).lower()
            if version != "gemm":
                raise ValueError(f"config.json: '{path}.version' {version!r}: only AWQ's GEMM "
                                 "layout is priced (qweight [in, out/8])")
        else:
            fmt = str(q.get("checkpoint_format", "gptq")).lower()
            if fmt != "gptq":
                raise ValueError(f"config.json: '{path}.checkpoint_format' {fmt!r}: only the "
                                 "AutoGPTQ 'gptq' layout is priced")
        return QuantConfig(method, bits, group_size=group, **common)
    four, eight = bool(q.get("load_in_4bit")), bool(q.get("load_in_8bit"))
    if four == eight:
        raise ValueError(f"config.json: '{path}' must set exactly one of load_in_4bit and "
                         "load_in_8bit to true")
    kind = str(q.get("bnb_4bit_quant_type", "fp4")).lower() if four else ""
    if four and kind not in ("nf4", "fp4"):
        raise ValueError(f"config.json: '{path}.bnb_4bit_quant_type' must be nf4 or fp4, got "
                         f"{kind!r:.40}")
    return QuantConfig("bitsandbytes", 4 if four else 8, group_size=64 if four else None,
                       quant_type=kind,
                       double_quant=four and bool(q.get("bnb_4bit_use_double_quant")), **common)
