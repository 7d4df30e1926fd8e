"""The bundled FlashAttention kernel as a transformers attention implementation.

``register(name="triton")`` puts ``triton_attention_forward`` into transformers'
``AttentionInterface`` and a mask function into its ``AttentionMaskInterface``; afterwards
``from_config(cfg, attn_implementation="triton")`` (or ``model.set_attn_implementation``) runs
``attnmem.kernels.flash_attention`` in every attention layer. The function follows the interface of
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

Packed sequences and padding run on the kernel's packed-sequence path
(``flash_attention(..., cu_seqlens=...)``: attention inside each sequence only):
- padding-free training (transformers' DataCollatorWithFlattening): one row of several
  sequences whose ``position_ids`` restart (a new sequence wherever the position does not
  grow by exactly 1, transformers' ``find_packed_sequence_indices``, which is what its SDPA
  mask encodes), causal, with or without the layer's sliding window (per sequence); rows
  of a batch > 1 may be packed too (a sequence never crosses a row). When the collator also
  passes ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (its flash-attention kwargs) and no mask
  says otherwise, those starts are used, as transformers' flash-attention path does;
- a padded batch on a causal layer without a sliding window whose queries are the keys
  (training, or a prefill into an empty cache; a 2D mask with zeros): the real tokens are gathered
  (unpadded), run as packed sequences, and scattered back. Exactly SDPA's output on every
  real token; padding positions get 0 (SDPA's rows there are never read by a real token,
  and transformers' FlashAttention-2 path also returns 0 there).
Both are recognised in the mask function (`_mask_function`), which then returns a small
marker (`PackedSequences`) carrying the int32 starts instead of an s x s mask, once per
model call: the kernel reads them on the host once per step, not per layer.

KV caches (generation) run on our kernels too, for every cache transformers builds for a
causal layer without a sliding window, without padding: the mask function recognises
transformers' causal mask of queries that sit at the end of the cache's valid keys (a
dynamic cache: kv_length = past + new; a static cache: kv_length = max_cache_len, the
queries' offset a tensor, the 2D mask as long as the valid keys) and returns a `CacheCausal`
marker (valid keys, first query's position) instead of a (B, 1, s_q, kv_length) mask. The
attention function then reads the cache tensors' first ``kv_len`` rows (views, no copy):
- queries = valid keys (prefill into an empty static cache): the forward kernel, causal;
- fewer queries than valid keys (decode, speculative decoding, chunked prefill with
  ``prefill_chunk_size``): the split-KV path `attnmem.kernels.flash.decode.decode_attention`,
  causal aligned bottom-right (query i of s_q sees keys 0 .. kv_len - s_q + i).
One query without any mask request (a plain dynamic-cache decode step) runs the split-KV path
too, with no mask (it sees every key).

What is refused with a ValueError that says why (the kernel has no additive or boolean mask,
no soft-capping and no dropout; nothing falls back silently):
- any other attention mask that transformers materialises: padding with a sliding window or
  a KV cache, a KV cache on a sliding-window layer with several new queries, custom mask
  functions (and_mask_function / or_mask_function, e.g.
  Gemma 3's bidirectional image tokens), chunked attention, bidirectional windows, padding
  on a non-causal layer;
- logit soft-capping (Gemma 2's attn_logit_softcapping), dropout > 0, a position bias,
  paged caches, causal attention with s_q != s_k > 1 and no cache marker (which alignment
  was meant cannot be told), a sliding window on a non-causal layer with several queries,
  a gradient through a call with fewer queries than keys (the split-KV path has no
  backward).

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

from attnmem.kernels.hf import NAME

_REGISTERED: set[str] = set()


@dataclass(frozen=True)
class SlidingWindowMask:
    """What our mask function returns in place of a causal sliding-window mask: query i sees
    keys i - window + 1 .. i (masking_utils.sliding_window_causal_mask_function), queries and
    keys aligned, no padding. Only ``triton_attention_forward`` reads it."""

    window: int


@dataclass(frozen=True)
class PackedSequences:
    """What our mask function returns in place of a packed-sequence or padding mask:
    ``cu_seqlens`` int32 (n + 1,) starts of the sequences in the (batch * length) tokens
    flattened row by row (or in the gathered real tokens when ``indices`` is set: their
    positions in that flattening, int64); ``window`` the causal sliding window the mask
    request carried (None: none). Only ``triton_attention_forward`` reads it."""

    cu_seqlens: Any
    window: int | None = None
    indices: Any = None


@dataclass(frozen=True)
class CacheCausal:
    """What our mask function returns in place of a KV cache's causal mask without padding
    or window: the cache tensors' first ``kv_len`` rows are the valid keys and the s_q new
    queries are their last s_q positions (``q_offset`` = kv_len - s_q), so query i sees keys
    0 .. q_offset + i (masking_utils.causal_mask_function with the query offset). Only
    ``triton_attention_forward`` reads it."""

    kv_len: int
    q_offset: int
    #: generate() builds the mask of a compileable (static) cache itself and passes the result
    #: back into the model as ``attention_mask``, whose mask code then reads ``.ndim`` (2 means
    #: "a 2D padding mask, build the mask"); anything else goes on to our mask function, which
    #: returns the marker as it came.
    ndim = 4


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
    """transformers' attention interface around ``attnmem.kernels.flash_attention`` (module docstring)."""
    from attnmem.kernels.flash.api import flash_attention

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
    if attention_mask is None and kwargs.get("cu_seq_lens_q") is None and s_q == s_k > 1:
        attention_mask = _packed_positions(kwargs.get("position_ids"), int(query.shape[0]), s_q)
    if isinstance(attention_mask, PackedSequences) or (
            attention_mask is None and kwargs.get("cu_seq_lens_q") is not None):
        return _packed_forward(module, query, key, value, attention_mask, scaling, window,
                               is_causal, kwargs, where)
    if isinstance(attention_mask, CacheCausal):
        return _cache_forward(module, query, key, value, attention_mask, scaling, window,
                              where)
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
    scale = None if scaling is None else float(scaling)
    if (not causal and window is None and int(query.shape[2]) == 1 < int(key.shape[2])
            and not _needs_grad(query, key, value)):
        # one new query against a cache: the split-KV path (every key is visible)
        from attnmem.kernels.flash.decode import decode_attention

        out = decode_attention(query, key, value, None, causal=False, scale=scale)
    else:
        out = flash_attention(query, key, value, causal=causal, scale=scale,
                              window=window)  # (B, H, s_q, d)
    return out.transpose(1, 2).contiguous(), None  # (B, s_q, H, d), as transformers expects


