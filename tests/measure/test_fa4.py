"""FlashAttention-4 (``fa4``) as a registry implementation.

On a CPU: without flash_attn.cute it is reported unavailable with the reason and the install
hint (and a measured point says so); a package that is there but broken says what failed; FA4's
dtype, head-dim and compute-capability rules are refused by name; and, with a fake FA4 kernel
in its place, the call passes (B, s, H, d) views (no copies), GQA as k/v with fewer heads, and
returns (B, H, s, d) outputs and gradients equal to the eager reference. Marked gpu: the real
FA4 against an fp32 reference, forward and backward, causal and GQA (skipped with the reason
where flash_attn.cute or a 9.x/10.x GPU is missing).
"""

from __future__ import annotations

import sys

import pytest
import torch

from attnmem.measure import registry
from attnmem.measure.harness import CpuDevice, PointConfig, measure_point


def _reference(q, k, v, causal):
    """fp64 eager attention on (B, H, s, d), k/v heads repeated for GQA."""
    return registry.naive(q.double(), k.double(), v.double(), causal)


# --------------------------------------------------------------------------------------------
# Absent or broken.
# --------------------------------------------------------------------------------------------


def test_fa4_is_unavailable_with_its_reason_when_flash_attn_cute_is_absent():
    if registry.fa4_installed_reason() is None:
        pytest.skip("flash_attn.cute is installed here")
    for device in ("cuda", "cpu"):
        ok, why = registry.available("fa4", "bf16", 128, causal=True, backward=True,
                                     heads=32, kv_heads=8, device=device)
        assert not ok
        assert "flash_attn.cute is not installed" in why and "pip install flash-attn-4" in why
        assert "flash-attn-4==4.0.0b36" in why and "../" not in why
    res = measure_point(PointConfig("fa4", 1, 4, 128, 64, "bf16"), device=CpuDevice())
    assert res.status == "unavailable" and "flash_attn.cute is not installed" in res.message
    assert "fa4" in registry.NAMES and registry.get("fa4").fn is registry.fa4_attention
    assert registry.gqa_note("fa4", "bf16", 128, causal=False, backward=False) == ""


def test_fa4_that_does_not_import_says_what_failed(tmp_path, monkeypatch):
    """flash_attn/cute present but a dependency missing: 'did not import', with the error."""
    pkg = tmp_path / "flash_attn" / "cute"
    pkg.mkdir(parents=True)
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("import cutlass_dsl_that_is_not_here  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_FA4_IMPORT", {})
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        assert registry.fa4_installed_reason() is None  # the files are there
        with pytest.raises(ImportError, match="did not import.*cutlass_dsl_that_is_not_here"):
            registry._fa4_func()
        with pytest.raises(ImportError, match="did not import"):  # remembered, not retried
            registry._fa4_func()
        ok, why = registry.available("fa4", "bf16", 128, device="cpu")
        assert not ok and "needs a CUDA GPU" in why
    finally:
        for name in ("flash_attn", "flash_attn.cute"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize("dtype,d,cap,want", [
    ("bf16", 128, (9, 0), None),
    ("fp16", 64, (9, 0), None),
    ("bf16", 256, (9, 0), None),
    ("bf16", 8, (9, 0), None),
    ("bf16", 128, (10, 0), None),
    ("bf16", 256, (10, 0), None),
    ("fp32", 128, (9, 0), "FA4 runs fp16 and bf16 only, got fp32"),
    ("bf16", 100, (9, 0), "FA4 on sm90 takes head dims 8 to 256 in steps of 8, got 100"),
    ("bf16", 264, (9, 0), "got 264"),
    ("bf16", 192, (10, 0), "FA4 on sm100 takes head dims 8 to 128 in steps of 8, or 256, got 192"),
    ("bf16", 128, (8, 0), "FA4 needs compute capability 9.0 or 10.x, this GPU is 8.0"),
    ("bf16", 128, (12, 0), "this GPU is 12.0"),
])
def test_fa4_shape_rules(dtype, d, cap, want):
    why = registry.fa4_shape_reason(dtype, d, cap)
    assert (why is None) if want is None else (why is not None and want in why)


# --------------------------------------------------------------------------------------------
# The call, with a fake FA4 kernel.
# --------------------------------------------------------------------------------------------


class FakeFA4:
    """Stands in for flash_attn.cute.flash_attn_func: checks the (B, s, H, d) layout it gets,
    records the tensors, and computes attention eagerly (so autograd gives real gradients)."""

    def __init__(self, tuple_out: bool = True) -> None:
        self.tuple_out = tuple_out
        self.calls: list[dict] = []

    def __call__(self, q, k, v, softmax_scale=None, causal=False):
        b, s, h, d = q.shape
        assert k.shape[0] == b and k.shape[3] == d and h % k.shape[2] == 0
        self.calls.append(dict(q=q, k=k, v=v, scale=softmax_scale, causal=causal))
        out = registry.naive(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal,
                             softmax_scale)  # (B, H, s, d)
        out = out.transpose(1, 2).contiguous()  # FA4 writes (B, s, H, d)
        lse = torch.zeros(b, h, s)
        return (out, lse) if self.tuple_out else out


@pytest.fixture
def fake_fa4(monkeypatch):
    fake = FakeFA4()
    monkeypatch.setattr(registry, "_FA4_IMPORT", {"fn": fake})
    monkeypatch.setattr(registry, "_fa4_tensor_reason", lambda q: None)
    return fake


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_fa4_call_passes_views_and_matches_the_reference(fake_fa4, causal, kv_heads):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 37, 16, dtype=torch.float64, requires_grad=True)  # (B, H, s, d)
    k = torch.randn(2, kv_heads, 37, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, kv_heads, 37, 16, dtype=torch.float64, requires_grad=True)
    out = registry.fa4_attention(q, k, v, causal)
    assert out.shape == (2, 4, 37, 16)
    call = fake_fa4.calls[-1]
    for mine, given in ((q, call["q"]), (k, call["k"]), (v, call["v"])):
        # the very same memory, seen as (B, s, H, d): a view, not a copy
        assert given.shape == (mine.shape[0], mine.shape[2], mine.shape[1], mine.shape[3])
        assert given.data_ptr() == mine.data_ptr() and given.stride() == mine.transpose(1, 2).stride()
    assert call["causal"] is causal and call["scale"] is None
    ref = _reference(q, k, v, causal)
    torch.testing.assert_close(out, ref)
    do = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), do)
    want = torch.autograd.grad(ref, (q, k, v), do)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_fa4_call_reads_a_bare_output_and_refuses_what_it_cannot_do(fake_fa4, monkeypatch):
    monkeypatch.setattr(registry, "_FA4_IMPORT", {"fn": FakeFA4(tuple_out=False)})
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(registry.fa4_attention(q, k, v, False, 0.5),
                               registry.naive(q, k, v, False, 0.5))
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        registry.fa4_attention(q, torch.randn(1, 3, 8, 16), torch.randn(1, 3, 8, 16))
    with pytest.raises(ValueError, match="s_q=8, s_k=12"):
        registry.fa4_attention(q, torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16), True)


