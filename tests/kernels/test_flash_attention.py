"""The bundled Triton FlashAttention against the eager fp32 reference.

Tolerance comes from the data (as in Dao-AILab/flash-attention's tests): the kernel's error
against a high-precision reference must be at most twice the error of plain PyTorch eager in
the same low precision, plus a small absolute floor. Inputs are fresh random draws every
time; every buffer the kernel allocates is poisoned with NaN first, so an element that the
kernel fails to write shows up as a mismatch.

Without a GPU the kernels run under Triton's CPU interpreter. Triton decides
interpret-or-compile when its own library and our kernels are decorated, i.e. when triton is
first imported, so the interpreter cases run in ONE child process started with
TRITON_INTERPRET=1 (this file run as a script); each parametrized test then reports its own
case from that run. Nothing in this pytest process is switched to interpreter mode. The
interpreter has no bf16: those runs use fp16 and fp32. The full grid of shapes runs on a GPU
as tests marked ``gpu``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

HAS_CUDA = torch.cuda.is_available()
KERNEL_MODULES = ("kernels.flash.fwd", "kernels.flash.bwd", "kernels.flash.api")
# Fixed tile configs, so the GPU grid compiles once per (d, causal, dtype) and never autotunes.
GPU_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
GPU_CONFIG_D256 = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
# Absolute error floor per dtype, on O(1) outputs and gradients.
FLOOR = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(scope="module")
def fa():
    """kernels.flash.api, imported in this process (compiled kernels; no driver call)."""
    return importlib.import_module("kernels.flash.api")


@contextlib.contextmanager
def poison_empty():
    """Every torch.empty / empty_like inside returns NaN-filled memory."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    def empty_like(*args, **kwargs):
        t = real_empty_like(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty, torch.empty_like = empty, empty_like
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real_empty, real_empty_like


@pytest.fixture
def poisoned():
    with poison_empty():
        yield


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _inputs(B, H, H_kv, s_q, s_k, d, dtype, device, layout="contiguous"):
    """Fresh random q, k, v (requiring grad) and dO; layout 'bshd' gives non-contiguous views."""
    def make(h, s):
        if layout == "bshd":  # stored as (B, s, h, d), viewed as (B, h, s, d)
            return torch.randn(B, s, h, d, device=device).transpose(1, 2).to(dtype)
        return torch.randn(B, h, s, d, device=device).to(dtype)

    q, k, v = make(H, s_q), make(H_kv, s_k), make(H_kv, s_k)
    do = torch.randn(B, H, s_q, d, device=device).to(dtype)
    return [t.detach().requires_grad_() for t in (q, k, v)] + [do]


def _forward_backward(fn, q, k, v, do):
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
    from kernels.flash.reference import attention_reference

    q, k, v, do = _inputs(B, H, H_kv, s_q, s_k, d, dtype, device, layout)
    hi = torch.float64 if device == "cpu" else torch.float32

    def kernel(a, b, c):
        return fa.flash_attention(a, b, c, causal=causal, scale=scale, config=config)

    out, grads = _forward_backward(kernel, q, k, v, do)
    ref, ref_grads = _forward_backward(
        lambda a, b, c: attention_reference(a.to(hi), b.to(hi), c.to(hi), causal, scale),
        q, k, v, do)
    base, base_grads = _forward_backward(
        lambda a, b, c: attention_reference(a, b, c, causal, scale), q, k, v, do)
    assert out.shape == (B, H, s_q, d) and out.dtype == dtype
    floor = FLOOR[dtype]
    assert_within("out", out, ref, base, floor)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads, strict=True):
        assert g.shape == r.shape
        assert_within(name, g, r, b, floor)


