"""attnmem.kernels.flash.route: which forward and which backward a call runs, as pure decisions of
the call's shape, its KernelConfig, SETTINGS and what the device can run (`Abilities`, stated
here for a Hopper GPU or a CPU), so no GPU is needed. The buffer rules are attnmem.calc.dispatch's: the
route's atomic-dQ and GQA-split choices must be those the memory model counts."""

from __future__ import annotations

import logging
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from attnmem.calc import dispatch  # noqa: E402
from attnmem.kernels.flash import route  # noqa: E402
from attnmem.kernels.flash.config import SETTINGS, KernelConfig, Tiles  # noqa: E402

CPU = route.Abilities()
# A Hopper GPU whose Gluon kernels take the tensors, with descriptor-friendly layouts.
HOPPER = route.Abilities(sm90_fwd=True, sm90_bwd=True, hopper=True, desc_layout=True,
                         dq_tma=True)


def call(B=1, H=32, H_kv=32, s_q=4096, s_k=None, d=128, elem=2, causal=True, window=None,
         packed=False, n_seq=4, max_q=None, max_k=None) -> route.Call:
    """A call's shape; packed: s_q, s_k are the totals, the longest sequences default to
    them, over n_seq sequences."""
    s_k = s_q if s_k is None else s_k
    extra = (n_seq, max_q or s_q, max_k or max_q or s_k) if packed else (0, 0, 0)
    return route.Call(B, H, H_kv, s_q, s_k, d, elem, causal, window, packed, "torch.bfloat16",
                      "cuda:0", *extra)


def needs_gluon():
    """Skip only where this Triton has no Gluon; where it has, the Hopper kernels imported."""
    if route.gluon_missing():
        pytest.skip("this Triton has no Gluon: the Hopper kernels never route")
    assert route.fwd_sm90 is not None and route.bwd_sm90 is not None, route.SM90_IMPORT_ERRORS


# ---- the forward -----------------------------------------------------------------------------

@pytest.mark.parametrize("kw, can, want", [
    (dict(d=128, s_q=1024), HOPPER, ("sm90", None, 2, 2)),  # d = 128: any length
    (dict(d=128, s_q=1), HOPPER, ("sm90", None, 2, 2)),
    (dict(d=64, s_q=8192), HOPPER, ("sm90", None, 3, 2)),  # d = 64, long: three warpgroups
    (dict(d=64, s_q=2049, causal=False), HOPPER, ("sm90", None, 3, 2)),
    (dict(d=64, s_q=4096), HOPPER, ("triton", True, None, None)),  # causal: not past 4,096
    (dict(d=64, s_q=1024), HOPPER, ("triton", False, None, None)),  # short keys: pointers
    (dict(d=128, s_q=4096, window=512), HOPPER, ("triton", True, None, None)),  # no window there
    (dict(d=80, s_q=4096), HOPPER._replace(sm90_fwd=False, desc_layout=False),
     ("triton", False, None, None)),  # padded head dim
    (dict(d=128, s_q=4096, elem=4), HOPPER._replace(sm90_fwd=False),
     ("triton", False, None, None)),  # fp32: pointer loads
    (dict(d=128, s_q=4096), CPU, ("triton", False, None, None)),
    (dict(d=128, s_q=4096, packed=True), HOPPER, ("sm90", None, 2, 2)),  # packed: Hopper too
    (dict(d=128, s_q=4096, packed=True), CPU, ("triton", False, None, None)),
])
def test_forward_default_route(kw, can, want):
    needs_gluon()
    r = route.forward_route(call(**kw), None, can)
    assert (r.kernel, r.use_desc if r.kernel == "triton" else None, r.sm90_consumers,
            r.sm90_stages) == want


