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
Each implementation's allocation sequence, with the sources of its algorithm, is in
attnmem/calc/attention_steps.py; the call, the implementations and the inputs each runs are in
attnmem/calc/attention_call.py (their names are importable from here too).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from attnmem.calc.allocator import (
    K_SMALL_SIZE,
    CachingAllocator,
    TensorReplay,
    is_small,
    round_size,
)

# The `X as X` names are re-exported: the rest of calc, the pages and the tests import the
# call's names and FlashAttention-2's split rule from here.
from attnmem.calc.attention_call import IMPL_DTYPES as IMPL_DTYPES
from attnmem.calc.attention_call import IMPL_HEAD_DIMS as IMPL_HEAD_DIMS
from attnmem.calc.attention_call import IMPL_KIND as IMPL_KIND
from attnmem.calc.attention_call import IMPL_LABELS as IMPL_LABELS
from attnmem.calc.attention_call import IMPLEMENTATIONS as IMPLEMENTATIONS
from attnmem.calc.attention_call import AttentionCall, call_of
from attnmem.calc.attention_call import DtypeNotRun as DtypeNotRun
from attnmem.calc.attention_call import check_impl as check_impl
from attnmem.calc.attention_call import takes_head_dim as takes_head_dim
from attnmem.calc.attention_steps import _F, _MODELS, Step, _inputs, _triton_varlen
from attnmem.calc.attention_steps import fa2_num_splits as fa2_num_splits
from attnmem.calc.units import (
    MAX_BATCH,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_SEQ_LEN,
    check_bool,
    check_int,
)

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
      (`attnmem.calc.attention_steps.fa4_tiles_sm90`), GQA + fp32 dk_accum, dv_accum (s rounded
      up to n_block_size).
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


def _decode_args(batch, heads, kv_heads, new_tokens, kv_len, head_dim, dtype, cache_len
                 ) -> tuple[int, int, int, int, int, int, str, int]:
    from attnmem.calc.units import dtype_name

    b = check_int("batch", batch, 1, MAX_BATCH)
    h = check_int("heads", heads, 1, MAX_HEADS)
    h_kv = check_int("kv_heads", heads if kv_heads is None else kv_heads, 1, h)
    if h % h_kv:
        raise ValueError(f"kv_heads ({h_kv}) must divide heads ({h})")
    n = check_int("new_tokens", new_tokens, 1, MAX_SEQ_LEN)
    kv = check_int("kv_len", kv_len, 1, MAX_SEQ_LEN)
    d = check_int("head_dim", head_dim, 16, 256)
    name = dtype_name(dtype)
    if name not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"dtype must be fp16, bf16 or fp32 for our decode path, got {dtype!r}")
    cache = kv if cache_len is None else check_int("cache_len", cache_len, kv, MAX_SEQ_LEN)
    return b, h, h_kv, n, kv, d, name, cache


def decode_peak_breakdown(batch: int, heads: int, kv_heads: int | None, new_tokens: int,
                          kv_len: int, head_dim: int, dtype: str, *,
                          cache_len: int | None = None, expandable: bool = False
                          ) -> list[PeakTerm]:
    """The tensors alive at the peak of one call of our decode path (`decode_peak_bytes`)."""
    from attnmem.calc.attention_steps import decode_inputs, triton_decode_steps

    b, h, h_kv, n, kv, d, name, cache = _decode_args(batch, heads, kv_heads, new_tokens,
                                                     kv_len, head_dim, dtype, cache_len)
    return list(_replay_steps(decode_inputs(b, h, h_kv, n, cache, d, name),
                              triton_decode_steps(b, h, h_kv, n, kv, d, name),
                              _check_expandable(expandable)).terms)


def decode_peak_bytes(batch: int, heads: int, kv_heads: int | None, new_tokens: int,
                      kv_len: int, head_dim: int, dtype: str, *, cache_len: int | None = None,
                      expandable: bool = False) -> int:
    """Predicted extra peak bytes of one call of our split-KV decode path
    (`attnmem.kernels.flash.decode.decode_attention(q, k, v, kv_len)`: ``new_tokens`` queries per
    sequence against ``kv_len`` valid keys of a cache whose tensors hold ``cache_len`` rows,
    default kv_len), as torch.cuda.max_memory_allocated() counts them with q, k and v
    allocated before the call (the module docstring's procedure).

    The tensors (e bytes per element, rows = B·H·new_tokens): the output, rows·d·e; and where
    attnmem.calc.decode_split.decode_plan cuts the keys into S > 1 chunks (programs =
    row blocks·B·H_kv·S of at most one wave of 132 SMs, chunks of whole 128- or 64-key
    tiles, at least 2 tiles each) the chunks' partial outputs rows·S·d·4 (fp32) and one
    buffer of their log2-sum-exps rows·S·4 (fp32) followed, where the split kernel combines
    its own chunks (2-4 chunks, tiles up to 32 x 128: attnmem.calc.decode_split.fused_combine;
    from 5 chunks a second kernel combines and there are none), by its int32 counters, one
    per row block, batch and key/value head, alive together with the output until the
    combine has run. The
    valid length sets S; the cache's allocated length only sizes the inputs. Each tensor is
    counted as the caching allocator's block (attnmem.calc.allocator, `ALLOCATOR_NOTE`).
    Sources: flash-decoding (Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context
    inference", 2023); the buffers as attnmem/kernels/flash/decode.py allocates them.
    """
    from attnmem.calc.attention_steps import decode_inputs, triton_decode_steps

    b, h, h_kv, n, kv, d, name, cache = _decode_args(batch, heads, kv_heads, new_tokens,
                                                     kv_len, head_dim, dtype, cache_len)
    return _replay_steps(decode_inputs(b, h, h_kv, n, cache, d, name),
                         triton_decode_steps(b, h, h_kv, n, kv, d, name),
                         _check_expandable(expandable)).peak
