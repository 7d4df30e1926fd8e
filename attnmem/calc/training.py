"""Attention memory in training: what each layer keeps for the backward pass.

Autograd keeps, for every layer until its backward runs, the tensors the backward needs. For
eager attention that is the softmax probabilities P (one s×s matrix per head: the backward of
softmax and of P·V both read it), so L layers keep L score matrices: this is the memory that
grows with L·s². FlashAttention keeps only the output and one fp32 log-sum-exp per row and
recomputes P in the backward (Dao et al. 2022, arXiv 2205.14135, sec. 3.1). Activation
checkpointing (Chen et al. 2016, arXiv 1604.06174) keeps only each layer's input and recomputes
the layer during the backward, so at most one layer's attention tensors exist at a time.

The total is the per-layer saved tensors of L − 1 layers plus the forward+backward peak of one
layer (attnmem.calc.peak, backward=True), which already contains that layer's saved tensors.

This is the attention part only, kept for the Model memory page; the whole step (weights,
gradients, AdamW state, every activation, the peak and where it occurs, parallel layouts) is
attnmem.calc.training_step (attnmem/calc/training_step.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnmem.calc.models import ModelConfig, check_model
from attnmem.calc.peak import IMPL_KIND, attention_peak_bytes, check_impl
from attnmem.calc.units import (
    MAX_BATCH,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_SEQ_LEN,
    ceil_bytes,
    check_bool,
    check_int,
    dtype_bytes,
)


@dataclass(frozen=True)
class TrainingAttention:
    """Attention memory of one training step, in bytes."""

    saved_per_layer_bytes: int  # what one layer keeps for its backward (0 with checkpointing)
    layers: int  # L, the layers with attention (all of them unless a hybrid)
    one_layer_peak_bytes: int  # forward+backward extra peak of one attention call
    checkpointing: bool

    @property
    def total_bytes(self) -> int:
        return (self.layers - 1) * self.saved_per_layer_bytes + self.one_layer_peak_bytes


def saved_for_backward_bytes(
    impl: str, batch: int, heads: int, seq_len: int, head_dim: int, dtype: str,
    causal: bool = True,
) -> int:
    """Bytes one attention layer keeps until its backward.

    Quadratic implementations keep the probabilities P: B·H·s²·e (the math backend in fp32,
    4 bytes, with 16-bit inputs); a causal mask is rebuilt per call and not kept. Fused ones
    keep the output and the log-sum-exp: B·H·s·(d·e + 4).
    """
    check_impl(impl)
    check_bool("causal", causal)
    b = check_int("batch", batch, 1, MAX_BATCH)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    h = check_int("heads", heads, 1, MAX_HEADS)
    d = check_int("head_dim", head_dim, 1, MAX_HEAD_DIM)
    e = dtype_bytes(dtype)
    if IMPL_KIND[impl] == "quadratic":
        per = 4 if impl == "sdpa_math" else e
        return ceil_bytes(b * h * s * s * per)
    return ceil_bytes(b * h * s * (d * e + 4))


def training_attention(
    model: ModelConfig, batch: int, seq_len: int, dtype: str, impl: str, checkpointing: bool,
) -> TrainingAttention:
    """Attention memory of a causal training step across the model's layers (module docstring)."""
    check_model(model)
    check_bool("checkpointing", checkpointing)
    peak = attention_peak_bytes(
        impl, batch, model.num_heads, seq_len, model.head_dim, dtype,
        causal=True, backward=True, kv_heads=model.num_kv_heads)
    saved = 0 if checkpointing else saved_for_backward_bytes(
        impl, batch, model.num_heads, seq_len, model.head_dim, dtype)
    # Only attention layers keep attention tensors: a hybrid's Mamba / DeltaNet layers have
    # none (model.kv_layers, as kv_cache_bytes counts them).
    return TrainingAttention(saved, model.kv_layers, peak, checkpointing)


def training_attention_bytes(
    model: ModelConfig, batch: int, seq_len: int, dtype: str, impl: str, checkpointing: bool,
) -> int:
    """Total attention bytes of a training step (TrainingAttention.total_bytes)."""
    return training_attention(model, batch, seq_len, dtype, impl, checkpointing).total_bytes
