"""The bundled FlashAttention kernel as a transformers attention implementation.

``register(name="triton")`` puts ``triton_attention_forward`` into transformers'
``AttentionInterface`` and a mask function into its ``AttentionMaskInterface``; afterwards
``from_config(cfg, attn_implementation="triton")`` (or ``model.set_attn_implementation``) runs
``kernels.flash_attention`` in every attention layer. The function follows the interface of
transformers' own ``integrations/sdpa_attention.py``: it gets query (B, H, s_q, d), key and
value (B, H_kv, s_k, d), the model's mask, ``scaling``, ``dropout``, ``sliding_window`` and
``is_causal``, and returns (output (B, s_q, H, d), None).

What is supported, exactly as the model would compute it:
- causal (decoder) and full (encoder) attention, from ``is_causal`` or the module's
  ``is_causal``; one query against many keys (decoding) is full attention, as in SDPA;
- grouped-query attention: the kernel reads key/value heads directly (no repeat_kv copies);
- ``scaling`` (e.g. Gemma's query_pre_attn_scalar); fp16, bf16, fp32; autocast: q, k, v are
  cast to autocast's dtype as autocast casts SDPA's inputs (rotary leaves q and k in fp32
  there, v in bf16); head dims 16 to 256;
- sliding-window layers (Mistral, Phi-3, Gemma 2/3's local layers, Qwen2/3 with
  use_sliding_window, ...): the layer's window goes to the kernel's causal sliding window
  (``flash_attention(..., causal=True, window=W)``: query i sees keys i - W + 1 .. i, the
  mask transformers builds from ``sliding_window_causal_mask_function``); a window that
  covers the whole sequence (s_k <= window) masks nothing, and the call is plain causal.
  Decoding one query against a cache longer than the window reads the window's last W keys
  (the query is the newest position).

What is refused with a ValueError that says why (the kernel has no additive or boolean mask,
no soft-capping and no dropout; nothing falls back silently):
- any attention mask that transformers materialises: padding (a 2D mask with a zero),
  packed sequences, custom mask functions (and_mask_function / or_mask_function, e.g.
  Gemma 3's bidirectional image tokens), chunked attention, bidirectional windows;
- logit soft-capping (Gemma 2's attn_logit_softcapping), dropout > 0, a position bias,
  paged caches, causal attention with s_q != s_k > 1 (our causal mask is top-left aligned,
  a KV cache's is bottom-right), a sliding window on a non-causal layer with several queries.

Why a mask function is registered too: transformers builds no mask at all for an attention
implementation its mask interface does not know (masking_utils._preprocess_mask_arguments),
so a padding mask would be dropped silently. With SDPA's mask function registered, a mask
that only says "causal" is skipped (None) and anything else reaches us and is refused. Two
changes to SDPA's function, both for sliding windows: a window at least as long as the keys
is dropped first (it masks nothing), so such a layer keeps the plain causal path; and a mask
that would say exactly "causal with the config's sliding window" (no padding, no extra mask
function, queries aligned with the keys) comes back as a `SlidingWindowMask` marker instead
of an s x s tensor. The attention function takes the window from the marker (or from the
``sliding_window`` argument the modeling code passes), so a model whose attention call does
not pass ``sliding_window`` still gets its window, and the kernel never sees a mask tensor.

``check_config(config, seq_len)`` lists those refusals for a model config before anything is
built (the training harness records them as ``unavailable`` rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernels.hf import NAME

_REGISTERED: set[str] = set()


@dataclass(frozen=True)
class SlidingWindowMask:
    """What our mask function returns in place of a causal sliding-window mask: query i sees
    keys i - window + 1 .. i (masking_utils.sliding_window_causal_mask_function), queries and
    keys aligned, no padding. Only ``triton_attention_forward`` reads it."""

    window: int


def _layer(module: Any) -> str:
    idx = getattr(module, "layer_idx", None)
    return f"layer {idx}" if idx is not None else type(module).__name__


def triton_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention interface around ``kernels.flash_attention`` (module docstring)."""
    from kernels.flash.api import flash_attention

    where = _layer(module)
    s_q, s_k = int(query.shape[2]), int(key.shape[2])
    if kwargs.get("softcap") is not None:
        raise ValueError(
            f"triton attention ({where}): logit soft-capping (softcap={kwargs['softcap']}) is not "
            "supported by our kernel; use attn_implementation='eager' for this model")
    if dropout:
        raise ValueError(
            f"triton attention ({where}): dropout={dropout} is not supported (our kernel has no "
            "dropout); set attention_dropout=0 or use model.eval()")
    if kwargs.get("position_bias") is not None:
        raise ValueError(f"triton attention ({where}): a position bias is not supported")
    cache = kwargs.get("cache")
    if cache is not None and type(cache).__name__ == "PagedAttentionCache":
        raise ValueError(f"triton attention ({where}): paged KV caches are not supported")
    window = None if sliding_window is None else int(sliding_window)
    if isinstance(attention_mask, SlidingWindowMask):
        if window is not None and window != attention_mask.window:
            raise ValueError(
                f"triton attention ({where}): the mask says a sliding window of "
                f"{attention_mask.window} tokens and the layer passes sliding_window={window}")
        window, attention_mask = attention_mask.window, None
    if attention_mask is not None:
        raise ValueError(
            f"triton attention ({where}): got a materialised attention mask of shape "
            f"{tuple(attention_mask.shape)} (padding, packed sequences or a custom mask); our "
            "kernel supports only plain causal or full attention. Pass no attention_mask (or "
            "one without padding)")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and s_q > 1  # one query sees every key (decoding), as SDPA does
    if causal and s_q != s_k:
        raise ValueError(
            f"triton attention ({where}): causal attention with {s_q} queries and {s_k} keys; "
            "our kernel aligns the causal mask top-left and a KV cache needs bottom-right")
    if scaling is not None and not (math.isfinite(float(scaling)) and float(scaling) > 0):
        raise ValueError(f"triton attention ({where}): scaling must be positive, got {scaling}")
    if window is not None and window < 1:
        raise ValueError(f"triton attention ({where}): sliding_window must be >= 1, got {window}")
    if window is not None and window >= s_k:
        window = None  # the window covers every key: it masks nothing
    if window is not None and not causal:
        if s_q != 1:
            raise ValueError(
                f"triton attention ({where}): a sliding window of {window} tokens on a "
                f"non-causal layer ({s_q} queries, {s_k} keys); our kernel's window is causal "
                "only")
        # one query, the newest position, against a longer cache: it sees the last `window`
        # keys (kv_idx > q_idx - window), views of the cache, no copy
        key, value = key[:, :, s_k - window:], value[:, :, s_k - window:]
        window = None
    query, key, value = _autocast_inputs(query, key, value, where)
    out = flash_attention(query, key, value, causal=causal,
                          scale=None if scaling is None else float(scaling),
                          window=window)  # (B, H, s_q, d)
    return out.transpose(1, 2).contiguous(), None  # (B, s_q, H, d), as transformers expects


