"""Transformer model shapes: the ModelConfig dataclass and Hugging Face config.json parsing.

Everything the memory model needs to know about an architecture lives in ModelConfig; the
formulas that use it live in params.py (weights) and kv.py (KV cache); presets in presets.py.

`ModelConfig.from_hf_config` reads the keys that the Hugging Face `transformers` configuration
classes define (LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config, Qwen2MoeConfig,
Qwen3Config, Qwen3MoeConfig, GemmaConfig, Gemma2Config, Gemma3TextConfig, Phi3Config,
GPT2Config, and the non-gated GPTNeoXConfig and PhiConfig). Unknown model types are read with
the Llama conventions (gated MLP, RMSNorm, no biases unless attention_bias/mlp_bias say so). Per-architecture conventions that a config.json leaves implicit (tied embeddings,
which layers use the sliding window, biases, extra norms) follow the matching modeling_*.py
files of `transformers`; each rule below names its architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calc.units import MAX_HEAD_DIM, MAX_HEADS, MAX_SEQ_LEN, check_int


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

    @classmethod
    def from_hf_config(cls, d: dict, name: str | None = None) -> ModelConfig:
        """Build a ModelConfig from a Hugging Face `config.json` dict (already JSON-parsed).

        Multimodal configs that nest the language model under `text_config` (Gemma 3, LLaVA,
        ...) are read from there, falling back to the top level for keys it lacks. Raises one
        ValueError naming the missing or wrong key and what is accepted. Nothing is evaluated.
        """
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name must be a text label or None, got {name!r}")
        return _parse_hf_config(d, name)


def check_model(model: object) -> ModelConfig:
    """Return model if it is a ModelConfig; else raise TypeError naming what was given."""
    if not isinstance(model, ModelConfig):
        raise TypeError(
            f"model must be a ModelConfig (a preset from calc.MODELS or "
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
_QK_NORM = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}
#: Qwen2's q/k/v projections always carry a bias and its o projection never does
#: (modeling_qwen2.py); its config has no attention_bias key.
_QWEN2_QKV_BIAS = {"qwen2", "qwen2_moe"}
#: Qwen families: use_sliding_window switches the window on for layers >= max_window_layers.
_QWEN = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}


class _Reader:
    """Key lookup over a config dict, text_config first; every error names the key path."""

    def __init__(self, d: object) -> None:
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
                    return prefix + key, scope[key]
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
            raise ValueError(f"config.json: missing '{keys[0]}'{also}, a whole number")
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
    if model_type in ("gemma3", "gemma3_text"):  # every p-th layer global, the rest local
        pattern = r.get_int("sliding_window_pattern", "_sliding_window_pattern", default=6)
        return layers - layers // pattern
    if model_type in _QWEN:  # Qwen2Config docstring: the first max_window_layers are global
        full = r.get_int("max_window_layers", lo=0, default=layers)
        return max(layers - full, 0)
    return layers  # Mistral v0.1, Phi-3: every layer uses the window


def _parse_hf_config(d: object, name: str | None) -> ModelConfig:
    r = _Reader(d)
    model_type = r.get_str("model_type").lower()
    gpt2 = model_type == "gpt2" or (r.find("n_embd") is not None and not model_type)

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
    head_dim = r.get_int("head_dim", hi=MAX_HEAD_DIM, default=None)
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
    experts = r.get_int("num_local_experts", "num_experts", lo=0, hi=_MAX_EXPERTS, default=1)
    experts = max(experts, 1)
    per_token, shared, dense_layers, dense_width = 1, 0, 0, 0
    if experts > 1:
        per_token = r.get_int("num_experts_per_tok", hi=experts)
        dense_width = intermediate
        intermediate = r.get_int("moe_intermediate_size", hi=_MAX_WIDTH, default=intermediate)
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
        mlp_bias = r.get_bool("mlp_bias", False)
        norm_bias = False
    learned = 0
    if gpt2:  # learned absolute positions (GPT-2 paper; modeling_gpt2.py: wpe)
        learned = positions if positions is not None else r.get_int("n_positions")
    norms = 4 if model_type in _FOUR_NORMS else 1 if model_type == "phi" else 2

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
        tie_embeddings=r.get_bool("tie_word_embeddings", model_type in _TIED_BY_DEFAULT or gpt2),
        gated_mlp=not classic,
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
