"""The named attention implementations that the harness, the command line and the pages share.

Names that the store, the pages and attnmem.calc.peak key on: ``naive`` (eager, ``masked_fill``),
``naive_inplace`` (eager, ``masked_fill_``), ``sdpa_math``, ``sdpa_efficient``, ``sdpa_flash``,
``sdpa_cudnn`` (each forced through ``torch.nn.attention.sdpa_kernel(SDPBackend.X)``, as
attention-gym's benchmark maps backend names to contexts), ``triton`` (the bundled kernel,
``attnmem.kernels.flash.api.flash_attention``, imported lazily) and ``fa4`` (FlashAttention-4,
``flash_attn.cute.flash_attn_func`` from the optional ``flash-attn-4`` package; see
``fa4_attention``).

Every implementation is a function ``fn(q, k, v, causal, scale) -> out`` on tensors of shape
q (B, H, s_q, d), k and v (B, H_kv, s_k, d) with H % H_kv == 0 (GQA when H_kv < H), returning
(B, H, s_q, d) in the input dtype. Causal masking is top-left aligned (query i sees keys j <= i),
as SDPA's ``is_causal``.

``available(name, dtype, head_dim, ...) -> (bool, reason)`` says whether it runs here and, if
not, why. The SDPA backends are probed empirically with a tiny call under the forced backend
(the support rules change between torch versions; the probe asks the installed one), cached per
(backend, dtype, head dim, GQA, causal, backward). Nothing here touches the GPU or the driver at
import time: torch is imported when a function is called.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnmem.measure.schema import DTYPES, canonical_dtype

__all__ = ["NAMES", "SDPA_BACKENDS", "TORCH_DTYPES", "Implementation", "available",
           "canonical_dtype", "fa4_attention", "fa4_installed_reason", "fa4_native",
           "fa4_shape_reason", "fa4_varlen", "fa4_version", "get",
           "gpu_reason", "gqa_note", "implementations", "label", "make_sdpa", "naive",
           "naive_inplace", "torch_dtype", "triton_attention"]

#: Implementation names, in the order the app shows them (attnmem.calc.IMPLEMENTATIONS names the same
#: ones for the peak model; ``fa4`` is an optional dependency, available where it imports).
NAMES: tuple[str, ...] = (
    "naive",
    "naive_inplace",
    "sdpa_math",
    "sdpa_efficient",
    "sdpa_flash",
    "sdpa_cudnn",
    "triton",
    "fa4",
)

#: SDPBackend member name for each SDPA implementation.
SDPA_BACKENDS: dict[str, str] = {
    "sdpa_math": "MATH",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
}

#: Dtype names the harness can run (schema.DTYPES) -> torch attribute.
TORCH_DTYPES: dict[str, str] = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
assert tuple(TORCH_DTYPES) == DTYPES


def torch_dtype(dtype: str) -> Any:
    """The torch dtype object for a dtype name ('fp16' -> torch.float16)."""
    import torch

    return getattr(torch, TORCH_DTYPES[canonical_dtype(dtype)])


# --------------------------------------------------------------------------------------------
# The eager reference: every intermediate is a real tensor, so its memory is what you see.
# --------------------------------------------------------------------------------------------


def _expand_kv(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """GQA for the eager path: repeat each key/value head H // H_kv times along dim 1."""
    if k.shape[1] == q.shape[1]:
        return k, v
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, H, s_k, d)


def _naive(q: Any, k: Any, v: Any, causal: bool, scale: float | None, inplace: bool) -> Any:
    import torch

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = _expand_kv(q, k, v)
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, s_q, s_k), input dtype
    if causal:
        s_q, s_k = scores.shape[-2:]
        # (s_q, s_k) bool, True above the diagonal: the complement of the tril mask, built in
        # place so that one s_q x s_k bool tensor exists (not multiplied by B * H).
        blocked = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).triu_(1)
        if inplace:
            scores.masked_fill_(blocked, float("-inf"))  # writes into scores: no new s x s tensor
        else:
            scores = scores.masked_fill(blocked, float("-inf"))  # a new s x s tensor (a copy)
    probs = torch.softmax(scores, dim=-1)  # (B, H, s_q, s_k), input dtype
    # scores stays referenced until return, as in ordinary eager code: two s x s tensors and
    # the output are alive at the peak (the anchors measure exactly this).
    return probs @ v  # (B, H, s_q, d)


