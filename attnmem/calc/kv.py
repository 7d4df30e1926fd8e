"""KV cache: the keys and values a decoder keeps for every past token.

Each layer stores one key and one value vector per key/value head per token:
2 (K and V) x L x B x s x H_kv x d_head x e bytes. Grouped-query attention (Ainslie et al.,
"GQA", arXiv 2305.13245) and multi-query attention (Shazeer, arXiv 1911.02150) shrink it by
using H_kv < H heads. A sliding-window layer (Mistral 7B, arXiv 2310.06825, sec. 2; Gemma 2's
local layers) never needs more than its window: it holds min(s, window) tokens (a rolling
buffer). The per-token form 2·L·H_kv·d·e is the one used by Kwon et al., "Efficient Memory
Management for LLM Serving with PagedAttention" (arXiv 2309.06180), sec. 3.

Beyond standard attention (issue 19):
- multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, sec. 2.1.2-2.1.3) caches one
  compressed latent of kv_lora_rank plus one shared RoPE key of qk_rope_head_dim per token per
  layer, for all heads together: L · B · s · (kv_lora_rank + qk_rope_head_dim) · e. That is what
  MLA serving engines keep (vLLM's MLAAttentionSpec, vllm/v1/kv_cache_interface.py: one
  "head" of that width, no separate V). Eager implementations (transformers'
  modeling_deepseek_v3.py) expand it into per-head K (nope + rope) and V (v_head_dim) and cache
  those: `mla_expanded_kv_bytes`.
- hybrids (Jamba, Nemotron-H, Qwen3-Next): only the attention layers hold a KV cache; the
  state-space / linear-attention layers hold a constant state per sequence
  (`state_bytes`, shapes from attnmem/calc/mixers.py).
"""

from __future__ import annotations

from attnmem.calc.models import ModelConfig, check_model
from attnmem.calc.units import (
    MAX_BATCH,
    MAX_SEQ_LEN,
    ceil_bytes,
    check_bytes_per_element,
    check_int,
)


def kv_tokens_per_sequence(model: ModelConfig, seq_len: int) -> int:
    """Token slots held summed over layers: global layers hold s, windowed ones min(s, window)."""
    check_model(model)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    layers = model.kv_layers  # attention layers only (hybrids)
    windowed = model.sliding_window_layers if model.sliding_window else 0
    windowed = min(windowed, layers)
    window_len = min(s, model.sliding_window) if model.sliding_window else s
    return (layers - windowed) * s + windowed * window_len


def kv_elements_per_token(model: ModelConfig) -> int:
    """Cached elements per token per attention layer: 2·H_kv·d for K and V, or the MLA latent
    kv_lora_rank + qk_rope_head_dim (DeepSeek-V2 sec. 2.1.3; vLLM MLAAttentionSpec)."""
    check_model(model)
    if model.is_mla:
        return model.kv_lora_rank + model.qk_rope_head_dim
    return 2 * model.num_kv_heads * model.head_dim


def mla_expanded_kv_bytes(
    model: ModelConfig, batch: int, seq_len: int, bytes_per_element: float | str
) -> int:
    """The K/V an eager MLA implementation caches after expanding the latent:
    L · B · s · H · ((nope + rope) + v_head_dim) · e (modeling_deepseek_v3.py builds
    key_states [B, H, s, nope + rope] and value_states [B, H, s, v_head_dim] and caches them).
    ValueError for a model without MLA."""
    check_model(model)
    if not model.is_mla:
        raise ValueError(
            f"mla_expanded_kv_bytes needs a multi-head latent attention model (DeepSeek-V2/V3), "
            f"got {model.name!r} ({model.model_type or 'standard attention'})")
    b = check_int("batch", batch, 1, MAX_BATCH)
    e = check_bytes_per_element(bytes_per_element)
    tokens = kv_tokens_per_sequence(model, seq_len)
    return ceil_bytes(b * tokens * model.num_heads * (model.head_dim + model.v_head_dim) * e)


def state_bytes(model: ModelConfig, batch: int, bytes_per_element: float | str) -> int:
    """Constant per-sequence state of a hybrid's non-attention layers: state_layers x (conv +
    recurrent state elements) x e x B (shapes: vLLM mamba_utils.MambaStateShapeCalculator, see
    attnmem/calc/mixers.py). Independent of the context length; 0 for a model without such layers."""
    check_model(model)
    b = check_int("batch", batch, 1, MAX_BATCH)
    e = check_bytes_per_element(bytes_per_element)
    if model.state_mixer is None:
        return 0
    return ceil_bytes(b * model.state_layers * model.state_mixer.state_elements * e)


def kv_cache_bytes(
    model: ModelConfig, batch: int, seq_len: int, bytes_per_element: float | str
) -> int:
    """Bytes of the KV cache: 2 · L · B · s · H_kv · d_head · e (sliding layers: window);
    L counts attention layers only; MLA models cache the latent, L · B · s · (kv_lora_rank +
    qk_rope_head_dim) · e (kv_elements_per_token).

    batch B and seq_len s are whole numbers; bytes_per_element e is a number (2 for fp16/bf16,
    1 for fp8/int8, 0.5 for int4) or a dtype name. Returns whole bytes. Sources in the module
    docstring (PagedAttention sec. 3; Mistral 7B sec. 2 for the rolling window; DeepSeek-V2
    sec. 2.1 for the latent). The constant state of hybrid layers is `state_bytes`.
    """
    check_model(model)
    b = check_int("batch", batch, 1, MAX_BATCH)
    e = check_bytes_per_element(bytes_per_element)
    tokens = kv_tokens_per_sequence(model, seq_len)
    return ceil_bytes(b * tokens * kv_elements_per_token(model) * e)
