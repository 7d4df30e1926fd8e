"""The kernel's causal sliding window (``flash_attention(..., causal=True, window=W)``).

Semantics under test: query i sees key j iff j <= i and i - j < W (top-left alignment, as the
kernel's causal mask; transformers' ``sliding_window_overlay``: kv_idx > q_idx - W). The
oracle is ``attnmem.kernels.flash.reference.attention_reference(..., window=W)`` in fp64; the kernel's
error must stay within twice plain eager's error in the same dtype plus a small floor (as in
tests/kernels/test_flash_attention.py). Rows that see no key (s_q >= s_k + W) are 0 in both.

Without a GPU the kernels run under Triton's CPU interpreter, switched on before triton is
imported, so every kernel case runs in ONE child process started with TRITON_INTERPRET=1 (this
file run as a script) and each test reads its case from that run. Every buffer the kernels
allocate (`attnmem.kernels.flash.common.empty`) is NaN-filled there, so an element a windowed launch
fails to write shows. The skipping tests poison inputs outside every window a tile needs and
check that the outputs stay finite: those tiles are never read. GPU tests are marked ``gpu``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
# tests/ holds the shared helpers; the interpreter child runs this file as a script
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _poison import poison_empty  # noqa: E402  (tests/_poison.py)
from _tolerance import within as _within  # noqa: E402  (tests/_tolerance.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_CUDA = torch.cuda.is_available()
FLOOR = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
TILES = (32, 32, 4, 1)  # the interpreter's tile: windows below are chosen against it


# ---------------------------------------------------------------------------------------------
# helpers (run in the interpreter child, and on the GPU)
# ---------------------------------------------------------------------------------------------
def _inputs(B, H, H_kv, s_q, s_k, d, dtype, device, layout="contiguous", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def make(h, s):
        if layout == "bshd":  # stored (B, s, h, d), viewed (B, h, s, d): strided
            return torch.randn(B, s, h, d, generator=g).to(device, dtype).transpose(1, 2)
        return torch.randn(B, h, s, d, generator=g).to(device, dtype)

    q, k, v = make(H, s_q), make(H_kv, s_k), make(H_kv, s_k)
    do = torch.randn(B, H, s_q, d, generator=g).to(device, dtype)
    return q, k, v, do


def _fwd_bwd(fn, q, k, v, do):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(do.to(out.dtype))
    return out.detach(), [t.grad.detach() for t in leaves]


def check_window(B, H, H_kv, s_q, s_k, d, window, dtype, device, config=None,
                 layout="contiguous"):
    """Forward and the three gradients of the windowed kernel against the fp64 (CPU, fp32
    inputs) or fp32 reference with the same window, bounded by plain eager's error in
    ``dtype``."""
    from attnmem.kernels import flash_attention
    from attnmem.kernels.flash.reference import attention_reference

    q, k, v, do = _inputs(B, H, H_kv, s_q, s_k, d, dtype, device, layout)
    # fp64 on the CPU, and for fp32 inputs anywhere (an fp32 reference would equal plain eager
    # and leave the bound no room for the kernel's own summation order)
    hi = torch.float64 if device == "cpu" or dtype == torch.float32 else torch.float32
    out, grads = _fwd_bwd(lambda a, b, c: flash_attention(a, b, c, causal=True, window=window,
                                                          config=config), q, k, v, do)
    ref, ref_grads = _fwd_bwd(lambda a, b, c: attention_reference(
        a.to(hi), b.to(hi), c.to(hi), True, None, window), q, k, v, do)
    base, base_grads = _fwd_bwd(lambda a, b, c: attention_reference(a, b, c, True, None, window),
                                q, k, v, do)
    assert out.shape == (B, H, s_q, d) and out.dtype == dtype
    _within("out", out, ref, base, FLOOR[dtype])
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads, strict=True):
        _within(name, g, r, b, FLOOR[dtype])


def check_wide_window_is_the_causal_path(B, H, H_kv, s_q, s_k, d, window, dtype, device):
    """A window of s_q or more hides nothing: bit for bit the call without a window."""
    from attnmem.kernels import flash_attention

    q, k, v, do = _inputs(B, H, H_kv, s_q, s_k, d, dtype, device)
    a, ga = _fwd_bwd(lambda x, y, z: flash_attention(x, y, z, causal=True, window=window),
                     q, k, v, do)
    b, gb = _fwd_bwd(lambda x, y, z: flash_attention(x, y, z, causal=True), q, k, v, do)
    assert torch.equal(a, b), "forward differs from the unwindowed call"
    for name, x, y in zip(("dq", "dk", "dv"), ga, gb, strict=True):
        assert torch.equal(x, y), f"{name} differs from the unwindowed call"


# (B, H, H_kv, s_q, s_k, d, window, dtype, config): windows against the 32-row interpreter tile
INTERP_CASES = {
    "w1": (1, 2, 2, 70, 70, 16, 1, torch.float32, None),
    "w20_gqa_fp16": (1, 4, 2, 97, 97, 32, 20, torch.float16, None),
    "w32_one_tile": (1, 2, 1, 97, 97, 16, 32, torch.float32, None),
    "w45_mha_fp16": (2, 2, 2, 97, 97, 16, 45, torch.float16, None),
    "w64_two_tiles": (1, 2, 2, 130, 130, 16, 64, torch.float32, None),
    "sq_lt_sk": (1, 4, 2, 40, 97, 16, 7, torch.float32, None),
    "sq_gt_sk_empty_rows": (1, 4, 1, 97, 40, 48, 20, torch.float16, None),
    "d80_padded": (1, 2, 1, 70, 70, 80, 33, torch.float32, None),
    "atomic_dq": (1, 4, 2, 97, 97, 32, 45, torch.float16, dict(atomic_dq=True)),
    "atomic_dq_w1": (1, 2, 1, 70, 70, 16, 1, torch.float32, dict(atomic_dq=True)),
    "gqa_split": (1, 8, 2, 97, 60, 32, 13, torch.float32, dict(kv_split=2)),
    "gqa_split_atomic": (2, 4, 1, 70, 70, 16, 33, torch.float32,
                         dict(atomic_dq=True, kv_split=2)),
    "descriptors": (1, 4, 2, 97, 97, 64, 40, torch.float16, dict(use_desc=True)),
}
# (B, H, H_kv, s_q, s_k, d, window, dtype): window >= s_q
WIDE_CASES = {
    "w_equals_s": (2, 2, 2, 64, 64, 16, 64, torch.float16),
    "w_beyond_s": (1, 4, 2, 40, 40, 16, 100, torch.float32),
    "w_equals_sq_lt_sk": (1, 2, 1, 17, 97, 16, 17, torch.float32),
}


def _config(extra):
    from attnmem.kernels.flash.config import KernelConfig

    return KernelConfig(tiles=TILES, **(extra or {}))


# ---- skipping: poisoned inputs outside the window ----------------------------------------------
# Four 32-row tiles: the smallest sequence where, for both poisonings, whole tiles lie outside
# every window a later tile needs, so a kernel that reads them shows (the window=None control
# proves the poison reaches the same outputs without the window).
SKIP_SHAPE = dict(B=1, H=2, H_kv=1, s=128, d=16, window=32)


def _skip_case(which: str, atomic: bool, window: int | None) -> dict:
    """Poison what a windowed call must never read; return which outputs stay finite and
    whether they equal the clean run's.

    "fwd_dq": V of keys 0..31 is NaN. With W = 32 a query tile from row 64 on starts its key
    loop at key 32 or later (row 64 sees keys 33..64), so O and dQ of rows 64.. stay finite
    and equal the clean run's (dQ's backward is given the poisoned V with the clean O, lse2).
    Any read of those keys would spread NaN (0 * NaN in P V or dO V^T) over the whole tile.
    "dkdv": dO of rows 96..127 is NaN. A dK/dV program of keys [n, n + 32) reads query rows
    below n + 63 only, so dK and dV of keys 0..63 stay finite and equal the clean run's.
    ``window=None`` runs the same poisoning without a window: the control, which must NOT
    stay finite (the check would otherwise prove nothing)."""
    from attnmem.kernels.flash.route import attention_backward, attention_forward

    sh = SKIP_SHAPE
    cfg = _config(dict(atomic_dq=atomic))
    q, k, v, do = _inputs(sh["B"], sh["H"], sh["H_kv"], sh["s"], sh["s"], sh["d"],
                          torch.float32, "cpu", seed=3)
    scale = sh["d"] ** -0.5
    o, lse2 = attention_forward(q, k, v, True, scale, cfg, window)
    dq, dk, dv = attention_backward(do, q, k, v, o, lse2, True, scale, cfg, window)
    if which == "fwd_dq":
        v_bad = v.clone()
        v_bad[:, :, :32] = float("nan")
        o_bad, _ = attention_forward(q, k, v_bad, True, scale, cfg, window)
        dq_bad, _, _ = attention_backward(do, q, k, v_bad, o, lse2, True, scale, cfg, window)
        got = {"out": (o_bad[:, :, 64:], o[:, :, 64:]), "dq": (dq_bad[:, :, 64:], dq[:, :, 64:])}
    else:
        do_bad = do.clone()
        do_bad[:, :, sh["s"] - 32:] = float("nan")
        _, dk_bad, dv_bad = attention_backward(do_bad, q, k, v, o, lse2, True, scale, cfg,
                                               window)
        kept = sh["s"] - 64  # keys whose programs end before the poisoned rows
        got = {"dk": (dk_bad[:, :, :kept], dk[:, :, :kept]),
               "dv": (dv_bad[:, :, :kept], dv[:, :, :kept])}
    return {name: {"finite": bool(torch.isfinite(a).all()),
                   "equal": bool(torch.isfinite(a).all()) and bool(torch.allclose(a, b,
                                                                                  atol=1e-6))}
            for name, (a, b) in got.items()}


SKIP_CASES = {
    f"{which}_{'atomic' if atomic else 'two_kernel'}": (which, atomic)
    for which in ("fwd_dq", "dkdv") for atomic in (False, True)
}


def _interp_worker() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _interp import quick_interpreter

    quick_interpreter()  # tests/_interp.py: the interpreter without two redundant costs
    fa = importlib.import_module("attnmem.kernels.flash.api")
    assert fa.interpreting(), "TRITON_INTERPRET=1 did not take effect"
    results: dict[str, object] = {}
    runs = {name: (lambda c=c: check_window(*c[:8], "cpu", config=_config(c[8])))
            for name, c in INTERP_CASES.items()}
    runs["strided_bshd"] = lambda: check_window(2, 4, 2, 33, 33, 32, 10, torch.float32, "cpu",
                                                config=_config(None), layout="bshd")
    runs |= {name: (lambda c=c: check_wide_window_is_the_causal_path(*c, "cpu"))
             for name, c in WIDE_CASES.items()}
    for name, run in runs.items():
        try:
            with poison_empty():
                run()
            results[name] = "ok"
        except BaseException as exc:  # reported by the test of that case
            results[name] = f"{type(exc).__name__}: {exc}"
    for name, (which, atomic) in SKIP_CASES.items():
        try:
            results["skip_" + name] = {"window": _skip_case(which, atomic, 32),
                                       "control": _skip_case(which, atomic, None)}
        except BaseException as exc:
            results["skip_" + name] = {"error": f"{type(exc).__name__}: {exc}"}
    print("WINDOW_RESULTS " + json.dumps(results), flush=True)


@pytest.fixture(scope="module")
def interp() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--interp-worker"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    for line in res.stdout.splitlines():
        if line.startswith("WINDOW_RESULTS "):
            return json.loads(line[len("WINDOW_RESULTS "):])
    pytest.fail(f"interpreter worker failed (rc {res.returncode}):\n{res.stderr[-4000:]}")


# ---------------------------------------------------------------------------------------------
# interpreter (CPU) tests
# ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(HAS_CUDA, reason="interpreter subset: the GPU tests below run instead")
@pytest.mark.parametrize("case", [*INTERP_CASES, "strided_bshd"])
def test_window_matches_reference_under_interpreter(interp, case):
    """Forward, dQ, dK, dV of windowed calls within plain eager's error of the fp64
    reference: W = 1, 20, 32 (one tile), 45, 64, s_q < s_k, s_q > s_k with rows that see no
    key, a padded head dim, MHA and GQA, fp32 and fp16, the atomic-dQ backward, GQA split over
    dK/dV programs (two-kernel and atomic), K/V through tensor descriptors, strided inputs;
    every kernel allocation NaN-poisoned."""
    assert interp[case] == "ok", interp[case]


@pytest.mark.skipif(HAS_CUDA, reason="interpreter subset")
@pytest.mark.parametrize("case", list(WIDE_CASES))
def test_window_of_s_q_or_more_is_the_unwindowed_call(interp, case):
    """W >= s_q hides no key: output and gradients equal the call without a window exactly."""
    assert interp[case] == "ok", interp[case]


@pytest.mark.skipif(HAS_CUDA, reason="interpreter subset")
@pytest.mark.parametrize("case", list(SKIP_CASES))
def test_tiles_outside_the_window_are_never_read(interp, case):
    """NaN in keys/values (or dO rows) outside the window of every tile that a part of the
    output needs leaves that part finite and equal to the clean run: the windowed kernels
    (forward, dQ kernel, dK/dV kernel, the atomic-dQ dK/dV kernel) never load those tiles.
    Without a window the same poisoning reaches that part (the control)."""
    r = interp["skip_" + case]
    assert "error" not in r, r["error"]
    for name, v in r["window"].items():
        assert v["finite"] and v["equal"], (name, r)
    assert not all(v["finite"] for v in r["control"].values()), r


# ---------------------------------------------------------------------------------------------
# refusals: in this process, before any kernel launch
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fa(monkeypatch):
    """attnmem.kernels.flash.api with CPU tensors accepted (every check below raises before a launch)."""
    api = importlib.import_module("attnmem.kernels.flash.api")
    monkeypatch.setattr(api, "interpreting", lambda: True)
    return api


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "4"])
def test_window_must_be_a_positive_int(fa, bad):
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match=r"window must be a positive int .* or None, got") as e:
        fa.flash_attention(q, q, q, causal=True, window=bad)
    assert repr(bad) in str(e.value)


def test_window_without_causal_is_refused(fa):
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match=r"window=4 was given with causal=False.*causal=True"):
        fa.flash_attention(q, q, q, window=4)
    with pytest.raises(ValueError, match="causal=True"):
        fa.flash_attention(q, q, q, causal=False, window=100)  # even one that hides nothing


def test_window_with_forced_hopper_forward_is_refused(fa):
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match=r"sm90=True was given with window=3.*no sliding window"):
        fa.flash_attention(q, q, q, causal=True, window=3, config=fa.KernelConfig(sm90=True))


def test_reference_window_semantics():
    """The oracle itself: query i sees keys i - W + 1 .. i; an empty row is 0."""
    from attnmem.kernels.flash.reference import attention_reference

    s, W = 6, 3
    q = torch.zeros(1, 1, s, 4, dtype=torch.float64)  # equal scores: uniform over visible keys
    v = torch.arange(s, dtype=torch.float64).view(1, 1, s, 1).expand(1, 1, s, 4)
    out = attention_reference(q, q[:, :, :s], v, causal=True, window=W)[0, 0, :, 0]
    expect = [sum(range(max(0, i - W + 1), i + 1)) / (i + 1 - max(0, i - W + 1))
              for i in range(s)]
    assert out.tolist() == pytest.approx(expect)
    few = attention_reference(q, q[:, :, :2], v[:, :, :2], causal=True, window=2)[0, 0, :, 0]
    assert few.tolist() == pytest.approx([0.0, 0.5, 1.0, 0.0, 0.0, 0.0])  # rows 3.. see none
    with pytest.raises(ValueError, match="causal=True"):
        attention_reference(q, q, v, causal=False, window=2)


def test_window_changes_no_allocation():
    """The memory formulas take no window: the kernels allocate the same buffers (the window
    only changes which tiles a launch visits), so attnmem.calc.peak's model of our kernel holds."""
    import inspect

    from attnmem.kernels.flash import api

    for fn in (api.forward_bytes, api.forward_backward_bytes):
        assert "window" not in inspect.signature(fn).parameters


