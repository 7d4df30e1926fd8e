"""Predicted extra peak memory of one attention call, per implementation.

What is predicted is what the measurement harness measures (shared/DESIGN.md, "Measurement"):
`max_memory_allocated()` during the call minus `memory_allocated()` just before it. Forward:
q, k, v exist before; the output is computed under no_grad. Forward + backward: q, k, v (with
requires_grad) and the upstream gradient dO exist before; the call runs the forward and
backward(dO), so q.grad, k.grad, v.grad count.

Notation: B batch, H query heads, H_kv key/value heads, s sequence length (queries = keys),
d head dim, e bytes per element of the inputs. N = B·H·s² score elements; O = B·H·s·d·e bytes
(one output-sized tensor); LSE = B·H·s·4 bytes (one fp32 value per row).

Each formula is derived from what the implementation allocates and checked against peaks
measured on an NVIDIA H200 (torch 2.11, shared/anchors/h200-sdpa-naive-tutorial-2026-11-30.csv;
fp16, B=1, H=32, d=128): every row with s >= 1024 is reproduced within 2% (tests/test_peak.py).
Sources for the algorithms: eager attention, Vaswani et al. 2017 (arXiv 1706.03762) eq. 1;
FlashAttention keeps O and the log-sum-exp only, Dao et al. 2022 (arXiv 2205.14135) sec. 3.1;
FlashAttention-2's backward with an fp32 dq accumulator, Dao 2023 (arXiv 2307.08691) sec. 3.2;
memory-efficient attention, Rabe & Staats 2021 (arXiv 2112.05682), as in xFormers/PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from calc import dispatch
from calc.units import (
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
)

IMPL_LABELS: dict[str, str] = {
    "naive": "Eager (masked_fill)",
    "naive_inplace": "Eager (masked_fill_)",
    "sdpa_math": "SDPA math",
    "sdpa_efficient": "SDPA memory-efficient",
    "sdpa_flash": "SDPA FlashAttention-2",
    "sdpa_cudnn": "SDPA cuDNN",
    "triton": "Our Triton kernel",
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
        "and a bool mask from its 'safe softmax' (9 bytes per score), plus fp32 copies of "
        "q, k, v and the output; causal adds an fp32 s×s mask. For fp32 inputs the same "
        "terms are assumed (not measured)."
    ),
    "sdpa_efficient": (
        "Fused (Rabe & Staats): forward keeps only the output; the backward adds the "
        "gradients, an fp32 dq accumulator, the log-sum-exp, the row sums of dO·O and a copy "
        "of dO in the kernel's layout (measured). This backend has no enable_gqa path in "
        "torch 2.11: GQA runs on k and v expanded to H heads, which costs their copies and "
        "H-head gradients. Internal workspaces beyond these are not modelled; the measured "
        "error shows them."
    ),
    "sdpa_flash": (
        "FlashAttention-2: the forward always writes the fp32 log-sum-exp; the backward "
        "adds the gradients and two fp32 output-sized accumulators (dq and a padded "
        "workspace). With GQA the backward computes dk, dv per query head and then sums "
        "each group (both alive: GQA's extra peak is above MHA's). Rounding of s to "
        "multiples of 128 inside the kernel is not modelled, nor the split-KV workspace "
        "that the forward takes for short sequences (measured at s=256, d=128: 10.1 MiB "
        "against 2.0 MiB modelled; none from s=1,024 on)."
    ),
    "sdpa_cudnn": (
        "cuDNN fused attention: output; in the backward the gradients, an fp32 dq "
        "accumulator, log-sum-exp and row sums (no dO copy, unlike the memory-efficient "
        "backend); with GQA, dk and dv per query head before the group sum. cuDNN's "
        "workspace, when it asks for one, is not modelled (seen: +1 MiB at s=8192)."
    ),
    "triton": (
        "Our kernel: the forward writes the output and one fp32 log-sum-exp per row; the "
        "backward adds the row sums of dO·O (fp32) and the three gradients, and for fp16/bf16 "
        "at d = 64 or 128 with s above 2,048 (and B·H_kv·S·⌈s/d⌉ ≥ 2,048) an fp32 dq buffer "
        "that its dK/dV kernel adds into with atomics (5 matrix products instead of 7; "
        "kernels/flash_attn_bwd.py). With GQA on a small grid (B·H_kv·⌈s/128⌉ < 1,024) the "
        "backward splits each group of query heads over S programs, whose partial dk, dv "
        "(2·S·B·H_kv·s·d·e) are summed at the end. Not modelled: under "
        "torch.use_deterministic_algorithms(True) the kernel keeps its deterministic "
        "two-kernel backward and that buffer is not allocated."
    ),
}

Term = tuple[str, int]


@dataclass(frozen=True)
class _Shape:
    """Validated call shape, all sizes in elements except e (bytes per element)."""

    b: int
    h: int
    h_kv: int
    s: int
    d: int
    dtype: str
    causal: bool
    backward: bool

    @property
    def e(self):  # bytes per input element (Fraction)
        return dtype_bytes(self.dtype)

    @property
    def n(self) -> int:  # score elements B·H·s²
        return self.b * self.h * self.s * self.s

    @property
    def rows(self) -> int:  # query rows B·H·s
        return self.b * self.h * self.s

    def out_bytes(self, e=None) -> int:  # one q/output-sized tensor
        return ceil_bytes(self.rows * self.d * (self.e if e is None else e))

    def kv_bytes(self, e=None) -> int:  # one key- or value-sized tensor (H_kv heads)
        return ceil_bytes(self.b * self.h_kv * self.s * self.d * (self.e if e is None else e))


def _naive(sh: _Shape) -> list[Term]:
    e = sh.e
    gqa = sh.h_kv != sh.h
    terms: list[Term] = []
    if not sh.backward:
        if gqa:
            terms.append(("k, v expanded to H heads (repeat_interleave)", 2 * sh.out_bytes()))
        terms.append(("scores Q·Kᵀ (s×s, input dtype)", ceil_bytes(sh.n * e)))
        terms.append(("softmax probabilities (s×s, input dtype)", ceil_bytes(sh.n * e)))
        terms.append(("output", sh.out_bytes()))
    else:
        # Backward peak (softmax backward): saved probabilities P, dP = dO·Vᵀ, dS and the
        # scaled copy that feeds dQ = dS·K: four s×s tensors. Alive beside them (measured on
        # an H200 with dO allocated before the call, data/attention_calls_h200.csv): the output
        # (held by the caller), dV = Pᵀ·dO (already computed, H heads) and, for GQA, the
        # expanded K that the matmul keeps for dQ (expanded V is freed once dV exists).
        terms.append(("probabilities P kept for backward (s×s)", ceil_bytes(sh.n * e)))
        terms.append(("dP = dO·Vᵀ (s×s)", ceil_bytes(sh.n * e)))
        terms.append(("dS, softmax backward (s×s)", ceil_bytes(sh.n * e)))
        terms.append(("dS scaled (s×s)", ceil_bytes(sh.n * e)))
        terms.append(("output", sh.out_bytes()))
        terms.append(("dV = Pᵀ·dO (H heads)", sh.out_bytes()))
        if gqa:
            terms.append(("k expanded to H heads, kept for dQ", sh.out_bytes()))
    if sh.causal:
        terms.append(("causal mask (bool s×s, shared by batch and heads)", sh.s * sh.s))
    return terms


def _math(sh: _Shape) -> list[Term]:
    c = 4  # the math backend computes in fp32 (16-bit inputs are upcast)
    terms: list[Term] = []
    if not sh.backward:
        terms.append(("fp32 scores (s×s)", sh.n * c))
        terms.append(("fp32 softmax (s×s)", sh.n * c))
        terms.append(("bool 'row all -inf' test of safe softmax (s×s)", sh.n))
        terms.append(("fp32 copies of q, k, v and the fp32 output", 4 * sh.out_bytes(c)))
        if sh.h_kv != sh.h:
            # Measured (bf16, d=64, H=32, H_kv=8): +2·B·H_kv·s·d·4 bytes: k and v are cast to
            # fp32 before enable_gqa's repeat to H heads, and those copies are still alive.
            terms.append(("fp32 k, v before expansion to H heads (GQA)", 2 * sh.kv_bytes(c)))
        if sh.causal:
            terms.append(("causal mask as fp32 additive bias (s×s)", sh.s * sh.s * 4))
    else:
        terms.append(("four fp32 s×s tensors (P, dP, dS and a temporary)", 4 * sh.n * c))
        # Measured: 14 bytes per q element beyond dO in 16-bit (fp32 q, k, v, output,
        # gradients cast back): expressed as 3.5 fp32 output-sized tensors.
        terms.append(("fp32 q, k, v, output and gradients", ceil_bytes(sh.rows * sh.d * 14)))
    return terms


def _fused_backward_terms(sh: _Shape) -> list[Term]:
    return [
        ("output (saved for backward)", sh.out_bytes()),
        ("dq", sh.out_bytes()),
        ("dk, dv", 2 * sh.kv_bytes()),
        ("log-sum-exp (fp32, one per row)", sh.rows * 4),
        ("row sums of dO·O (fp32, one per row)", sh.rows * 4),
    ]


def _gqa_expanded_grads(sh: _Shape) -> list[Term]:
    """FlashAttention-2 and cuDNN with enable_gqa compute dk, dv per query head (H heads),
    then sum each group into H_kv heads: both copies are alive at the peak (measured)."""
    if sh.h_kv == sh.h:
        return []
    return [("dk, dv per query head before the sum over each group (GQA)", 2 * sh.out_bytes())]


def _efficient(sh: _Shape) -> list[Term]:
    gqa = sh.h_kv != sh.h
    # torch 2.11's memory-efficient backend has no enable_gqa path: GQA runs on k, v expanded
    # to H heads (repeat_interleave), so the kernel sees H heads everywhere.
    expanded = [("k, v expanded to H heads (no enable_gqa path in this backend)",
                 2 * sh.out_bytes())] if gqa else []
    if not sh.backward:
        return expanded + [("output", sh.out_bytes())]
    terms = _fused_backward_terms(sh)
    if gqa:
        terms = [t if t[0] != "dk, dv" else ("dk, dv of the expanded k, v (H heads)",
                                             2 * sh.out_bytes()) for t in terms]
    return expanded + terms + [
        ("fp32 dq accumulator", sh.out_bytes(4)),
        # Measured: +B·H·s·d·e at every s (900.1 vs 772 MiB at s=16384, fp16, d=128): the
        # backward copies dO into the kernel's (B, s, H, d) layout.
        ("dO copied to the kernel's layout", sh.out_bytes()),
    ]


def _cudnn(sh: _Shape) -> list[Term]:
    if not sh.backward:
        return [("output", sh.out_bytes())]
    return (_fused_backward_terms(sh) + [("fp32 dq accumulator", sh.out_bytes(4))]
            + _gqa_expanded_grads(sh))


def _flash(sh: _Shape) -> list[Term]:
    if not sh.backward:
        return [("output", sh.out_bytes()), ("log-sum-exp (fp32, one per row)", sh.rows * 4)]
    return _fused_backward_terms(sh) + [
        ("fp32 dq accumulator", sh.out_bytes(4)),
        ("fp32 output-sized workspace", sh.out_bytes(4)),
    ] + _gqa_expanded_grads(sh)


def _triton(sh: _Shape) -> list[Term]:
    if not sh.backward:
        return [("output", sh.out_bytes()), ("log-sum-exp (fp32, one per row)", sh.rows * 4)]
    terms = _fused_backward_terms(sh)
    if dispatch.atomic_dq(sh.b, sh.h, sh.h_kv, sh.s, sh.s, sh.d, dtype_bytes(sh.dtype)):
        terms.append(("fp32 dq buffer of the atomic-dQ backward (s > 2,048, d = 64 or 128, "
                      "B·H_kv·S·⌈s/d⌉ ≥ 2,048)", sh.out_bytes(4)))
    split = dispatch.kv_split(sh.b, sh.h, sh.h_kv, sh.s)
    if split > 1:
        terms.append((f"partial dk, dv of the GQA group split over {split} programs "
                      "(B·H_kv·⌈s/128⌉ < 1,024)", 2 * split * sh.kv_bytes()))
    return terms


_MODELS: dict[str, Callable[[_Shape], list[Term]]] = {
    "naive": _naive,
    "naive_inplace": _naive,
    "sdpa_math": _math,
    "sdpa_efficient": _efficient,
    "sdpa_flash": _flash,
    "sdpa_cudnn": _cudnn,
    "triton": _triton,
}


def check_impl(impl: str) -> str:
    """Return impl if it is a known implementation name; else raise ValueError listing them."""
    if not isinstance(impl, str) or impl not in _MODELS:
        raise ValueError(
            f"unknown implementation {impl!r}; accepted: {', '.join(IMPLEMENTATIONS)}"
        )
    return impl


def _shape(batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads) -> _Shape:
    b = check_int("batch", batch, 1, MAX_BATCH)
    h = check_int("heads", heads, 1, MAX_HEADS)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    d = check_int("head_dim", head_dim, 1, MAX_HEAD_DIM)
    h_kv = h if kv_heads is None else check_int("kv_heads", kv_heads, 1, h)
    if h % h_kv:
        raise ValueError(f"heads ({h}) must be a multiple of kv_heads, got kv_heads={kv_heads!r}")
    check_bool("causal", causal)
    check_bool("backward", backward)
    return _Shape(b, h, h_kv, s, d, dtype_name(dtype), causal, backward)


def attention_peak_terms(
    impl: str,
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    dtype: str,
    causal: bool = False,
    backward: bool = False,
    kv_heads: int | None = None,
) -> list[tuple[str, int]]:
    """The terms (label, bytes) whose sum is attention_peak_bytes, for tables and tooltips."""
    sh = _shape(batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads)
    return _MODELS[check_impl(impl)](sh)


def attention_peak_bytes(
    impl: str,
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    dtype: str,
    causal: bool = False,
    backward: bool = False,
    kv_heads: int | None = None,
) -> int:
    """Predicted extra peak bytes of one attention call of `impl` (see the module docstring).

    Per implementation (N = B·H·s², O = B·H·s·d·e, LSE = B·H·s·4, mask = s² bytes):
    - naive, naive_inplace: forward 2·N·e + O (+ mask if causal), GQA + 2·O for the
      expanded k and v; forward+backward 4·N·e + 2·O (output and dV) (+ mask), GQA + O
      (expanded k kept for dQ).
    - sdpa_math (fp32 compute): forward 9·N + 4·B·H·s·d·4 (+ 4·s² if causal; GQA + fp32
      k, v at H_kv heads); forward+backward 16·N + 14·B·H·s·d.
    - sdpa_cudnn: forward O; forward+backward O + dq + dk + dv + 2·LSE + fp32 dq
      (B·H·s·d·4), GQA + 2·O (dk, dv per query head).
    - sdpa_efficient: as cudnn plus a copy of dO (O) in the backward; GQA runs on expanded
      k, v: + 2·O in both directions, and its dk, dv have H heads.
    - sdpa_flash: forward O + LSE; forward+backward as cudnn plus one more fp32
      output-sized workspace.
    - triton (ours): forward O + LSE; forward+backward O + dq + dk + dv + 2·LSE, + fp32 dq
      (B·H·s·d·4) for 16-bit inputs at d = 64 or 128 with s > 2,048 and B·H_kv·S·⌈s/d⌉ ≥
      2,048, where its backward adds dQ with atomics (kernels/flash_attn_bwd.py), + partial
      dk, dv 2·S·B·H_kv·s·d·e where GQA splits each group over S > 1 programs
      (`calc.dispatch.kv_split`).
    Returns whole bytes.
    """
    return sum(b for _, b in attention_peak_terms(
        impl, batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads))


def attention_flops(
    batch: int, heads: int, seq_len: int, head_dim: int, causal: bool = False,
    backward: bool = False,
) -> int:
    """FLOPs of one attention call: forward 4·B·H·s²·d (two matmuls of 2·s²·d each per head),
    half of that when causal; forward+backward 3.5 × forward (the backward's five matmuls are
    2.5 × the forward's two). Convention of FlashAttention-2 (Dao 2023, arXiv 2307.08691, sec. 4)
    and shared/DESIGN.md.
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