# ---------------------------------------------------------------------------------------------
# import, errors
# ---------------------------------------------------------------------------------------------
def test_import_touches_no_gpu_or_triton():
    code = (
        "import sys, kernels\n"
        "assert 'triton' not in sys.modules, 'import kernels pulled in triton'\n"
        "assert callable(kernels.attention_reference)\n"
        "import kernels.flash.api, torch\n"
        "assert not torch.cuda.is_initialized(), 'importing the kernel initialised CUDA'\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr


def test_errors_name_the_argument(fa, monkeypatch):
    """Runs in this process on CPU: every check happens before any kernel launch."""
    """Runs in this process on CPU: every check happens before any kernel launch."""
    dev = "cuda" if HAS_CUDA else "cpu"
    q = torch.randn(1, 4, 8, 16, device=dev, dtype=torch.float16)
    kv = torch.randn(1, 2, 8, 16, device=dev, dtype=torch.float16)
    cases = [
        (ValueError, "4-d", (q[0], kv, kv)),
        (TypeError, "dtype", (q, kv.float(), kv)),
        (TypeError, "float16, bfloat16 or float32", (q.int(), kv, kv)),
        (ValueError, "multiple of key/value heads", (q, kv[:, :1].expand(1, 3, 8, 16), kv[:, :1]
                                                     .expand(1, 3, 8, 16))),
        (ValueError, "head_dim must be from 16 to 256", (q[..., :8], kv[..., :8], kv[..., :8])),
        (ValueError, "one head dim", (q, kv[..., :15], kv[..., :15])),
        (ValueError, "one batch size", (q, torch.cat([kv, kv]), torch.cat([kv, kv]))),
        (TypeError, "torch.Tensor", (q.tolist(), kv, kv)),
    ]
    for exc, words, args in cases:
        with pytest.raises(exc, match=words):
            fa.flash_attention(*args)
    with pytest.raises(ValueError, match="scale must be"):
        fa.flash_attention(q, kv, kv, scale=-1.0)
    q_big = torch.randn(1, 4, 8, 272, device=dev, dtype=torch.float16)
    with pytest.raises(ValueError, match="head_dim"):
        fa.flash_attention(q_big, q_big[:, :2], q_big[:, :2])
    # CPU tensors are refused unless the kernels run under the interpreter.
    monkeypatch.setattr(fa, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        fa.flash_attention(q.cpu(), kv.cpu(), kv.cpu())


def test_memory_formula_docstring(fa):
    # 1 x 32 heads x 4096 x 128, fp16: O 32 MiB + lse 0.5 MiB.
    assert fa.forward_bytes(1, 32, 4096, 128, 2) == 32 * 4096 * (128 * 2 + 4)
    two_kernel = 2 * 32 * 4096 * 128 * 2 + 2 * 8 * 4096 * 128 * 2 + 8 * 32 * 4096
    # GQA with 8 key/value heads: 8 x 32 = 256 dK/dV programs, the two-kernel backward, with
    # the group split over 4 programs (8 x 32 x 4 = 1,024): partial dK, dV sums 2*B*H_kv*4*s*d*e
    partial = 2 * 8 * 4 * 4096 * 128 * 2
    assert fa.forward_backward_bytes(1, 32, 8, 4096, 4096, 128, 2) == two_kernel + partial
    assert fa.forward_backward_bytes(1, 32, 8, 4096, 4096, 128, 2, split=1) == two_kernel
    # the atomic-dQ backward (by default from s = 2,049 at d = 64 and 128, 16-bit, with at
    # least 2,048 dK/dV programs: here 8 x 8 x 32, so no split) adds its fp32 buffer
    buffer = 8 * 32 * 4096 * 128 * 4
    assert fa.forward_backward_bytes(8, 32, 8, 4096, 4096, 128, 2) == 8 * two_kernel + buffer
    assert fa.forward_backward_bytes(8, 32, 8, 4096, 4096, 128, 2, atomic=False) == 8 * two_kernel
    assert fa.forward_backward_bytes(4, 32, 8, 4096, 4096, 128, 2) == 4 * two_kernel  # 1,024
    assert fa.forward_backward_bytes(1, 32, 32, 2048, 2048, 128, 2) == (  # s = 2,048: no buffer
        4 * 32 * 2048 * 128 * 2 + 8 * 32 * 2048)
    assert fa.forward_backward_bytes(1, 32, 32, 4096, 4096, 96, 2) == (  # d = 96: no buffer
        4 * 32 * 4096 * 96 * 2 + 8 * 32 * 4096)
    assert "2*B*H*s_q*d*e + 2*B*H_kv*s_k*d*e + 8*B*H*s_q" in fa.flash_attention.__doc__
    assert "4*B*H*s_q*d" in fa.flash_attention.__doc__
    assert "2*B*H_kv*S*s_k*d*e" in fa.flash_attention.__doc__


def test_pretuned_table_lookup(fa, monkeypatch):
    """The stored H200 choices apply to 16-bit inputs on a Hopper GPU only, and can be
    switched off; a malformed call falls back to tuning instead of failing."""
    from types import SimpleNamespace

    fwd = sys.modules["kernels.flash.fwd"]
    q16 = SimpleNamespace(device=SimpleNamespace(type="cuda"), element_size=lambda: 2)
    args = {"Q": q16, "seq_bucket": 4096}
    meta = {"BLOCK_D": 128, "CAUSAL": False}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    hit = fwd.pretuned("fwd", args, meta)
    want = fwd.TUNED_H200[("fwd", 2, 128, False, 4096)]
    assert hit is not None and (hit.kwargs["BLOCK_M"], hit.kwargs["BLOCK_N"], hit.num_warps,
                                hit.num_stages) == want
    pruned = fwd._prune_fwd([], args, **meta)
    assert [c.kwargs for c in pruned] == [hit.kwargs]
    # the stored choice sets the descriptors' tiles like every other config (else the kernel
    # would be compiled for a placeholder tile and skip keys: found on the H200, fixed)
    assert pruned[0].pre_hook is fwd._set_tiles
    assert all(c.pre_hook is fwd._set_tiles for c in fwd._fwd_kernel_tuned.configs)
    assert fwd.pretuned("fwd", {**args, "seq_bucket": 256}, meta) is None  # not stored
    assert fwd.pretuned("fwd", {"seq_bucket": 4096}, meta) is None  # malformed: tune
    monkeypatch.setenv("FLASH_ATTN_TUNE", "1")
    assert fwd.pretuned("fwd", args, meta) is None
    monkeypatch.delenv("FLASH_ATTN_TUNE")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert fwd.pretuned("fwd", args, meta) is None  # not a Hopper part
    for (kernel, _, _, _, _), (bm, bn, warps, stages) in fwd.TUNED_H200.items():
        assert kernel in ("fwd", "dkdv", "dq") and bm in (32, 64, 128) and bn in (32, 64, 128)
        assert warps in (4, 8) and stages in (2, 3, 4, 5)


def test_descriptor_layouts(fa):
    """K/V go through tensor descriptors only when (batch, head, seq) flatten into rows with a
    16-byte row stride; asking for them elsewhere is refused with a message, not misread."""
    fwd = sys.modules["kernels.flash.fwd"]
    if fwd.TensorDescriptor is None:
        pytest.skip("this Triton has no tensor descriptors")
    x = torch.zeros(2, 4, 40, 64, dtype=torch.float16)
    assert fwd._rows_view(x) == (2 * 4 * 40, 64)
    assert fwd._rows_view(x.transpose(1, 2).contiguous().transpose(1, 2)) is None  # (B, s, H, d)
    assert fwd._rows_view(x[:, :, :20]) is None  # heads 40 rows apart, 20 used
    assert fwd._rows_view(x[:1, :1, :20]) == (20, 64)  # one head: any row count
    assert fwd._rows_view(torch.zeros(1, 2, 8, 100, dtype=torch.float16)[..., :36]) is None  # 200 B rows
    assert fwd.descriptors_usable(x, x, 64, True)
    assert not fwd.descriptors_usable(x, x, 64, False)
    assert not fwd.descriptors_usable(x, x, 80, True)  # padded head dim: pointers
    assert not fwd.descriptors_usable(x, x, 64, None)  # CPU tensor, no forcing: pointers
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    kt = torch.zeros(1, 16, 2, 64, dtype=torch.float16).transpose(1, 2)
    with pytest.raises(ValueError, match="USE_DESC=True"):
        fwd.attention_forward(q, kt, kt, False, 0.125, {"BLOCK_M": 16, "BLOCK_N": 16,
                                                          "num_warps": 4, "num_stages": 1,
                                                          "USE_DESC": True})


# ---------------------------------------------------------------------------------------------
# interpreter (CPU) subset: small shapes, fp32 and fp16
# ---------------------------------------------------------------------------------------------
INTERP_CASES = [
    # B, H, H_kv, s_q, s_k, d, causal, dtype
    (1, 2, 2, 1, 1, 16, False, torch.float32),
    (1, 2, 2, 1, 1, 16, True, torch.float16),
    (2, 2, 2, 17, 17, 16, True, torch.float32),
    (1, 4, 1, 17, 17, 80, False, torch.float16),
    (1, 4, 1, 97, 97, 16, True, torch.float16),
    (2, 2, 2, 97, 97, 64, False, torch.float32),
    (1, 8, 1, 33, 33, 96, True, torch.float32),
    (1, 2, 2, 64, 64, 32, True, torch.float16),
    (1, 4, 2, 17, 97, 16, True, torch.float32),  # s_q < s_k, top-left causal
    (1, 4, 2, 97, 17, 48, True, torch.float16),  # s_q > s_k
    (1, 2, 1, 40, 70, 24, False, torch.float32),
    (1, 2, 2, 1, 97, 16, True, torch.float32),  # a single query row: sees key 0 only
]


def _strided_case(fa):
    check_against_reference(fa, 2, 4, 2, 33, 33, 32, True, torch.float32, "cpu",
                            layout="bshd", scale=0.3)


def _stride0_grad_case(fa):
    """out.sum().backward() hands the kernel an expanded (stride-0) dO."""
    from kernels.flash.reference import attention_reference

    q, k, v, _ = _inputs(1, 2, 1, 9, 9, 16, torch.float32, "cpu")
    fa.flash_attention(q, k, v, causal=True).sum().backward()
    q2, k2, v2 = (t.detach().double().requires_grad_() for t in (q, k, v))
    attention_reference(q2, k2, v2, causal=True).sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-5, rtol=1e-4)


# The same cases with K/V read through tensor descriptors (TMA on a GPU; emulated by the
# interpreter): head dims that are powers of two, contiguous layouts, ragged tails and GQA.
INTERP_DESC = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "USE_DESC": True}
INTERP_DESC_CASES = [
    (1, 4, 2, 97, 97, 64, True, torch.float16),
    (2, 2, 2, 70, 70, 32, False, torch.float32),
    (1, 4, 1, 17, 130, 16, True, torch.float32),
    (1, 2, 2, 130, 33, 16, False, torch.float16),
]

