"""SDPA on the meta device, allocating what the chosen CUDA backend allocates.

On meta, `torch.nn.functional.scaled_dot_product_attention` takes the math path (fp32 s×s
scores), which is not what a GPU runs. During a trace, `sdpa_as(backend)` puts this function in
its place, so that transformers' own `sdpa_attention_forward` still decides everything around
the call (repeat_kv, enable_gqa, pack_gqa for one query, is_causal, the mask it passes), and the
call itself allocates what the backend does on CUDA:

- queries and keys aligned, no mask: the backend's allocation sequence from
  attnmem.calc.attention_steps (`steps_of`, read from each backend's CUDA source: the output,
  the log-sum-exp, flash's split-KV partials and rng state, the efficient backend's own GQA
  expansion, cuDNN's tiny tensors), the temporaries freed at the end of the call;
- otherwise (a decode step, a later prefill chunk, a mask): the output, and the fp32
  log-sum-exp (B, H, q) for flash (attnmem.calc.inference_step's rule for such calls); with a
  boolean mask, the memory-efficient and cuDNN backends first turn it into an additive bias in
  the input dtype (the efficient one pads its columns to 16, aten's preprocess_mask).

The output is (B, q, H, d) in memory, returned as the (B, H, q, d) view the fused backends
return, so transformers' transpose-and-contiguous makes no copy, as on CUDA.

A backend with no kernel for the call raises attnmem.calc.backends.NoKernel naming why:
flash given a mask, the memory-efficient backend given enable_gqa (torch has no grouped-query
path there; on the H200 every such generate() found none).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from attnmem.calc.attention_call import AttentionCall
from attnmem.calc.attention_steps import _A, steps_of
from attnmem.calc.backends import NoKernel

#: The SDPA backends a trace can stand in for; "sdpa" is torch's choice (flash without a mask
#: and with one head dim, else memory-efficient: attnmem.calc.inference_step._backend).
SDPA_BACKENDS = ("sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


def _resolve(backend: str, masked: bool, d_qk: int, d_v: int) -> str:
    if backend != "sdpa":
        return backend
    return "sdpa_efficient" if masked or d_qk != d_v else "sdpa_flash"


def fake_sdpa(backend: str):
    """A stand-in for F.scaled_dot_product_attention that allocates as `backend` on CUDA."""
    import torch

    def sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
        b, h, q, d = query.shape
        h_kv, kv, d_v = key.shape[1], key.shape[2], value.shape[-1]
        impl = _resolve(backend, attn_mask is not None, d, d_v)
        if impl == "sdpa_flash" and attn_mask is not None:
            raise NoKernel("SDPA's flash backend takes no mask, and transformers passes one "
                           f"here ({q} queries over {kv} keys); use 'sdpa' (torch's choice) "
                           "or the memory-efficient backend")
        if impl == "sdpa_efficient" and enable_gqa and h_kv != h:
            raise NoKernel("SDPA's memory-efficient backend has no grouped-query kernel "
                           f"({h} query heads over {h_kv} key/value heads, enable_gqa=True); "
                           "use 'sdpa' (torch's choice) or flash")
        dtype = _DTYPES.get(str(query.dtype), "bf16")
        dev = query.device
        temps: list[Any] = []

        def tmp(nbytes: int) -> Any:
            return torch.empty(int(nbytes), dtype=torch.uint8, device=dev)

        if attn_mask is not None and attn_mask.dtype == torch.bool and impl in (
                "sdpa_efficient", "sdpa_cudnn"):
            rows, cols = attn_mask.shape[-2], attn_mask.shape[-1]
            if impl == "sdpa_efficient":
                cols = -(-cols // 16) * 16
            lead = attn_mask.numel() // (attn_mask.shape[-2] * attn_mask.shape[-1])
            temps.append(tmp(lead * rows * cols * query.element_size()))
        if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
            if q != kv or d != d_v:
                raise ValueError("the trace's training attention takes as many queries as keys "
                                 f"and one head dim (got {q} queries over {kv} keys, d = {d}, "
                                 f"d_v = {d_v})")
            call = AttentionCall(impl, b, h, q, d, dtype, causal=bool(is_causal),
                                 backward=True, kv_heads=h_kv if enable_gqa else h)
            return _Fused.apply(query, key, value, call, *temps)
        out = torch.empty(b, q, h, d_v, dtype=query.dtype, device=dev).transpose(1, 2)
        if q == kv and attn_mask is None and d == d_v:
            call = AttentionCall(impl, b, h, q, d, dtype, causal=bool(is_causal),
                                 backward=False, kv_heads=h_kv if enable_gqa else h)
            made_output = False
            keyed: dict[str, list[Any]] = {}
            for step in steps_of(call):
                if isinstance(step, _A):
                    sizes = list(step.sizes)
                    if not made_output and step.label.startswith("output"):
                        made_output = True  # `out` above is this allocation
                        sizes = sizes[1:]
                    made = [tmp(n) for n in sizes if n > 0]
                    (keyed.setdefault(step.key, []) if step.key else temps).extend(made)
                else:
                    keyed.pop(step.key, None)
            keyed.clear()
        elif impl in ("sdpa_flash",):
            temps.append(tmp(b * h * q * 4))  # softmax_lse
        del temps
        return out

    return sdpa


#: Labels at which an implementation's allocation sequence (attention_steps) enters its
#: backward: everything before is the forward's, kept for the backward.
_BACKWARD_STARTS = ("contiguous copies of dO", "dO copied", "dq", "dk", "row sums of dO",
                    "dP", "fp32 dq")


def _split(steps: list) -> tuple[list, list]:
    for i, st in enumerate(steps):
        if isinstance(st, _A) and st.label.startswith(_BACKWARD_STARTS):
            return steps[:i], steps[i:]
    return steps, []


def _alloc(steps: list, first_shaped: dict[str, Any], dev: Any) -> tuple[dict, list]:
    """Allocate `steps` (freeing keyed ones as they say); a step whose label is a key of
    `first_shaped` makes that tensor (its first size) in place of a blob. Returns the shaped
    tensors made and the blobs still alive."""
    import torch

    shaped: dict[str, Any] = {}
    alive: list[Any] = []
    keyed: dict[str, list[Any]] = {}
    for step in steps:
        if not isinstance(step, _A):
            keyed.pop(step.key, None)
            continue
        sizes = list(step.sizes)
        made: list[Any] = []
        for label, like in first_shaped.items():
            if label not in shaped and (step.label == label
                                        or step.label.startswith(label + " ")):
                shapes = like if isinstance(like, list) else [like]
                for want in shapes:
                    shaped.setdefault(label, []).append(want())
                sizes = sizes[len(shapes):]
                break
        made += [torch.empty(int(n), dtype=torch.uint8, device=dev) for n in sizes if n > 0]
        (keyed.setdefault(step.key, []) if step.key else alive).extend(made)
    return shaped, alive


def _fused_function():
    import torch

    class Fused(torch.autograd.Function):
        """A fused attention call with its backward, allocating as the backend does: the
        forward's steps (the output and what the backend saves: log-sum-exp, rng state), kept
        with q, k, v for the backward (save_for_backward, so checkpointing drops and remakes
        them as it does the real ones); the backward's steps, of which dq, dk, dv are returned
        and the rest freed when it returns."""

        @staticmethod
        def forward(ctx, query, key, value, call, *extra):
            fwd, bwd = _split(steps_of(call))
            b, h, s, d = query.shape
            dev = query.device
            shaped, alive = _alloc(fwd, {"output": lambda: torch.empty(
                b, s, h, d, dtype=query.dtype, device=dev).transpose(1, 2)}, dev)
            out = shaped["output"][0]
            ctx.call, ctx.bwd, ctx.n_extra = call, bwd, len(extra)
            ctx.save_for_backward(query, key, value, out, *alive, *extra)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            query, key, value = ctx.saved_tensors[:3]
            dev = query.device
            shaped, _ = _alloc(ctx.bwd, {
                "dq": lambda: torch.empty(query.shape[0], query.shape[2], query.shape[1],
                                          query.shape[3], dtype=query.dtype,
                                          device=dev).transpose(1, 2),
                "dk, dv": [lambda: torch.empty_like(key), lambda: torch.empty_like(value)],
            }, dev)
            dq = shaped.get("dq", [torch.empty_like(query)])[0]
            dk, dv = shaped.get("dk, dv", [torch.empty_like(key), torch.empty_like(value)])
            return (dq, dk, dv, None) + (None,) * ctx.n_extra

    return Fused


class _LazyFused:
    _cls = None

    @classmethod
    def apply(cls, *args):
        if cls._cls is None:
            cls._cls = _fused_function()
        return cls._cls.apply(*args)


_Fused = _LazyFused


@contextmanager
def sdpa_as(backend: str) -> Iterator[None]:
    """Within the block, F.scaled_dot_product_attention allocates as `backend` (SDPA_BACKENDS)."""
    import torch.nn.functional as F

    if backend not in SDPA_BACKENDS:
        raise ValueError(f"attention {backend!r}: the trace stands in for {SDPA_BACKENDS} "
                         "(and runs transformers' eager attention as it is)")
    real = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = fake_sdpa(backend)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = real