def _needs_grad(*tensors: Any) -> bool:
    import torch

    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _cache_forward(module: Any, query: Any, key: Any, value: Any, marker: CacheCausal,
                   scaling: float | None, window: int | None, where: str) -> tuple[Any, None]:
    """A causal layer's call with a KV cache (`CacheCausal`; module docstring): the valid keys
    are the cache tensors' first ``marker.kv_len`` rows, the queries their last positions."""
    from attnmem.kernels.flash.api import flash_attention
    from attnmem.kernels.flash.decode import decode_attention

    s_q, s_k = int(query.shape[2]), int(key.shape[2])
    kv = marker.kv_len
    if window is not None and window < kv:
        raise ValueError(
            f"triton attention ({where}): a KV cache on a layer with a sliding window of "
            f"{window} tokens shorter than its {kv} valid keys arrived with a plain causal mask; "
            "our cache path has no window")
    if not (s_q <= kv <= s_k and marker.q_offset + s_q == kv):
        raise ValueError(
            f"triton attention ({where}): the cache mask says {kv} valid keys with queries from "
            f"position {marker.q_offset}, but the call has {s_q} queries and a cache of {s_k} "
            "rows; the queries must be the last positions of the valid keys")
    if scaling is not None and not (math.isfinite(float(scaling)) and float(scaling) > 0):
        raise ValueError(f"triton attention ({where}): scaling must be positive, got {scaling}")
    query, key, value = _autocast_inputs(query, key, value, where)
    scale = None if scaling is None else float(scaling)
    key, value = key[:, :, :kv], value[:, :, :kv]  # views of the cache's valid rows
    if s_q == kv:  # prefill into an empty cache: queries are the keys
        out = flash_attention(query, key, value, causal=True, scale=scale)
    elif _needs_grad(query, key, value):
        raise ValueError(
            f"triton attention ({where}): {s_q} queries against {kv} cached keys with a "
            "gradient; our split-KV path is inference only (run generation under "
            "torch.no_grad())")
    else:
        out = decode_attention(query, key, value, None, causal=True, scale=scale)
    return out.transpose(1, 2).contiguous(), None  # (B, s_q, H, d)


