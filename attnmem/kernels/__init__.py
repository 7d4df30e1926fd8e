"""Everything that runs attention. Importing this package is light: it imports neither triton
nor touches a GPU driver. ``flash_attention`` (the bundled Triton kernel) is imported on first
use; ``attention_reference`` (the plain eager oracle) is pure torch."""

from __future__ import annotations

from typing import Any

__all__ = ["attention_reference", "flash_attention", "ring_attention"]


def __getattr__(name: str) -> Any:
    if name == "flash_attention":
        from attnmem.kernels.flash.api import flash_attention

        return flash_attention
    if name == "attention_reference":
        from attnmem.kernels.flash.reference import attention_reference

        return attention_reference
    if name == "ring_attention":
        from attnmem.kernels.ring import ring_attention

        return ring_attention
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")
