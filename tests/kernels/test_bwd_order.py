"""The causal Hopper backward's grid order (attnmem.kernels.flash.bwd_sm90.head_group): a group of
heads launched together, longest key block first, sized to what L2 holds and to at least a
wave of programs. CPU only: the rule is host code; the GPU tests of test_bwd_sm90.py run the
kernel under it."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

H200_SMS = 132


def _sm90():
    """attnmem.kernels.flash.bwd_sm90; skipped only where this Triton has no Gluon at all (any
    other failure to import it fails the test)."""
    from attnmem.kernels.flash import route

    if route.gluon_missing():
        pytest.skip("this Triton has no Gluon (triton.experimental.gluon)")
    from attnmem.kernels.flash import bwd_sm90

    return bwd_sm90


@pytest.mark.parametrize("heads,group,s,d", [
    (256, 1, 8192, 128), (128, 4, 4096, 128), (1, 1, 32768, 128), (32, 1, 512, 64),
    (4096, 4, 1536, 128), (96, 1, 3000, 64), (7, 1, 1024, 64), (30, 8, 100, 64),
    (8, 4, 8192, 128),
])
def test_group_divides_heads_fits_l2_and_fills_a_wave(heads, group, s, d):
    b90 = _sm90()
    g = b90.head_group(heads, group, s, s, d, H200_SMS)
    assert 1 <= g <= heads and heads % g == 0
    n_kb = -(-s // 128)
    divisors = [x for x in range(1, heads + 1) if heads % x == 0]
    fits = [x for x in divisors if x * 8 * s * d * group <= b90.GROUP_L2_BYTES] or [1]
    if max(fits) * n_kb >= H200_SMS:
        assert g == max(fits)
    else:  # the smallest group that gives every SM a program, else all heads
        assert g == min([x for x in divisors if x * n_kb >= H200_SMS] or [heads])


def test_measured_shapes_take_the_groups_that_won():
    """The shapes attnmem/kernels/dev/bwd_order.py timed on the H200 (attnmem/kernels/flash/NOTES.md, "Grid order
    of the causal backward"): B/H/H_kv/s/d -> heads per group."""
    b90 = _sm90()
    rule = b90.head_group
    assert rule(8 * 32, 1, 8192, 8192, 128, H200_SMS) == 4  # 8 MiB a head: 2 fit, 4 fill a wave
    assert rule(32, 1, 16384, 16384, 128, H200_SMS) == 2  # 16 MiB a head; 128 key blocks
    assert rule(32, 1, 32768, 32768, 128, H200_SMS) == 1  # 256 key blocks fill the SMs alone
    assert rule(8, 4, 8192, 8192, 128, H200_SMS) == 4  # GQA 4:1: one head is 64 programs
    assert rule(4096, 1, 512, 512, 64, H200_SMS) == 64  # 256 KiB a head: 96 fit, 64 divides
    assert rule(7, 1, 128, 128, 64, H200_SMS) == 7  # every head fits: plain longest first
