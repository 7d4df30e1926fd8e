"""The kernels' accuracy check, shared by the attention tests: an output of ours against a
high-precision reference, allowed twice plain PyTorch's error at the same precision plus a
floor (FlashAttention's own tests use the same two-times rule)."""

from __future__ import annotations


def within(name, got, ref, base, floor) -> None:
    """|got - ref| <= 2 * max|base - ref| + floor + one ulp of got's dtype at |ref|; NaN fails.
    Raises AssertionError naming the worst elements."""
    import torch

    ulp = torch.finfo(got.dtype).eps if got.dtype.is_floating_point else 0.0
    got, ref, base = got.double(), ref.double(), base.double()
    base_err = (base - ref).abs().max().item()
    err = (got - ref).abs()
    bad = ~(err <= 2 * base_err + floor + ulp * ref.abs())
    if bad.any():
        idx = bad.nonzero()[:4].tolist()
        where = ", ".join(f"{tuple(i)}: {got[tuple(i)].item():.5g} vs {ref[tuple(i)].item():.5g}"
                          for i in idx)
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.numel()} off (max error "
            f"{err.nan_to_num(float('inf')).max().item():.3g}, plain torch {base_err:.3g}, "
            f"NaN {int(got.isnan().sum())}): {where}")