def test_forward_config_forces_and_refuses():
    needs_gluon()
    c = call(d=64, s_q=1024)
    r = route.forward_route(c, KernelConfig(sm90=True, sm90_consumers=3, sm90_stages=2), HOPPER)
    assert (r.kernel, r.sm90_consumers, r.sm90_stages, r.sm90_block_n) == ("sm90", 3, 2, None)
    tiles = Tiles(64, 64, 4, 2)
    r = route.forward_route(call(d=128), KernelConfig(tiles=tiles, sm90=False), HOPPER)
    assert (r.kernel, r.tiles, r.use_desc) == ("triton", tiles.meta(), True)
    r = route.forward_route(call(d=128), KernelConfig(sm90=False, use_desc=False), HOPPER)
    assert (r.kernel, r.use_desc) == ("triton", False)
    with pytest.raises(ValueError, match="sm90=True was asked for, but the Hopper forward"):
        route.forward_route(c, KernelConfig(sm90=True), CPU)
    with pytest.raises(ValueError, match=r"config sm90=True was given with window=3.*no sliding"):
        route.forward_route(call(window=3), KernelConfig(sm90=True), HOPPER)
    with pytest.raises(ValueError, match="use_desc=True was asked for"):
        route.forward_route(c, KernelConfig(use_desc=True), CPU)
    with pytest.raises(ValueError, match="packed sequences .* use_desc=True"):
        route.forward_route(call(packed=True), KernelConfig(use_desc=True), HOPPER)


def test_forward_settings_turn_the_defaults_off(monkeypatch):
    needs_gluon()
    monkeypatch.setattr(SETTINGS, "sm90", False)
    r = route.forward_route(call(d=128), None, HOPPER)
    assert (r.kernel, r.use_desc) == ("triton", True)
    monkeypatch.setattr(SETTINGS, "descriptors", False)
    assert route.forward_route(call(d=128), None, HOPPER).use_desc is False
    # a config's choice is not a default: it still runs
    assert route.forward_route(call(d=128), KernelConfig(sm90=True), HOPPER).kernel == "sm90"


def test_descriptors_from_the_length_bucket_desc_min_bucket():
    """The portable forward reads K/V through descriptors by default (Hopper, 16-bit) where
    the keys' length bucket reaches `route.DESC_MIN_BUCKET`: `common.seq_bucket` rounds up to
    a power of two, so the switch lies between half the bucket and one key more."""
    from attnmem.kernels.flash.common import seq_bucket

    first = route.DESC_MIN_BUCKET // 2 + 1
    assert seq_bucket(first) == route.DESC_MIN_BUCKET > seq_bucket(first - 1)
    for s_k, want in ((first - 1, False), (first, True), (route.DESC_MIN_BUCKET, True)):
        r = route.forward_route(call(s_q=s_k, s_k=s_k), KernelConfig(sm90=False), HOPPER)
        assert (r.kernel, r.use_desc) == ("triton", want), s_k
        fp32 = route.forward_route(call(s_q=s_k, s_k=s_k, elem=4), KernelConfig(sm90=False),
                                   HOPPER)
        assert (fp32.kernel, fp32.use_desc) == ("triton", False)
    assert (first - 1, first) == (1024, 1025)  # what the constant's comment says


# ---- the backward ----------------------------------------------------------------------------

@pytest.mark.parametrize("kw, can, want", [
    # the Hopper region (attnmem.calc.dispatch.sm90_region): the Gluon backward, atomic dQ, no split
    (dict(H=32, H_kv=32, s_q=4096, d=64), HOPPER, ("sm90", True, 1)),
    (dict(H=32, H_kv=8, s_q=4096, d=128), HOPPER, ("sm90", True, 1)),
    (dict(H=32, H_kv=32, s_q=4096, d=64), CPU, ("triton", True, 1)),  # same buffers elsewhere
    (dict(H=28, H_kv=4, s_q=4096, d=128), HOPPER, ("triton", False, 7)),  # 128 programs: split
    (dict(H=4, H_kv=4, s_q=1024, d=64), HOPPER, ("triton", False, 1)),  # short: two kernels
    (dict(B=4, H=32, H_kv=32, s_q=3072, d=128), HOPPER, ("sm90", True, 1)),  # 3,072 programs
    (dict(H=32, H_kv=32, s_q=2048, d=128), HOPPER, ("triton", False, 1)),  # 2,048 queries
    (dict(H=32, H_kv=32, s_q=4096, d=64, window=512), HOPPER, ("triton", True, 1)),
    (dict(H=32, H_kv=32, s_q=4096, d=64), HOPPER._replace(deterministic=True),
     ("triton", False, 1)),
    (dict(H=32, H_kv=32, s_q=4096, d=64, packed=True), HOPPER, ("triton", False, 1)),
])
def test_backward_default_route(kw, can, want):
    r = route.backward_route(call(**kw), None, can)
    assert (r.kernel, r.atomic, r.split) == want
    if r.kernel == "triton" and r.atomic:
        assert r.dq_tma == can.dq_tma


