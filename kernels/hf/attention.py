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
- sliding-window layers whose window covers the whole sequence (s_k <= window): the window
  then masks nothing, so plain causal attention is exact.

What is refused with a ValueError that says why (the kernel has no additive or boolean mask,
no window, no soft-capping and no dropout; nothing falls back silently):
- any attention mask that transformers materialises: padding (a 2D mask with a zero),
  packed sequences, a window shorter than the sequence, custom mask functions;
- a sliding window shorter than the keys (the message names the layer and the window);
- logit soft-capping (Gemma 2's attn_logit_softcapping), dropout > 0, a position bias,
  paged caches, causal attention with s_q != s_k > 1 (our causal mask is top-left aligned,
  a KV cache's is bottom-right).

Why a mask function is registered too: transformers builds no mask at all for an attention
implementation its mask interface does not know (masking_utils._preprocess_mask_arguments),
so a padding mask would be dropped silently. With SDPA's mask function registered, a mask
that only says "causal" is skipped (None) and anything else reaches us and is refused. The
one change to SDPA's function: a window at least as long as the keys is dropped first (it
masks nothing), so such a layer keeps the plain causal path.

``check_config(config, seq_len)`` lists those refusals for a model config before anything is
built (the training harness records them as ``unavailable`` rows).
"""

from __future__ import annotations

import math
from typing import Any

from kernels.hf import NAME

_REGISTERED: set[str] = set()


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
    if sliding_window is not None and s_k > int(sliding_window):
        raise ValueError(
            f"triton attention ({where}): this layer attends through a sliding window of "
            f"{sliding_window} tokens and the keys are {s_k} long; our kernel has no window "
            f"(it would attend to all {s_k}). Use sequences of at most {sliding_window} "
            "tokens, or another attn_implementation for this model")
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
    query, key, value = _autocast_inputs(query, key, value, where)
    out = flash_attention(query, key, value, causal=causal,
                          scale=None if scaling is None else float(scaling))  # (B, H, s_q, d)
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
    """SDPA's mask function, after dropping a window that covers every key (module docstring)."""
    from transformers.masking_utils import sdpa_mask

    local = kwargs.get("local_size")
    kv_length = kwargs.get("kv_length")
    if local is not None and kv_length is not None and int(kv_length) <= int(local):
        kwargs["local_size"] = None
    return sdpa_mask(*args, **kwargs)


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
    training or prefill step without padding; empty when it can."""
    from kernels.measure.train_models import sliding_layers

    why: list[str] = []
    short = [(i, w) for i, w in sliding_layers(config) if w < seq_len]
    if short:
        layers = ", ".join(str(i) for i, _ in short)
        windows = sorted({w for _, w in short})
        why.append(f"layer(s) {layers} attend through a sliding window of "
                   f"{'/'.join(str(w) for w in windows)} tokens < s = {seq_len}; our kernel has "
                   "no window")
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