# The experimental forward loops (off by default; kernels/NOTES.md step 3) stay correct too.
INTERP_EXPERIMENTS = {"ahead": dict(INTERP_DESC, AHEAD=True), "ws": dict(INTERP_DESC, WS=True)}

# The atomic-dQ backward (config BWD_ATOMIC_DQ; kernels/flash_attn_bwd.py): causal and not,
# ragged tails, s_q != s_k, GQA, a padded head dim.
INTERP_ATOMIC = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1,
                 "BWD_ATOMIC_DQ": True}
INTERP_ATOMIC_CASES = [
    (1, 4, 2, 97, 97, 32, True, torch.float16),
    (2, 2, 2, 70, 40, 16, False, torch.float32),
    (1, 4, 1, 17, 130, 80, True, torch.float32),
]
# GQA groups split over dK/dV programs by a config (the default splits small grids by the whole
# group, which the GQA cases above run): a share of 2 of 4 query heads, two-kernel and atomic
INTERP_SPLIT_CASES = [
    ({"BWD_KV_SPLIT": 2}, (1, 8, 2, 97, 60, 32, True, torch.float16)),
    ({"BWD_KV_SPLIT": 2, "BWD_ATOMIC_DQ": True}, (2, 4, 1, 33, 70, 16, False, torch.float32)),
]

