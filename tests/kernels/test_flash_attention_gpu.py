"""The bundled FlashAttention on a GPU (tests marked ``gpu``): the full grid of shapes,
dtypes, head dims, GQA groups and layouts against the eager reference with every kernel
buffer NaN-poisoned (the tolerance rule of tests/kernels/test_flash_attention.py, shared in
tests/kernels/_flash_check.py), each forward and backward path forced in turn (descriptors,
the Hopper forward's schedules, atomic dQ, direct launches), and the peak memory of a call
against api.py's formula."""

from __future__ import annotations

import dataclasses
import importlib
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _flash_check import (  # noqa: E402
    GPU_CONFIG,
    GPU_CONFIG_D256,
    HOPPER,
    check_against_reference,
    inputs,
)

from attnmem.kernels.flash.config import KernelConfig  # noqa: E402

# ---------------------------------------------------------------------------------------------
# GPU: the full grid
# ---------------------------------------------------------------------------------------------
GPU_SEQ = [1, 17, 97, 128, 1000, 1025]
GPU_DIMS = [16, 64, 80, 96, 128, 256]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", GPU_DIMS)
@pytest.mark.parametrize("s", GPU_SEQ)
def test_gpu_grid_matches_reference(fa, poisoned, s, d, causal, group, dtype):
    config = GPU_CONFIG_D256 if d > 128 else GPU_CONFIG
    check_against_reference(fa, 2, 8, 8 // group, s, s, d, causal, dtype, "cuda", config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_k", [(17, 97), (1025, 128), (128, 1000), (1, 1025), (1000, 1)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 96])
def test_gpu_unequal_lengths_match_reference(fa, poisoned, s_q, s_k, d, causal):
    check_against_reference(fa, 2, 4, 2, s_q, s_k, d, causal, torch.bfloat16, "cuda",
                            config=GPU_CONFIG)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bshd"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32],
                         ids=["fp16", "bf16", "fp32"])
def test_gpu_strided_views_and_fp32_match_reference(fa, poisoned, layout, dtype):
    check_against_reference(fa, 2, 8, 2, 300, 300, 64, True, dtype, "cuda", layout=layout,
                            config=GPU_CONFIG, scale=0.2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [16, 64, 128, 256])
@pytest.mark.parametrize("s_q,s_k", [(1, 1), (97, 97), (1025, 1025), (2065, 2065), (130, 1000),
                                     (1000, 130)])
def test_gpu_descriptor_loads_match_reference(fa, poisoned, s_q, s_k, d, causal, dtype):
    """K/V through tensor descriptors (TMA), forced on, GQA 4: ragged tails and diagonals."""
    config = dataclasses.replace(GPU_CONFIG_D256 if d > 128 else GPU_CONFIG, use_desc=True)
    check_against_reference(fa, 2, 8, 2, s_q, s_k, d, causal, dtype, "cuda", config=config)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 80, 96, 128])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("s_q,s_k", [(1, 1), (17, 17), (97, 97), (128, 128), (1000, 1000),
                                     (1025, 1025), (2065, 2065), (130, 1000), (1000, 130),
                                     (1, 1025), (1025, 1), (300, 4100)])
def test_gpu_sm90_forward_matches_reference(fa, poisoned, s_q, s_k, group, d, causal, dtype,
                                            monkeypatch):
    """The hand-scheduled Hopper forward (fwd_sm90), forced on: ragged tails,
    diagonals, s_q != s_k, GQA, d = 80 and 96 in 128-wide tiles (`fwd_sm90.tile_d`, with
    SETTINGS.sm90_padded_dims); gradients through the Triton backward on its O and lse2."""
    from attnmem.kernels.flash.config import SETTINGS

    monkeypatch.setattr(SETTINGS, "sm90_padded_dims", True)
    check_against_reference(fa, 2, 8, 8 // group, s_q, s_k, d, causal, dtype, "cuda",
                            config=KernelConfig(sm90=True))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q,s_k", [(1, 1), (200, 1000), (1025, 1025), (4100, 300)])
def test_gpu_sm90_ring_depths_agree(fa, poisoned, s_q, s_k, causal, stages):
    """Both ring depths (K/V slots) give the same answer."""
    config = fa.KernelConfig(sm90=True, sm90_stages=stages)
    check_against_reference(fa, 1, 4, 2, s_q, s_k, 128, causal, torch.bfloat16, "cuda",
                            config=config)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("s_q,s_k", [(1, 1), (17, 300), (192, 192), (200, 1000), (1025, 1025),
                                     (4100, 300), (385, 4100)])
