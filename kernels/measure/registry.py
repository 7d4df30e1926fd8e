"""The named attention implementations that the harness, the command line and the pages share.

Names follow DESIGN.md ("Names that other parts rely on"): ``naive`` (eager, ``masked_fill``),
``naive_inplace`` (eager, ``masked_fill_``), ``sdpa_math``, ``sdpa_efficient``, ``sdpa_flash``,
``sdpa_cudnn`` (each forced through ``torch.nn.attention.sdpa_kernel(SDPBackend.X)``, as
attention-gym's benchmark maps backend names to contexts) and ``triton`` (the bundled kernel,
``kernels.flash.api.flash_attention``, imported lazily).

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

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Implementation names, in the order the app shows them (same as calc.IMPLEMENTATIONS).
NAMES: tuple[str, ...] = (
    "naive",
    "naive_inplace",
    "sdpa_math",
    "sdpa_efficient",
    "sdpa_flash",
    "sdpa_cudnn",
    "triton",
)

#: SDPBackend member name for each SDPA implementation.
SDPA_BACKENDS: dict[str, str] = {
    "sdpa_math": "MATH",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
}

#: Dtype names the harness can run (attention needs a floating point type) -> torch attribute.
TORCH_DTYPES: dict[str, str] = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
_ALIASES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}


def canonical_dtype(dtype: str) -> str:
    """'fp16' | 'bf16' | 'fp32' for a name or torch spelling; ValueError otherwise."""
    key = str(dtype).strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in TORCH_DTYPES:
        raise ValueError(
            f"dtype must be one of fp16, bf16, fp32 (or float16, bfloat16, float32), got {dtype!r}"
        )
    return key


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
    from kernels.flash.api import flash_attention  # lazy: may not exist, needs triton

    return flash_attention


def triton_attention(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> Any:
    """The bundled Triton kernel (``kernels.flash.api.flash_attention``; on a Hopper GPU at
    d = 128 its forward is the Gluon kernel of ``kernels/flash_attn_fwd_sm90.py``)."""
    return _triton_fn()(q, k, v, causal=causal, scale=scale)


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
    correctness reference and the CPU tests); everything else needs a CUDA GPU.
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
    # triton
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


LABELS: dict[str, str] = {
    "naive": "eager (masked_fill)",
    "naive_inplace": "eager (masked_fill_)",
    "sdpa_math": "SDPA math",
    "sdpa_efficient": "SDPA memory-efficient",
    "sdpa_flash": "SDPA FlashAttention-2",
    "sdpa_cudnn": "SDPA cuDNN",
    "triton": "bundled Triton kernel",
}


def get(name: str, *, dtype: str = "fp16", head_dim: int = 64, causal: bool = False,
        backward: bool = False, gqa: bool = False, device: str = "cuda") -> Implementation:
    """The implementation called ``name``, with its GQA mode settled for this configuration."""
    if name in ("naive", "naive_inplace"):
        return Implementation(name, LABELS[name], naive if name == "naive" else naive_inplace)
    if name in SDPA_BACKENDS:
        gqa_native = True
        if gqa and device != "cpu":
            _, _, gqa_native = _probe_sdpa(name, canonical_dtype(dtype), head_dim, True, causal,
                                           backward, device)
        return Implementation(name, LABELS[name], make_sdpa(name, gqa_native))
    if name == "triton":
        return Implementation(name, LABELS[name], triton_attention)
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