INTERP_IDS = ([f"case{i}" for i in range(len(INTERP_CASES))] + ["strided", "stride0_grad"]
              + [f"desc{i}" for i in range(len(INTERP_DESC_CASES))] + list(INTERP_EXPERIMENTS)
              + [f"atomic{i}" for i in range(len(INTERP_ATOMIC_CASES))]
              + [f"split{i}" for i in range(len(INTERP_SPLIT_CASES))])


def _interp_worker() -> None:
    """Child process (TRITON_INTERPRET=1): run every interpreter case, print JSON results."""
    fa = importlib.import_module("kernels.flash.api")
    assert fa.interpreting(), "TRITON_INTERPRET=1 did not take effect"
    runs = [lambda c=c: check_against_reference(fa, *c, "cpu") for c in INTERP_CASES]
    runs += [lambda: _strided_case(fa), lambda: _stride0_grad_case(fa)]
    runs += [lambda c=c: check_against_reference(fa, *c, "cpu", config=INTERP_DESC)
             for c in INTERP_DESC_CASES]
    runs += [lambda cfg=cfg, causal=causal: check_against_reference(
                 fa, 1, 4, 2, 130, 130, 32, causal, torch.float16, "cpu", config=cfg)
             for causal, cfg in zip((False, True), INTERP_EXPERIMENTS.values(), strict=True)]
    runs += [lambda c=c: check_against_reference(fa, *c, "cpu", config=INTERP_ATOMIC)
             for c in INTERP_ATOMIC_CASES]
    runs += [lambda cfg=cfg, c=c: check_against_reference(fa, *c, "cpu", config=cfg)
             for cfg, c in INTERP_SPLIT_CASES]
    results = {}
    for name, run in zip(INTERP_IDS, runs, strict=True):
        try:
            with poison_empty():
                run()
            results[name] = "ok"
        except BaseException as exc:  # pytest.fail raises a BaseException subclass
            results[name] = f"{type(exc).__name__}: {exc}"
    print("INTERP_RESULTS " + json.dumps(results))


@pytest.fixture(scope="module")
def interp_results() -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--interp-worker"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=500)
    for line in res.stdout.splitlines():
        if line.startswith("INTERP_RESULTS "):
            return json.loads(line[len("INTERP_RESULTS "):])
    pytest.fail(f"interpreter worker failed (rc {res.returncode}):\n{res.stderr[-4000:]}")


@pytest.mark.skipif(HAS_CUDA, reason="interpreter subset: the GPU runs the full grid instead")
@pytest.mark.parametrize("case", INTERP_IDS)
def test_interpreter_matches_reference(interp_results, case):
    """Small shapes under the CPU interpreter: s 1/17/97, d 16..96, GQA, s_q != s_k, strides."""
    if interp_results[case] != "ok":
        pytest.fail(f"{case}: {interp_results[case]}")


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
def test_gpu_grid(fa, poisoned, s, d, causal, group, dtype):
    config = GPU_CONFIG_D256 if d > 128 else GPU_CONFIG
    check_against_reference(fa, 2, 8, 8 // group, s, s, d, causal, dtype, "cuda", config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_k", [(17, 97), (1025, 128), (128, 1000), (1, 1025), (1000, 1)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 96])
def test_gpu_unequal_lengths(fa, poisoned, s_q, s_k, d, causal):
    check_against_reference(fa, 2, 4, 2, s_q, s_k, d, causal, torch.bfloat16, "cuda",
                            config=GPU_CONFIG)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bshd"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32],
                         ids=["fp16", "bf16", "fp32"])
