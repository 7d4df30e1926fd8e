"""Transformer model shapes: the ModelConfig dataclass, Hugging Face config parsing, presets.

Everything the memory model needs to know about an architecture lives in ModelConfig; the
formulas that use it live in params.py (weights) and kv.py (KV cache).
"""

from __future__ import annotations

from dataclasses import dataclass


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
    mlp_bias: bool = False  # biases on the MLP and output projections (GPT-2, Phi-2)
    norm_bias: bool = False  # LayerNorm with bias (GPT-2) vs RMSNorm (no bias)
    learned_positions: int = 0  # rows of a learned position embedding (GPT-2: 1024), else 0
    max_position_embeddings: int | None = None  # longest context the model was trained for
    source: str = ""  # where the numbers come from (model card / config.json)
