"""The Hopper (Gluon) backward, attnmem.kernels.flash.bwd_sm90, against the eager fp32 reference.

GPU tests (marked ``gpu``; they also need compute capability 9.x): all three gradients, at
lengths that are and are not multiples of the tiles, causal and not, MHA and GQA, fp16 and
bf16, d = 64 and 128. The tolerance comes from the data, as in test_flash_attention.py: the
error against the fp32 reference may be at most twice the error of the same gradients
computed by plain PyTorch in the low precision, plus a small floor. Every buffer the backward
allocates with ``new_empty`` is NaN-filled first, so an element it fails to write shows up.

CPU test: the kernel compiles for sm_90 with Triton's compiler and ptxas on this machine
(no GPU needed), every variant with 0 spilled bytes and within the shared-memory limit.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys

import pytest
from _hopper import hopper_reason

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

FLOOR = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _sm90():
    """attnmem.kernels.flash.bwd_sm90; skipped only where this Triton has no Gluon at all (any
    other failure to import it fails the test)."""
    from attnmem.kernels.flash import route

    if route.gluon_missing():
        pytest.skip("this Triton has no Gluon (triton.experimental.gluon)")
    from attnmem.kernels.flash import bwd_sm90

    return bwd_sm90


@contextlib.contextmanager
def _poisoned_new_empty():
    """Tensor.new_empty returns NaN-filled floating tensors inside (dK, dV, the stats, the dQ
    buffer are allocated with it), so an element the kernels do not write is caught."""
    orig = torch.Tensor.new_empty

    def new_empty(self, *args, **kwargs):
        t = orig(self, *args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.Tensor.new_empty = new_empty
    try:
        yield
    finally:
        torch.Tensor.new_empty = orig


def _grads(q, k, v, do, causal, scale):
    from attnmem.kernels.flash.reference import attention_reference

    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = attention_reference(q, k, v, causal, scale)
    return torch.autograd.grad(o, (q, k, v), do)


GPU_CASES = [
    # B, H, H_kv, s_q, s_k, d, causal
    (1, 2, 2, 128, 128, 128, False),
    (2, 3, 3, 1000, 1000, 128, False),
    (2, 3, 3, 1000, 1000, 128, True),
    (1, 4, 1, 780, 777, 128, True),  # GQA 4:1, ragged (queries: a multiple of 4, `usable`)
    (1, 4, 4, 300, 1100, 128, False),  # s_q != s_k
    (1, 4, 4, 1100, 300, 128, True),
    (2, 2, 2, 1000, 1000, 64, False),
    (1, 8, 2, 1028, 1025, 64, True),  # GQA 4:1
    (1, 2, 2, 2048, 2048, 64, True),
    (1, 2, 2, 2048, 2048, 128, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "B{}H{}kv{}q{}k{}d{}{}".format(
    *c[:6], "c" if c[6] else ""))
def test_gradients_match_reference(case, dtype):
    reason = hopper_reason()
    if reason:
        pytest.skip(reason)
    b90 = _sm90()
    from attnmem.kernels.flash.route import attention_forward

    B, H, H_kv, s_q, s_k, d, causal = case
    torch.manual_seed(hash(case) % 2**31)
    dev = "cuda"
    q = torch.randn(B, H, s_q, d, device=dev, dtype=dtype)
    k = torch.randn(B, H_kv, s_k, d, device=dev, dtype=dtype)
    v = torch.randn(B, H_kv, s_k, d, device=dev, dtype=dtype)
    do = torch.randn(B, H, s_q, d, device=dev, dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    assert b90.usable(q, k, v)
    o, lse2 = attention_forward(q, k, v, causal, scale)
    with _poisoned_new_empty():
        got = b90.attention_backward_sm90(do, q, k, v, o, lse2, causal, scale)
    ref = _grads(q.double(), k.double(), v.double(), do.double(), causal, scale)
    low = _grads(q, k, v, do, causal, scale)  # plain PyTorch in the low precision
    for name, g, r, lo in zip(("dq", "dk", "dv"), got, ref, low, strict=True):
        assert g.shape == r.shape and g.dtype == dtype, name
        err = (g.double() - r).abs().max().item()
        base = (lo.double() - r).abs().max().item()
        assert math.isfinite(err), f"{name}: non-finite values (an unwritten element?)"
        assert err <= 2 * base + FLOOR[dtype], f"{name}: max error {err:.3g}, eager {base:.3g}"


def test_flat_tile_puts_each_element_where_the_cast_reads_it():
    """`flat_tile` (the kernel's reshape and permute, in torch) places element (r, c) of a
    64 x 64 partial at the float the final cast decodes: 512 (c // 8) + 128 (r // 16) +
    16 (r % 8) + 4 (c // 2 % 4) + 2 (r // 8 % 2) + c % 2, and every thread's 4-float chunk
    holds what one thread of the warpgroup owns (rows 16 w + i and + 8, columns 8 j + 2 a and
    + 1: NVMMA's accumulator layout)."""
    b90 = _sm90()
    part = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)
    flat = b90.flat_tile(part).reshape(-1)
    r = torch.arange(64).view(64, 1)
    c = torch.arange(64).view(1, 64)
    at = 512 * (c // 8) + 128 * (r // 16) + 16 * (r % 8) + 4 * (c // 2 % 4) + 2 * (r // 8 % 2) + c % 2
    assert torch.equal(flat[at], part)
    # thread t = 32 w + 4 i + a owns float 4 (128 j + t) .. + 3 of chunk j: rows 16 w + i, + 8
    chunk = flat.reshape(8, 128, 4)
    w, i, a, j = 1, 5, 3, 6
    t = 32 * w + 4 * i + a
    rows, cols = (16 * w + i, 16 * w + i + 8), (8 * j + 2 * a, 8 * j + 2 * a + 1)
    want = [part[rows[0], cols[0]], part[rows[0], cols[1]], part[rows[1], cols[0]],
            part[rows[1], cols[1]]]
    assert chunk[j, t].tolist() == [x.item() for x in want]


_FLAT_CAST_CHILD = """
import json, sys, torch
sys.path.insert(0, "tests")  # run from the repository root: tests/_interp.py
from _interp import quick_interpreter
quick_interpreter()
from attnmem.kernels.flash import bwd_sm90 as b90
out = []
for B, H, s_q, d, bm, split_d in [(1, 2, 128, 128, 64, True), (2, 1, 256, 64, 128, False),
                                  (1, 2, 100, 128, 64, True), (2, 1, 200, 64, 128, False)]:
    torch.manual_seed(0)
    n_m = -(-s_q // bm)
    assert n_m * bm == b90.dq_buffer_rows(s_q, d)
    dq_true = torch.randn(B * H, n_m * bm, d)  # rows past s_q: the buffer's padding
    acc = torch.empty(B * H * n_m * 2, b90.FLAT_ROWS, 32)
    for bh in range(B * H):
        for m in range(n_m):
            blk = dq_true[bh, m * bm:(m + 1) * bm]
            for u in range(2):  # the kernel's partial u: rows of d (split by d) or queries
                part = blk[:, 64 * u:64 * u + 64] if split_d else blk[64 * u:64 * u + 64]
                acc[(bh * n_m + m) * 2 + u] = b90.flat_tile(part.T.contiguous())
    dq = torch.empty(B, H, s_q, d, dtype=torch.float16)
    b90._flat_cast_kernel[(n_m, B * H)](acc, dq, 0.5, s_q, HEAD_D=d, BLOCK_M=bm,
                                        SPLIT_D=split_d)
    want = (0.5 * dq_true[:, :s_q]).half().view(B, H, s_q, d)
    out.append([d, bool(torch.equal(dq, want))])
print(json.dumps(out))
"""


def test_flat_cast_decodes_the_flat_buffer_under_the_interpreter():
    """The final cast (`_flat_cast_kernel`, Triton's CPU interpreter in a child process)
    returns scale x dQ in (B, H, s_q, d) from a buffer laid out by `flat_tile`, at d = 128
    (partials: halves of d) and d = 64 (partials: halves of the queries), with s_q a multiple
    of the query block and not (the last block's padding rows are not written)."""
    _sm90()
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, "-c", _FLAT_CAST_CHILD], capture_output=True,
                         text=True, env=env, cwd=root, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [
        [128, True], [64, True], [128, True], [64, True]]


def test_every_table_entry_gives_the_flat_staging_its_64_by_64_partial():
    """The schedule tables (TILES, DQ_SPLIT_D) give each warpgroup the 64 x 64 dQ^T partial
    the flat dQ staging and its cast are written for: d = 128 split by rows of d with
    BLOCK_M = 64, d = 64 split by queries with BLOCK_M = 128."""
    b90 = _sm90()
    for d in b90.HEAD_DIMS:
        bm = b90.TILES[d][0]
        part = (d // 2, bm) if b90.DQ_SPLIT_D[d] else (d, bm // 2)
        assert part == (64, 64), (d, b90.TILES[d], b90.DQ_SPLIT_D[d])


def test_dq_buffer_rows_match_calc():
    """The flat dQ buffer's rows per (batch, head) are what attnmem.calc.peak counts in the Hopper
    region (attnmem.calc.dispatch.sm90_dq_rows): s_q rounded up to the query block of TILES."""
    b90 = _sm90()
    from attnmem.calc import dispatch

    for d in b90.HEAD_DIMS:
        assert dispatch.SM90_QUERY_BLOCK[d] == b90.TILES[d][0]
        for s_q in (4096, 4097, 4100, 4160, 8191, 16384):
            assert b90.dq_buffer_rows(s_q, d) == dispatch.sm90_dq_rows(s_q, d)
            assert dispatch.sm90_dq_rows(s_q, d) % b90.TILES[d][0] == 0


@pytest.mark.gpu
def test_strided_inputs_and_expanded_gradient():
    """q, k, v as views of a (B, s, H, d) tensor (strided heads), and the stride-0 gradient of
    out.sum(): the backward reads the views through their strides and copies dO once."""
    reason = hopper_reason()
    if reason:
        pytest.skip(reason)
    b90 = _sm90()
    from attnmem.kernels.flash.route import attention_forward

    B, H, s, d = 1, 4, 640, 128
    qkv = torch.randn(B, s, 3, H, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert b90.usable(q, k, v)
    scale = 1.0 / math.sqrt(d)
    o, lse2 = attention_forward(q, k, v, True, scale)
    do = torch.ones(1, device="cuda", dtype=torch.bfloat16).expand(B, H, s, d)
    got = b90.attention_backward_sm90(do, q, k, v, o, lse2, True, scale)
    ref = _grads(q.double(), k.double(), v.double(), do.double(), True, scale)
    for g, r in zip(got, ref, strict=True):
        assert (g.double() - r).abs().max().item() < 0.1


def test_usable_refuses_cpu_tensors():
    b90 = _sm90()
    x = torch.zeros(1, 1, 8, 64, dtype=torch.float16)
    assert not b90.usable(x, x, x)


@pytest.mark.parametrize("d", [64, 128])
def test_compiles_for_sm90_without_spills(d):
    """The CPU compile check (attnmem/kernels/dev/compile_bwd_sm90.py): the default variant compiles
    for sm_90 and fits the 227 KiB of shared memory; 0 spilled bytes is the goal. Known
    spills (expected failures until they are 0), the causal variant compiled here: at d = 128
    none with Triton 3.6 (the GPU host's) and 8 bytes with 3.9, outside the loops, since the
    K and V descriptors are rebuilt every step (attnmem/kernels/flash/NOTES.md, "K and V descriptors
    rebuilt every step"; before, 44-68
    and about 350); at d = 64 the BLOCK_M = 128 tile (S^T and dP^T 64 registers each) spills
    16-56 bytes with either, and was 3-17% faster on the H200 than BLOCK_M = 64, which spilled
    none (attnmem/kernels/flash/NOTES.md, "the Hopper region")."""
    _sm90()
    from attnmem.kernels.dev import compile_bwd_sm90 as cb

    try:
        rows = cb.run(dims=(d,), verbose=False, dtypes=("bf16",), causals=(True,))
    except Exception as e:  # no ptxas / no sm_90 backend in this Triton: nothing to check
        pytest.skip(f"sm_90 compile unavailable here: {type(e).__name__}: {e}")
    for _dtype, _d, causal, bm, _st, regs, spills, shared, err in rows:
        assert err is None, f"d={d} causal={causal}: {err}"
        assert shared <= 227, f"d={d}: {shared:.1f} KiB of shared memory"
        if spills != "0":
            pytest.xfail(f"d={d} BLOCK_M={bm}: {spills} bytes spilled ({regs} registers), known")


def test_mha_specialisation_compiles_within_shared_memory():
    """The kernel as the JIT builds it without GQA (GROUP = 1 a constant, which changes what
    ptxas keeps in registers: attnmem/kernels/flash/NOTES.md, "where the backward's time goes (ncu)")
    compiles for sm_90 at both head dims within the 227 KiB a block may use. Its spills are not asserted (a few local loads remain)."""
    _sm90()
    from attnmem.kernels.dev import compile_bwd_sm90 as cb

    try:
        rows = cb.run(verbose=False, dtypes=("bf16",), causals=(False,), mha=True)
    except Exception as e:  # no ptxas / no sm_90 backend in this Triton: nothing to check
        pytest.skip(f"sm_90 compile unavailable here: {type(e).__name__}: {e}")
    assert [r[1] for r in rows] == [64, 128]
    for _dtype, d, _causal, _bm, _st, _regs, _spills, shared, err in rows:
        assert err is None, f"d={d}: {err}"
        assert shared <= 227, f"d={d}: {shared:.1f} KiB of shared memory"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 32, 32, 4096, 64), (1, 32, 8, 16384, 64)],
                         ids=["MHA-4k", "GQA4-16k"])
def test_allocates_what_the_atomic_triton_backward_allocates(shape):
    """Same buffers, same sizes, same order as bwd.triton_backward's atomic-dQ path (no GQA
    split at these shapes), so calc's peak model holds whichever backward runs: the peak
    above the inputs is equal to the byte."""
    reason = hopper_reason()
    if reason:
        pytest.skip(reason)
    b90 = _sm90()
    from attnmem.calc.dispatch import atomic_dq, kv_split
    from attnmem.kernels.flash.config import KernelConfig
    from attnmem.kernels.flash.route import attention_backward, attention_forward

    B, H, H_kv, s, d = shape
    assert atomic_dq(B, H, H_kv, s, s, d, 2) and kv_split(B, H, H_kv, s, s, d, 2) == 1
    q = torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, H_kv, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    scale = 1.0 / math.sqrt(d)
    o, lse2 = attention_forward(q, k, v, True, scale)
    assert b90.usable(q, k, v, do, o)

    def extra(fn):
        fn()  # compile and warm the allocator
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        grads = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        del grads
        return peak

    ours = extra(lambda: b90.attention_backward_sm90(do, q, k, v, o, lse2, True, scale))
    triton_bwd = extra(lambda: attention_backward(do, q, k, v, o, lse2, True, scale,
                                                  KernelConfig(atomic_dq=True)))
    assert ours == triton_bwd


@pytest.mark.gpu
def test_usable_needs_queries_in_multiples_of_four():
    reason = hopper_reason()
    if reason:
        pytest.skip(reason)
    b90 = _sm90()
    x = torch.zeros(1, 2, 780, 64, device="cuda", dtype=torch.bfloat16)
    assert b90.usable(x, x, x)
    assert not b90.usable(x[:, :, :777], x, x)


# ---- routing: when flash_attention's backward is the Gluon one (route.backward_route) ---------

def test_configs_that_pick_the_triton_backward_keep_it():
    from attnmem.kernels.flash.config import KernelConfig, Tiles

    assert not KernelConfig().triton_backward_chosen()
    assert KernelConfig(atomic_dq=True).triton_backward_chosen()
    assert KernelConfig(kv_split=2).triton_backward_chosen()
    assert KernelConfig(dkdv_tiles=Tiles(64, 64, 4, 3)).triton_backward_chosen()
    assert not KernelConfig(sm90=True).triton_backward_chosen()  # a forward choice only
    assert KernelConfig(tiles=Tiles(64, 64, 4, 2)).triton_backward_chosen()
    with pytest.raises(ValueError, match="sm90_bwd must be True, False or None"):
        KernelConfig(sm90_bwd="yes")


def test_forcing_it_where_it_cannot_run_is_refused_clearly():
    """CPU tensors (or any call the Gluon backward cannot take): sm90_bwd=True names why;
    the default falls back to the Triton backward silently, as designed."""
    from attnmem.kernels.flash import route
    from attnmem.kernels.flash.config import SETTINGS, KernelConfig

    assert SETTINGS.sm90_bwd is True  # the default; no environment variable changes it
    x = torch.zeros(1, 2, 64, 64, dtype=torch.float16)
    call, can = route.Call.of(x, x, False, None), route.probe(x, x, x, x, x)
    assert route.backward_route(call, None, can).kernel == "triton"
    assert route.backward_route(call, KernelConfig(sm90_bwd=False), can).kernel == "triton"
    with pytest.raises(ValueError, match=r"sm90_bwd=True: .*got q \(1, 2, 64, 64\) torch.float16 on cpu"):
        route.backward_route(call, KernelConfig(sm90_bwd=True), can)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,expect", [
    ((1, 32, 32, 4096, 64, True), True),  # the Hopper region: the Gluon backward
    ((1, 32, 32, 8192, 128, False), True),
    ((1, 32, 32, 4096, 128, True), True),  # 1,024 programs (the Triton rule: two kernels)
    ((1, 32, 8, 4096, 128, True), True),  # 256 programs (the Triton rule: GQA split 4)
    ((1, 28, 4, 4096, 128, True), False),  # 128 programs: Triton, split 7
    ((1, 8, 2, 4096, 128, True), False),  # 64 programs: Triton, split 4
    ((1, 4, 4, 1024, 64, True), False),  # short: the two-kernel Triton backward
    ((4, 32, 32, 3072, 128, True), True),  # 3,072 programs over 12,288 queries
    ((1, 32, 32, 2048, 128, True), False),  # 512 programs but 2,048 queries: Triton
    ((1, 32, 32, 4098, 64, True), False),  # queries not a multiple of 4
])
def test_flash_attention_routes_its_backward(monkeypatch, shape, expect):
    """With SETTINGS.sm90_bwd on (the default) flash_attention's default backward takes the
    Gluon kernel exactly where the rule says, and its gradients match the Triton backward's
    (sm90_bwd=False); with the setting off (SETTINGS.sm90_bwd patched False) it never does."""
    reason = hopper_reason()
    if reason:
        pytest.skip(reason)
    b90 = _sm90()
    from attnmem.kernels import flash_attention
    from attnmem.kernels.flash import config as cfg
    from attnmem.kernels.flash.config import KernelConfig

    B, H, H_kv, s, d, causal = shape
    calls = []
    real = b90.attention_backward_sm90
    monkeypatch.setattr(b90, "attention_backward_sm90",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    torch.manual_seed(0)
    q = torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, H_kv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    do = torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setattr(cfg.SETTINGS, "sm90_bwd", False)
    torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do)
    assert not calls
    monkeypatch.setattr(cfg.SETTINGS, "sm90_bwd", True)
    got = torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do)
    assert bool(calls) == expect
    calls.clear()
    ref = torch.autograd.grad(flash_attention(q, k, v, causal=causal,
                                              config=KernelConfig(sm90_bwd=False)), (q, k, v), do)
    assert not calls
    for g, r in zip(got, ref, strict=True):
        assert (g.float() - r.float()).abs().max().item() < 0.05