def test_gpu_strides_and_fp32(fa, poisoned, layout, dtype):
    check_against_reference(fa, 2, 8, 2, 300, 300, 64, True, dtype, "cuda", layout=layout,
                            config=GPU_CONFIG, scale=0.2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [16, 64, 128, 256])
@pytest.mark.parametrize("s_q,s_k", [(1, 1), (97, 97), (1025, 1025), (2065, 2065), (130, 1000),
                                     (1000, 130)])
def test_gpu_descriptor_path(fa, poisoned, s_q, s_k, d, causal, dtype):
    """K/V through tensor descriptors (TMA), forced on, GQA 4: ragged tails and diagonals."""
    config = dict(GPU_CONFIG_D256 if d > 128 else GPU_CONFIG, USE_DESC=True)
    check_against_reference(fa, 2, 8, 2, s_q, s_k, d, causal, dtype, "cuda", config=config)


HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("s_q,s_k", [(1, 1), (17, 17), (97, 97), (128, 128), (1000, 1000),
                                     (1025, 1025), (2065, 2065), (130, 1000), (1000, 130),
                                     (1, 1025), (1025, 1), (300, 4100)])
def test_gpu_sm90_path(fa, poisoned, s_q, s_k, group, d, causal, dtype):
    """The hand-scheduled Hopper forward (flash_attn_fwd_sm90), forced on: ragged tails,
    diagonals, s_q != s_k, GQA; gradients through the Triton backward on its O and lse2."""
    check_against_reference(fa, 2, 8, 8 // group, s_q, s_k, d, causal, dtype, "cuda",
                            config={"SM90": True})


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("pingpong", [False, True], ids=["plain", "pingpong"])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q,s_k", [(1, 1), (200, 1000), (1025, 1025), (4100, 300)])
def test_gpu_sm90_schedules(fa, poisoned, s_q, s_k, causal, stages, pingpong):
    """Both schedules (warpgroups taking turns or not) and ring depths give the same answer."""
    config = {"SM90": True, "SM90_STAGES": stages, "SM90_PINGPONG": pingpong}
    check_against_reference(fa, 1, 4, 2, s_q, s_k, 128, causal, torch.bfloat16, "cuda",
                            config=config)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("s_q,s_k", [(1, 1), (17, 300), (192, 192), (200, 1000), (1025, 1025),
                                     (4100, 300), (385, 4100)])
def test_gpu_sm90_three_consumers(fa, poisoned, s_q, s_k, group, causal, dtype):
    """Three consumer warpgroups (BLOCK_M = 192) at d = 64: tile edges at 192-row steps,
    ragged tails, s_q != s_k, GQA; forward and every gradient against the reference."""
    check_against_reference(fa, 2, 4, 4 // group, s_q, s_k, 64, causal, dtype, "cuda",
                            config={"SM90": True, "SM90_CONSUMERS": 3})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q,s_k,d,group", [(1, 1, 64, 1), (97, 1000, 128, 4), (1025, 1025, 64, 1),
                                             (1000, 300, 80, 2), (2048, 2048, 128, 1)])
def test_gpu_atomic_dq_backward(fa, poisoned, s_q, s_k, d, group, causal, dtype):
    """The atomic-dQ backward (config BWD_ATOMIC_DQ, default tiles): every gradient against
    the reference, as the default backward is checked. On Hopper, d = 64 and 128 add dQ with
    the copy engine's bulk reduce-add (d = 80 with element-wise atomics)."""
    from kernels.flash.bwd import dq_tma_usable

    q = torch.empty(1, 1, 1, d, device="cuda", dtype=dtype)
    assert dq_tma_usable(q, d) == (HOPPER and d in (64, 128))
    check_against_reference(fa, 2, 4, 4 // group, s_q, s_k, d, causal, dtype, "cuda",
                            config={"BWD_ATOMIC_DQ": True})


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q,s_k,d,group", [(97, 1000, 128, 4), (1025, 1025, 64, 1)])
def test_gpu_atomic_dq_elementwise(fa, poisoned, s_q, s_k, d, group, causal):
    """{"BWD_DQ_TMA": False}: the element-wise atomic adds where bulk reduce-adds would run."""
    check_against_reference(fa, 2, 4, 4 // group, s_q, s_k, d, causal, torch.float16, "cuda",
                            config={"BWD_ATOMIC_DQ": True, "BWD_DQ_TMA": False})


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q,s_k,d,group", [(1, 1, 128, 1), (17, 300, 128, 4), (200, 1000, 128, 1),
                                             (1025, 1025, 64, 1), (4100, 300, 128, 4),
                                             (385, 4100, 128, 2), (8200, 1000, 128, 1)])