def _autocast_inputs(query: Any, key: Any, value: Any, where: str) -> tuple[Any, Any, Any]:
    """Under autocast, cast q, k, v to its dtype, as autocast does for SDPA; otherwise they must
    share one dtype already. (Under autocast rotary makes q and k fp32 while v, a projection's
    output, is bf16: transformers' rotary multiplies by fp32 cos/sin.)"""
    import torch

    kind = query.device.type
    if torch.is_autocast_enabled(kind):
        target = torch.get_autocast_dtype(kind)
        return tuple(t if t.dtype == target else t.to(target) for t in (query, key, value))
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(
            f"triton attention ({where}): query, key and value have dtypes {query.dtype}, "
            f"{key.dtype}, {value.dtype} outside autocast; our kernel needs one dtype")
    return query, key, value


def _mask_function(*args: Any, **kwargs: Any) -> Any:
    """SDPA's mask function, after dropping a window that covers every key, or a
    `SlidingWindowMask` where the mask would be exactly the config's causal sliding window
    (module docstring)."""
    from transformers.masking_utils import sdpa_mask

    local = kwargs.get("local_size")
    kv_length = kwargs.get("kv_length")
    if local is not None and kv_length is not None and int(kv_length) <= int(local):
        kwargs["local_size"] = None
    elif local is not None and not args and _plain_sliding_window(kwargs):
        # SDPA's own skip rule, asked without the window: None means no padding and
        # queries aligned with keys, so the mask is the window and nothing else
        if sdpa_mask(**{**kwargs, "local_size": None}) is None:
            return SlidingWindowMask(int(local))
    return sdpa_mask(*args, **kwargs)