@pytest.mark.gpu
def test_deterministic_mode_keeps_the_triton_backward(monkeypatch):
    reason = hopper_reason()
    if reason:
        pytest.skip(reason)
    b90 = _sm90()
    from attnmem.kernels import flash_attention
    from attnmem.kernels.flash import config as cfg

    monkeypatch.setattr(cfg.SETTINGS, "sm90_bwd", True)
    monkeypatch.setattr(b90, "attention_backward_sm90",
                        lambda *a, **kw: pytest.fail("Gluon backward in deterministic mode"))
    q = torch.randn(1, 32, 4096, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.use_deterministic_algorithms(True)
    try:
        flash_attention(q, q, q, causal=True).sum().backward()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.gpu
def test_forced_where_the_default_would_not_route(monkeypatch):
    """sm90_bwd=True runs the Gluon backward also at a shape whose default is the two-kernel
    Triton backward (MHA d = 128, s = 4,096, B = 1: 1,024 dK/dV programs), and the gradients
    agree with it."""
    reason = hopper_reason()
    if reason:
        pytest.skip(reason)
    b90 = _sm90()
    from attnmem.kernels import flash_attention
    from attnmem.kernels.flash.config import KernelConfig

    calls = []
    real = b90.attention_backward_sm90
    monkeypatch.setattr(b90, "attention_backward_sm90",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = (torch.randn(1, 32, 4096, 128, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    got = torch.autograd.grad(flash_attention(q, k, v, causal=True,
                                              config=KernelConfig(sm90_bwd=True)), (q, k, v), do)
    assert calls
    ref = torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do)
    for g, r in zip(got, ref, strict=True):
        assert (g.float() - r.float()).abs().max().item() < 0.05


def test_ab_bwd_loads_a_commits_kernel_with_that_commits_partitions(tmp_path):
    """attnmem.kernels.dev.ab_bwd.load_at (the A/B tool's --against): bwd_sm90.py at a commit
    imports the device code of bwd_sm90_partitions.py at the same commit, not the working
    tree's, and the real module is put back; a commit without the partitions file loads the
    kernel file alone. Checked on a made-up repository (no Gluon needed)."""
    import subprocess

    from attnmem.kernels.dev import ab_bwd

    part_name = "attnmem.kernels.flash.bwd_sm90_partitions"
    assert set(ab_bwd.KERNEL_PARTS) == {part_name}
    flash = tmp_path / "attnmem" / "kernels" / "flash"
    flash.mkdir(parents=True)

    def git(*args):
        out = subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True,
                             text=True, check=True, env={"GIT_AUTHOR_NAME": "t",
                                                         "GIT_AUTHOR_EMAIL": "t@t",
                                                         "GIT_COMMITTER_NAME": "t",
                                                         "GIT_COMMITTER_EMAIL": "t@t",
                                                         "HOME": str(tmp_path)})
        return out.stdout.strip()

    git("init", "-q")
    (flash / "bwd_sm90.py").write_text("WHERE = 'one file'\n")
    git("add", "-A")
    git("commit", "-q", "-m", "one file")
    old = git("rev-parse", "HEAD")
    (flash / "bwd_sm90_partitions.py").write_text("WHERE = 'the commit partitions'\n")
    (flash / "bwd_sm90.py").write_text(f"from {part_name} import WHERE\n")
    git("add", "-A")
    git("commit", "-q", "-m", "split")
    new = git("rev-parse", "HEAD")

    before = sys.modules.get(part_name)
    mod = ab_bwd.load_at(new, root=str(tmp_path))
    assert mod.WHERE == "the commit partitions"
    assert sys.modules.get(part_name) is before
    assert ab_bwd.load_at(old, root=str(tmp_path)).WHERE == "one file"
    assert sys.modules.get(part_name) is before