def test_gpu_sm90_persistent(fa, poisoned, s_q, s_k, d, group, causal, dtype):
    """The persistent Gluon forward (config SM90_PERSISTENT): one program per SM walking the
    tiles. B * H = 8, so from s_q = 4,100 on (264 tiles and more on 132 SMs) programs run two
    tiles or more, carrying ring slots and barrier phases over; forward and every gradient."""
    check_against_reference(fa, 2, 4, 4 // group, s_q, s_k, d, causal, dtype, "cuda",
                            config={"SM90": True, "SM90_PERSISTENT": True})


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
def test_gpu_sm90_persistent_refused(fa):
    """The persistent form has two consumer warpgroups and no ping-pong: other asks are refused
    by name."""
    q = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="SM90_PERSISTENT needs two consumer warpgroups"):
        fa.flash_attention(q, q, q, config={"SM90": True, "SM90_PERSISTENT": True,
                                            "SM90_CONSUMERS": 3})


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
def test_gpu_sm90_consumers_refused(fa):
    """Three warpgroups exist at d = 64 only and without ping-pong: asked elsewhere, the call
    says so instead of running."""
    q = torch.randn(1, 2, 64, 128, device="cuda", dtype=torch.float16)
    for config, words in (({"SM90": True, "SM90_CONSUMERS": 3}, "at d = 128"),
                          ({"SM90": True, "SM90_CONSUMERS": 4}, "got 4"),
                          ({"SM90": True, "SM90_CONSUMERS": 3, "SM90_PINGPONG": True},
                           "ping-pong")):
        qq = q if "d = 128" in words else q[..., :64].contiguous()
        with pytest.raises(ValueError, match=words):
            fa.flash_attention(qq, qq, qq, config=config)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_sm90_strided(fa, poisoned, dtype):
    """(B, s, H, d) storage viewed as (B, H, s, d): the descriptors take the strides as they are."""
    check_against_reference(fa, 2, 8, 2, 300, 700, 128, True, dtype, "cuda", layout="bshd",
                            config={"SM90": True}, scale=0.2)
    # the repeated calls above went through the direct launch of the compiled kernel, on
    # Triton 3.6 straight to its C launch function with the encoded tensor maps kept
    launcher = importlib.import_module("kernels.flash.fwd_sm90").LAUNCHER
    assert launcher.direct_calls > 0
    if importlib.import_module("triton").__version__.startswith("3.6."):
        assert launcher.raw_calls > 0 and launcher.encoded


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_direct_launch(fa, poisoned, d):
    """After the first call of a configuration the compiled kernels are launched without the
    JIT's dispatch (kernels/direct.py). A call whose arguments specialise differently must not
    reuse a kernel compiled for others: the same shapes in turn as contiguous tensors,
    (B, s, H, d) views and another GQA group, each twice, each against the reference; then
    inputs at a 2-byte offset (not 16-byte aligned), against the same inputs aligned."""
    from kernels.flash import fwd as fwd

    def direct_calls():
        sm90 = fwd._sm90.LAUNCHER.direct_calls if fwd._sm90 is not None else 0
        return sum(lau.direct_calls for lau in fwd._LAUNCHERS.values()) + sm90

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


def test_sm90_dispatch_rules():
    """Which forward runs: a config without "SM90" picks the Triton kernel, SM90 False too;
    SM90 True where the Gluon kernel cannot run says why instead of running something else."""
    fwd = importlib.import_module("kernels.flash.fwd")
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    assert fwd._use_sm90(q, q, q, {"SM90": False}) is False
    assert fwd._use_sm90(q, q, q, dict(GPU_CONFIG)) is False
    assert fwd._use_sm90(q, q, q, None) is False  # CPU tensors
    with pytest.raises(ValueError, match="SM90=True"):
        fwd._use_sm90(q, q, q, {"SM90": True})


def test_dq_tma_usable_rule():
    """Bulk reduce-adds of dQ need a CUDA tensor (never under the interpreter), a head dim that
    is a power of two, and are refused when a config turns them off."""
    from kernels.flash.bwd import dq_tma_usable

    cpu = torch.empty(1, 1, 1, 64)
    assert not dq_tma_usable(cpu, 64)
    assert not dq_tma_usable(cpu, 80, force=None)
    if HOPPER:
        gpu = torch.empty(1, 1, 1, 64, device="cuda")
        assert dq_tma_usable(gpu, 64) and dq_tma_usable(gpu, 128)
        assert not dq_tma_usable(gpu, 80) and not dq_tma_usable(gpu, 64, force=False)


