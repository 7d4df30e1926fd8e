"""Predicted extra peak memory of one attention call, per implementation.

What is predicted is what the measurement harness measures (attnmem/measure/harness.py):
`max_memory_allocated()` during the call minus `memory_allocated()` just before it. Forward:
q, k, v exist before; the output is computed under no_grad. Forward + backward: q, k, v (with
requires_grad) and the upstream gradient dO exist before; the call runs the forward and
backward(dO), so q.grad, k.grad, v.grad count.

Notation: B batch, H query heads, H_kv key/value heads, s sequence length (queries = keys),
d head dim, e bytes per element of the inputs. N = B·H·s² score elements; O = B·H·s·d·e bytes
(one output-sized tensor); LSE = B·H·s·4 bytes (one fp32 value per row).

Each implementation is a sequence of allocations and frees (the tensors it makes, in order,
from what its code allocates), replayed through attnmem.calc.allocator, which counts each tensor as the
caching allocator's block (c10/cuda/CUDACachingAllocator.cpp: round_size, get_allocation_size,
should_split): the peak is the most "allocated" grows above the inputs during the call, and
the terms are the tensors alive then. The same replay gives the growth of memory_reserved()
(attention_reserved_bytes) where every temporary is known. Checked against peaks measured on
an NVIDIA H200 (torch 2.11; data/attention_calls_h200.csv and, at awkward shapes,
data/attention_calls_awkward_h200.csv): within 0.5% at s >= 1,024
(tests/measure/test_store.py).
Sources for the algorithms: eager attention, Vaswani et al. 2017 (arXiv 1706.03762) eq. 1;
FlashAttention keeps O and the log-sum-exp only, Dao et al. 2022 (arXiv 2205.14135) sec. 3.1;
FlashAttention-2's backward with an fp32 dq accumulator, Dao 2023 (arXiv 2307.08691) sec. 3.2;
memory-efficient attention, Rabe & Staats 2021 (arXiv 2112.05682), as in xFormers/PyTorch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

from attnmem.calc import dispatch
from attnmem.calc.allocator import (
    K_SMALL_SIZE,
    CachingAllocator,
    TensorReplay,
    is_small,
    round_size,
)
from attnmem.calc.units import (
    MAX_BATCH,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_SEQ_LEN,
    ceil_bytes,
    check_bool,
    check_int,
    dtype_bytes,
    dtype_name,
)

IMPLEMENTATIONS: tuple[str, ...] = (
    "naive",
    "naive_inplace",
    "sdpa_math",
    "sdpa_efficient",
    "sdpa_flash",
    "sdpa_cudnn",
    "triton",
    "fa4",
)

IMPL_LABELS: dict[str, str] = {
    "naive": "Eager (masked_fill)",
    "naive_inplace": "Eager (masked_fill_)",
    "sdpa_math": "SDPA math",
    "sdpa_efficient": "SDPA memory-efficient",
    "sdpa_flash": "SDPA FlashAttention-2",
    "sdpa_cudnn": "SDPA cuDNN",
    "triton": "Our Triton kernel",
    "fa4": "FlashAttention-4 (CuTe)",
}

#: Whether the extra memory grows with s^2 (stores the score matrix) or with s.
IMPL_KIND: dict[str, str] = {
    "naive": "quadratic",
    "naive_inplace": "quadratic",
    "sdpa_math": "quadratic",
    "sdpa_efficient": "linear",
    "sdpa_flash": "linear",
    "sdpa_cudnn": "linear",
    "triton": "linear",
    "fa4": "linear",
}

#: What each formula assumes and what it cannot know.
PEAK_MODEL_NOTES: dict[str, str] = {
    "naive": (
        "Two s×s tensors in the input dtype are alive at once (scores and softmax "
        "probabilities), plus the output; a causal call adds a bool s×s mask (shared across "
        "batch and heads). GQA adds the key/value copies made by repeat_interleave. The "
        "backward peak holds four s×s tensors plus the output and dV (measured on an H200)."
    ),
    "naive_inplace": (
        "Same peak as masked_fill: the in-place fill saves a copy kernel (time), not the "
        "peak, because softmax still needs a second s×s tensor."
    ),
    "sdpa_math": (
        "PyTorch's math backend upcasts 16-bit inputs to fp32: fp32 scores, an fp32 softmax "
        "and a bool mask from its 'safe softmax' (9 bytes per score, and one bool per row), "
        "plus fp32 copies of q, k, v and the output; causal adds an fp32 s×s mask. For fp32 "
        "inputs the same terms are assumed (not measured)."
    ),
    "sdpa_efficient": (
        "Fused (Rabe & Staats): forward keeps only the output; the backward adds the "
        "gradients, an fp32 dq accumulator, the log-sum-exp, the row sums of dO·O and a copy "
        "of dO in the kernel's layout (measured). This backend has no enable_gqa path in "
        "torch 2.11: GQA runs on k and v expanded to H heads, which costs their copies and "
        "H-head gradients. Its log-sum-exp rows are padded to 32 and its fp32 workspace to "
        "the kernel's 64- or 128-row query blocks (kernel_backward.h workspace_size)."
    ),
    "sdpa_flash": (
        "FlashAttention-2: the forward always writes the fp32 log-sum-exp; the backward "
        "adds the gradients, contiguous copies of dO and of the output (the kernel gets "
        "transposed views) and an fp32 dq accumulator. With GQA the backward computes dk, dv per query head and then sums "
        "each group (both alive: GQA's extra peak is above MHA's). The backward's fp32 "
        "buffers have s rounded up to 128 (flash_api.cpp mha_bwd). Not modelled: the "
        "split-KV workspace that the forward takes for short sequences (measured at s=256, "
        "d=128: 10.1 MiB against 2.0 MiB modelled; none from s=1,024 on)."
    ),
    "sdpa_cudnn": (
        "cuDNN fused attention: output; in the backward the gradients, an fp32 dq "
        "accumulator, log-sum-exp and row sums (no dO copy, unlike the memory-efficient "
        "backend); with GQA, dk and dv per query head before the group sum; three tiny "
        "tensors (512 B blocks, measured on every row). cuDNN's own workspace, when it asks "
        "for one, is not modelled (seen: +1 MiB at s=8192, fwd+bwd)."
    ),
    "triton": (
        "Our kernel: the forward writes the output and one fp32 log-sum-exp per row; the "
        "backward adds the row sums of dO·O (fp32) and the three gradients, and for fp16/bf16 "
        "at d = 64 or 128 an fp32 dq buffer that its dK/dV kernel adds into with atomics (5 "
        "matrix products instead of 7): from s = 4,096 with B·H_kv·⌈s/128⌉ ≥ 256, and from "
        "s = 512 with ≥ 512 such programs over ≥ 8,192 queries per call (the region "
        "where a Hopper GPU runs the Gluon backward, attnmem/kernels/flash/bwd_sm90.py; other GPUs the "
        "Triton one with the same buffers), and with s above 2,048 where B·H_kv·S·⌈s/d⌉ ≥ "
        "2,048. Outside that region, with GQA on a small grid (B·H_kv·⌈s/128⌉ < 1,024) the "
        "backward splits each group of query heads over S programs, whose partial dk, dv "
        "(2·S·B·H_kv·s·d·e) are summed at the end. Not modelled: under "
        "torch.use_deterministic_algorithms(True) the kernel keeps its deterministic "
        "two-kernel backward and that buffer is not allocated."
    ),
    "fa4": (
        "FlashAttention-4 (flash_attn/cute/interface.py, read at the August 2026 main branch; "
        "the H200 runs 4.0.0b36): the forward writes the output, and the fp32 log-sum-exp "
        "only when a gradient is needed; the backward adds the gradients, an fp32 dQ "
        "accumulator and two fp32 row vectors (dpsum, lse_log2), all with s rounded up to "
        "the backward's tile (128 rows at d <= 64; 80, or 64 if causal, at d = 128), and "
        "with GQA fp32 dK, dV accumulators per key/value head. Hopper tiles; copies a "
        "wrapper makes to change layouts are not modelled."
    ),
}

#: Shared by every implementation: how the tensors are counted.
ALLOCATOR_NOTE = (
    "Each tensor is counted as the block PyTorch's caching allocator gives it, which is what "
    "max_memory_allocated() reports: rounded up to 512 bytes; a tensor over 10 MiB gets a "
    "segment rounded up to 2 MiB, and when at most 1 MiB of it would be left over the whole "
    "segment is counted (c10/cuda/CUDACachingAllocator.cpp: round_size, get_allocation_size, "
    "should_split). At powers of two this adds nothing; at other shapes up to 1 MiB per tensor."
)

Term = tuple[str, int]


@dataclass(frozen=True)
class PeakTerm:
    """One term of the peak: tensors alive at the peak, what they hold and what the caching
    allocator counts for them (attnmem.calc.allocator: 512 B rounding, whole blocks not split)."""

    label: str
    tensor_bytes: int  # the bytes the tensors ask for
    counted_bytes: int  # what max_memory_allocated() counts: the allocator blocks they get
    tensors: int  # how many tensors

    @property
    def rounding_bytes(self) -> int:
        return self.counted_bytes - self.tensor_bytes


@dataclass(frozen=True)
class _A:
    """Allocate tensors (one step of an implementation's allocation sequence)."""

    label: str
    sizes: tuple[int, ...]
    key: str = ""  # a name, to free the tensors later; "" = alive until the end of the call


@dataclass(frozen=True)
class _F:
    """Free the tensors allocated under `key`."""

    key: str


Step = _A | _F


def _a(label: str, *sizes: int, key: str = "") -> _A:
    return _A(label, tuple(int(x) for x in sizes), key)


@dataclass(frozen=True)
class AttentionCall:
    """One attention call: the implementation and the shape, validated once when it is made.

    ``AttentionCall(impl, batch, heads, seq_len, head_dim, dtype, causal=False,
    backward=False, kv_heads=None)`` takes the arguments of `attention_peak_bytes` in the same
    order and refuses a bad one with ValueError naming the value and what is accepted (sizes
    from 1 to attnmem.calc.units' limits, kv_heads dividing heads, True/False flags, a dtype name, an
    implementation of IMPLEMENTATIONS that runs that dtype: IMPL_DTYPES). The dtype is kept
    under its canonical name ("float16" becomes "fp16"). The peak functions here, attnmem.calc.fit,
    attnmem.calc.sweep and attnmem.calc.context_parallel take it in place of the separate arguments and pass
    it down without checking it again; `with_seq_len` is the same call at another length (the
    searches' step), checking only the new length.

    The shape in the notation of the module docstring: b, h, h_kv, s, d; e bytes per input
    element; sizes of the tensors the implementations make (out_bytes, kv_bytes, sxs)."""

    impl: str
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    dtype: str
    causal: bool = False
    backward: bool = False
    kv_heads: int | None = None

    def __post_init__(self) -> None:
        # Checked in this order, each error naming its value: the sizes, kv_heads, the flags,
        # the dtype, the implementation, and whether the implementation runs the dtype.
        set_ = object.__setattr__
        set_(self, "batch", check_int("batch", self.batch, 1, MAX_BATCH))
        set_(self, "heads", h := check_int("heads", self.heads, 1, MAX_HEADS))
        set_(self, "seq_len", check_int("seq_len", self.seq_len, 1, MAX_SEQ_LEN))
        set_(self, "head_dim", check_int("head_dim", self.head_dim, 1, MAX_HEAD_DIM))
        if self.kv_heads is not None:
            h_kv = check_int("kv_heads", self.kv_heads, 1, h)
            if h % h_kv:
                raise ValueError(f"heads ({h}) must be a multiple of kv_heads, got "
                                 f"kv_heads={self.kv_heads!r}")
            set_(self, "kv_heads", h_kv)
        check_bool("causal", self.causal)
        check_bool("backward", self.backward)
        set_(self, "dtype", dtype_name(self.dtype))
        check_impl(self.impl)
        check_impl_dtype(self.impl, self.dtype)
        if not takes_head_dim(self.impl, self.head_dim):
            lo, hi = IMPL_HEAD_DIMS[self.impl]
            raise ValueError(f"{self.impl} takes head dims from {lo} to {hi}, got "
                             f"head_dim={self.head_dim}")
        self._letters()

    def with_seq_len(self, seq_len: int) -> AttentionCall:
        """The same call at seq_len tokens; only seq_len is checked (the rest already was)."""
        new = copy.copy(self)
        s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
        object.__setattr__(new, "seq_len", s)
        object.__setattr__(new, "s", s)
        return new

    # The shape in the module docstring's letters, b, h, h_kv, s, d and e (bytes per input
    # element: an int where whole, faster than a Fraction), are plain attributes set with the
    # fields (`_letters`): the models read them thousands of times in a search.
    b: int = field(init=False, repr=False, compare=False)
    h: int = field(init=False, repr=False, compare=False)
    h_kv: int = field(init=False, repr=False, compare=False)
    s: int = field(init=False, repr=False, compare=False)
    d: int = field(init=False, repr=False, compare=False)
    e: int | Fraction = field(init=False, repr=False, compare=False)

    def _letters(self) -> None:
        set_ = object.__setattr__
        set_(self, "b", self.batch)
        set_(self, "h", self.heads)
        set_(self, "h_kv", self.heads if self.kv_heads is None else self.kv_heads)
        set_(self, "s", self.seq_len)
        set_(self, "d", self.head_dim)
        e = dtype_bytes(self.dtype)
        set_(self, "e", int(e) if e.denominator == 1 else e)

    @property
    def n(self) -> int:  # score elements B·H·s²
        return self.b * self.h * self.s * self.s

    @property
    def rows(self) -> int:  # query rows B·H·s
        return self.b * self.h * self.s

    def rows_of(self, tokens: int) -> int:  # query rows of `tokens` tokens: B·H·tokens
        return self.b * self.h * tokens

    def kv_elements(self, tokens: int) -> int:  # one key (or value) block: B·H_kv·tokens·d
        return self.b * self.h_kv * tokens * self.d

    def out_bytes(self, e=None) -> int:  # one q/output-sized tensor
        return ceil_bytes(self.rows * self.d * (self.e if e is None else e))

    def kv_bytes(self, e=None) -> int:  # one key- or value-sized tensor (H_kv heads)
        return ceil_bytes(self.b * self.h_kv * self.s * self.d * (self.e if e is None else e))

    def sxs(self, e=None) -> int:  # one B·H·s×s tensor
        return ceil_bytes(self.n * (self.e if e is None else e))

    @property
    def gqa(self) -> bool:
        return self.h_kv != self.h


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _inputs(sh: AttentionCall) -> list[int]:
    """What exists before the call (the harness's procedure): q, k, v; with backward also dO."""
    sizes = [sh.out_bytes(), sh.kv_bytes(), sh.kv_bytes()]
    return sizes + ([sh.out_bytes()] if sh.backward else [])


def _naive(sh: AttentionCall, inplace: bool = False) -> list[Step]:
    """attnmem.measure.registry._naive, step by step: (q @ kᵀ) * scale allocates the product
    and then the scaled scores (the product is freed); masked_fill copies the scores (the old
    ones freed), masked_fill_ does not; softmax; probs @ v."""
    steps: list[Step] = []
    if sh.gqa:
        steps.append(_a("k expanded to H heads (repeat_interleave)", sh.out_bytes(), key="kx"))
        steps.append(_a("v expanded to H heads (repeat_interleave)", sh.out_bytes(), key="vx"))
    steps += [_a("Q·Kᵀ before the scale (s×s, freed once scaled)", sh.sxs(), key="qk"),
              _a("scores Q·Kᵀ·scale (s×s, input dtype)", sh.sxs(), key="scores"), _F("qk")]
    if sh.causal:
        steps.append(_a("causal mask (bool s×s, shared by batch and heads)", sh.s * sh.s))
        if not inplace:
            steps += [_a("masked scores (masked_fill's copy, s×s)", sh.sxs(), key="masked"),
                      _F("scores")]
    steps.append(_a("softmax probabilities (s×s, input dtype)" if not sh.backward else
                    "probabilities P kept for backward (s×s)", sh.sxs()))
    steps.append(_a("output", sh.out_bytes()))
    if not sh.backward:
        return steps
    # The forward's scores are not saved (softmax saves its output): freed when it returns.
    steps.append(_F("masked" if sh.causal and not inplace else "scores"))
    # Backward peak (softmax backward): saved probabilities P, dP = dO·Vᵀ, dS and the scaled
    # copy that feeds dQ = dS·K: four s×s tensors. Alive beside them (measured on an H200
    # with dO allocated before the call, data/attention_calls_h200.csv): the output (held by
    # the caller), dV = Pᵀ·dO (already computed, H heads) and, for GQA, the expanded K that
    # the matmul keeps for dQ (expanded V is freed once dV exists).
    steps.append(_a("dP = dO·Vᵀ (s×s)", sh.sxs()))
    steps.append(_a("dV = Pᵀ·dO (H heads)", sh.out_bytes()))
    if sh.gqa:
        steps.append(_F("vx"))
    steps.append(_a("dS, softmax backward (s×s)", sh.sxs()))
    steps.append(_a("dS scaled (s×s)", sh.sxs()))
    return steps


def _math(sh: AttentionCall) -> list[Step]:
    c = 4  # the math backend computes in fp32 (16-bit inputs are upcast)
    if sh.backward:
        # Measured: four fp32 s×s tensors and 14 bytes per q element beyond dO in 16-bit:
        # fp32 q, k, v (saved for the backward) and the 16-bit output held by the caller.
        return [_a("fp32 q, k, v saved for the backward", *[sh.out_bytes(c)] * 3),
                _a("output", ceil_bytes(sh.rows * sh.d * 2)),
                _a("four fp32 s×s tensors (P, dP, dS and a temporary)", *[sh.sxs(c)] * 4)]
    steps: list[Step] = [_a("fp32 copy of q", sh.out_bytes(c))]
    if sh.gqa:
        # Measured (bf16, d=64, H=32, H_kv=8): +2·B·H_kv·s·d·4 bytes: k and v are cast to
        # fp32 before enable_gqa's repeat to H heads, and those copies are still alive.
        steps.append(_a("fp32 k, v before expansion to H heads (GQA)", *[sh.kv_bytes(c)] * 2))
    steps.append(_a("fp32 k, v" + (" expanded to H heads" if sh.gqa else ""),
                    *[sh.out_bytes(c)] * 2))
    if sh.causal:
        steps.append(_a("causal mask as fp32 additive bias (s×s)", sh.s * sh.s * 4))
    steps += [_a("fp32 scores (s×s)", sh.sxs(c)),
              _a("bool 'row all -inf' test of safe softmax (s×s)", sh.n),
              # Measured on every reference row: + B·H·s + 512 bytes (a bool per row, the
              # reduction of the test above over each row, and a scalar).
              _a("bool per row of safe softmax (any over the row)", sh.rows),
              _a("a scalar of safe softmax (512 B block)", 1),
              _a("fp32 softmax (s×s)", sh.sxs(c)),
              _a("fp32 output", sh.out_bytes(c))]
    return steps


def _efficient(sh: AttentionCall) -> list[Step]:
    """PyTorch's memory-efficient backend (aten/src/ATen/native/transformers/cuda/
    attention.cu, attention_backward.cu): the output in (B, s, H, d); with grad the forward
    also writes the log-sum-exp, padded to a multiple of 32 rows (kAlignLSE); the backward
    makes the gradients, the row sums of dO·O, an fp32 dQ accumulator and (measured) a
    contiguous copy of dO. torch 2.11 has no enable_gqa path here: GQA runs on k, v
    expanded to H heads (repeat_interleave), so the kernel sees H heads everywhere."""
    steps: list[Step] = []
    if sh.gqa:
        steps.append(_a("k, v expanded to H heads (no enable_gqa path in this backend)",
                        sh.out_bytes(), sh.out_bytes()))
    steps.append(_a("output" if not sh.backward else "output (saved for backward)",
                    sh.out_bytes()))
    if not sh.backward:
        return steps
    steps.append(_a("log-sum-exp (fp32, rows padded to 32)",
                    sh.b * sh.h * _round_up(sh.s, 32) * 4))
    # Measured: +B·H·s·d·e at every s (900.1 vs 772 MiB at s=16384, fp16, d=128): the
    # backward copies dO into the kernel's (B, s, H, d) layout.
    steps.append(_a("dO copied to the kernel's layout", sh.out_bytes()))
    kvb = sh.out_bytes() if sh.gqa else sh.kv_bytes()
    steps.append(_a("dq", sh.out_bytes()))
    steps.append(_a("dk, dv" + (" of the expanded k, v (H heads)" if sh.gqa else ""), kvb, kvb))
    steps.append(_a("row sums of dO·O (fp32, one per row)", sh.rows * 4))
    # One fp32 workspace (attention_backward.cu: at::empty({p.workspace_size()}); kernel_backward.h
    # workspace_elements_gq: per (batch, head) ceil(s / kBlockSizeI) blocks of
    # GradQTempStorage, the block's dQ accumulator plus 4 floats): s padded to the block,
    # kBlockSizeI = 64 at d <= 64, 128 above (measured on every reference row: 16 B per block).
    bi = 64 if sh.d <= 64 else 128
    nblk = -(-sh.s // bi)
    steps.append(_a(f"fp32 workspace: dq accumulator, s rounded up to {bi}, + 16 B per block",
                    sh.b * sh.h * nblk * (bi * sh.d + 4) * 4))
    return steps


def _cudnn(sh: AttentionCall) -> list[Step]:
    """cuDNN fused attention (aten/src/ATen/native/cudnn/MHA.cpp): the output; with grad the
    forward keeps the fp32 softmax statistics (one per row); the backward the gradients and
    cuDNN's workspace (an fp32 dQ accumulator and the row sums of dO·O); with GQA dk, dv per
    query head before the group sum (measured)."""
    tiny = _a("three tiny CUDA tensors (measured: 3 blocks of 512 B on every reference row)",
              1, 1, 1)
    if not sh.backward:
        return [_a("output", sh.out_bytes()), tiny]
    steps: list[Step] = [
        _a("output (saved for backward)", sh.out_bytes()),
        _a("log-sum-exp (fp32, one per row)", sh.rows * 4),
        tiny,
        _a("dq", sh.out_bytes()),
        _a("dk, dv", sh.kv_bytes(), sh.kv_bytes()),
    ]
    if sh.gqa:
        steps.append(_a("dk, dv per query head before the sum over each group (GQA)",
                        sh.out_bytes(), sh.out_bytes()))
    steps.append(_a("row sums of dO·O (fp32, one per row)", sh.rows * 4))
    steps.append(_a("fp32 dq accumulator", sh.out_bytes(4)))
    return steps


#: Streaming multiprocessors of an H100/H200 SXM (cudaDeviceProp.multiProcessorCount), which
#: FlashAttention-2's split-KV heuristic reads.
FA2_NUM_SMS = 132


def fa2_num_splits(b: int, h: int, s_q: int, s_k: int, d: int, num_sms: int = FA2_NUM_SMS) -> int:
    """How many key/value splits FlashAttention-2's forward takes (flash_api.cpp
    set_params_splitkv, num_splits_heuristic): splits only when B·H·⌈s_q/64⌉ < 0.8 × 2 ×
    SMs; then the smallest eligible split count within 85% of the best wave efficiency."""
    block_n = 256 if d <= 64 else (128 if d <= 128 else 64)
    n_blocks = -(-s_k // block_n)
    bnm = b * h * -(-s_q // 64)
    sms = 2 * num_sms
    if bnm >= 0.8 * sms:
        return 1
    max_splits = min(128, sms, n_blocks)

    def eligible(n: int) -> bool:
        return n == 1 or -(-n_blocks // n) != -(-n_blocks // (n - 1))

    eff = []
    for n in range(1, max_splits + 1):
        if not eligible(n):
            eff.append(0.0)
            continue
        waves = bnm * n / sms
        eff.append(waves / math.ceil(waves))
    best = max(eff) if eff else 0.0
    for n in range(1, max_splits + 1):
        if eligible(n) and eff[n - 1] >= 0.85 * best:
            return n
    return 1


def _flash(sh: AttentionCall) -> list[Step]:
    """FlashAttention-2 as PyTorch ships it (aten/src/ATen/native/transformers/cuda/
    flash_attn/flash_api.cpp mha_fwd, mha_bwd; attention_backward.cu
    _flash_attention_backward): the forward makes out, softmax_lse (B, H, s) fp32 and two
    tiny CUDA tensors (rng_state, _unused: one 512 B block each); the backward makes
    contiguous copies of dO and of out (both are transposed views), dq, dk, dv,
    softmax_d (B, H, s rounded up to 128) fp32, dq_accum (B, s rounded up to 128, H, d
    rounded up to 32) fp32 and, with GQA, dk_expanded, dv_expanded (B, s, H, d) before the
    group sum."""
    steps: list[Step] = [
        _a("output" if not sh.backward else "output (saved for backward)", sh.out_bytes()),
        _a("log-sum-exp (fp32, one per row)", sh.rows * 4),
    ]
    splits = fa2_num_splits(sh.b, sh.h, sh.s, sh.s, sh.d)
    if splits > 1:
        d32 = _round_up(sh.d, 32)
        steps.append(_a(f"split-KV partial log-sum-exp and output ({splits} splits, fp32; "
                        "freed after the forward)", splits * sh.rows * 4,
                        splits * sh.rows * d32 * 4, key="splitkv"))
    steps.append(_a("rng_state and _unused (tiny CUDA tensors)", 16, 8))
    if splits > 1:
        steps.append(_F("splitkv"))
    if not sh.backward:
        return steps
    s128, d32 = _round_up(sh.s, 128), _round_up(sh.d, 32)
    steps += [
        _a("contiguous copies of dO and of the output (transposed views)",
           sh.out_bytes(), sh.out_bytes()),
        _a("dq", sh.out_bytes()),
        _a("dk, dv", sh.kv_bytes(), sh.kv_bytes()),
        _a("softmax_d: row sums of dO·O (fp32, s rounded up to 128)", sh.b * sh.h * s128 * 4),
        _a("dq_accum (fp32, s rounded up to 128, d to 32)", sh.b * s128 * sh.h * d32 * 4),
    ]
    if sh.gqa:
        steps.append(_a("dk, dv per query head before the sum over each group (GQA)",
                        sh.out_bytes(), sh.out_bytes()))
    return steps


def _triton(sh: AttentionCall) -> list[Step]:
    """Our kernel (attnmem/kernels/flash/fwd.py attention_forward, bwd.py attention_backward), in its
    allocation order: o, lse2; delta, dk, dv, the split's partial dk, dv, the fp32 dQ buffer
    (or dq), and dq cast from the buffer."""
    steps: list[Step] = [
        _a("output" if not sh.backward else "output (saved for backward)", sh.out_bytes()),
        _a("log-sum-exp (fp32, one per row)", sh.rows * 4),
    ]
    if not sh.backward:
        return steps
    steps += [_a("row sums of dO·O (fp32, one per row)", sh.rows * 4),
              _a("dk, dv", sh.kv_bytes(), sh.kv_bytes())]
    split = dispatch.kv_split(sh.b, sh.h, sh.h_kv, sh.s, sh.s, sh.d, dtype_bytes(sh.dtype))
    if split > 1:
        steps.append(_a(f"partial dk, dv of the GQA group split over {split} programs "
                        "(B·H_kv·⌈s/128⌉ < 1,024)", split * sh.kv_bytes(), split * sh.kv_bytes()))
    e = dtype_bytes(sh.dtype)
    if dispatch.sm90_region(sh.b, sh.h_kv, sh.s, sh.s, sh.d, e):
        rows = dispatch.sm90_dq_rows(sh.s, sh.d)
        steps.append(_a(f"fp32 dq buffer of the Hopper backward (s rounded up to "
                        f"{dispatch.SM90_QUERY_BLOCK[sh.d]}: s ≥ 4,096 with B·H_kv·⌈s/128⌉ ≥ 256)",
                        ceil_bytes(sh.b * sh.h * rows * sh.d * 4)))
    elif dispatch.atomic_dq(sh.b, sh.h, sh.h_kv, sh.s, sh.s, sh.d, e):
        steps.append(_a("fp32 dq buffer of the atomic-dQ backward (d = 64 or 128: s > 2,048 "
                        "with B·H_kv·S·⌈s/d⌉ ≥ 2,048)", sh.out_bytes(4)))
    steps.append(_a("dq", sh.out_bytes()))
    return steps


def fa4_tiles_sm90(head_dim: int, causal: bool) -> tuple[int, int]:
    """FlashAttention-4's backward tile (m_block_size, n_block_size) on Hopper:
    flash_attn/cute/interface.py `_tile_size_bwd_sm90` (non-local attention)."""
    if head_dim <= 64:
        return 128, 128
    if head_dim <= 96:
        return 64, 128
    if head_dim <= 128:
        return (64 if causal else 80), 128
    if head_dim <= 192:
        return 64, 96
    return 64, 64


def _fa4(sh: AttentionCall) -> list[Step]:
    """FlashAttention-4 (flash_attn/cute/interface.py, `_flash_attn_fwd`, `_flash_attn_bwd`,
    on sm90): the forward makes out (B, s, H, d) and, only when a gradient is needed, lse
    (B, H, s) fp32; the backward makes dq, dk, dv (empty_like), dq_accum (B, H, s_q rounded
    up to m_block_size times d rounded up to 32) fp32, dpsum and lse_log2 (B, H, s_q
    rounded) fp32 and, with GQA, dk_accum, dv_accum (B, H_kv, s_k rounded up to
    n_block_size times d rounded up to 32) fp32 (zeros)."""
    if not sh.backward:
        return [_a("output", sh.out_bytes())]
    m_blk, n_blk = fa4_tiles_sm90(sh.d, sh.causal)
    sq, sk, d32 = _round_up(sh.s, m_blk), _round_up(sh.s, n_blk), _round_up(sh.d, 32)
    steps: list[Step] = [
        _a("output (saved for backward)", sh.out_bytes()),
        _a("log-sum-exp (fp32, one per row)", sh.rows * 4),
        _a("dq", sh.out_bytes()),
        _a("dk, dv", sh.kv_bytes(), sh.kv_bytes()),
        _a(f"dq_accum (fp32, s rounded up to {m_blk}, d to 32)", sh.b * sh.h * sq * d32 * 4),
        _a(f"dpsum and lse_log2 (fp32, s rounded up to {m_blk})",
           sh.b * sh.h * sq * 4, sh.b * sh.h * sq * 4),
    ]
    if sh.gqa:
        steps.append(_a(f"dk_accum, dv_accum of the GQA groups (fp32, s rounded up to {n_blk})",
                        sh.b * sh.h_kv * sk * d32 * 4, sh.b * sh.h_kv * sk * d32 * 4))
    return steps


_MODELS: dict[str, Callable[[AttentionCall], list[Step]]] = {
    "naive": _naive,
    "naive_inplace": lambda sh: _naive(sh, inplace=True),
    "sdpa_math": _math,
    "sdpa_efficient": _efficient,
    "sdpa_flash": _flash,
    "sdpa_cudnn": _cudnn,
    "triton": _triton,
    "fa4": _fa4,
}

#: Implementations whose allocation sequence calc knows step by step, temporaries included,
#: so that memory_reserved() is predictable too (impl -> (forward, forward+backward)); the
#: others make temporaries that the model does not list, and their reservation depends on
#: how the allocator re-cuts them: the math backend, the eager backward, cuDNN's backward
#: (measured: one more 2 MiB small segment from s = 2,048 on, a 20 MiB one below) and the
#: memory-efficient backward with GQA (measured 20 MiB below the replay at s = 1,024).
RESERVED_PREDICTED: dict[str, tuple[bool, bool]] = {
    "naive": (True, False),
    "naive_inplace": (True, False),
    "sdpa_math": (False, False),
    "sdpa_efficient": (True, True),
    "sdpa_flash": (True, True),
    "sdpa_cudnn": (True, False),
    "triton": (True, True),
    "fa4": (True, True),
}


def reserved_predicted(impl: str, backward: bool, gqa: bool = False) -> bool:
    """Whether attention_reserved_bytes predicts this call (RESERVED_PREDICTED)."""
    if impl == "sdpa_efficient" and backward and gqa:
        return False
    return RESERVED_PREDICTED[impl][1 if backward else 0]


@dataclass(frozen=True)
class _ReplayResult:
    terms: tuple[PeakTerm, ...]
    peak: int
    reserved: int


#: The input dtypes each implementation runs (the others are refused, not priced): PyTorch's
#: SDPA flash and cuDNN backends take fp16/bf16 only (aten/src/ATen/native/transformers/cuda/
#: sdp_utils.cpp, check_flash_attention_datatype / check_cudnn_tensor_shapes' dtype check),
#: the memory-efficient and math backends and eager matmuls fp32 too (tf32 is fp32 storage
#: with TF32 matmuls), FlashAttention-4 fp16/bf16 (flash_attn/cute/interface.py;
#: attnmem.measure.registry.fa4_shape_reason), ours fp16/bf16/fp32 (attnmem/kernels/flash/api.py).
#: No implementation here runs attention on fp8 or integer inputs.
IMPL_DTYPES: dict[str, tuple[str, ...]] = {
    "naive": ("fp32", "tf32", "bf16", "fp16"),
    "naive_inplace": ("fp32", "tf32", "bf16", "fp16"),
    "sdpa_math": ("fp32", "tf32", "bf16", "fp16"),
    "sdpa_efficient": ("fp32", "tf32", "bf16", "fp16"),
    "sdpa_flash": ("bf16", "fp16"),
    "sdpa_cudnn": ("bf16", "fp16"),
    "triton": ("fp32", "tf32", "bf16", "fp16"),
    "fa4": ("bf16", "fp16"),
}


#: Head dims an implementation takes, where calc knows a bound: the bundled kernel's own
#: check (attnmem/kernels/flash/api.py, attnmem.calc.dispatch.HEAD_DIM_MIN/MAX). The others are sized at any d.
IMPL_HEAD_DIMS: dict[str, tuple[int, int]] = {
    "triton": (dispatch.HEAD_DIM_MIN, dispatch.HEAD_DIM_MAX),
}


def takes_head_dim(impl: str, head_dim: int) -> bool:
    """Whether ``impl`` takes this head dim (`IMPL_HEAD_DIMS`; no bound listed: yes)."""
    lo, hi = IMPL_HEAD_DIMS.get(impl, (1, head_dim))
    return lo <= head_dim <= hi


class DtypeNotRun(ValueError):
    """An implementation was given an input dtype it does not run (`check_impl_dtype`)."""


def check_impl_dtype(impl: str, dtype: str) -> None:
    """Refuse (DtypeNotRun, a ValueError naming both and what is accepted) an input dtype the
    implementation does not run (`IMPL_DTYPES`)."""
    if dtype not in IMPL_DTYPES[impl]:
        raise DtypeNotRun(f"{impl} does not run {dtype} inputs; accepted dtypes for {impl}: "
                         f"{', '.join(IMPL_DTYPES[impl])}")


@lru_cache(maxsize=4096)
def _replay(call: AttentionCall, expandable: bool, cached_free: int = 0) -> _ReplayResult:
    """Run the call's allocation sequence through attnmem.calc.allocator under the harness's
    procedure: inputs allocated, cache emptied, peaks reset, then the call. The peak terms
    are the tensors alive when "allocated" is highest. `cached_free`: a free block of that
    many bytes that the cache still holds (pinned, so empty_cache() keeps it)."""
    return _replay_steps(_inputs(call), _MODELS[call.impl](call), expandable, cached_free)


def _replay_steps(inputs: list[int], steps: list[Step], expandable: bool,
                  cached_free: int = 0) -> _ReplayResult:
    """`_replay` of an allocation sequence ``steps`` after the tensors ``inputs`` (bytes)."""
    a = CachingAllocator(expandable)
    if cached_free and not expandable:
        # Free bytes the cache held before the call beyond the free tails of the inputs' own
        # segments: one pinned block, there before the inputs, so the large inputs were cut
        # from it (best fit): it held that much more then.
        fresh = CachingAllocator()
        for n in inputs:
            fresh.malloc(n)
        held = cached_free - (fresh.reserved - fresh.allocated)
        if held > K_SMALL_SIZE:
            a.hold_cached_block(held + sum(round_size(n) for n in inputs
                                           if not is_small(round_size(n))))
    for n in inputs:
        a.malloc(n)
    a.empty_cache()
    a.reset_peak()
    reserved_before = a.reserved
    rp = TensorReplay(a)
    for i, step in enumerate(steps):
        if type(step) is _F:
            rp.free(step.key)
        else:  # an unnamed step stays alive to the end: a key no _F names
            rp.alloc(step.key or f"#{i}", step.label, *step.sizes)
    terms = tuple(PeakTerm(label, n, counted, k) for label, n, counted, k in rp.at_peak)
    return _ReplayResult(terms, rp.peak, a.peak_reserved - reserved_before)


def check_impl(impl: str) -> str:
    """Return impl if it is a known implementation name; else raise ValueError listing them."""
    if not isinstance(impl, str) or impl not in _MODELS:
        raise ValueError(
            f"unknown implementation {impl!r}; accepted: {', '.join(IMPLEMENTATIONS)}"
        )
    return impl


def call_of(impl, batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads
            ) -> AttentionCall:
    """The AttentionCall a public function was given (as `impl`, with no other shape
    argument), or the one its arguments make; made calls are remembered for plain hashable
    arguments (the searches and the training and inference models ask often)."""
    if isinstance(impl, AttentionCall):
        extra = {k: v for k, v in (("batch", batch), ("heads", heads), ("seq_len", seq_len),
                                   ("head_dim", head_dim), ("dtype", dtype),
                                   ("kv_heads", kv_heads)) if v is not None}
        extra.update({k: v for k, v in (("causal", causal), ("backward", backward))
                      if v is not False})
        if extra:
            raise ValueError(f"give either an AttentionCall or impl, batch, heads, seq_len, "
                             f"head_dim, dtype, causal, backward, kv_heads, not both: got "
                             f"{impl!r} and {extra!r:.200}")
        return impl
    args = (impl, batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads)
    try:
        # bool and int compare equal as cache keys (True == 1): keep their types in the key
        return _call_lru(tuple(type(x) for x in args), *args)
    except TypeError:  # unhashable: validate (and refuse) the long way
        return AttentionCall(*args)


@lru_cache(maxsize=65536)
def _call_lru(_types, *args) -> AttentionCall:
    return AttentionCall(*args)


def _check_free(n: object) -> int:
    return check_int("cached_free_bytes", n, 0, 1 << 50)


def _check_expandable(expandable: object) -> bool:
    check_bool("expandable", expandable)
    return bool(expandable)


def attention_peak_breakdown(
    impl: str | AttentionCall,
    batch: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    causal: bool = False,
    backward: bool = False,
    kv_heads: int | None = None,
    *,
    expandable: bool = False,
    cached_free_bytes: int = 0,
) -> list[PeakTerm]:
    """The tensors alive at the peak of one call, grouped as terms, each with its tensor
    bytes and the bytes the caching allocator counts for it (attnmem.calc.allocator); the counted
    bytes sum to attention_peak_bytes. `expandable`: PYTORCH_CUDA_ALLOC_CONF=
    expandable_segments:True (blocks always split: only the 512 B rounding remains).
    `cached_free_bytes`: what the cache holds free just before the call
    (memory_reserved() - memory_allocated()); 0 under the harness's procedure (see
    attention_peak_bytes). `impl` may be an AttentionCall given alone."""
    call = call_of(impl, batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads)
    return list(_replay(call, _check_expandable(expandable),
                        _check_free(cached_free_bytes)).terms)


def attention_peak_terms(
    impl: str | AttentionCall,
    batch: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    causal: bool = False,
    backward: bool = False,
    kv_heads: int | None = None,
    *,
    expandable: bool = False,
    cached_free_bytes: int = 0,
) -> list[tuple[str, int]]:
    """The terms (label, bytes) whose sum is attention_peak_bytes, for tables and tooltips.
    Bytes are what the allocator counts; a label says when that is more than the tensors
    hold ("+N B allocator rounding"). `impl` may be an AttentionCall given alone."""
    out = []
    call = call_of(impl, batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads)
    for t in attention_peak_breakdown(call, expandable=expandable,
                                      cached_free_bytes=cached_free_bytes):
        label = t.label
        if t.rounding_bytes:
            label += f" (+{t.rounding_bytes:,} B allocator rounding)"
        out.append((label, t.counted_bytes))
    return out


def attention_peak_bytes(
    impl: str | AttentionCall,
    batch: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    causal: bool = False,
    backward: bool = False,
    kv_heads: int | None = None,
    *,
    expandable: bool = False,
    cached_free_bytes: int = 0,
) -> int:
    """Predicted extra peak bytes of one attention call of `impl`, as
    torch.cuda.max_memory_allocated() counts them (see the module docstring).

    The tensors, per implementation (N = B·H·s², O = B·H·s·d·e, LSE = B·H·s·4, mask = s²
    bytes), each then counted as the caching allocator's block (attnmem.calc.allocator: rounded up
    to 512 B; a block of a 2 MiB-rounded segment that would leave at most 1 MiB is counted
    whole; c10/cuda/CUDACachingAllocator.cpp round_size, get_allocation_size, should_split):
    - naive, naive_inplace: forward 2·N·e + O (+ mask if causal), GQA + 2·O for the
      expanded k and v; forward+backward 4·N·e + 2·O (output and dV) (+ mask), GQA + O
      (expanded k kept for dQ).
    - sdpa_math (fp32 compute): forward 9·N + 4·B·H·s·d·4 (+ 4·s² if causal; GQA + fp32
      k, v at H_kv heads); forward+backward 16·N + 14·B·H·s·d.
    - sdpa_cudnn: forward O; forward+backward O + dq + dk + dv + 2·LSE + fp32 dq
      (B·H·s·d·4), GQA + 2·O (dk, dv per query head).
    - sdpa_efficient: as cudnn plus a copy of dO (O) in the backward, its LSE rows padded
      to 32; GQA runs on expanded k, v: + 2·O in both directions, and its dk, dv have H heads.
    - sdpa_flash: forward O + LSE (+ two 512 B blocks); forward+backward O + LSE + copies
      of dO and O (2·O) + dq + dk + dv + fp32 softmax_d and dq_accum with s rounded up to
      128 (flash_api.cpp mha_bwd), GQA + 2·O.
    - triton (ours): forward O + LSE; forward+backward O + dq + dk + dv + 2·LSE, + fp32 dq
      (B·H·s·d·4) for 16-bit inputs at d = 64 or 128 with s > 2,048 and B·H_kv·S·⌈s/d⌉ ≥
      2,048, where its backward adds dQ with atomics (attnmem/kernels/flash/bwd.py); in the Hopper
      region (`attnmem.calc.dispatch.sm90_region`) that buffer holds s rounded up to the Gluon
      backward's query block (`attnmem.calc.dispatch.sm90_dq_rows`: 64 at d = 128, 128 at d = 64), + partial
      dk, dv 2·S·B·H_kv·s·d·e where GQA splits each group over S > 1 programs
      (`attnmem.calc.dispatch.kv_split`).
    - fa4 (FlashAttention-4, sm90): forward O; forward+backward O + LSE + dq + dk + dv +
      fp32 dq_accum, dpsum, lse_log2 with s rounded up to the backward's m_block_size
      (`fa4_tiles_sm90`), GQA + fp32 dk_accum, dv_accum (s rounded up to n_block_size).
    An input dtype the implementation does not run is refused (ValueError; `IMPL_DTYPES`).
    `expandable=True` predicts PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
    `cached_free_bytes`: free bytes the caching allocator still holds just before the call,
    memory_reserved() - memory_allocated() (the harness's reserved_bytes -
    reserved_extra_bytes - before_bytes). The harness's procedure empties the cache, so the
    default is 0; but empty_cache() cannot release a segment that a long-lived block pins
    (a cuBLAS workspace created inside a freed s×s segment does), and the call's tensors are
    then cut from that free block: counted at their 512 B-rounded size, not as whole
    segments. Modelled as one such block, there before the inputs.
    The call may be given as one AttentionCall in place of impl ... kv_heads
    (``attention_peak_bytes(AttentionCall("triton", 1, 32, 8192, 128, "bf16"))``).
    Returns whole bytes.
    """
    call = call_of(impl, batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads)
    return _replay(call, _check_expandable(expandable), _check_free(cached_free_bytes)).peak


def attention_reserved_bytes(
    impl: str | AttentionCall,
    batch: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    causal: bool = False,
    backward: bool = False,
    kv_heads: int | None = None,
    *,
    expandable: bool = False,
    cached_free_bytes: int = 0,
) -> int | None:
    """Predicted growth of torch.cuda.memory_reserved() during one call (the harness's
    reserved_extra_bytes: max_memory_reserved() during the call minus memory_reserved()
    before it): the segments cudaMalloc'ed for the call's tensors, temporaries included
    (attnmem.calc.allocator: get_allocation_size; freed blocks are cached, not returned, so the
    reservation only grows during a call). Deterministic under the harness's procedure
    because the cache is emptied before the call: only the segments holding live inputs remain
    (their free tails can serve the call). None where calc does not know every temporary
    (`reserved_predicted`: the math backend, the eager backward, cuDNN's backward, the
    memory-efficient backward with GQA). Assumes no cudaMalloc fails
    (near out of memory the allocator frees cached blocks and retries). With
    `expandable=True` the reservation grows in 20 MiB pages (2 MiB for requests of at most
    1 MiB) of one segment, assumed to hold only the inputs before the call: an
    approximation, since other live blocks (cuBLAS workspaces) share that segment (measured:
    exact on 25 of 35 rows, within one 20 MiB page on 34).
    nvidia-smi shows this plus the CUDA context and any memory outside PyTorch's allocator.
    `impl` may be an AttentionCall given alone.
    """
    call = call_of(impl, batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads)
    ok = reserved_predicted(call.impl, call.backward, call.gqa)
    expandable = _check_expandable(expandable)
    free = _check_free(cached_free_bytes)
    return _replay(call, expandable, free).reserved if ok else None


def attention_flops(
    batch: int, heads: int, seq_len: int, head_dim: int, causal: bool = False,
    backward: bool = False,
) -> int:
    """FLOPs of one attention call: forward 4·B·H·s²·d (two matmuls of 2·s²·d each per head),
    half of that when causal; forward+backward 3.5 × forward (the backward's five matmuls are
    2.5 × the forward's two). Convention of FlashAttention-2 (Dao 2023, arXiv 2307.08691, sec. 4),
    which the speed benchmark and the harness use too.
    """
    b = check_int("batch", batch, 1, MAX_BATCH)
    h = check_int("heads", heads, 1, MAX_HEADS)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    d = check_int("head_dim", head_dim, 1, MAX_HEAD_DIM)
    check_bool("causal", causal)
    check_bool("backward", backward)
    fwd2 = 8 * b * h * s * s * d  # twice the forward, so that halving stays exact
    if causal:
        fwd2 //= 2
    return fwd2 * 7 // 4 if backward else fwd2 // 2


def _varlen_shape(heads, seq_lens, head_dim, dtype, backward, kv_heads
                  ) -> tuple[AttentionCall, list[int]]:
    """(the shape of one batch of the packed total, the checked lengths)."""
    if isinstance(seq_lens, (str, bytes)) or not hasattr(seq_lens, "__iter__"):
        raise ValueError(f"seq_lens must be a list of sequence lengths (ints >= 1), got "
                         f"{seq_lens!r}")
    lens = [check_int("seq_lens[i]", n, 1, MAX_SEQ_LEN) for n in seq_lens]
    if not lens:
        raise ValueError("seq_lens must hold at least one sequence length, got none")
    total = sum(lens)
    if total > MAX_SEQ_LEN:
        raise ValueError(f"the packed total of seq_lens must be at most {MAX_SEQ_LEN:,} tokens, "
                         f"got {total:,}")
    return AttentionCall("triton", 1, heads, total, head_dim, dtype, False, backward,
                         kv_heads), lens


def _check_window(window: object) -> int | None:
    if window is None:
        return None
    return check_int("window", window, 1, MAX_SEQ_LEN)


def _triton_varlen(sh: AttentionCall, lens: list[int], window: int | None) -> list[Step]:
    """Our kernel on packed sequences, in allocation order: o, lse2 (attnmem/kernels/flash/fwd.py
    packed_forward, fwd_sm90.py attention_forward_sm90_packed: the same outputs); then the
    backward: where attnmem.calc.dispatch.sm90_packed picks the Hopper one (attnmem/kernels/flash/bwd_sm90.py,
    attention_backward_sm90_packed), lse2 and delta copied into padded rows (2·H·P fp32, P =
    attnmem.calc.dispatch.sm90_packed_pad_rows), dk, dv, the fp32 dq buffer of the padded rows
    (H·P·d fp32) and dq; else the portable two-kernel one (bwd.py packed_backward): delta,
    dk, dv, dq. No GQA partial sums on either."""
    steps: list[Step] = [
        _a("output" if not sh.backward else "output (saved for backward)", sh.out_bytes()),
        _a("log-sum-exp (fp32, one per packed row)", sh.rows * 4),
    ]
    if not sh.backward:
        return steps
    n = len(lens)
    if dispatch.sm90_packed(n, sh.h, sh.h_kv, max(lens), sh.s, sh.d, dtype_bytes(sh.dtype),
                            window):
        rows = dispatch.sm90_packed_pad_rows(sh.s, n, sh.d)
        bm = dispatch.SM90_QUERY_BLOCK[sh.d]
        pad = f"T + {n}·{bm} rounded up to {bm}: {rows:,}"
        steps += [_a(f"row sums of dO·O and log-sum-exp copied into padded rows "
                     f"(fp32, 2·H·({pad}))", 2 * sh.h * rows * 4),
                  _a("dk, dv", sh.kv_bytes(), sh.kv_bytes()),
                  _a(f"fp32 dq buffer of the Hopper backward (padded rows: {pad})",
                     sh.h * rows * sh.d * 4),
                  _a("dq", sh.out_bytes())]
    else:
        steps += [_a("row sums of dO·O (fp32, one per packed row)", sh.rows * 4),
                  _a("dk, dv", sh.kv_bytes(), sh.kv_bytes()),
                  _a("dq", sh.out_bytes())]
    return steps


def varlen_peak_breakdown(
    heads: int,
    seq_lens: list[int],
    head_dim: int,
    dtype: str,
    backward: bool = False,
    kv_heads: int | None = None,
    *,
    expandable: bool = False,
    window: int | None = None,
) -> list[PeakTerm]:
    """The tensors alive at the peak of one packed-sequence call of our kernel
    (`varlen_peak_bytes`), as `attention_peak_breakdown` gives them for a dense call."""
    sh, lens = _varlen_shape(heads, seq_lens, head_dim, dtype, backward, kv_heads)
    return list(_replay_steps(_inputs(sh), _triton_varlen(sh, lens, _check_window(window)),
                              _check_expandable(expandable)).terms)


def varlen_peak_bytes(
    heads: int,
    seq_lens: list[int],
    head_dim: int,
    dtype: str,
    backward: bool = False,
    kv_heads: int | None = None,
    *,
    expandable: bool = False,
    window: int | None = None,
) -> int:
    """Predicted extra peak bytes of one call of our kernel on packed sequences
    (`attnmem.kernels.flash_attention(q, k, v, ..., cu_seqlens=..., window=...)`: several sequences of
    lengths ``seq_lens`` concatenated into one batch of T = sum(seq_lens) rows, attention
    inside each sequence), as torch.cuda.max_memory_allocated() counts them with q (1, H, T,
    d), k, v (1, H_kv, T, d) (and dO) allocated before the call (the module docstring's
    procedure).

    The tensors (e bytes per element, n sequences): forward O (H·T·d·e) and one fp32
    log-sum-exp per packed row (H·T·4), whichever forward runs; forward + backward also dq,
    dk, dv (H·T·d·e + 2·H_kv·T·d·e) and:
    - where attnmem.calc.dispatch.sm90_packed picks the Hopper backward (16-bit, d = 64 or 128, no
      ``window`` shorter than the longest sequence; attnmem/kernels/flash/bwd_sm90.py,
      attention_backward_sm90_packed): the log-sum-exp and the row sums of dO·O copied into
      P padded rows per head (2·H·P·4) and an fp32 dq buffer of those rows (H·P·d·4), P = T +
      n·BLOCK_M rounded up to BLOCK_M (attnmem.calc.dispatch.sm90_packed_pad_rows: FlashAttention-3's
      padded offsets, Shah et al. 2024, arXiv 2407.08608; BLOCK_M 64 at d = 128, 128 at d =
      64), so the peak depends on the number of sequences too;
    - else (the portable two-kernel backward, attnmem/kernels/flash/bwd.py packed_backward) the row
      sums of dO·O (H·T·4), no buffer.
    No GQA partial sums on either, and the causal mask changes nothing. On a GPU where the
    Hopper kernel cannot run the portable backward runs and allocates less than predicted
    (attnmem.calc.dispatch.sm90_packed). Each tensor is counted as the caching allocator's block
    (attnmem.calc.allocator, `ALLOCATOR_NOTE`). The int32 cu_seqlens exist before the call and are not
    counted. Sources: FlashAttention keeps O and the log-sum-exp only (Dao et al. 2022, arXiv
    2205.14135, sec. 3.1); the packed layout is FlashAttention-2's varlen interface
    (cumulative sequence starts, Dao 2023, arXiv 2307.08691).
    """
    sh, lens = _varlen_shape(heads, seq_lens, head_dim, dtype, backward, kv_heads)
    return _replay_steps(_inputs(sh), _triton_varlen(sh, lens, _check_window(window)),
                         _check_expandable(expandable)).peak