def naive(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> Any:
    """Eager attention with ``masked_fill`` (out of place)."""
    return _naive(q, k, v, causal, scale, inplace=False)


def naive_inplace(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> Any:
    """Eager attention with ``masked_fill_`` (in place)."""
    return _naive(q, k, v, causal, scale, inplace=True)


# --------------------------------------------------------------------------------------------
# SDPA backends, each forced through sdpa_kernel.
# --------------------------------------------------------------------------------------------

#: (impl, dtype, head_dim, gqa, causal, backward, device) -> (ok, reason, gqa_native)
_PROBE_CACHE: dict[tuple, tuple[bool, str, bool]] = {}


def _sdpa_call(backend_name: str, q: Any, k: Any, v: Any, causal: bool, scale: float | None,
               gqa_native: bool) -> Any:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    gqa = k.shape[1] != q.shape[1]
    if gqa and not gqa_native:
        k, v = _expand_kv(q, k, v)  # backend without enable_gqa: materialise the repeated heads
        gqa = False
    with sdpa_kernel(backend):
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                  enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def make_sdpa(impl: str, gqa_native: bool = True) -> Callable[..., Any]:
    """The call for one SDPA implementation; ``gqa_native=False`` expands k/v for GQA itself."""
    backend_name = SDPA_BACKENDS[impl]

    def fn(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> Any:
        return _sdpa_call(backend_name, q, k, v, causal, scale, gqa_native)

    fn.__name__ = impl
    return fn


def _triton_fn() -> Callable[..., Any]:
    from attnmem.kernels.flash.api import flash_attention  # lazy: may not exist, needs triton

    return flash_attention


def triton_attention(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> Any:
    """The bundled kernel (``attnmem.kernels.flash.api.flash_attention``; on a Hopper GPU at d = 128,
    and at d = 64 on long sequences, its forward is the Gluon kernel of
    ``attnmem/kernels/flash/fwd_sm90.py``)."""
    return _triton_fn()(q, k, v, causal=causal, scale=scale)


# --------------------------------------------------------------------------------------------
# FlashAttention-4 (optional: the flash-attn-4 package, CuTe DSL kernels for sm90 and sm100).
# --------------------------------------------------------------------------------------------

#: How to get FA4: the version the peak model and the bundled measurements use, on a Hopper
#: (sm90) or Blackwell (sm100) GPU with a CUDA build of torch.
FA4_INSTALL = "pip install flash-attn-4==4.0.0b36 on a Hopper or Blackwell GPU"
#: Compute capability majors FA4 has forward and backward kernels for here (Hopper, Blackwell).
FA4_MAJORS = (9, 10)
_FA4_IMPORT: dict[str, Any] = {}  # "fn": flash_attn_func, or "reason": why it did not import


def fa4_installed_reason() -> str | None:
    """None when the ``flash_attn.cute`` package is on the path, else why not; looks for the
    files only (importing it takes about 10 s), so a page can ask on every rerun."""
    import importlib.util
    import os

    try:
        spec = importlib.util.find_spec("flash_attn")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not any(os.path.isdir(os.path.join(loc, "cute")) for loc in locations):
        return f"flash_attn.cute is not installed ({FA4_INSTALL})"
    return None


def _fa4_func() -> Callable[..., Any]:
    """``flash_attn.cute.flash_attn_func``, imported once; ImportError saying why not."""
    if "fn" not in _FA4_IMPORT and "reason" not in _FA4_IMPORT:
        try:
            from flash_attn.cute import flash_attn_func

            _FA4_IMPORT["fn"] = flash_attn_func
        except ModuleNotFoundError as exc:
            if exc.name in ("flash_attn", "flash_attn.cute"):
                _FA4_IMPORT["reason"] = f"flash_attn.cute is not installed ({FA4_INSTALL})"
            else:  # a dependency of it (cutlass, tvm_ffi, ...) is missing
                _FA4_IMPORT["reason"] = f"flash_attn.cute did not import: {_first_line(exc)}"
        except Exception as exc:  # noqa: BLE001 - a broken install is "unavailable", with why
            _FA4_IMPORT["reason"] = f"flash_attn.cute did not import: {_first_line(exc)}"
    if "fn" in _FA4_IMPORT:
        return _FA4_IMPORT["fn"]
    raise ImportError(_FA4_IMPORT["reason"])


def fa4_version() -> str:
    """The installed flash-attn-4 version ('' when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("flash-attn-4")
    except metadata.PackageNotFoundError:
        return ""


def fa4_shape_reason(dtype: str, head_dim: int, capability: tuple[int, int]) -> str | None:
    """None when FA4 has kernels for this dtype and head dim on a GPU of this compute
    capability, else why not. Its rules (flash_attn/cute/interface.py, _flash_attn_fwd and
    _validate_head_dims, 4.0.0b36): fp16 or bf16 (fp8 forward only on sm100, not measured
    here); head dims multiples of 8 (16 bytes), 8 to 256 on sm90, 8 to 128 or 256 on sm100."""
    major, minor = capability
    if major not in FA4_MAJORS:
        return (f"FA4 needs compute capability 9.0 or 10.x, this GPU is {major}.{minor}")
    if dtype not in ("fp16", "bf16"):
        return f"FA4 runs fp16 and bf16 only, got {dtype}"
    if major == 9:
        ok, rule = 8 <= head_dim <= 256 and head_dim % 8 == 0, "8 to 256 in steps of 8"
    else:
        ok = (8 <= head_dim <= 128 and head_dim % 8 == 0) or head_dim == 256
        rule = "8 to 128 in steps of 8, or 256"
    if not ok:
        return f"FA4 on sm{major}{minor} takes head dims {rule}, got {head_dim}"
    return None


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    """Compute capability of CUDA device ``index`` (asked once: the check runs on every call)."""
    import torch

    return tuple(torch.cuda.get_device_capability(index))


def _fa4_tensor_reason(q: Any) -> str | None:
    """None when FA4 has a kernel for q's device, dtype and head dim, else why not."""
    import torch

    if q.device.type != "cuda":
        return f"FA4 needs CUDA tensors, got device {q.device}"
    dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(q.dtype, str(q.dtype))
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return fa4_shape_reason(dtype, q.shape[-1], _capability(index))


def fa4_native(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> Any:
    """FlashAttention-4 on its own layout: q (B, s_q, H, d), k and v (B, s_k, H_kv, d) in,
    (B, s_q, H, d) out; differentiable. GQA is k and v with fewer heads (H % H_kv == 0).
    FA4 returns (out, lse) in some versions and out in others: both are read. Shapes FA4 has
    no kernel for, and a causal call with s_q != s_k (FA4 aligns its causal mask to the
    bottom right, the registry's is top left), raise ValueError with the rule."""
    s_q, h = q.shape[1], q.shape[2]
    s_k, h_kv = k.shape[1], k.shape[2]
    if h % h_kv:
        raise ValueError(f"FA4: heads ({h}) must be a multiple of kv_heads ({h_kv})")
    if causal and s_q != s_k:
        raise ValueError(f"FA4 aligns its causal mask to the bottom right; the registry's is top "
                         f"left: only s_q == s_k agree, got s_q={s_q}, s_k={s_k}")
    why = _fa4_tensor_reason(q)
    if why:
        raise ValueError(why)
    res = _fa4_func()(q, k, v, softmax_scale=scale, causal=causal)
    return res[0] if isinstance(res, tuple) else res  # (B, s_q, H, d)


def _fa4_varlen_func() -> Callable[..., Any]:
    """``flash_attn.cute.flash_attn_varlen_func``, imported after ``_fa4_func`` (same reasons)."""
    _fa4_func()
    if "varlen" not in _FA4_IMPORT:
        try:
            from flash_attn.cute import flash_attn_varlen_func
        except ImportError as exc:
            raise ImportError(f"flash_attn.cute has no flash_attn_varlen_func: "
                              f"{_first_line(exc)}") from None
        _FA4_IMPORT["varlen"] = flash_attn_varlen_func
    return _FA4_IMPORT["varlen"]


def fa4_varlen(q: Any, k: Any, v: Any, cu_seqlens: Any, max_seqlen: int, causal: bool = False,
               scale: float | None = None) -> Any:
    """FlashAttention-4 on packed sequences, FlashAttention's varlen layout: q (total, H, d),
    k and v (total, H_kv, d), ``cu_seqlens`` int32 cumulative starts (n + 1) shared by queries
    and keys, ``max_seqlen`` the longest sequence; (total, H, d) out, differentiable.
    ``flash_attn.cute.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k, softmax_scale=, causal=)`` (Dao-AILab/flash-attention,
    flash_attn/cute/interface.py). With equal query and key lengths per sequence FA4's
    bottom-right causal mask is the registry's top-left one. Shapes FA4 has no kernel for
    raise ValueError with the rule, as ``fa4_native``."""
    h, h_kv = q.shape[1], k.shape[1]
    if q.dim() != 3 or h % h_kv:
        raise ValueError(f"FA4 varlen takes q (total, H, d) and k, v (total, H_kv, d) with H a "
                         f"multiple of H_kv, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    why = _fa4_tensor_reason(q)
    if why:
        raise ValueError(why)
    res = _fa4_varlen_func()(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                             max_seqlen_q=int(max_seqlen), max_seqlen_k=int(max_seqlen),
                             softmax_scale=scale, causal=causal)
    return res[0] if isinstance(res, tuple) else res  # (total, H, d)


def fa4_attention(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> Any:
    """FlashAttention-4 on the registry's layout: q (B, H, s_q, d), k and v (B, H_kv, s_k, d)
    in, (B, H, s_q, d) out (``fa4_native`` on transposed views).

    The transposes are views, not copies: ``x.transpose(1, 2)`` of a contiguous (B, H, s, d)
    tensor has unit last stride and other strides that are multiples of 16 bytes, which FA4's
    ``maybe_contiguous`` accepts as they are, and the (B, s, H, d) output goes back as a
    transposed view; dO reaches FA4's backward as the same kind of view. So a measurement
    counts what a user calling FA4 on (B, H, s, d) tensors this way allocates, and no layout
    copy of q, k, v, O or dO: in the forward the output and the fp32 log-sum-exp; in the
    backward FA4's own buffers and gradients, which it writes in (B, s, H, d), plus the copies
    autograd makes of them into each (B, H, s, d) input's layout (AccumulateGrad's layout
    contract), as it would for that user. (Copying to (B, s, H, d) first, with
    ``.contiguous()``, would add 3 to 4 tensors of B·H·s·d elements that FA4 itself never
    needs.) The speed benchmark times ``fa4_native`` on (B, s, H, d) leaves instead, FA4's
    kernels without those gradient copies.
    """
    out = fa4_native(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, scale)
    return out.transpose(1, 2)  # (B, H, s_q, d), a view


# --------------------------------------------------------------------------------------------
# Availability.
# --------------------------------------------------------------------------------------------


def gpu_reason() -> str | None:
    """None when a CUDA GPU is usable, else why not (in words)."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a requirement
        return f"torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return f"no CUDA GPU on this machine (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _probe_sdpa(impl: str, dtype: str, head_dim: int, gqa: bool, causal: bool, backward: bool,
                device: str) -> tuple[bool, str, bool]:
    """Run a tiny call under the forced backend; returns (ok, reason, gqa_native)."""
    key = (impl, dtype, head_dim, gqa, causal, backward, device)
    if key in _PROBE_CACHE:
        return _PROBE_CACHE[key]
    import warnings

    import torch

    tdt = torch_dtype(dtype)
    heads, kv_heads = (4, 2) if gqa else (2, 2)
    result: tuple[bool, str, bool] = (False, "not probed", True)
    for gqa_native in ((True, False) if gqa else (True,)):
        try:
            q = torch.randn(1, heads, 128, head_dim, device=device, dtype=tdt, requires_grad=backward)
            k = torch.randn(1, kv_heads, 128, head_dim, device=device, dtype=tdt, requires_grad=backward)
            v = torch.randn(1, kv_heads, 128, head_dim, device=device, dtype=tdt, requires_grad=backward)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SDPA warns why a backend refused; we keep the error
                out = _sdpa_call(SDPA_BACKENDS[impl], q, k, v, causal, None, gqa_native)
                if backward:
                    out.backward(torch.randn_like(out))
            if device == "cuda":
                torch.cuda.synchronize()
            note = "" if gqa_native else "GQA through expanded k/v (backend has no enable_gqa path)"
            result = (True, note, gqa_native)
            break
        except Exception as exc:  # noqa: BLE001 - any refusal means "not available", with its reason
            result = (False, f"{impl} refused {dtype}, head_dim={head_dim}"
                      f"{', GQA' if gqa else ''}{', causal' if causal else ''}"
                      f"{', backward' if backward else ''}: {_first_line(exc)}", True)
    _PROBE_CACHE[key] = result
    return result


def available(name: str, dtype: str, head_dim: int, *, causal: bool = False,
              backward: bool = False, heads: int = 1, kv_heads: int | None = None,
              device: str = "cuda") -> tuple[bool, str]:
    """Whether implementation ``name`` runs here for this dtype/head dim, and if not, why.

    ``device='cpu'`` allows the eager implementations and ``sdpa_math`` on the CPU (the
    correctness reference and the CPU tests); everything else needs a CUDA GPU. ``fa4`` says
    first whether flash_attn.cute is installed, then checks the GPU's compute capability, the
    dtype and the head dim against FA4's rules, then imports it (about 10 s, once).
    """
    if name not in NAMES:
        return False, f"unknown implementation {name!r}; known: {', '.join(NAMES)}"
    try:
        dtype = canonical_dtype(dtype)
    except ValueError as exc:
        return False, str(exc)
    if not isinstance(head_dim, int) or head_dim < 1:
        return False, f"head_dim must be a whole number >= 1, got {head_dim!r}"
    kv_heads = heads if kv_heads is None else kv_heads
    if kv_heads < 1 or heads % kv_heads:
        return False, f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})"
    gqa = kv_heads != heads
    if name == "fa4":  # an optional package: say first whether it is there at all
        missing = fa4_installed_reason()
        if missing:
            return False, missing
    if device == "cpu":
        if name in ("naive", "naive_inplace", "sdpa_math"):
            return True, ""
        return False, f"{name} needs a CUDA GPU (asked for device='cpu')"
    reason = gpu_reason()
    if reason:
        return False, reason
    if name in ("naive", "naive_inplace"):
        return True, ""
    if name in SDPA_BACKENDS:
        ok, why, _ = _probe_sdpa(name, dtype, head_dim, gqa, causal, backward, device)
        return ok, why
    if name == "fa4":
        import torch

        why = fa4_shape_reason(dtype, head_dim, torch.cuda.get_device_capability())
        if why:
            return False, why
        try:
            _fa4_func()
        except ImportError as exc:
            return False, str(exc)
        return True, ""
    # triton (the remaining name)
    try:
        _triton_fn()
    except Exception as exc:  # noqa: BLE001 - ImportError, SyntaxError, a missing name: all say why
        return False, f"bundled Triton kernel did not import: {_first_line(exc)}"
    return True, ""


@dataclass(frozen=True)
class Implementation:
    """One named implementation: how to call it and how to ask whether it runs here."""

    name: str  # one of NAMES
    label: str  # for tables and legends
    fn: Callable[..., Any]  # fn(q, k, v, causal, scale) -> out

    def available(self, dtype: str, head_dim: int, **kw: Any) -> tuple[bool, str]:
        """(runs here?, why not) for this dtype and head dim; see the module's available()."""
        return available(self.name, dtype, head_dim, **kw)


def label(name: str) -> str:
    """The display label of an implementation: attnmem.calc.IMPL_LABELS, the one table of labels
    (the name itself for one calc does not list)."""
    from attnmem.calc import IMPL_LABELS

    return IMPL_LABELS.get(name, name)


def get(name: str, *, dtype: str = "fp16", head_dim: int = 64, causal: bool = False,
        backward: bool = False, gqa: bool = False, device: str = "cuda") -> Implementation:
    """The implementation called ``name``, with its GQA mode settled for this configuration."""
    if name in ("naive", "naive_inplace"):
        return Implementation(name, label(name), naive if name == "naive" else naive_inplace)
    if name in SDPA_BACKENDS:
        gqa_native = True
        if gqa and device != "cpu":
            _, _, gqa_native = _probe_sdpa(name, canonical_dtype(dtype), head_dim, True, causal,
                                           backward, device)
        return Implementation(name, label(name), make_sdpa(name, gqa_native))
    if name == "triton":
        return Implementation(name, label(name), triton_attention)
    if name == "fa4":
        return Implementation(name, label(name), fa4_attention)
    raise KeyError(f"unknown implementation {name!r}; known: {', '.join(NAMES)}")


def gqa_note(name: str, dtype: str, head_dim: int, *, causal: bool, backward: bool,
             device: str = "cuda") -> str:
    """'' or a note when a GQA call of ``name`` expands k/v instead of using enable_gqa."""
    if name in ("naive", "naive_inplace"):
        return "GQA through repeat_interleave of k/v"
    if name in SDPA_BACKENDS and device != "cpu":
        ok, why, native = _probe_sdpa(name, canonical_dtype(dtype), head_dim, True, causal,
                                      backward, device)
        return why if ok and not native else ""
    return ""


def implementations() -> dict[str, Implementation]:
    """Every implementation by name (GQA settled per call by get(); this is for listing)."""
    return {name: get(name, device="cpu") for name in NAMES}