def test_backward_choice(monkeypatch):
    """Which backward attention_backward launches, with the launches recorded instead of run
    (CPU tensors, no kernel): the atomic-dQ one by `atomic_by_default`, a config's switch
    first, and tiles given without the switch selecting the two-kernel one."""
    from kernels.flash import bwd as bwd

    launched = []
    monkeypatch.setattr(bwd, "launch", lambda tuned, plain, name, *a, **k: launched.append(name))
    monkeypatch.setattr(bwd, "_DELTA_LAUNCHER", lambda grid, key, args, kw: launched.append("delta"))

    def names(B, H, H_kv, s, d, dtype=torch.float16, config=None, **kw):
        q, do, o = (torch.zeros(B, H, s, d, dtype=dtype) for _ in range(3))
        k, v = (torch.zeros(B, H_kv, s, d, dtype=dtype) for _ in range(2))
        lse2 = torch.zeros(B, H, s)
        launched.clear()
        dq, dk, dv = bwd.attention_backward(do, q, k, v, o, lse2, False, 0.1, config, **kw)
        assert dq.dtype == dtype and dq.shape == q.shape and dk.shape == k.shape
        return launched[:]

    atomic, two = ["delta", "dkdv_atomic"], ["dq", "dkdv"]
    assert names(1, 32, 32, 4096, 64) == atomic  # 32 x 64 = 2,048 dK/dV programs
    assert names(1, 32, 32, 2048, 64) == two  # not longer than 2,048
    assert names(1, 32, 32, 4096, 128) == two  # 32 x 32 = 1,024 programs
    assert names(1, 32, 32, 8192, 128) == atomic  # 2,048
    assert names(1, 32, 8, 4096, 64) == atomic  # GQA split over 4: 8 x 4 x 64 = 2,048
    assert names(1, 32, 8, 4096, 128) == two  # GQA split over 4: 8 x 4 x 32 = 1,024
    assert names(4, 32, 8, 4096, 128) == two  # no split (4 x 8 x 32 blocks): 1,024
    assert names(8, 32, 8, 4096, 128) == atomic  # 2,048
    assert names(1, 32, 32, 4096, 80) == two  # head dim
    assert names(1, 32, 32, 4096, 64, torch.float32) == two  # dtype
    assert names(1, 32, 32, 4096, 64, config={"BWD_ATOMIC_DQ": False}) == two
    assert names(1, 2, 2, 100, 64, config={"BWD_ATOMIC_DQ": True}) == atomic
    assert names(1, 32, 32, 4096, 64, config=dict(GPU_CONFIG)) == two  # tiles, no switch
    assert names(1, 32, 32, 4096, 64, dkdv_config=dict(GPU_CONFIG)) == two
    assert names(1, 32, 32, 4096, 64, config={"SM90": True}) == atomic  # forward-only keys
    # deterministic mode keeps the deterministic backward (a config's switch still wins)
    torch.use_deterministic_algorithms(True)
    try:
        assert names(1, 32, 32, 4096, 64) == two
        assert names(1, 32, 32, 4096, 64, config={"BWD_ATOMIC_DQ": True}) == atomic
    finally:
        torch.use_deterministic_algorithms(False)


def test_backward_kv_split(monkeypatch):
    """The GQA split of the dK/dV grid (`kv_split`, a config's BWD_KV_SPLIT), with the launches
    recorded instead of run: the third grid axis, the partial sums' shape, the refusals."""
    from kernels.flash import bwd as bwd

    grids = []
    monkeypatch.setattr(bwd, "launch", lambda tuned, plain, name, meta, bucket, cfg, args, grid,
                        **k: grids.append((name, grid({"BLOCK_N": 128, "BLOCK_M": 64}),
                                           args[6].shape)))
    monkeypatch.setattr(bwd, "_DELTA_LAUNCHER", lambda grid, key, args, kw: None)

    def dkdv(B, H, H_kv, s, config=None):
        q, do, o = (torch.zeros(B, H, s, 64, dtype=torch.float16) for _ in range(3))
        k, v = (torch.zeros(B, H_kv, s, 64, dtype=torch.float16) for _ in range(2))
        grids.clear()
        dq, dk, dv = bwd.attention_backward(do, q, k, v, o, torch.zeros(B, H, s), True, 0.1,
                                            config)
        assert dk.shape == k.shape and dv.shape == v.shape
        return [g[1:] for g in grids if g[0].startswith("dkdv")][0]

    # (key blocks, B * H_kv, split), and the tensor the programs write
    assert dkdv(1, 32, 32, 4096) == ((32, 32, 1), (1, 32, 4096, 64))  # MHA: no split
    assert dkdv(1, 32, 8, 4096) == ((32, 8, 4), (1, 32, 4096, 64))  # 8 x 32 blocks: x4
    assert dkdv(1, 32, 8, 16384) == ((128, 8, 1), (1, 8, 16384, 64))  # 1,024 blocks already
    assert dkdv(1, 32, 8, 4096, {"BWD_KV_SPLIT": 2}) == ((32, 8, 2), (1, 16, 4096, 64))
    assert dkdv(1, 32, 8, 4096, {"BWD_KV_SPLIT": 1}) == ((32, 8, 1), (1, 8, 4096, 64))
    for bad in (0, 3, 8, 2.0, True, "2"):
        with pytest.raises(ValueError, match=f"BWD_KV_SPLIT must be a positive divisor of the "
                                             f"GQA group H / H_kv = 32 / 8 = 4, got {bad!r}"):
            dkdv(1, 32, 8, 4096, {"BWD_KV_SPLIT": bad})