def test_gpu_sm90_three_warpgroups_match_reference(fa, poisoned, s_q, s_k, group, causal, dtype):
    """Three consumer warpgroups (BLOCK_M = 192) at d = 64: tile edges at 192-row steps,
    ragged tails, s_q != s_k, GQA; forward and every gradient against the reference."""
    check_against_reference(fa, 2, 4, 4 // group, s_q, s_k, 64, causal, dtype, "cuda",
                            config=KernelConfig(sm90=True, sm90_consumers=3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q,s_k,d,group", [(1, 1, 64, 1), (97, 1000, 128, 4), (1025, 1025, 64, 1),
                                             (1000, 300, 80, 2), (2048, 2048, 128, 1)])
def test_gpu_atomic_dq_backward_matches_reference(fa, poisoned, s_q, s_k, d, group, causal, dtype):
    """The atomic-dQ backward (KernelConfig(atomic_dq=True), default tiles): every gradient against
    the reference, as the default backward is checked. On Hopper, d = 64 and 128 add dQ with
    the copy engine's bulk reduce-add (d = 80 with element-wise atomics)."""
    from attnmem.kernels.flash.route import dq_tma_usable

    q = torch.empty(1, 1, 1, d, device="cuda", dtype=dtype)
    assert dq_tma_usable(q, d) == (HOPPER and d in (64, 128))
    check_against_reference(fa, 2, 4, 4 // group, s_q, s_k, d, causal, dtype, "cuda",
                            config=KernelConfig(atomic_dq=True))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q,s_k,d,group", [(97, 1000, 128, 4), (1025, 1025, 64, 1)])
def test_gpu_elementwise_atomic_dq_matches_reference(fa, poisoned, s_q, s_k, d, group, causal):
    """dq_tma=False: the element-wise atomic adds where bulk reduce-adds would run."""
    check_against_reference(fa, 2, 4, 4 // group, s_q, s_k, d, causal, torch.float16, "cuda",
                            config=KernelConfig(atomic_dq=True, dq_tma=False))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
def test_gpu_sm90_three_warpgroups_refused_off_d64(fa):
    """Three warpgroups exist at d = 64 only: asked elsewhere, the call says so instead of
    running."""
    q = torch.randn(1, 2, 64, 128, device="cuda", dtype=torch.float16)
    for fields, words in ((dict(sm90=True, sm90_consumers=3), "at d = 128"),
                          (dict(sm90=True, sm90_consumers=4), "got 4")):
        qq = q if "d = 128" in words else q[..., :64].contiguous()
        with pytest.raises(ValueError, match=words):
            fa.flash_attention(qq, qq, qq, config=KernelConfig(**fields))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_sm90_takes_strided_views_without_copies(fa, poisoned, dtype):
    """(B, s, H, d) storage viewed as (B, H, s, d): the descriptors take the strides as they are."""
    # twice: the first call in a fresh process compiles through the JIT, the second one finds
    # the compiled kernel (otherwise whether it ran direct depends on what ran before in the
    # same pytest worker)
    for _ in range(2):
        check_against_reference(fa, 2, 8, 2, 300, 700, 128, True, dtype, "cuda", layout="bshd",
                                config=KernelConfig(sm90=True), scale=0.2)
    # the repeated call went through the direct launch of the compiled kernel, on
    # Triton 3.6 straight to its C launch function with the encoded tensor maps kept
    launcher = importlib.import_module("attnmem.kernels.flash.fwd_sm90").LAUNCHER
    assert launcher.direct_calls > 0
    if importlib.import_module("triton").__version__.startswith("3.6."):
        assert launcher.raw_calls > 0 and launcher.encoded


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_direct_launch_never_reuses_a_mismatched_kernel(fa, poisoned, d):
    """After the first call of a configuration the compiled kernels are launched without the
    JIT's dispatch (launcher.DirectLauncher). A call whose arguments specialise differently must not
    reuse a kernel compiled for others: the same shapes in turn as contiguous tensors,
    (B, s, H, d) views and another GQA group, each twice, each against the reference; then
    inputs at a 2-byte offset (not 16-byte aligned), against the same inputs aligned."""
    from attnmem.kernels.flash import common, route

    def direct_calls():
        sm90 = route.fwd_sm90.LAUNCHER.direct_calls if route.fwd_sm90 is not None else 0
        return sum(lau.direct_calls for lau in common.LAUNCHERS.values()) + sm90

    before = direct_calls()
    for layout, h_kv in (("contiguous", 4), ("bshd", 4), ("contiguous", 1), ("bshd", 4)):
        for _ in range(2):
            check_against_reference(fa, 2, 4, h_kv, 300, 300, d, True, torch.float16, "cuda",
                                    layout=layout)
    assert direct_calls() > before

    def offset(shape):  # a view starting 2 bytes into its buffer
        n = math.prod(shape)
        return torch.randn(n + 1, device="cuda", dtype=torch.float16)[1:].view(shape)

    def run(q, k, v, do):  # no copies: the kernels see these very views
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = fa.flash_attention(*leaves, causal=True)
        out.backward(do)
        return [out.detach()] + [t.grad for t in leaves]

    q, k, v, do = (offset((2, 4, 300, d)) for _ in range(4))
    assert q.data_ptr() % 16 and k.data_ptr() % 16
    want = run(*(t.clone() for t in (q, k, v, do)))  # aligned first: its kernels get cached
    for _ in range(2):
        got = run(q, k, v, do)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_d64_long_runs_three_warpgroups_by_default(fa, poisoned, causal):
    """d = 64 past 4,096 runs the three-warpgroup forward without any config (the default
    schedule, causal or not), and its output and gradients match the reference."""
    k90 = importlib.import_module("attnmem.kernels.flash.fwd_sm90")
    before = len(k90.LAUNCHER.cache) + k90.LAUNCHER.direct_calls
    check_against_reference(fa, 1, 2, 2, 4100, 4300, 64, causal, torch.bfloat16, "cuda")
    assert len(k90.LAUNCHER.cache) + k90.LAUNCHER.direct_calls > before
    assert any(key[1][5] == 3 for key in k90.LAUNCHER.cache)  # (.., consumers = 3, ..)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_autotuned_choices_match_reference(fa, poisoned, d, causal):
    """The autotuner's choices are correct too (config=None)."""
    check_against_reference(fa, 1, 8, 8, 1025, 1025, d, causal, torch.bfloat16, "cuda")


