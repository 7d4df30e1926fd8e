"""Whole-model memory for inference: weights + KV cache + the prompt's prefill peak.

The total is the peak of generate() over a prompt of seq_len tokens (attnmem.calc.inference_step, new
tokens = 1): weights, the KV cache, and what the prefill holds at its largest moment beyond
them (the MLP's intermediates, hidden states, masks, one layer's attention call, the cuBLAS
workspace), measured within 0.3% on an H200 (data/inference_steps_h200.csv). Before, the total
was weights + KV cache + one layer's attention peak, 12-34% under measured generate() peaks.
Where inference_step does not model the architecture or the implementation (hybrids, GPT-2
and other LayerNorm families, the math backend), the total falls back to that sum and
`total_is_lower_bound` says so. Formulas: weights, attnmem.calc.params; KV cache, attnmem.calc.kv; attention,
attnmem.calc.peak (causal prefill of the whole context, forward only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real

from attnmem.calc.backends import NoKernel
from attnmem.calc.fit import largest_fitting
from attnmem.calc.inference_step import InferenceMemory, inference_step
from attnmem.calc.kv import kv_cache_bytes
from attnmem.calc.models import ModelConfig, check_model
from attnmem.calc.params import CHECKPOINT
from attnmem.calc.peak import attention_peak_bytes
from attnmem.calc.scores import score_matrix_bytes
from attnmem.calc.units import dtype_name
from attnmem.calc.weights import weight_bytes

#: attnmem.calc.peak's implementations as transformers runs them in generate(): the bench's naive
#: attention is transformers' eager attention there (both materialize the scores).
INFERENCE_IMPL = {"naive": "eager", "naive_inplace": "eager"}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of each part of an inference step over a context of seq_len tokens."""

    weights_bytes: int  # all parameters at the weight dtype
    kv_cache_bytes: int  # keys and values of every layer for the whole context
    attention_bytes: int  # one layer's extra peak for the chosen implementation
    scores_bytes: int  # one layer's B·H·s²·e score matrix (what naive attention stores)
    prefill_bytes: int = 0  # the prefill peak beyond weights and KV cache (inference_step)
    peak_phase: str = ""  # where the peak is (attnmem.calc.inference_step.PHASES)
    inference: InferenceMemory | None = None  # the whole prediction, when modelled
    not_modelled: str = ""  # why the total is a lower bound (empty when it is the peak)
    counted_as: str = ""  # why generate() was counted with SDPA as torch picks it (empty: impl)

    @property
    def total_is_lower_bound(self) -> bool:
        return bool(self.not_modelled)

    @property
    def total_bytes(self) -> int:
        """generate()'s peak over the prompt (inference_step), or the lower bound weights +
        KV cache + one attention call where that is not modelled (not_modelled says why)."""
        if self.not_modelled:
            return self.weights_bytes + self.kv_cache_bytes + self.attention_bytes
        return self.weights_bytes + self.kv_cache_bytes + self.prefill_bytes


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

    The three dtypes are names (attnmem.calc.units.DTYPES or torch spellings), not byte counts;
    weight_dtype may also be "checkpoint": the weights as the checkpoint stores them
    (attnmem.calc.weight_bytes(model, "checkpoint"), which refuses a config that says neither a
    quantization_config nor a torch_dtype).
    """
    check_model(model)
    for arg, value in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype),
                       ("act_dtype", act_dtype)):
        if not isinstance(value, str):
            raise ValueError(f"{arg} must be a dtype name such as 'bf16', got {value!r:.60}")
        if arg == "weight_dtype" and value == CHECKPOINT:  # as stored: attnmem.calc.weight_bytes says
            continue
        try:
            dtype_name(value)
        except ValueError as err:
            raise ValueError(f"{arg}: {err}") from None
    weights = weight_bytes(model, weight_dtype)
    kv = kv_cache_bytes(model, batch, seq_len, kv_dtype)
    attention = attention_peak_bytes(impl, batch, model.num_heads, seq_len, model.head_dim,
                                     act_dtype, causal=True, backward=False,
                                     kv_heads=model.num_kv_heads)
    scores = score_matrix_bytes(batch, model.num_heads, seq_len, act_dtype)
    counted_as = ""
    kw = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, act_dtype=act_dtype)
    try:
        try:
            inf = inference_step(model, batch, seq_len, 1,
                                 attention=INFERENCE_IMPL.get(impl, impl), **kw)
        except NoKernel as err:
            # the backend forced alone has no kernel in generate() here: count generate() as
            # transformers runs it by default (SDPA, torch choosing the backend), and say so
            inf = inference_step(model, batch, seq_len, 1, attention="sdpa", **kw)
            counted_as = f"generate() counted with SDPA as torch picks the backend: {err}"
    except ValueError as err:
        return MemoryBreakdown(weights, kv, attention, scores,
                               not_modelled=f"prefill not modelled: {err}")
    return MemoryBreakdown(weights, kv, attention, scores,
                           prefill_bytes=inf.peak_bytes - weights - kv,
                           peak_phase=inf.peak_phase, inference=inf, counted_as=counted_as)


def model_max_seq_len(
    model: ModelConfig,
    gpu_bytes: int,
    batch: int,
    weight_dtype: str,
    kv_dtype: str,
    act_dtype: str = "bf16",
    impl: str = "naive",
) -> int:
    """Longest prompt whose total (generate()'s prefill peak, MemoryBreakdown.total_bytes) fits
    gpu_bytes (0 if none); exact integer search over s (attnmem.calc.fit.largest_fitting)."""
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