def _packed_forward(module: Any, query: Any, key: Any, value: Any, marker: Any,
                    scaling: float | None, window: int | None, is_causal: bool | None,
                    kwargs: dict[str, Any], where: str) -> tuple[Any, None]:
    """Packed sequences or an unpadded batch (module docstring) on the kernel's packed path:
    (B, H, s, d) inputs flattened to (B * s, H, d) tokens (a view for transformers' usual
    layout), the real tokens gathered when ``marker.indices`` says which; out (B, s, H, d)."""
    import torch

    from attnmem.kernels.flash.api import flash_attention

    B, H, s_q, d = (int(x) for x in query.shape)
    s_k = int(key.shape[2])
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if s_q != s_k:
        raise ValueError(
            f"triton attention ({where}): packed sequences with {s_q} queries and {s_k} keys "
            "(a KV cache); the packed path takes queries aligned with keys only")
    if isinstance(marker, PackedSequences):
        cu_q = cu_k = marker.cu_seqlens
        if marker.window is not None:
            if window is not None and window != marker.window:
                raise ValueError(
                    f"triton attention ({where}): the mask says a sliding window of "
                    f"{marker.window} tokens and the layer passes sliding_window={window}")
            window = marker.window
        indices = marker.indices
    else:  # the collator's flash-attention kwargs, no mask
        cu_q = kwargs["cu_seq_lens_q"]
        cu_k = kwargs.get("cu_seq_lens_k")
        cu_q = cu_q if cu_q.dtype == torch.int32 else cu_q.to(torch.int32)
        cu_k = cu_q if cu_k is None else (cu_k if cu_k.dtype == torch.int32
                                           else cu_k.to(torch.int32))
        indices = None
    if not causal:
        if window is not None:
            raise ValueError(f"triton attention ({where}): a sliding window of {window} "
                             "tokens on a non-causal layer; our kernel's window is causal only")
    elif window is not None and window < 1:
        raise ValueError(f"triton attention ({where}): sliding_window must be >= 1, got {window}")
    if scaling is not None and not (math.isfinite(float(scaling)) and float(scaling) > 0):
        raise ValueError(f"triton attention ({where}): scaling must be positive, got {scaling}")
    query, key, value = _autocast_inputs(query, key, value, where)
    q, k, v = (t.transpose(1, 2).reshape(B * s_q, t.shape[1], d) for t in (query, key, value))
    if indices is not None:
        q, k, v = (t.index_select(0, indices) for t in (q, k, v))
    out = flash_attention(q, k, v, causal=bool(causal),
                          scale=None if scaling is None else float(scaling), window=window,
                          cu_seqlens=cu_q, cu_seqlens_k=None if cu_k is cu_q else cu_k)
    if indices is not None:
        out = out.new_zeros((B * s_q, H, d)).index_copy(0, indices, out)
    return out.reshape(B, s_q, H, d), None


# Packed sequences read from position_ids, by the tensor's id, while it lives and is unmodified
# (every layer of one model call gets the same tensor): one device read per call, not per layer.
_POSITIONS: dict[int, tuple[Any, int, int, Any]] = {}


