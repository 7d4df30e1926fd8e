"""kernels.flash.route for packed sequences (``cu_seqlens``): which forward runs, as pure
decisions of the call's shape (the longest sequences, their count), its KernelConfig, SETTINGS
and what the device can run, so no GPU is needed; and that a Hopper decision reaches the
packed Hopper forward with the call's Packed. The backward of a packed call stays the Triton
two-kernel one whichever forward ran (its inputs, O and lse2, have one layout)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels.flash import route  # noqa: E402
from kernels.flash.common import Packed  # noqa: E402
from kernels.flash.config import SETTINGS, KernelConfig, Tiles  # noqa: E402

CPU = route.Abilities()
HOPPER = route.Abilities(sm90_fwd=True, sm90_bwd=True, hopper=True, desc_layout=True,
                         dq_tma=True)


def packed(total=20_000, max_q=4096, max_k=None, n_seq=12, H=32, H_kv=32, d=128, causal=True,
           window=None) -> route.Call:
    """A packed call: q (1, H, total, d), sequences of at most max_q queries / max_k keys."""
    return route.Call(1, H, H_kv, total, total, d, 2, causal, window, True, "torch.bfloat16",
                      "cuda:0", n_seq, max_q, max_q if max_k is None else max_k)


def needs_gluon():
    if route.fwd_sm90 is None:
        pytest.skip("this Triton has no Gluon Hopper API: the Hopper forward never routes")


def summary(r: route.ForwardRoute) -> tuple:
    return r.kernel, r.sm90_consumers, r.sm90_stages


@pytest.mark.parametrize("kw, can, want", [
    # d = 128: the Hopper forward, two warpgroups, two stages, whatever the lengths
    (dict(d=128, max_q=97), HOPPER, ("sm90", 2, 2)),
    (dict(d=128, max_q=8192, causal=False), HOPPER, ("sm90", 2, 2)),
    (dict(d=128, H=32, H_kv=8, max_q=1), HOPPER, ("sm90", 2, 2)),
    # d = 64: the dense rule on the longest sequence (three warpgroups past 2,048 / 4,096)
    (dict(d=64, max_q=8192), HOPPER, ("sm90", 3, 2)),
    (dict(d=64, max_q=4097), HOPPER, ("sm90", 3, 2)),
    (dict(d=64, max_q=4096), HOPPER, ("triton", None, None)),  # causal: not at 4,096
    (dict(d=64, max_q=2049, causal=False), HOPPER, ("sm90", 3, 2)),
    (dict(d=64, max_q=8192, max_k=2048, causal=False), HOPPER, ("triton", None, None)),
    (dict(d=64, max_q=1024), HOPPER, ("triton", None, None)),
    # where it cannot or may not run
    (dict(d=128, window=256), HOPPER, ("triton", None, None)),  # no window in the Gluon kernel
    (dict(d=128), CPU, ("triton", None, None)),
    (dict(d=128), HOPPER._replace(sm90_fwd=False), ("triton", None, None)),  # fp32, d = 80, ...
    (dict(d=128, n_seq=2048, H=32), HOPPER, ("triton", None, None)),  # 65,536 > 65,535 rows
    (dict(d=128, n_seq=2047, H=32), HOPPER, ("sm90", 2, 2)),
])
def test_packed_forward_default_route(kw, can, want):
    needs_gluon()
    r = route.forward_route(packed(**kw), None, can)
    assert summary(r) == want
    assert r.use_desc is False  # packed: never the portable kernel's descriptors


def test_packed_forward_config_forces_and_refuses(monkeypatch):
    needs_gluon()
    short64 = packed(d=64, max_q=700)
    r = route.forward_route(short64, KernelConfig(sm90=True, sm90_consumers=3, sm90_stages=2),
                            HOPPER)
    assert summary(r) == ("sm90", 3, 2)
    r = route.forward_route(short64, KernelConfig(sm90=True), HOPPER)
    assert summary(r) == ("sm90", None, None)  # the kernel's own table (`fwd_sm90.TILES`)
    tiles = Tiles(64, 64, 4, 2)
    r = route.forward_route(packed(), KernelConfig(sm90=False, tiles=tiles), HOPPER)
    assert (r.kernel, r.tiles, r.use_desc) == ("triton", tiles.meta(), False)
    assert route.forward_route(packed(), KernelConfig(use_desc=False), HOPPER).kernel == "sm90"
    with pytest.raises(ValueError, match=r"packed sequences .* use_desc=True"):
        route.forward_route(packed(), KernelConfig(use_desc=True), HOPPER)
    with pytest.raises(ValueError, match=r"sm90=True was asked for, but the Hopper forward "
                                         r"cannot run here .*got 2048 x 32"):
        route.forward_route(packed(n_seq=2048), KernelConfig(sm90=True), HOPPER)
    with pytest.raises(ValueError, match=r"sm90=True was asked for.*got 12 x 32"):
        route.forward_route(packed(), KernelConfig(sm90=True), CPU)
    with pytest.raises(ValueError, match=r"config sm90=True was given with window=256"):
        route.forward_route(packed(window=256), KernelConfig(sm90=True), HOPPER)
    # the settings turn the default off, not a forced choice
    monkeypatch.setattr(SETTINGS, "sm90", False)
    assert route.forward_route(packed(), None, HOPPER).kernel == "triton"
    assert route.forward_route(packed(), KernelConfig(sm90=True), HOPPER).kernel == "sm90"


def test_packed_backward_is_the_triton_two_kernel_one_whichever_forward_ran():
    for can in (CPU, HOPPER):
        for call in (packed(d=128), packed(d=64, max_q=8192)):
            r = route.backward_route(call, None, can)
            assert (r.kernel, r.atomic, r.split) == ("triton", False, 1)
    with pytest.raises(ValueError, match="packed sequences .* sm90_bwd=True"):
        route.backward_route(packed(), KernelConfig(sm90_bwd=True), HOPPER)


def test_call_of_reads_the_packed_lengths():
    q = torch.zeros(1, 4, 30, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 45, 64, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 10, 30], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 45], dtype=torch.int32)
    c = route.Call.of(q, k, True, None, Packed(cu_q, cu_k, 20, 40))
    assert (c.packed, c.n_seq, c.max_q, c.max_k, c.s_q, c.s_k) == (True, 2, 20, 40, 30, 45)
    c = route.Call.of(q, k, True, None)
    assert (c.packed, c.n_seq, c.max_q, c.max_k) == (False, 0, 0, 0)


def test_a_hopper_decision_runs_the_packed_hopper_forward(monkeypatch):
    """attention_forward hands a packed call routed to "sm90" to
    `fwd_sm90.attention_forward_sm90_packed` with its Packed and schedule (the kernel
    replaced by a recorder: no GPU here)."""
    needs_gluon()
    seen = {}

    def fake(q, k, v, causal, qk_scale, pk, stages, block_n, consumers):
        seen.update(pk=pk, causal=causal, qk_scale=qk_scale, sched=(stages, block_n, consumers))
        return "o", "lse2"

    monkeypatch.setattr(route.fwd_sm90, "attention_forward_sm90_packed", fake)
    monkeypatch.setattr(route, "probe", lambda *a, **k: HOPPER)
    q = torch.zeros(1, 4, 30, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 10, 30], dtype=torch.int32)
    pk = Packed(cu, cu, 20, 20)
    got = route.attention_forward(q, q, q, False, 0.5,
                                  KernelConfig(sm90=True, sm90_consumers=3, sm90_stages=2),
                                  None, pk)
    assert got == ("o", "lse2")
    assert seen["pk"] is pk and seen["causal"] is False
    assert seen["qk_scale"] == pytest.approx(0.5 * route.LOG2E)
    assert seen["sched"] == (2, None, 3)
