"""Whole-model memory for inference: weights + KV cache + one layer's attention peak.

Inference holds all weights and the KV cache for the full context at once; attention's extra
memory is needed for one layer at a time (layers run one after another), so one layer's
attention peak is added, not L of them. Formulas: weights, calc.params; KV cache, calc.kv;
attention, calc.peak (causal prefill of the whole context, forward only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real

from calc.fit import largest_fitting
from calc.kv import kv_cache_bytes
from calc.models import ModelConfig, check_model
from calc.params import weight_bytes
from calc.peak import attention_peak_bytes
from calc.scores import score_matrix_bytes
from calc.units import dtype_name


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of each part of an inference step over a context of seq_len tokens."""

    weights_bytes: int  # all parameters at the weight dtype
    kv_cache_bytes: int  # keys and values of every layer for the whole context
    attention_bytes: int  # one layer's extra peak for the chosen implementation
    scores_bytes: int  # one layer's B·H·s²·e score matrix (what naive attention stores)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.attention_bytes


def model_memory(
    model: ModelConfig,
    batch: int,
    seq_len: int,
    weight_dtype: str,
    kv_dtype: str,
    act_dtype: str = "bf16",
    impl: str = "naive",
) -> MemoryBreakdown:
    """Weights, KV cache and one layer's attention peak for a causal prefill of seq_len.

    The three dtypes are names (calc.units.DTYPES or torch spellings), not byte counts.
    """
    check_model(model)
    for arg, value in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype),
                       ("act_dtype", act_dtype)):
        if not isinstance(value, str):
            raise ValueError(f"{arg} must be a dtype name such as 'bf16', got {value!r:.60}")
        try:
            dtype_name(value)
        except ValueError as err:
            raise ValueError(f"{arg}: {err}") from None
    return MemoryBreakdown(
        weights_bytes=weight_bytes(model, weight_dtype),
        kv_cache_bytes=kv_cache_bytes(model, batch, seq_len, kv_dtype),
        attention_bytes=attention_peak_bytes(
            impl, batch, model.num_heads, seq_len, model.head_dim, act_dtype,
            causal=True, backward=False, kv_heads=model.num_kv_heads),
        scores_bytes=score_matrix_bytes(batch, model.num_heads, seq_len, act_dtype),
    )


def model_max_seq_len(
    model: ModelConfig,
    gpu_bytes: int,
    batch: int,
    weight_dtype: str,
    kv_dtype: str,
    act_dtype: str = "bf16",
    impl: str = "naive",
) -> int:
    """Longest context whose weights + KV cache + attention peak fit gpu_bytes (0 if none);
    exact integer search over s (calc.fit.largest_fitting)."""
    model_memory(model, batch, 1, weight_dtype, kv_dtype, act_dtype, impl)  # validates inputs
    budget = _finite_bytes("gpu_bytes", gpu_bytes, allow_zero=True)
    return largest_fitting(
        lambda s: model_memory(model, batch, s, weight_dtype, kv_dtype, act_dtype, impl)
        .total_bytes,
        budget,
    )


def gpus_needed(total_bytes: int, gpu_bytes: int) -> int:
    """Whole GPUs of gpu_bytes each whose memory adds up to total_bytes (an ideal split,
    ignoring per-GPU duplication such as replicated embeddings or activations)."""
    total = _finite_bytes("total_bytes", total_bytes, allow_zero=True)
    gpu = _finite_bytes("gpu_bytes", gpu_bytes, allow_zero=False)
    return max(1, math.ceil(total / gpu))  # exact: Fractions, no float rounding


def _finite_bytes(name: str, value: object, allow_zero: bool) -> Fraction:
    """value as an exact Fraction if it is a finite real >= 0 (> 0 unless allow_zero)."""
    if isinstance(value, bool) or not isinstance(value, Real) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number of bytes, got {value!r:.80}")
    frac = Fraction(value)
    if frac < 0 or (frac == 0 and not allow_zero):
        bound = "0 or more" if allow_zero else "above 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return frac