# ---------------------------------------------------------------------------------------------
# GPU: realistic shapes (the lead runs these on the H200)
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("s, window, H_kv", [(4096, 1024, 8), (4096, 1024, 2), (4096, 4000, 8),
                                             (2000, 333, 8), (8192, 128, 2)])
def test_gpu_window_matches_reference_bf16(s, window, H_kv):
    """B = 1, H = 8, d = 128, bf16, the default dispatch (autotuned / stored tiles, atomic dQ
    from s > 2,048 where the grid is large enough, GQA split on small grids)."""
    with poison_empty():
        check_window(1, 8, H_kv, s, s, 128, window, torch.bfloat16, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("s_q, s_k, d, window, dtype", [
    (1025, 1025, 64, 100, torch.float16), (97, 1000, 128, 50, torch.bfloat16),
    (1000, 97, 128, 50, torch.bfloat16), (1000, 1000, 96, 257, torch.float32),
    (3000, 3000, 64, 2048, torch.bfloat16)])
def test_gpu_window_odd_shapes_match_reference(s_q, s_k, d, window, dtype):
    """fp32 runs with given tiles: it has no stored H200 tiles, and autotuning its exact
    (IEEE) kernels at a new key took over 270 s on the H200, window or not."""
    from attnmem.kernels.flash.config import KernelConfig

    cfg = KernelConfig(tiles=(64, 64, 4, 2)) if dtype == torch.float32 else None
    with poison_empty():
        check_window(2, 4, 2, s_q, s_k, d, window, dtype, "cuda", config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("B, H, H_kv, window, config", [
    (4, 16, 16, 512, None),  # 4 * 16 * 32 = 2,048 dK/dV programs: atomic dQ by default
    (1, 8, 2, 1000, dict(atomic_dq=True)),  # forced, GQA split, bulk dQ adds on Hopper
    (1, 8, 2, 1000, dict(atomic_dq=True, dq_tma=False)),  # element-wise dQ adds
])
def test_gpu_window_atomic_dq_matches_reference(B, H, H_kv, window, config):
    from attnmem.kernels.flash.config import KernelConfig

    cfg = None if config is None else KernelConfig(**config)
    with poison_empty():
        check_window(B, H, H_kv, 4096, 4096, 128, window, torch.bfloat16, "cuda", config=cfg)


if __name__ == "__main__" and "--interp-worker" in sys.argv:
    _interp_worker()


