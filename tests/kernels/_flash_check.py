"""The flash-attention tests' shared harness (tests/kernels/test_flash_attention.py, CPU and
the interpreter; tests/kernels/test_flash_attention_gpu.py, the GPU grid): the tolerance rule
(`assert_within`: at most twice plain PyTorch's low-precision error against an fp64/fp32
reference, plus `FLOOR` and a unit in the last place), `check_against_reference` for one shape,
the NaN poisoning of every buffer the kernels allocate (`poison_empty`; the `poisoned` fixture
in tests/kernels/conftest.py), and the GPU configs.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from attnmem.kernels.flash.config import KernelConfig, Tiles

HAS_CUDA = torch.cuda.is_available()
HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
# Fixed tiles, so the GPU grid compiles once per (d, causal, dtype) and never autotunes: the
# portable forward and the two-kernel backward with those tiles.
GPU_CONFIG = KernelConfig(tiles=Tiles(64, 64, 4, 2), sm90=False, atomic_dq=False)
GPU_CONFIG_D256 = KernelConfig(tiles=Tiles(32, 32, 4, 2), sm90=False, atomic_dq=False)
# Absolute error floor per dtype, on O(1) outputs and gradients.
FLOOR = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _nan_filled(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan")) if t.is_floating_point() else t


@contextlib.contextmanager
def poison_empty():
    """Every buffer allocated inside is NaN-filled: the kernels' one allocation helper
    (`attnmem.kernels.flash.common.empty`: O, lse2, delta, dQ, dK, dV, the partial dK/dV sums), and
    torch.empty / torch.empty_like / Tensor.new_empty for anything else on the way."""
    from attnmem.kernels.flash import common

    real = (common.empty, torch.empty, torch.empty_like, torch.Tensor.new_empty)
    own_new_empty = "new_empty" in torch.Tensor.__dict__  # else it is TensorBase's

    def wrap(fn):
        return lambda *args, **kwargs: _nan_filled(fn(*args, **kwargs))

    common.empty, torch.empty, torch.empty_like, torch.Tensor.new_empty = map(wrap, real)
    try:
        yield
    finally:
        common.empty, torch.empty, torch.empty_like, torch.Tensor.new_empty = real
        if not own_new_empty:
            del torch.Tensor.new_empty


def inputs(B, H, H_kv, s_q, s_k, d, dtype, device, layout="contiguous"):
    """Fresh random q, k, v (requiring grad) and dO; layout 'bshd' gives non-contiguous views."""
    def make(h, s):
        if layout == "bshd":  # stored as (B, s, h, d), viewed as (B, h, s, d)
            return torch.randn(B, s, h, d, device=device).transpose(1, 2).to(dtype)
        return torch.randn(B, h, s, d, device=device).to(dtype)

    q, k, v = make(H, s_q), make(H_kv, s_k), make(H_kv, s_k)
    do = torch.randn(B, H, s_q, d, device=device).to(dtype)
    return [t.detach().requires_grad_() for t in (q, k, v)] + [do]


def forward_backward(fn, q, k, v, do):
    """out and (dq, dk, dv) of fn on leaf copies of q, k, v."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(do.to(out.dtype))
    return out.detach(), [t.grad.detach() for t in leaves]


def assert_within(name: str, got: torch.Tensor, ref: torch.Tensor, base: torch.Tensor,
                  floor: float) -> None:
    """|got - ref| <= 2 * max|base - ref| + floor + one unit in the last place of got's dtype
    at |ref|, everywhere; on failure, say which elements.

    The last term is the rounding of the stored result itself: an output accumulated in fp32
    and rounded to fp16 can land one unit from the reference when the exact value is near a
    rounding midpoint, even where plain torch happened to round the other way (error 0). It
    matters only for large values (a dV summed over ~1000 rows: 1 unit = 0.0078 at 9.7).
    """
    ulp = torch.finfo(got.dtype).eps
    got, ref, base = got.double(), ref.double(), base.double()
    base_err = (base - ref).abs().max().item()
    bound = 2 * base_err + floor + ulp * ref.abs()
    err = (got - ref).abs()
    bad = ~(err <= bound)  # NaN counts as bad
    if bad.any():
        bound = bound.max().item()
        idx = bad.nonzero()[:8].tolist()
        lines = [f"  at {tuple(i)}: got {got[tuple(i)].item():.6g}, ref {ref[tuple(i)].item():.6g}"
                 for i in idx]
        pytest.fail(
            f"{name}: {int(bad.sum())} of {bad.numel()} elements off by more than {bound:.3g} "
            f"(max error {err.nan_to_num(float('inf')).max().item():.3g}, NaN: "
            f"{int(got.isnan().sum())}, plain torch error {base_err:.3g}):\n"
            + "\n".join(lines))


def check_against_reference(fa, B, H, H_kv, s_q, s_k, d, causal, dtype, device,
                            layout="contiguous", config=None, scale=None):
    """Kernel vs fp64/fp32 reference vs plain eager in `dtype`, forward and every gradient."""
    from attnmem.kernels.flash.reference import attention_reference

    q, k, v, do = inputs(B, H, H_kv, s_q, s_k, d, dtype, device, layout)
    hi = torch.float64 if device == "cpu" else torch.float32

    def kernel(a, b, c):
        return fa.flash_attention(a, b, c, causal=causal, scale=scale, config=config)

    out, grads = forward_backward(kernel, q, k, v, do)
    ref, ref_grads = forward_backward(
        lambda a, b, c: attention_reference(a.to(hi), b.to(hi), c.to(hi), causal, scale),
        q, k, v, do)
    base, base_grads = forward_backward(
        lambda a, b, c: attention_reference(a, b, c, causal, scale), q, k, v, do)
    assert out.shape == (B, H, s_q, d) and out.dtype == dtype
    floor = FLOOR[dtype]
    assert_within("out", out, ref, base, floor)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads, strict=True):
        assert g.shape == r.shape
        assert_within(name, g, r, b, floor)
