"""Our FlashAttention kernel inside Hugging Face transformers models.

``attnmem.kernels.hf.register()`` adds ``attn_implementation="triton"`` to transformers'
``AttentionInterface`` (and its mask interface), so any model whose attention goes through that
interface (Llama, Qwen2/3, Mistral, Gemma 2/3, Phi-3, ...) can run the bundled kernel::

    import attnmem.kernels.hf
    attnmem.kernels.hf.register()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="triton")

What it refuses, and why: ``attnmem.kernels.hf.attention``. Importing this package imports neither torch
nor transformers; ``register`` does.
"""

from __future__ import annotations

from typing import Any

NAME = "triton"

__all__ = ["NAME", "check_config", "register", "triton_attention_forward"]


def __getattr__(name: str) -> Any:
    if name in ("register", "triton_attention_forward", "check_config"):
        from attnmem.kernels.hf import attention

        return getattr(attention, name)
    raise AttributeError(f"module 'attnmem.kernels.hf' has no attribute {name!r}")