def _plain_sliding_window(kw: dict[str, Any]) -> bool:
    """Whether a mask request with ``local_size`` is transformers' causal sliding window
    (create_sliding_window_causal_mask) with nothing added: the skip is allowed (it is turned
    off for and/or mask functions and packed sequences), the window is the config's
    sliding_window and not a chunk size (create_chunked_causal_mask passes its chunk as
    local_size too), and the queries sit on the keys' diagonal: as many as the keys from the
    same offset, or one query at the newest key. Older transformers releases describe the
    queries by ``cache_position`` (their positions, a tensor) instead of ``q_length`` and
    ``q_offset``; both forms are read."""
    if not kw.get("allow_is_causal_skip", True):
        return False
    config = kw.get("config")
    if config is None or getattr(config, "attention_chunk_size", None) is not None:
        return False
    if getattr(config, "sliding_window", None) != kw.get("local_size"):
        return False
    q_len, kv_len = kw.get("q_length"), kw.get("kv_length")
    q_off, kv_off = kw.get("q_offset", 0), kw.get("kv_offset", 0)
    positions = kw.get("cache_position")
    if q_len is None and positions is not None and getattr(positions, "dim", None) is not None:
        if positions.dim() != 1 or positions.numel() == 0:
            return False
        q_len, q_off = int(positions.numel()), int(positions[0])
        if int(positions[-1]) != q_off + q_len - 1:  # not consecutive positions
            return False
    if not all(type(x) is int for x in (q_len, kv_len, q_off, kv_off)):
        return False  # tensor offsets (static caches) or anything unexpected: materialise
    return ((q_len == kv_len and q_off == kv_off)
            or (q_len == 1 and q_off == kv_off + kv_len - 1))


def register(name: str = NAME) -> str:
    """Register our kernel in transformers as ``attn_implementation=name``; returns the name.

    Idempotent. Raises ImportError when transformers (>= 5, with AttentionInterface and
    AttentionMaskInterface) is not installed.
    """
    if name in _REGISTERED:
        return name
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as exc:
        raise ImportError(
            "kernels.hf.register needs transformers with AttentionInterface and "
            f"AttentionMaskInterface (pip install 'transformers>=5.17'): {exc}") from exc
    AttentionInterface.register(name, triton_attention_forward)
    AttentionMaskInterface.register(name, _mask_function)
    _REGISTERED.add(name)
    return name


def check_config(config: Any, seq_len: int) -> list[str]:
    """Why our kernel cannot run ``config`` (a transformers config) at ``seq_len`` tokens in a
    training or prefill step without padding; empty when it can. Sliding windows are no
    reason: the kernel runs them (so no rule here depends on ``seq_len`` now)."""
    why: list[str] = []
    cap = getattr(config, "attn_logit_softcapping", None)
    if cap is not None:
        why.append(f"attention logits are soft-capped (attn_logit_softcapping={cap}); our kernel "
                   "does not soft-cap")
    drop = getattr(config, "attention_dropout", 0.0) or 0.0
    if drop:
        why.append(f"attention_dropout={drop}; our kernel has no dropout")
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // heads if heads else None)
    if head_dim is not None and not 16 <= int(head_dim) <= 256:
        why.append(f"head_dim {head_dim} is outside our kernel's 16..256")
    return why