def test_sm90_default_schedule():
    """Where the Gluon forward is the default: d = 128 at every length (two warpgroups, two
    stages), d = 64 only when both lengths exceed 2,048, or 4,096 with a causal mask (three
    warpgroups, two stages)."""
    k90 = importlib.import_module("kernels.flash.fwd")._sm90
    if k90 is None:
        pytest.skip("this Triton has no Gluon Hopper API")
    for causal in (False, True):
        assert k90.default_schedule(128, 1, 1, causal) == (2, 2)
        assert k90.default_schedule(128, 16384, 300, causal) == (2, 2)
        assert k90.default_schedule(64, 2048, 16384, causal) is None
        assert k90.default_schedule(64, 16384, 2048, causal) is None
        assert k90.default_schedule(64, 4097, 8192, causal) == (3, 2)
        assert k90.default_schedule(80, 8192, 8192, causal) is None
    assert k90.default_schedule(64, 2049, 4096, False) == (3, 2)
    assert k90.default_schedule(64, 2049, 4096, True) is None


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon forward runs on compute capability 9.x only")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_sm90_default_d64_long(fa, poisoned, causal):
    """d = 64 past 4,096 runs the three-warpgroup forward without any config (the default
    schedule, causal or not), and its output and gradients match the reference."""
    k90 = importlib.import_module("kernels.flash.fwd_sm90")
    before = len(k90.LAUNCHER.cache) + k90.LAUNCHER.direct_calls
    check_against_reference(fa, 1, 2, 2, 4100, 4300, 64, causal, torch.bfloat16, "cuda")
    assert len(k90.LAUNCHER.cache) + k90.LAUNCHER.direct_calls > before
    assert any(key[1][6] == 3 for key in k90.LAUNCHER.cache)  # (.., consumers = 3, ..)


def test_sm90_kernel_compiles_for_hopper():
    """The Gluon forward compiles for sm_90 on this machine (no GPU needed: Triton's compiler
    and ptxas run on the CPU), without register spills and within the 227 KiB of shared
    memory one block may use."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from kernels.bench import compile_sm90 as mod
    for args in (("bf16", 128, True, 128, 2), ("fp16", 64, False, 128, 3, False, 3)):
        ck = mod.compile_variant(*args)  # the default tile at d = 128; three warpgroups at 64
        regs, spills = mod._ptxas_usage(ck.asm["ptx"])
        assert spills == "0", f"{args}: ptxas reports {spills} bytes of spill stores ({regs} regs)"
        assert ck.metadata.shared <= 227 * 1024
        assert ck.asm["ptx"].count("wgmma.wait_group.sync.aligned 1") >= 1  # the overlap


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_autotuned_path(fa, poisoned, d, causal):
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
def test_gpu_memory_matches_formula(fa, backward, forward, s):
    """Peak extra bytes of one call equal the documented formula (allocator rounding aside),
    with either forward kernel; at s = 4,096 the sm90 case's backward is the atomic-dQ one
    (16 x 4 x 32 = 2,048 dK/dV programs; its fp32 buffer counted), the triton case's (tiles
    given) the two-kernel one."""
    if forward == "sm90" and not HOPPER:
        pytest.skip("the Gluon forward runs on compute capability 9.x only")
    B, H, H_kv, d = 16, 8, 4, 128
    q, k, v, do = _inputs(B, H, H_kv, s, s, d, torch.bfloat16, "cuda")
    cfg = GPU_CONFIG if forward == "triton" else {"SM90": True}
    atomic = forward == "sm90" and s > 2048
    from kernels.flash.bwd import atomic_by_default

    assert atomic_by_default(B, H, H_kv, s, s, d, 2) == (s > 2048)

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
def test_gpu_memory_gqa_split(fa, s):
    """Peak extra bytes of forward + backward with a GQA group of 8 split over programs equal
    the formula: at s = 2,048 the partial dK, dV sums (S = 8), at 4,096 also the atomic
    backward's fp32 buffer (S = 8: 4 x 8 x 64 = 2,048 dK/dV programs)."""
    from kernels.flash.bwd import atomic_by_default, kv_split

    B, H, H_kv, d = 1, 32, 4, 64
    assert kv_split(B, H, H_kv, s) == 8
    assert atomic_by_default(B, H, H_kv, s, s, d, 2) == (s > 2048)
    q, k, v, do = _inputs(B, H, H_kv, s, s, d, torch.float16, "cuda")

    def call():
        fa.flash_attention(q, k, v, causal=False).backward(do)

    peak = _peak_extra_bytes(call, (q, k, v))
    want = fa.forward_backward_bytes(B, H, H_kv, s, s, d, 2)
    assert want == fa.forward_backward_bytes(B, H, H_kv, s, s, d, 2, atomic=False, split=1) + (
        2 * 8 * B * H_kv * s * d * 2) + (B * H * s * d * 4 if s > 2048 else 0)
    assert want <= peak <= want + 10 * 512, (peak, want)


if __name__ == "__main__" and "--interp-worker" in sys.argv:
    _interp_worker()
