"""KV cache: the keys and values a decoder keeps for every past token.

Each layer stores one key and one value vector per key/value head per token:
2 (K and V) x L x B x s x H_kv x d_head x e bytes. Grouped-query attention (Ainslie et al.,
"GQA", arXiv 2305.13245) and multi-query attention (Shazeer, arXiv 1911.02150) shrink it by
using H_kv < H heads. A sliding-window layer (Mistral 7B, arXiv 2310.06825, sec. 2; Gemma 2's
local layers) never needs more than its window: it holds min(s, window) tokens (a rolling
buffer). The per-token form 2·L·H_kv·d·e is the one used by Kwon et al., "Efficient Memory
Management for LLM Serving with PagedAttention" (arXiv 2309.06180), sec. 3.
"""

from __future__ import annotations

from calc.models import ModelConfig, check_model
from calc.units import MAX_BATCH, MAX_SEQ_LEN, ceil_bytes, check_bytes_per_element, check_int


def kv_tokens_per_sequence(model: ModelConfig, seq_len: int) -> int:
    """Token slots held summed over layers: global layers hold s, windowed ones min(s, window)."""
    check_model(model)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    windowed = model.sliding_window_layers if model.sliding_window else 0
    windowed = min(windowed, model.num_layers)
    window_len = min(s, model.sliding_window) if model.sliding_window else s
    return (model.num_layers - windowed) * s + windowed * window_len


def kv_cache_bytes(
    model: ModelConfig, batch: int, seq_len: int, bytes_per_element: float | str
) -> int:
    """Bytes of the KV cache: 2 · L · B · s · H_kv · d_head · e (sliding layers: window).

    batch B and seq_len s are whole numbers; bytes_per_element e is a number (2 for fp16/bf16,
    1 for fp8/int8, 0.5 for int4) or a dtype name. Returns whole bytes. Sources in the module
    docstring (PagedAttention sec. 3; Mistral 7B sec. 2 for the rolling window).
    """
    check_model(model)
    b = check_int("batch", batch, 1, MAX_BATCH)
    e = check_bytes_per_element(bytes_per_element)
    tokens = kv_tokens_per_sequence(model, seq_len)
    return ceil_bytes(2 * b * tokens * model.num_kv_heads * model.head_dim * e)