def _peak_extra_bytes(call, leaves) -> int:
    """Peak bytes allocated by call() beyond what was allocated before it, after a first call
    (compilation) and with the leaves' gradients unset, so that the call allocates them."""
    call()  # compile
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


@pytest.mark.gpu
@pytest.mark.parametrize("s", [2048, 4096])
@pytest.mark.parametrize("forward", ["triton", "sm90"])
@pytest.mark.parametrize("backward", [False, True])
def test_gpu_peak_memory_matches_formula(fa, backward, forward, s):
    """Peak extra bytes of one call equal the documented formula (allocator rounding aside),
    with either forward kernel; the sm90 case's backward is the Hopper region's (16 x 4 x 16 =
    1,024 dK/dV programs over 16 x 2,048 queries at s = 2,048, 2,048 programs at 4,096), which
    adds dQ atomically into the fp32 buffer (counted); the triton case's (tiles given,
    atomic_dq off) is the two-kernel one."""
    if forward == "sm90" and not HOPPER:
        pytest.skip("the Gluon forward runs on compute capability 9.x only")
    B, H, H_kv, d = 16, 8, 4, 128
    q, k, v, do = inputs(B, H, H_kv, s, s, d, torch.bfloat16, "cuda")
    cfg = GPU_CONFIG if forward == "triton" else KernelConfig(sm90=True)
    atomic = forward == "sm90"
    from attnmem.calc.dispatch import sm90_region
    from attnmem.kernels.flash.route import atomic_by_default

    assert atomic_by_default(B, H, H_kv, s, s, d, 2)
    assert sm90_region(B, H_kv, s, s, d, 2)

    def call():
        if backward:
            fa.flash_attention(q, k, v, causal=True, config=cfg).backward(do)
        else:
            with torch.no_grad():
                fa.flash_attention(q, k, v, causal=True, config=cfg)

    peak = _peak_extra_bytes(call, (q, k, v))
    want = (fa.forward_backward_bytes(B, H, H_kv, s, s, d, 2, atomic=atomic) if backward
            else fa.forward_bytes(B, H, s, d, 2))
    assert want <= peak <= want + 8 * 512, (peak, want)


@pytest.mark.gpu
@pytest.mark.parametrize("s", [2048, 4096])
def test_gpu_peak_memory_with_gqa_split_matches_formula(fa, s):
    """Peak extra bytes of forward + backward with a GQA group of 8 split over programs equal
    the formula: at s = 2,048 the partial dK, dV sums (S = 8), at 4,096 also the atomic
    backward's fp32 buffer (S = 8: 4 x 8 x 64 = 2,048 dK/dV programs)."""
    from attnmem.kernels.flash.route import atomic_by_default, kv_split

    B, H, H_kv, d = 1, 32, 4, 64
    assert kv_split(B, H, H_kv, s, s, d, 2) == 8  # 4 x 32 = 128 programs: not the Hopper region
    assert atomic_by_default(B, H, H_kv, s, s, d, 2) == (s > 2048)
    q, k, v, do = inputs(B, H, H_kv, s, s, d, torch.float16, "cuda")

    def call():
        fa.flash_attention(q, k, v, causal=False).backward(do)

    peak = _peak_extra_bytes(call, (q, k, v))
    want = fa.forward_backward_bytes(B, H, H_kv, s, s, d, 2)
    assert want == fa.forward_backward_bytes(B, H, H_kv, s, s, d, 2, atomic=False, split=1) + (
        2 * 8 * B * H_kv * s * d * 2) + (B * H * s * d * 4 if s > 2048 else 0)
    assert want <= peak <= want + 10 * 512, (peak, want)
