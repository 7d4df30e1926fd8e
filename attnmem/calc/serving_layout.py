"""Serving capacity of a model described by its cache layers, not by calc's rules.

attnmem.calc.serving counts vLLM's KV pool from a ModelConfig. A model type calc has no rules
for is described instead by what its cache layers hold (attnmem.trace.serving reads them from
the cache transformers' own modules fill): `KVLayout`. The arithmetic is vLLM's, the same as
attnmem.calc.serving's (vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py):

- a full-attention layer's page is block_size x the K and V elements it caches per token x e
  (FullAttentionSpec.real_page_size_bytes: num_kv_heads x (head_size + head_size_v));
- a sliding-window layer keeps ceil(min(window - 1 + max_num_batched_tokens, s) / block_size)
  + 1 blocks of one request (SlidingWindowSpec.max_memory_usage_bytes), full and sliding layers
  grouped as attnmem.calc.serving.group_layers does;
- chunked local attention (Llama 4's attention_chunk_size) is counted as full attention: that
  is what vLLM does when its hybrid KV cache manager is off, the default for chunked attention
  where VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE is unset in the vLLM versions that
  default it to off (vllm/config/vllm.py); with the manager on, a chunked layer keeps at most
  attention_chunk_size + max_num_batched_tokens tokens (ChunkedLocalAttentionSpec), so the
  requests counted here are then a lower bound;
- a state layer (Mamba, linear attention) holds one constant state per request (MambaSpec
  with mamba_cache_mode "none"), counted at the bytes the layout gives.

What the layout cannot be counted from is refused by the layout's maker, not here: attention
layers of different sizes (vLLM's page-size unification is not modelled), several windows,
sliding windows beside state layers, a model with no attention layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnmem.calc.serving import (
    PoolSettings,
    ServingCapacity,
    group_layers,
    pool_capacity,
)
from attnmem.calc.units import MAX_SEQ_LEN, ceil_bytes, check_int, dtype_bytes, dtype_name


@dataclass(frozen=True)
class KVLayout:
    """What one request holds in a model's cache layers, per layer kind."""

    full_layers: int  # attention layers caching every token (chunked ones included)
    sliding_layers: int  # attention layers caching a window of `window` tokens
    window: int | None
    elements_per_token: int  # K and V elements one attention layer caches per token
    state_layers: int  # layers holding a constant state (Mamba, linear attention)
    state_bytes: int  # that state of one request, all state layers together
    chunked_layers: int = 0  # of full_layers: chunked local attention, counted as full

    def __post_init__(self) -> None:
        for name in ("full_layers", "sliding_layers", "state_layers", "chunked_layers"):
            check_int(name, getattr(self, name), 0, 1_000_000)
        check_int("elements_per_token", self.elements_per_token, 1, 1 << 40)
        check_int("state_bytes", self.state_bytes, 0, 1 << 60)
        if self.full_layers + self.sliding_layers == 0:
            raise ValueError("a KVLayout needs at least one attention layer")
        if self.sliding_layers:
            check_int("window", self.window, 1, MAX_SEQ_LEN)
        if self.sliding_layers and self.state_layers:
            raise ValueError("sliding-window layers beside state layers: vLLM's grouping of "
                             "such a model is not modelled")
        if self.chunked_layers > self.full_layers:
            raise ValueError(f"chunked_layers ({self.chunked_layers}) must be at most "
                             f"full_layers ({self.full_layers})")

    @property
    def attention_layers(self) -> int:
        return self.full_layers + self.sliding_layers

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """K and V bytes per token of every attention layer at kv_dtype (before blocks)."""
        return ceil_bytes(self.attention_layers * self.elements_per_token
                          * dtype_bytes(dtype_name(kv_dtype)))


def layout_page_bytes(layout: KVLayout, block_size: int, kv_dtype: str) -> int:
    """One KV block: block_size x elements per token x e, times the layers one block spans
    (all attention layers, or the group size with sliding and full layers)."""
    bs = check_int("block_size", block_size, 1, 4096)
    e = dtype_bytes(dtype_name(kv_dtype))
    groups = group_layers(layout.full_layers, layout.sliding_layers, layout.state_layers > 0)
    return ceil_bytes(groups.group_size * bs * layout.elements_per_token * e)


def layout_sequence_bytes(layout: KVLayout, seq_len: int, block_size: int, kv_dtype: str,
                          max_num_batched_tokens: int) -> int:
    """Bytes one request of seq_len tokens occupies: the KV blocks of its groups, padding
    slots included (as attnmem.calc.serving.sequence_bytes), plus its constant state."""
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    bs = check_int("block_size", block_size, 1, 4096)
    t = check_int("max_num_batched_tokens", max_num_batched_tokens, 1, MAX_SEQ_LEN)
    layer_page = bs * layout.elements_per_token * dtype_bytes(dtype_name(kv_dtype))
    groups = group_layers(layout.full_layers, layout.sliding_layers, layout.state_layers > 0)
    total = groups.full_groups * groups.group_size * -(-s // bs) * layer_page
    if groups.sliding_groups:
        tokens = min(layout.window - 1 + t, s)
        total += groups.sliding_groups * groups.group_size * (-(-tokens // bs) + 1) * layer_page
    return ceil_bytes(total) + layout.state_bytes


def layout_capacity(layout: KVLayout, p: PoolSettings, weights_bytes: int,
                    activation_bytes: int, activation_estimated: bool,
                    kv_dtype: str = "bf16") -> ServingCapacity:
    """KV blocks, concurrent requests and the longest request for a KVLayout, with the
    weights and activation peak given (attnmem.calc.serving.pool_capacity: vLLM's budget)."""
    for name, v in (("weights_bytes", weights_bytes), ("activation_bytes", activation_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10**15:
            raise ValueError(f"{name} must be a whole number of bytes from 0 to 10^15, got "
                             f"{v!r:.60}")
    page = layout_page_bytes(layout, p.block_size, kv_dtype)
    return pool_capacity(
        p, weights_bytes, activation_bytes, activation_estimated, page,
        lambda n: layout_sequence_bytes(layout, n, p.block_size, kv_dtype, p.batched_tokens))