def test_fa4_call_refuses_cpu_tensors_by_rule():
    """Without the fake: CPU tensors are refused before FA4 is imported."""
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="FA4 needs CUDA tensors"):
        registry.fa4_attention(q, q, q)


# --------------------------------------------------------------------------------------------
# On a GPU with FA4 installed.
# --------------------------------------------------------------------------------------------


def _need_fa4(**kw):
    ok, why = registry.available("fa4", kw.pop("dtype", "bf16"), kw.pop("head_dim", 128), **kw)
    if not ok:
        pytest.skip(f"fa4 unavailable: {why}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("d,causal,kv_heads", [(128, False, 8), (128, True, 8), (64, True, 2),
                                               (128, True, 4)])
def test_gpu_fa4_matches_the_reference(dtype, d, causal, kv_heads):
    """FA-style tolerance: FA4's error against an fp64 reference is at most twice that of an
    eager run in the same 16-bit dtype (plus a little), for the output and every gradient."""
    _need_fa4(dtype=dtype, head_dim=d, causal=causal, backward=True, heads=8, kv_heads=kv_heads)
    torch.manual_seed(0)
    tdt = registry.torch_dtype(dtype)
    s = 1025  # not a multiple of any tile
    q = torch.randn(2, 8, s, d, device="cuda", dtype=tdt, requires_grad=True)
    k = torch.randn(2, kv_heads, s, d, device="cuda", dtype=tdt, requires_grad=True)
    v = torch.randn(2, kv_heads, s, d, device="cuda", dtype=tdt, requires_grad=True)
    do = torch.randn(2, 8, s, d, device="cuda", dtype=tdt)
    fn = registry.get("fa4").fn
    runs = {}
    for name, call, cast in (("fa4", fn, lambda t: t), ("eager", registry.naive, lambda t: t),
                             ("ref", registry.naive, lambda t: t.double())):
        qq, kk, vv = (cast(t.detach()).requires_grad_() for t in (q, k, v))
        out = call(qq, kk, vv, causal, None)
        out.backward(cast(do))
        runs[name] = (out, qq.grad, kk.grad, vv.grad)
    for i, what in enumerate(("out", "dq", "dk", "dv")):
        ref = runs["ref"][i]
        err = {n: ((runs[n][i].double() - ref).norm() / ref.norm()).item() for n in ("fa4", "eager")}
        assert err["fa4"] <= 2 * err["eager"] + 1e-3, (what, err)


@pytest.mark.gpu
def test_gpu_fa4_point_is_measured():
    _need_fa4(causal=True, backward=True, heads=32, kv_heads=8)
    res = measure_point(PointConfig("fa4", 1, 32, 2048, 128, "bf16", causal=True, backward=True,
                                    kv_heads=8))
    assert res.status == "ok", res.message
    assert res.peak_extra_bytes and res.peak_extra_bytes > 0 and res.tflops and res.tflops > 0
