"""attnmem.kernels.flash.route for packed sequences (``cu_seqlens``): which forward runs, as pure
decisions of the call's shape (the longest sequences, their count), its KernelConfig, SETTINGS
and what the device can run, so no GPU is needed; and that a Hopper decision reaches the
packed Hopper forward with the call's Packed. The backward of a packed call is the Hopper
backward's packed form where attnmem.calc.dispatch.sm90_packed says and the inputs allow, else the
Triton two-kernel one, whichever forward ran (its inputs, O and lse2, have one layout)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnmem.kernels.flash import route  # noqa: E402
from attnmem.kernels.flash.common import Packed  # noqa: E402
from attnmem.kernels.flash.config import SETTINGS, KernelConfig, Tiles  # noqa: E402

CPU = route.Abilities()
HOPPER = route.Abilities(sm90_fwd=True, sm90_bwd=True, hopper=True, desc_layout=True,
                         dq_tma=True)
HOPPER_PACKED = HOPPER._replace(sm90_bwd_packed=True)  # the packed Hopper backward takes them


def packed(total=20_000, max_q=4096, max_k=None, n_seq=12, H=32, H_kv=32, d=128, causal=True,
           window=None) -> route.Call:
    """A packed call: q (1, H, total, d), sequences of at most max_q queries / max_k keys."""
    return route.Call(1, H, H_kv, total, total, d, 2, causal, window, True, "torch.bfloat16",
                      "cuda:0", n_seq, max_q, max_q if max_k is None else max_k)


def needs_gluon():
    """Skip only where this Triton has no Gluon; where it has, the Hopper kernels imported."""
    if route.gluon_missing():
        pytest.skip("this Triton has no Gluon: the Hopper kernels never route")
    assert route.fwd_sm90 is not None and route.bwd_sm90 is not None, route.SM90_IMPORT_ERRORS


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


def summary_bwd(r: route.BackwardRoute) -> tuple:
    return r.kernel, r.atomic, r.split


@pytest.mark.parametrize("kw, can, want", [
    # the Hopper backward's packed form wherever it can run: attnmem.calc.dispatch.sm90_packed
    (dict(d=128), HOPPER_PACKED, ("sm90", True, 1)),
    (dict(d=64, max_q=97, causal=False), HOPPER_PACKED, ("sm90", True, 1)),
    (dict(d=128, H=32, H_kv=8, max_q=1, n_seq=1, total=64), HOPPER_PACKED, ("sm90", True, 1)),
    (dict(d=64, max_q=8, n_seq=10, total=1280), HOPPER_PACKED, ("sm90", True, 1)),
    # ... not where sequences average fewer tokens than the query block (the padded buffer)
    (dict(d=64, max_q=8, n_seq=10, total=1279), HOPPER_PACKED, ("triton", False, 1)),
    (dict(d=128, max_q=1, n_seq=1, total=1), HOPPER_PACKED, ("triton", False, 1)),
    (dict(d=128, total=20_001), HOPPER_PACKED, ("sm90", True, 1)),  # any total (padded stats)
    (dict(d=128, n_seq=2047, H=32, total=131_008), HOPPER_PACKED, ("sm90", True, 1)),
    # the portable two-kernel backward elsewhere
    (dict(d=128, n_seq=2048, H=32, total=131_072), HOPPER_PACKED,
     ("triton", False, 1)),  # grid y > 65,535
    (dict(d=128, window=256), HOPPER_PACKED, ("triton", False, 1)),  # no window in Gluon
    (dict(d=80), HOPPER_PACKED, ("triton", False, 1)),
    (dict(d=128), HOPPER, ("triton", False, 1)),  # layouts the packed kernel cannot read
    (dict(d=128), HOPPER_PACKED._replace(deterministic=True), ("triton", False, 1)),
    (dict(d=128), CPU, ("triton", False, 1)),
])
def test_packed_backward_default_route(kw, can, want):
    assert summary_bwd(route.backward_route(packed(**kw), None, can)) == want


def test_packed_backward_rule_is_calc_dispatch(monkeypatch):
    """The route asks attnmem.calc.dispatch.sm90_packed (the rule attnmem.calc.peak counts the buffer by)."""
    seen = []

    def rule(*args):
        seen.append(args)
        return False

    monkeypatch.setattr(route.dispatch, "sm90_packed", rule)
    assert route.backward_route(packed(d=64, max_q=700, n_seq=5, total=2000, H=8, H_kv=2),
                                None, HOPPER_PACKED).kernel == "triton"
    assert seen == [(5, 8, 2, 700, 2000, 64, 2, None)]


def test_packed_backward_config_forces_and_refuses(monkeypatch):
    tiles = Tiles(64, 64, 4, 2)
    r = route.backward_route(packed(), KernelConfig(sm90_bwd=False, tiles=tiles), HOPPER_PACKED)
    assert (r.kernel, r.dq_tiles, r.dkdv_tiles) == ("triton", tiles.meta(), tiles.meta())
    # a field of the Triton backward keeps it, unless sm90_bwd=True forces the Hopper one
    assert route.backward_route(packed(), KernelConfig(tiles=tiles), HOPPER_PACKED).kernel == \
        "triton"
    assert route.backward_route(packed(d=80), KernelConfig(sm90_bwd=True, tiles=tiles),
                                HOPPER_PACKED._replace(sm90_bwd_packed=True)).kernel == "sm90"
    with pytest.raises(ValueError, match=r"sm90_bwd=True: the Hopper backward of packed "
                                         r"sequences needs .*12 sequences x 32 heads"):
        route.backward_route(packed(), KernelConfig(sm90_bwd=True), CPU)
    with pytest.raises(ValueError, match=r"sm90_bwd=True.*window=256"):
        route.backward_route(packed(window=256), KernelConfig(sm90_bwd=True), HOPPER_PACKED)
    with pytest.raises(ValueError, match=r"sm90_bwd=True.*2048 sequences x 32 heads"):
        route.backward_route(packed(n_seq=2048), KernelConfig(sm90_bwd=True), HOPPER_PACKED)
    for cfg in (KernelConfig(atomic_dq=True), KernelConfig(kv_split=2)):
        with pytest.raises(ValueError, match="packed sequences .* without a GQA split"):
            route.backward_route(packed(H_kv=8), cfg, HOPPER_PACKED)
    # the settings turn the default off, not a forced choice
    monkeypatch.setattr(SETTINGS, "sm90_bwd", False)
    assert route.backward_route(packed(), None, HOPPER_PACKED).kernel == "triton"
    assert route.backward_route(packed(), KernelConfig(sm90_bwd=True), HOPPER_PACKED).kernel == \
        "sm90"


def test_a_hopper_decision_runs_the_packed_hopper_backward(monkeypatch):
    """attention_backward hands a packed call routed to "sm90" to
    `bwd_sm90.attention_backward_sm90_packed` with its Packed (the kernel replaced by a
    recorder: no GPU here)."""
    needs_gluon()
    seen = {}

    def fake(do, q, k, v, o, lse2, causal, scale, pk):
        seen.update(pk=pk, causal=causal, scale=scale)
        return "dq", "dk", "dv"

    monkeypatch.setattr(route.bwd_sm90, "attention_backward_sm90_packed", fake)
    monkeypatch.setattr(route, "probe", lambda *a, **k: HOPPER_PACKED)
    q = torch.zeros(1, 4, 256, 64, dtype=torch.bfloat16)  # 2 x 128 rows: not padded past 2x
    cu = torch.tensor([0, 100, 256], dtype=torch.int32)
    pk = Packed(cu, cu, 156, 156)
    got = route.attention_backward(q, q, q, q, q, q[..., 0].float(), True, 0.5, None, None, pk)
    assert got == ("dq", "dk", "dv")
    assert seen == {"pk": pk, "causal": True, "scale": 0.5}


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
