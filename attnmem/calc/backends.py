"""Where a forced SDPA backend has no kernel: the calls transformers makes that torch refuses.

A run with such a backend raises "No available kernel" (torch.nn.functional.
scaled_dot_product_attention under sdpa_kernel with one backend), so calc refuses the inputs
with `NoKernel` instead of sizing a step that cannot run. The rules read transformers 5.17
(masking_utils._ignore_causal_mask_sdpa: a mask is materialized when a sliding window is not
longer than the keys, when a forward's queries do not start at key 0 and are not a single
token, or when a static cache's decode sees its unfilled slots; integrations/sdpa_attention.py
use_gqa_in_sdpa: enable_gqa=True wherever no mask is passed) and torch 2.11's backend
constraints (flash: no mask, one head dim for q, k and v; memory-efficient: no enable_gqa).
The rules refuse exactly the H200 rows that said "No available kernel" in
data/inference_steps_h200.csv and data/training_steps_h200.csv, and no row that ran. Training
with memory-efficient forced on grouped-query heads has no measured row: it is refused where a
layer gets no mask, the same unmasked call as generate()'s prefill.

Pure: stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable


class NoKernel(ValueError):
    """The inputs ask a forced SDPA backend for a call it has no kernel for. A search over
    lengths (attnmem.calc.max_inference_seq_len, attnmem.calc.max_train_seq_len) counts a length refused so as
    one that does not fit."""


def no_fit_without_kernel(peak: Callable[[int], int]) -> Callable[[int], float]:
    """``peak`` for a search over lengths (attnmem.calc.fit.largest_fitting): a length whose forced
    backend has no kernel (NoKernel) counts as one that does not fit."""
    def cost(s: int) -> float:
        try:
            return peak(s)
        except NoKernel:
            return float("inf")
    return cost


def _window_note(window: int, keys: int) -> str:
    return (f"the sliding window ({window:,}) is not longer than the keys ({keys:,}), so "
            "transformers passes a mask")


def inference_refusal(model, attention: str, prompt_len: int, new_tokens: int, static: bool,
                      prefill_chunk: int | None) -> str | None:
    """Why `generate()` with a forced SDPA backend finds no kernel, or None."""
    if (attention == "sdpa_efficient" and model.num_kv_heads < model.num_heads
            and not model.is_mla and model.head_dim <= 256):  # use_gqa_in_sdpa's conditions
        return ("SDPA's memory-efficient backend has no grouped-query kernel "
                f"({model.num_heads} query heads over {model.num_kv_heads} key/value heads: "
                "transformers calls SDPA with enable_gqa=True where it passes no mask, and on "
                "the H200 every such generate() found none); use 'sdpa' (torch's choice) or "
                "flash")
    if attention != "sdpa_flash":
        return None
    why = []
    if model.is_mla:
        why.append(f"MLA's value head ({model.v_head_dim}) differs from its query/key head "
                   f"({model.head_dim}), and flash takes one head dim")
    if static and new_tokens > 1:
        why.append("a static cache's decode steps pass a mask over its unfilled slots")
    if prefill_chunk is not None and prefill_chunk < prompt_len:
        why.append("a prefill chunk after the first passes a mask")
    keys = prompt_len + new_tokens - 1  # the last forward's keys in a sliding layer, at most
    if model.sliding_window and model.sliding_window_layers and keys >= model.sliding_window:
        why.append(_window_note(model.sliding_window, keys))
    if not why:
        return None
    return ("SDPA's flash backend takes no mask and has no kernel here: " + "; ".join(why)
            + "; use 'sdpa' (torch's choice) or the memory-efficient backend")


def training_refusal(model, attention: str, seq_len: int, masked_layers: int,
                     packed: bool = False) -> str | None:
    """Why a training step with a forced SDPA backend finds no kernel, or None; masked_layers:
    the layers that get a materialized mask (a packed row's block-diagonal one, or a sliding
    window not longer than s)."""
    if attention == "sdpa_flash" and masked_layers and not packed:
        return ("SDPA's flash backend takes no mask and has no kernel here: "
                + _window_note(model.sliding_window, seq_len)
                + f" to {masked_layers} layer(s); use sdpa_efficient, sdpa_cudnn, our kernel, "
                f"or fewer than {model.sliding_window:,} tokens")
    if (attention == "sdpa_efficient" and model.num_kv_heads < model.num_heads
            and not model.is_mla and model.head_dim <= 256
            and masked_layers < model.num_layers):
        # the same unmasked grouped-query call as generate()'s prefill, which found no kernel
        # (use_gqa_in_sdpa: no mask, one head dim of at most 256)
        return ("SDPA's memory-efficient backend has no grouped-query kernel "
                f"({model.num_heads} query heads over {model.num_kv_heads} key/value heads: "
                "transformers calls SDPA with enable_gqa=True where it passes no mask, in "
                f"{model.num_layers - masked_layers} layer(s) here; on the H200 every such "
                "generate() found none); use sdpa_flash, sdpa_cudnn or our kernel")
    return None
