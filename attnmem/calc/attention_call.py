"""One attention call: the implementations calc knows, the inputs each runs, and the call's
validated shape.

`AttentionCall(impl, batch, heads, seq_len, head_dim, dtype, causal=False, backward=False,
kv_heads=None)` is checked once when it is made (sizes within attnmem.calc.units' limits,
kv_heads dividing heads, True/False flags, a dtype the implementation runs: `IMPL_DTYPES`, a
head dim it takes: `IMPL_HEAD_DIMS`) and passed down unchecked by attnmem.calc.peak,
attnmem.calc.fit, attnmem.calc.sweep and attnmem.calc.context_parallel; `call_of` turns a
public function's arguments into one.

Notation (the letters a call carries): B batch, H query heads, H_kv key/value heads, s sequence
length (queries = keys), d head dim, e bytes per element of the inputs; N = B·H·s² score
elements. Sources of the limits: PyTorch's SDPA dtype checks (aten/src/ATen/native/transformers/
cuda/sdp_utils.cpp), FlashAttention-4's (flash_attn/cute/interface.py) and our kernel's own
(attnmem/kernels/flash/api.py, attnmem.calc.dispatch.HEAD_DIM_MIN/MAX).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

from attnmem.calc import dispatch
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


def check_impl(impl: str) -> str:
    """Return impl if it is a known implementation name; else raise ValueError listing them."""
    if not isinstance(impl, str) or impl not in IMPLEMENTATIONS:
        raise ValueError(
            f"unknown implementation {impl!r}; accepted: {', '.join(IMPLEMENTATIONS)}"
        )
    return impl


@dataclass(frozen=True)
class AttentionCall:
    """One attention call: the implementation and the shape, validated once when it is made.

    ``AttentionCall(impl, batch, heads, seq_len, head_dim, dtype, causal=False,
    backward=False, kv_heads=None)`` takes the arguments of `attention_peak_bytes` in the same
    order and refuses a bad one with ValueError naming the value and what is accepted (sizes
    from 1 to attnmem.calc.units' limits, kv_heads dividing heads, True/False flags, a dtype name, an
    implementation of IMPLEMENTATIONS that runs that dtype: IMPL_DTYPES). The dtype is kept
    under its canonical name ("float16" becomes "fp16"). The peak functions of attnmem.calc.peak,
    attnmem.calc.fit, attnmem.calc.sweep and attnmem.calc.context_parallel take it in place of the separate arguments and pass
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