def _packed_positions(position_ids: Any, batch: int, length: int) -> PackedSequences | None:
    """`PackedSequences` when ``position_ids`` (1 or ``batch`` rows of ``length``) start a new
    sequence somewhere inside a row (a position that is not the previous one + 1:
    transformers' find_packed_sequence_indices), else None. This is how transformers'
    flash-attention path finds packed rows (modeling_flash_attention_utils
    _is_packed_sequence), and it is needed here too: with a cache object present (use_cache,
    transformers' default even in training) create_causal_mask skips its packed-sequence
    mask, so no mask says that the row is packed."""
    import weakref

    import torch

    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2:
        return None
    if position_ids.shape[1] != length or position_ids.shape[0] not in (1, batch):
        return None
    key = id(position_ids)
    hit = _POSITIONS.get(key)
    if (hit is not None and hit[0]() is position_ids and hit[1] == position_ids._version
            and hit[2] == batch):
        return hit[3]
    pos = position_ids.expand(batch, length)
    new = torch.ones_like(pos, dtype=torch.bool)
    new[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    marker = None
    if bool(new[:, 1:].any()):
        ids = new.cumsum(1)  # sequence ids per row, as find_packed_sequence_indices numbers them
        marker = PackedSequences(_starts(ids))
    ref = weakref.ref(position_ids, lambda _r, key=key: _POSITIONS.pop(key, None))
    _POSITIONS[key] = (ref, position_ids._version, batch, marker)
    return marker


def _closure(fn: Any) -> dict[str, Any]:
    """The free variables of a function (a transformers mask function's parameters)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return {}
    return {name: cell.cell_contents
            for name, cell in zip(code.co_freevars, cells, strict=True)}


def _qualname(fn: Any) -> str:
    return getattr(fn, "__qualname__", "")


def _packed_request(kw: dict[str, Any]) -> tuple[Any, int | None] | None:
    """(transformers' packed sequence ids (B, s), the window or None) when a mask request is
    exactly create_causal_mask's or create_sliding_window_causal_mask's packed-sequence mask
    with no padding mask, nothing added (no and/or mask function, no block overlay) and
    queries = keys; None for anything else, which is then materialised and refused. Two
    structures are read from the mask functions' closures (transformers' masking_utils):
    and_masks(causal [+ window], packed_sequence_mask_function(ids)) (5.17: the causal mask on
    the row's positions, which within one contiguous sequence is the sequence's own causal
    mask) and and_masks(remap_positions_for_packed_sequence(causal [+ window]),
    packed_sequence_mask_function(ids)) (later 5.x); another structure reads as None, so the
    check fails closed."""
    from transformers.masking_utils import causal_mask_function

    fn = kw.get("mask_function")
    if kw.get("attention_mask") is not None or _qualname(fn) != "and_masks.<locals>.and_mask":
        return None
    parts = _closure(fn).get("mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2:
        return None
    first, packed = parts
    if _qualname(packed) != "packed_sequence_mask_function.<locals>.inner_mask":
        return None
    ids = _closure(packed).get("packed_sequence_mask")
    if _qualname(first) == "remap_positions_for_packed_sequence.<locals>.inner_mask":
        base = _closure(first).get("mask_function")
    else:
        base = first
    if ids is None or getattr(ids, "dim", lambda: 0)() != 2:
        return None
    if kw.get("q_length") != kw.get("kv_length") or kw.get("q_length") != ids.shape[1]:
        return None
    if kw.get("q_offset", 0) != 0 or kw.get("kv_offset", 0) != 0:
        return None
    if base is causal_mask_function:
        return (ids, None) if kw.get("local_size") is None else None
    # sliding_window_causal_mask_function(W) = and_masks(sliding_window_overlay(W), causal)
    inner = _closure(base).get("mask_functions")
    if (_qualname(base) != "and_masks.<locals>.and_mask" or not isinstance(inner, tuple)
            or len(inner) != 2 or inner[1] is not causal_mask_function
            or _qualname(inner[0]) != "sliding_window_overlay.<locals>.inner_mask"):
        return None
    window = _closure(inner[0]).get("sliding_window")
    if type(window) is not int or window != kw.get("local_size"):
        return None
    return ids, window


def _starts(ids: Any) -> Any:
    """int32 starts of the runs of equal ids in (B, s) sequence ids flattened row by row
    (a new run at every row start too): the cu_seqlens of those tokens."""
    import torch

    B, s = ids.shape
    flat = ids.reshape(-1)
    new = torch.ones_like(flat, dtype=torch.bool)
    new[1:] = flat[1:] != flat[:-1]
    new[::s] = True  # a sequence never crosses a row
    firsts = new.nonzero().reshape(-1)
    end = torch.full((1,), B * s, dtype=firsts.dtype, device=firsts.device)
    return torch.cat([firsts, end]).to(torch.int32)


def _padding_request(args: tuple, kw: dict[str, Any]) -> PackedSequences | None:
    """The unpadded form of a causal padding mask (module docstring): transformers' plain
    causal mask function with a 2D mask that has a zero, queries = keys at offset 0, no
    window; None otherwise. The real tokens' flat positions and their sequences' starts."""
    import torch
    from transformers.masking_utils import causal_mask_function

    mask = kw.get("attention_mask")
    if (args or kw.get("mask_function") is not causal_mask_function
            or kw.get("local_size") is not None or not isinstance(mask, torch.Tensor)
            or mask.dim() != 2 or mask.dtype != torch.bool):
        return None
    q_len, kv_len = kw.get("q_length"), kw.get("kv_length")
    if (type(q_len) is not int or q_len != kv_len or mask.shape[1] != kv_len
            or kw.get("q_offset", 0) != 0 or kw.get("kv_offset", 0) != 0 or bool(mask.all())):
        return None
    lens = mask.sum(1, dtype=torch.int32)
    lens = lens[lens > 0]  # a row of padding only is no sequence
    if lens.numel() == 0:
        return None
    cu = torch.cat([lens.new_zeros(1), lens.cumsum(0, dtype=torch.int32)])
    return PackedSequences(cu, None, mask.reshape(-1).nonzero().reshape(-1))


def _cache_request(args: tuple, kw: dict[str, Any]) -> CacheCausal | None:
    """`CacheCausal` when a mask request is transformers' plain causal mask of queries at the
    end of a KV cache's valid keys, without padding; None for anything else. Read from
    create_causal_mask's arguments (masking_utils._preprocess_mask_arguments): the plain
    causal mask function, no window (``local_size``), keys from offset 0, fewer queries than
    ``kv_length`` (the cache's rows: past + new for a dynamic cache, max_cache_len for a
    static one), and the valid keys either the 2D attention mask's length (generate() passes
    one as long as the tokens so far; all of it must be ones) or, without a mask, the query
    offset + q_length. The query offset is an int, or a one-element tensor for static
    caches (read on the host: one sync per model call, as SDPA's own skip check reads the
    padding mask)."""
    import torch
    from transformers.masking_utils import causal_mask_function

    if args or kw.get("mask_function") is not causal_mask_function:
        return None
    if kw.get("local_size") is not None or kw.get("kv_offset", 0) != 0:
        return None
    q_len, kv_len = kw.get("q_length"), kw.get("kv_length")
    if type(q_len) is not int or type(kv_len) is not int or not 0 < q_len < kv_len:
        return None
    q_off = kw.get("q_offset", 0)
    if isinstance(q_off, torch.Tensor):
        if q_off.numel() != 1:
            return None
        q_off = int(q_off.reshape(-1)[0])
    if type(q_off) is not int:
        return None
    mask = kw.get("attention_mask")
    if mask is None:
        valid = q_off + q_len
    elif (isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] <= kv_len
          and bool(mask.all())):
        valid = int(mask.shape[-1])
    else:
        return None
    if q_off + q_len != valid or valid > kv_len:
        return None
    return CacheCausal(valid, q_off)


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
    `SlidingWindowMask` where the mask would be exactly the config's causal sliding window,
    or `PackedSequences` for a packed-sequence or causal padding mask (module docstring)."""
    from transformers.masking_utils import sdpa_mask

    if isinstance(kwargs.get("attention_mask"), CacheCausal):
        return kwargs["attention_mask"]  # generate() built it already (CacheCausal.ndim)
    packed = None if args else _packed_request(kwargs)
    if packed is not None:
        return PackedSequences(_starts(packed[0]), packed[1])
    unpadded = _padding_request(args, kwargs)
    if unpadded is not None:
        return unpadded
    cached = _cache_request(args, kwargs)
    if cached is not None:
        return cached
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
            "attnmem.kernels.hf.register needs transformers with AttentionInterface and "
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