def test_backward_buffers_follow_calc_dispatch_whichever_kernel_runs():
    """With no config, the atomic-dQ buffer and the GQA split are attnmem.calc.dispatch's on either
    device, so attnmem.calc.peak predicts the buffers of whichever backward runs."""
    for B, H, H_kv, s, d in [(1, 32, 32, 4096, 64), (1, 32, 8, 3072, 64), (1, 32, 4, 4096, 128),
                             (1, 8, 2, 4096, 128), (4, 32, 32, 3072, 128), (2, 16, 16, 512, 80),
                             (1, 32, 8, 16384, 64)]:
        for can in (CPU, HOPPER):
            r = route.backward_route(call(B, H, H_kv, s, d=d), None, can)
            assert r.atomic == dispatch.atomic_dq(B, H, H_kv, s, s, d, 2), (B, H, H_kv, s, d)
            assert r.split == dispatch.kv_split(B, H, H_kv, s, s, d, 2), (B, H, H_kv, s, d)


def test_backward_config_forces_and_refuses(monkeypatch):
    region = call(H=32, H_kv=32, s_q=4096, d=64)
    # a field of the Triton backward keeps it, even in the Hopper region
    for config in (KernelConfig(tiles=Tiles(64, 64, 4, 2)), KernelConfig(atomic_dq=True),
                   KernelConfig(kv_split=1), KernelConfig(dq_tma=False)):
        assert route.backward_route(region, config, HOPPER).kernel == "triton", config
    r = route.backward_route(region, KernelConfig(atomic_dq=True, dq_tma=False), HOPPER)
    assert (r.atomic, r.dq_tma) == (True, False)
    # forced where the default would not route (two-kernel shape)
    short = call(H=4, H_kv=4, s_q=1024, d=64)
    assert route.backward_route(short, KernelConfig(sm90_bwd=True), HOPPER).kernel == "sm90"
    assert route.backward_route(region, KernelConfig(sm90_bwd=False), HOPPER).kernel == "triton"
    with pytest.raises(ValueError, match=r"sm90_bwd=True: .*got q \(1, 32, 4096, 64\) "
                                         r"torch.bfloat16 on cuda:0, window=None"):
        route.backward_route(region, KernelConfig(sm90_bwd=True), CPU)
    with pytest.raises(ValueError, match="sm90_bwd=True: .*window=8"):
        route.backward_route(call(window=8), KernelConfig(sm90_bwd=True), HOPPER)
    with pytest.raises(ValueError, match="kv_split must be a positive divisor of the GQA group "
                                         "H / H_kv = 32 / 8 = 4, got 3"):
        route.backward_route(call(H_kv=8), KernelConfig(kv_split=3), HOPPER)
    with pytest.raises(ValueError, match="packed sequences .* kv_split=2"):
        route.backward_route(call(packed=True), KernelConfig(kv_split=2), HOPPER)
    # the settings turn the default off, not a forced choice
    monkeypatch.setattr(SETTINGS, "sm90_bwd", False)
    assert route.backward_route(region, None, HOPPER).kernel == "triton"
    assert route.backward_route(region, KernelConfig(sm90_bwd=True), HOPPER).kernel == "sm90"


def test_tiles_reach_each_launch():
    t1, t2 = Tiles(64, 64, 4, 2), Tiles(32, 64, 4, 3)
    r = route.backward_route(call(s_q=512), KernelConfig(tiles=t1, dkdv_tiles=t2), CPU)
    assert (r.dq_tiles, r.dkdv_tiles) == (t1.meta(), t2.meta())
    r = route.backward_route(call(s_q=512), None, CPU)
    assert (r.dq_tiles, r.dkdv_tiles) == (None, None)


def test_window_rule():
    assert route.check_window(None, False, 10) is None
    assert route.check_window(10, True, 10) is None  # a window of s_q keys hides nothing
    assert route.check_window(3, True, 10) == 3
    with pytest.raises(ValueError, match="window=3 was given with causal=False"):
        route.check_window(3, False, 10)
    with pytest.raises(ValueError, match="window must be a positive int"):
        route.check_window(True, True, 10)


# ---- the Hopper kernels' import ---------------------------------------------------------------

def test_the_hopper_kernels_import_where_triton_has_gluon():
    """Where this Triton has Gluon (CI's 3.9, the GPU host's 3.6), fwd_sm90 and bwd_sm90
    imported: no reason is recorded. A bug in either module fails here, instead of turning
    the Hopper path off and skipping its tests."""
    if route.gluon_missing():
        pytest.skip("this Triton has no Gluon (triton.experimental.gluon)")
    assert route.SM90_IMPORT_ERRORS == {}
    assert route.fwd_sm90 is not None and route.bwd_sm90 is not None


def test_a_broken_hopper_module_is_a_logged_named_reason(tmp_path, monkeypatch, caplog):
    """A Hopper module that fails to import for any reason but a missing Gluon: None, the
    reason recorded under its name, one warning naming the module and the exception; a
    forced Hopper kernel's refusal then says why."""
    (tmp_path / "broken_sm90.py").write_text("import math\nmath.no_such_function()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(route, "SM90_IMPORT_ERRORS", {})
    with caplog.at_level(logging.WARNING, logger=route.__name__):
        assert route._import_sm90("broken_sm90") is None
    reason = "AttributeError: module 'math' has no attribute 'no_such_function'"
    assert route.SM90_IMPORT_ERRORS == {"broken_sm90": reason}
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "broken_sm90 failed to import" in record.getMessage()
    assert reason in record.getMessage()
    assert route._import_error(None, "broken_sm90") == f"; broken_sm90 failed to import: {reason}"
    assert route._import_error(route, "broken_sm90") == ""  # imported after all: nothing to say
    assert route._import_error(None, "other_sm90") == ""


def test_a_triton_without_gluon_is_quiet(tmp_path, monkeypatch, caplog):
    """Only a Triton without Gluon (triton.experimental.gluon not found) makes the Hopper
    kernels quietly unavailable: no reason recorded, nothing logged."""
    import triton.experimental

    (tmp_path / "needs_gluon_sm90.py").write_text("from triton.experimental import gluon\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(route, "SM90_IMPORT_ERRORS", {})
    monkeypatch.setitem(sys.modules, "triton.experimental.gluon", None)  # as if absent
    monkeypatch.delattr(triton.experimental, "gluon", raising=False)
    assert route.gluon_missing()
    with caplog.at_level(logging.DEBUG, logger=route.__name__):
        assert route._import_sm90("needs_gluon_sm90") is None
    assert route.SM90_IMPORT_ERRORS == {} and caplog.records == []


def test_a_forced_hopper_kernel_names_the_failed_import(monkeypatch):
    """sm90=True / sm90_bwd=True where the Hopper module failed to import: the refusal says
    which module and why, beside what the kernel needs."""
    monkeypatch.setattr(route, "fwd_sm90", None)
    monkeypatch.setattr(route, "bwd_sm90", None)
    monkeypatch.setattr(route, "SM90_IMPORT_ERRORS", {
        "attnmem.kernels.flash.fwd_sm90": "NameError: name 'x' is not defined",
        "attnmem.kernels.flash.bwd_sm90": "TypeError: bad"})
    with pytest.raises(ValueError, match=r"sm90=True .*; attnmem\.kernels\.flash\.fwd_sm90 "
                                         r"failed to import: NameError: name 'x'"):
        route.forward_route(call(), KernelConfig(sm90=True), CPU)
    with pytest.raises(ValueError, match=r"sm90_bwd=True: .*; attnmem\.kernels\.flash\."
                                         r"bwd_sm90 failed to import: TypeError: bad"):
        route.backward_route(call(), KernelConfig(sm90_bwd=True), CPU)
    with pytest.raises(ValueError, match=r"packed sequences .*bwd_sm90 failed to import"):
        route.backward_route(call(packed=True), KernelConfig(sm90_bwd=True), CPU)
