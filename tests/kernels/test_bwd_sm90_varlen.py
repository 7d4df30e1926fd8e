"""The Hopper (Gluon) backward on packed sequences (`bwd_sm90.attention_backward_sm90_packed`,
the backward of ``flash_attention(..., cu_seqlens=...)`` on a compute capability 9.x GPU).

Oracle: each sequence alone through the fp32 eager reference
(``attnmem.kernels.flash.reference.attention_reference``); dQ, dK, dV must stay within twice plain
eager's error in the same dtype plus a floor (tests/_tolerance.py), and the portable packed
backward (``KernelConfig(sm90_bwd=False)``) on the same inputs gives the same gradients within
the same bound. Every buffer the kernels allocate is NaN-filled first (`common.empty`), so a
row no program writes, or a reduce-add landing in another sequence's unzeroed rows, shows.

What the packed backward adds to the dense one: tiles past a sequence's end read the next
sequence's queries and keys (masked: a gradient that saw a neighbour fails the reference);
the lse2 / delta copies and the fp32 dQ sums live in padded rows per sequence (a sequence's
partials landing in another's fail); dK, dV rows past a sequence's end are not stored (the
next sequence's program owns them: `test_gpu_packed_bwd_writes_only_its_rows`). Lengths 1,
97, 128, 700, 4,096 among others; MHA and GQA 4:1; fp16 and bf16; d = 64 and 128; causal and
not; q as (1, H, T, d) and FlashAttention's (T, H, d). The route decisions are CPU tests in
tests/kernels/test_route_packed.py; the compile for sm_90 runs here on the CPU.
"""

from __future__ import annotations

import contextlib
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from _hopper import hopper_reason  # noqa: E402
from _poison import poison_empty  # noqa: E402  (tests/_poison.py)
from _tolerance import within as _within  # noqa: E402  (tests/_tolerance.py)

REASON = hopper_reason() if torch.cuda.is_available() else "no CUDA GPU"
FLOOR = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LENS = [97, 1, 128, 700, 4096, 64, 193, 129]  # across the 64/128-row query blocks, 128 keys
LOG2E = 1.4426950408889634

needs_hopper = pytest.mark.skipif(REASON is not None, reason=f"Hopper backward: {REASON}")


@contextlib.contextmanager
def poison_and_count():
    """Under `poison_empty` (tests/_poison.py), a list that gets one entry per call of
    `bwd_sm90.attention_backward_sm90_packed`."""
    from attnmem.kernels.flash import bwd_sm90

    real_bwd, seen = bwd_sm90.attention_backward_sm90_packed, []

    def wrapper(*args, **kwargs):
        seen.append(1)
        return real_bwd(*args, **kwargs)

    bwd_sm90.attention_backward_sm90_packed = wrapper
    try:
        with poison_empty():
            yield seen
    finally:
        bwd_sm90.attention_backward_sm90_packed = real_bwd


def _starts(lens) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")


def _reference_grads(q, k, v, do, starts, starts_k, causal, dtype_hi):
    """Per sequence, the reference's gradients of q, k, v in ``dtype_hi`` (queries of sequence
    i at starts[i] .., keys at starts_k[i] ..)."""
    from attnmem.kernels.flash.reference import attention_reference

    leaves = [t.detach().to(dtype_hi).requires_grad_() for t in (q, k, v)]
    outs = [attention_reference(leaves[0][:, :, a:b], leaves[1][:, :, ak:bk],
                                leaves[2][:, :, ak:bk], causal)
            for a, b, ak, bk in zip(starts[:-1], starts[1:], starts_k[:-1], starts_k[1:],
                                    strict=True)]
    torch.cat(outs, 2).backward(do.to(dtype_hi))
    return [t.grad for t in leaves]


def _inputs(lens, H, H_kv, d, dtype, seed=0, lens_k=None):
    g = torch.Generator(device="cpu").manual_seed(seed)
    T, T_k = sum(lens), sum(lens if lens_k is None else lens_k)
    return [torch.randn(1, n, t, d, generator=g).to("cuda", dtype)
            for n, t in ((H, T), (H_kv, T_k), (H_kv, T_k), (H, T))]


def _grads(q, k, v, do, cu, cu_k, causal, config, flat):
    """dq, dk, dv of the packed call through `flash_attention`, as (1, heads, T, d)."""
    from attnmem.kernels.flash.api import flash_attention

    if flat:  # FlashAttention's (T, H, d), contiguous: the kernels get its transposed view
        leaves = [t[0].transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v)]
        flash_attention(*leaves, causal=causal, cu_seqlens=cu, cu_seqlens_k=cu_k,
                        config=config).backward(do[0].transpose(0, 1))
        return [t.grad.transpose(0, 1).unsqueeze(0) for t in leaves]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*leaves, causal=causal, cu_seqlens=cu, cu_seqlens_k=cu_k,
                    config=config).backward(do)
    return [t.grad for t in leaves]


def check_packed_bwd(lens, H, H_kv, d, causal, dtype, flat=False, config=None, lens_k=None):
    """The packed backward on the Hopper kernel (``config`` None: the default route, which must
    take it) against the reference, and against the portable packed backward; ``lens_k``: the
    sequences' key counts where they differ from ``lens`` (``cu_seqlens_k``)."""
    from attnmem.kernels.flash.config import KernelConfig

    q, k, v, do = _inputs(lens, H, H_kv, d, dtype, lens_k=lens_k)
    cu = _starts(lens)
    cu_k = None if lens_k is None else _starts(lens_k)
    with poison_and_count() as calls:
        grads = _grads(q, k, v, do, cu, cu_k, causal, config, flat)
    assert calls, "the packed backward did not run the Hopper kernel"
    portable = _grads(q, k, v, do, cu, cu_k, causal, KernelConfig(sm90_bwd=False), flat)
    starts = cu.tolist()
    starts_k = starts if cu_k is None else cu_k.tolist()
    ref = _reference_grads(q, k, v, do, starts, starts_k, causal, torch.float32)
    base = _reference_grads(q, k, v, do, starts, starts_k, causal, dtype)
    for name, gr, r, b, p in zip(("dq", "dk", "dv"), grads, ref, base, portable, strict=True):
        assert gr.dtype == dtype and gr.shape == r.shape
        _within(name, gr, r, b, FLOOR[dtype])
        _within(f"{name} (portable backward)", p, r, b, FLOOR[dtype])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("d,dtype,flat,H_kv,causal", [
    (64, torch.float16, True, 4, True),
    (128, torch.bfloat16, False, 1, True),
    (128, torch.float16, True, 4, False),
    (64, torch.bfloat16, False, 1, False),
], ids=["d64_fp16_flat_mha_causal", "d128_bf16_gqa4_causal", "d128_fp16_flat_mha_full",
        "d64_bf16_gqa4_full"])
def test_gpu_packed_sm90_backward_matches_reference(d, dtype, flat, H_kv, causal):
    """Default route (no config), H = 4 query heads over H_kv = 4 (MHA) or 1 (GQA 4:1): each
    dtype, head dim, mask, GQA and layout twice, in four compiled variants."""
    check_packed_bwd(LENS, 4, H_kv, d, causal, dtype, flat)


@pytest.mark.gpu
@needs_hopper
def test_gpu_packed_sm90_backward_forced_and_short():
    """``sm90_bwd=True`` forces it where the rule would not (sequences shorter than the query
    block on average); single-token and sub-block sequences only (every key block and query
    block ragged)."""
    from attnmem.kernels.flash.config import KernelConfig

    check_packed_bwd([1, 3, 5, 63, 2], 4, 1, 128, True, torch.bfloat16,
                     config=KernelConfig(sm90_bwd=True))


@pytest.mark.gpu
@needs_hopper
def test_gpu_packed_sm90_backward_cross_lengths():
    """``cu_seqlens_k`` other than ``cu_seqlens``: sequences with more keys than queries (keys
    past the last query see no query: zero dK, dV) and fewer (every query row past s_k sees
    all keys), causal top-left; the variant of the d = 128 GQA case above. The forward is the
    portable one here (``sm90=False``; the backward's default rule still applies), so that
    only this backward is new to these lengths."""
    from attnmem.kernels.flash.config import KernelConfig

    check_packed_bwd([97, 300, 1, 200, 64], 4, 1, 128, True, torch.bfloat16,
                     config=KernelConfig(sm90=False), lens_k=[150, 64, 5, 200, 1])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("d,causal", [(128, True), (64, False)])
def test_gpu_packed_bwd_writes_only_its_rows(d, causal):
    """Rows after the last sequence belong to no sequence: dQ, dK and dV must keep their NaN
    there (a store past a sequence's end would overwrite the next sequence's rows in a real
    batch), and every owned row must be written."""
    from attnmem.kernels.flash import bwd_sm90, fwd
    from attnmem.kernels.flash.common import Packed

    first, end, tail = 300, 97, 200
    T = first + end + tail
    q, k, v, do = _inputs([T], 4, 1, d, torch.bfloat16, seed=d)  # variants compiled above
    cu = torch.tensor([0, first, first + end], dtype=torch.int32, device="cuda")
    packed = Packed(cu, cu, first, first)
    with poison_and_count():
        o, lse2 = fwd.packed_forward(q, k, v, causal, 0.125, None, None, packed)
        dq, dk, dv = bwd_sm90.attention_backward_sm90_packed(do, q, k, v, o, lse2, causal,
                                                             0.125, packed)
    torch.cuda.synchronize()
    owned = first + end
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert not t[:, :, :owned].isnan().any(), f"{name}: an owned row was not written"
        assert t[:, :, owned:].isnan().all(), f"{name} written past the last sequence"


@pytest.mark.gpu
@needs_hopper
def test_gpu_packed_sm90_peak_equals_calc():
    """The measured extra peak of a packed forward + backward on the Hopper backward (q, k, v,
    dO and cu_seqlens allocated before, in an emptied cache: a fresh child process,
    tests/_packed_peak.py; warmed up once) equals attnmem.calc.varlen_peak_bytes to the byte, its
    padded fp32 dQ buffer and stats copies included."""
    from _packed_peak import packed_peak

    import attnmem.calc

    lens, H, H_kv, d = [1000, 3001, 4190, 5], 12, 1, 128  # the d = 128 GQA variant above
    got = packed_peak(lens, H, H_kv, d, True)
    assert got["hopper_backward"], "the default route did not take the Hopper packed backward"
    want = attnmem.calc.varlen_peak_bytes(H, lens, d, "bf16", True, H_kv)
    assert got["measured"] == want, (got, want)


# ---- CPU: the packed program's schedule, emulated ----------------------------------------------

def emulate_packed_backward(q, k, v, do, o, lse2, cu, causal, scale, cu_k=None):
    """What `attn_bwd_sm90_varlen_kernel` and its stats and cast kernels compute, step for step
    in torch (float64 on the CPU): per program (128 keys of one sequence, key/value head) the
    same query-block ranges (masked [lo, mid), unmasked [mid, n_full), masked to n_m), the
    same masks, tiles read at the sequence's first rows with the copy engine's zero fill past
    the tensor (so a block past a sequence's end sees the next one's rows), lse2 and delta from
    the padded copies and dQ summed in the padded rows (gaps NaN: a step reading or adding
    there shows), dK, dV stored for keys < s_k only. q, o, do (1, H, T, d), k, v (1, H_kv, T,
    d), lse2 (1, H, T) base 2; ``cu_k`` the keys' starts (default ``cu``)."""
    from attnmem.kernels.flash import bwd_sm90 as b90

    _, H, T, d = q.shape
    H_kv, group = k.shape[1], q.shape[1] // k.shape[1]
    bm, bn = b90.TILES[d][0], b90.BLOCK_N
    starts = cu.tolist()
    starts_k = starts if cu_k is None else cu_k.tolist()
    n = len(starts) - 1
    rows = b90.packed_pad_rows(T, n, d)
    nan = float("nan")
    lse_p, delta_p = (torch.full((H, rows), nan, dtype=torch.float64) for _ in range(2))
    acc = torch.full((H, rows, d), nan, dtype=torch.float64)
    dk = torch.full(k.shape, nan, dtype=torch.float64)
    dv = torch.full(v.shape, nan, dtype=torch.float64)
    delta = (o.double() * do.double()).sum(-1)

    def tile(t, h, r0, count):  # rows r0 .. of head h through the copy engine (0 past the end)
        out = torch.zeros(count, t.shape[-1], dtype=torch.float64)
        hi = min(r0 + count, t.shape[2])
        if hi > r0:
            out[:hi - r0] = t[0, h, r0:hi].double()
        return out

    for i in range(n):  # the stats kernel: copies and zeroed tiles, the sequence's blocks only
        q0, s_q = starts[i], starts[i + 1] - starts[i]
        p0 = (q0 // bm + i) * bm
        blocks = -(-s_q // bm) * bm
        lse_p[:, p0:p0 + blocks] = 0
        delta_p[:, p0:p0 + blocks] = 0
        lse_p[:, p0:p0 + s_q] = lse2[0, :, q0:q0 + s_q].double()
        delta_p[:, p0:p0 + s_q] = delta[0, :, q0:q0 + s_q]
        acc[:, p0:p0 + blocks] = 0
    for i in range(n):  # the backward's programs
        q0, s_q = starts[i], starts[i + 1] - starts[i]
        k0, s_k = starts_k[i], starts_k[i + 1] - starts_k[i]
        pb0 = q0 // bm + i
        n_m, n_full = -(-s_q // bm), s_q // bm
        for h_kv in range(H_kv):
            for start_n in range(0, s_k, bn):
                lo, mid = 0, 0
                if causal:
                    lo, mid = start_n // bm, min((start_n + bn + bm - 1) // bm, n_m)
                if start_n + bn > s_k:
                    mid = n_m
                kt, vt = tile(k, h_kv, k0 + start_n, bn), tile(v, h_kv, k0 + start_n, bn)
                keys = start_n + torch.arange(bn)
                dk_b = torch.zeros(bn, d, dtype=torch.float64)
                dv_b = torch.zeros(bn, d, dtype=torch.float64)
                steps = ([(m, True) for m in range(lo, mid)]
                         + [(m, False) for m in range(mid, n_full)]
                         + [(m, True) for m in range(max(mid, n_full), n_m)])
                for g in range(group):
                    h = h_kv * group + g
                    for m, masked in steps:
                        qt, dot = tile(q, h, q0 + m * bm, bm), tile(do, h, q0 + m * bm, bm)
                        r = slice((pb0 + m) * bm, (pb0 + m + 1) * bm)
                        st = kt @ qt.T  # S^T (keys, queries)
                        pt = torch.exp2(st * scale * LOG2E - lse_p[h, r])
                        if masked:
                            cols = m * bm + torch.arange(bm)
                            vis = (keys[:, None] < s_k) & (cols[None, :] < s_q)
                            if causal:
                                vis = vis & (cols[None, :] >= keys[:, None])
                            pt = torch.where(vis, pt, torch.zeros_like(pt))
                        dv_b += pt @ dot
                        dst = pt * (vt @ dot.T - delta_p[h, r])
                        dk_b += dst @ qt
                        acc[h, r] += dst.T @ kt
                own = min(bn, s_k - start_n)
                dk[0, h_kv, k0 + start_n:k0 + start_n + own] = (dk_b * scale)[:own]
                dv[0, h_kv, k0 + start_n:k0 + start_n + own] = dv_b[:own]
    dq = torch.full(q.shape, nan, dtype=torch.float64)
    for i in range(n):  # the cast
        q0, s_q = starts[i], starts[i + 1] - starts[i]
        p0 = (q0 // bm + i) * bm
        dq[0, :, q0:q0 + s_q] = acc[:, p0:p0 + s_q] * scale
    return dq, dk, dv


@pytest.mark.parametrize("d,causal,H_kv,cross", [(128, True, 1, False), (64, False, 2, False),
                                                  (64, True, 2, False), (128, False, 1, False),
                                                  (128, True, 2, True), (64, False, 1, True)])
def test_packed_schedule_emulated_matches_reference(d, causal, H_kv, cross):
    """The packed program's schedule (`emulate_packed_backward`: ranges, masks, padded rows,
    reads past a sequence's end) gives the reference's gradients in float64 on the CPU, for
    lengths across the 64/128-row query blocks and 128-key blocks, a 1-token sequence among
    them, GQA, and (``cross``) key counts other than the query counts."""
    pytest.importorskip("triton.experimental.gluon")  # only a Triton without Gluon skips
    from attnmem.kernels.flash.reference import attention_reference

    lens, H = [97, 1, 128, 300, 64, 193], 4
    lens_k = [150, 5, 64, 300, 1, 260] if cross else lens
    g = torch.Generator().manual_seed(d + causal)
    T, T_k = sum(lens), sum(lens_k)
    q, do = (torch.randn(1, H, T, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, H_kv, T_k, d, generator=g, dtype=torch.float64) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    outs, lses = [], []
    for a, b, ak, bk in zip(cu[:-1].tolist(), cu[1:].tolist(), cu_k[:-1].tolist(),
                            cu_k[1:].tolist(), strict=True):
        qs, ks, vs = leaves[0][:, :, a:b], leaves[1][:, :, ak:bk], leaves[2][:, :, ak:bk]
        outs.append(attention_reference(qs, ks, vs, causal))
        with torch.no_grad():
            sc = qs @ ks.repeat_interleave(H // H_kv, 1).transpose(-2, -1) / math.sqrt(d)
            if causal:
                sc = sc.masked_fill(torch.ones(b - a, bk - ak, dtype=torch.bool).triu(1),
                                    float("-inf"))
            lses.append(torch.logsumexp(sc, -1) * LOG2E)
    out = torch.cat(outs, 2)
    out.backward(do)
    got = emulate_packed_backward(q, k, v, do, out.detach(), torch.cat(lses, 2), cu, causal,
                                  1 / math.sqrt(d), cu_k)
    for name, gr, leaf in zip(("dq", "dk", "dv"), got, leaves, strict=True):
        assert not gr.isnan().any(), f"{name}: a row unwritten, or a gap row read"
        torch.testing.assert_close(gr, leaf.grad, atol=1e-9, rtol=1e-9, msg=name)


# ---- CPU: the packed stats and cast kernels under Triton's interpreter ----------------------

_STATS_CAST_CHILD = """
import json, sys, torch
sys.path.insert(0, "tests")  # run from the repository root: tests/_interp.py
from _interp import quick_interpreter
quick_interpreter()
from attnmem.kernels.flash import bwd_sm90 as b90
out = []
for lens, H, d in [([5, 64, 130, 1, 70], 2, 128), ([200, 1, 129], 1, 64)]:
    torch.manual_seed(0)
    bm, split_d = b90.TILES[d][0], b90.DQ_SPLIT_D[d]
    T, n = sum(lens), len(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    rows = b90.packed_pad_rows(T, n, d)
    n_pad = rows // bm
    o = torch.randn(T, H, d).half().transpose(0, 1).unsqueeze(0)  # (1, H, T, d) view
    do = torch.randn(1, H, T, d).half()
    lse2 = torch.randn(1, H, T)
    stats = torch.full((2, H, rows), float("nan"))
    acc = torch.full((H * rows * d // 32, 32), float("nan"))
    n_qb = -(-max(lens) // bm)
    b90._stats_varlen_kernel[(n_qb, n * H)](
        o, do, lse2, stats, acc, cu, o.stride(1), o.stride(2), do.stride(1), do.stride(2), H,
        T, rows, HEAD_D=d, BLOCK=bm)
    delta = (o.float() * do.float()).sum(-1)
    ok, owned = True, torch.zeros(H, rows, dtype=torch.bool)
    dq_true = torch.randn(H, T, d)
    tiles = acc.view(H * n_pad * 2, b90.FLAT_ROWS, 32)
    for i, (q0, L) in enumerate(zip(cu[:-1].tolist(), lens)):
        pb0 = q0 // bm + i
        assert pb0 * bm == (q0 + i * bm) // bm * bm  # FlashAttention-3's padded start
        for h in range(H):
            p0 = pb0 * bm
            ok &= torch.equal(stats[0, h, p0:p0 + L], lse2[0, h, q0:q0 + L])
            ok &= torch.allclose(stats[1, h, p0:p0 + L], delta[0, h, q0:q0 + L], atol=1e-3)
            n_m = -(-L // bm)
            ok &= bool((stats[:, h, p0 + L:p0 + n_m * bm] == 0).all())  # ragged rows: 0
            owned[h, p0:p0 + n_m * bm] = True
            for m in range(n_m):
                t0 = (h * n_pad + pb0 + m) * 2
                ok &= bool((tiles[t0:t0 + 2] == 0).all())  # zeroed by the stats kernel
                blk = torch.zeros(bm, d)
                r = min(bm, L - m * bm)
                blk[:r] = dq_true[h, q0 + m * bm:q0 + m * bm + r]
                for u in range(2):
                    part = blk[:, 64 * u:64 * u + 64] if split_d else blk[64 * u:64 * u + 64]
                    tiles[t0 + u] = b90.flat_tile(part.T.contiguous())
    # rows no sequence owns were not written (the gaps of the padded layout)
    ok &= bool(stats[:, ~owned].isnan().all())
    dq = torch.full((1, H, T, d), float("nan")).half()
    b90._flat_cast_varlen_kernel[(n_qb, n * H)](acc, dq, cu, 0.5, H, T, n_pad, HEAD_D=d,
                                                BLOCK_M=bm, SPLIT_D=split_d)
    ok &= torch.equal(dq, (0.5 * dq_true).half().unsqueeze(0))
    out.append([d, bool(ok)])
print(json.dumps(out))
"""


def test_packed_stats_and_cast_under_the_interpreter():
    """The packed backward's stats kernel (`_stats_varlen_kernel`: lse2 and delta into the
    padded rows, 0 on a ragged block's rows past the sequence, the sequence's dQ tiles zeroed,
    nothing written in the gaps) and its cast (`_flat_cast_varlen_kernel`: every packed row
    of dQ from the partials at tiles (h * n_pad + pb0 + m) * 2 + u), under Triton's CPU
    interpreter in a child process, at d = 128 and 64, O as a transposed view."""
    pytest.importorskip("triton.experimental.gluon")  # only a Triton without Gluon skips
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, "-c", _STATS_CAST_CHILD], capture_output=True,
                         text=True, env=env, cwd=root, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [[128, True], [64, True]]


# ---- CPU: the compile for sm_90 --------------------------------------------------------------

def compile_varlen(dtype: str, d: int, causal: bool, mha: bool = False):
    """The packed backward kernel compiled for sm_90 with the signature its launch has (no
    GPU: Triton's compiler and ptxas run on the CPU, as attnmem/kernels/dev/compile_bwd_sm90.py does for the
    dense kernel); ``mha``: GROUP = 1 as the JIT specialises it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from attnmem.kernels.flash import bwd_sm90 as b90

    gdt = {"fp16": b90.gl.float16, "bf16": b90.gl.bfloat16}[dtype]
    bm, st = b90.TILES[d]

    def desc(rows):
        lay = b90.gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], gdt)
        return f"tensordesc<{dtype}[1, 1, {rows}, {d}],{lay!r}>"

    stats = f"tensordesc<fp32[1, {bm}],{b90.STATS_LAYOUT!r}>"
    sig = {"q_desc": desc(bm), "k_desc": desc(b90.HALF_N), "v_desc": desc(b90.HALF_N),
           "do_desc": desc(bm),
           "dq_desc": f"tensordesc<fp32[{b90.FLAT_ROWS}, 32],{b90.STATS_LAYOUT!r}>",
           "lse_desc": stats, "delta_desc": stats, "DK": f"*{dtype}", "DV": f"*{dtype}",
           "CU_Q": "*i32", "CU_K": "*i32", "H": "i32", "H_kv": "i32", "GROUP": "i32",
           "HEADS_PER_GROUP": "i32", "total_k": "i32", "n_pad": "i32", "qk_scale": "fp32", "sm_scale": "fp32",
           "CAUSAL": "constexpr", "STAGES": "constexpr", "DQ_SPLIT_D": "constexpr",
           "num_warps": "constexpr"}
    consts = {"CAUSAL": causal, "STAGES": st, "DQ_SPLIT_D": b90.DQ_SPLIT_D[d],
              "num_warps": b90.NUM_WARPS}
    if mha:
        sig["GROUP"], consts["GROUP"] = "constexpr", 1
    src = GluonASTSource(b90.attn_bwd_sm90_varlen_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": b90.NUM_WARPS})


def compile_helpers(dtype: str, d: int):
    """The packed stats and cast kernels (Triton) compiled for sm_90 as their launches do."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnmem.kernels.flash import bwd_sm90 as b90

    bm = b90.TILES[d][0]
    target = GPUTarget("cuda", 90, 32)
    sig = {"Out": f"*{dtype}", "DO": f"*{dtype}", "LSE2": "*fp32", "STATS": "*fp32",
           "DQ_ACC": "*fp32", "CU_Q": "*i32", "stride_oh": "i32", "stride_om": "i32",
           "stride_doh": "i32", "stride_dom": "i32", "H": "i32", "total_q": "i32",
           "n_rows": "i32", "HEAD_D": "constexpr", "BLOCK": "constexpr"}
    stats = triton.compile(ASTSource(b90._stats_varlen_kernel, sig,
                                     constexprs={"HEAD_D": d, "BLOCK": bm}),
                           target=target, options={"num_warps": 4})
    sig = {"ACC": "*fp32", "DQ": f"*{dtype}", "CU_Q": "*i32", "scale": "fp32", "H": "i32",
           "total_q": "i32", "n_pad": "i32", "HEAD_D": "constexpr", "BLOCK_M": "constexpr",
           "SPLIT_D": "constexpr"}
    cast = triton.compile(ASTSource(b90._flat_cast_varlen_kernel, sig,
                                    constexprs={"HEAD_D": d, "BLOCK_M": bm,
                                                "SPLIT_D": b90.DQ_SPLIT_D[d]}),
                          target=target, options={"num_warps": 4})
    return stats, cast


def test_packed_sm90_backward_compiles():
    """The packed backward compiles for sm_90 (bf16 d = 128 causal, fp16 d = 64 full, MHA),
    within 227 KiB of shared memory, with bulk loads and reduce-adds and masked register
    stores of dK, dV, spilling at most what the dense kernel spills plus a margin; its stats
    and cast kernels compile too."""
    pytest.importorskip("triton.experimental.gluon")  # only a Triton without Gluon skips
    from attnmem.kernels.dev.compile_sm90 import _ptxas_usage

    for args, limit in ((("bf16", 128, True, True), 64), (("fp16", 64, False, False), 256)):
        ck = compile_varlen(*args)
        regs, spills = _ptxas_usage(ck.asm["ptx"])
        assert spills != "?" and int(spills) <= limit, f"{args}: {spills} bytes spilled ({regs})"
        assert ck.metadata.shared <= 227 * 1024
        ptx = ck.asm["ptx"]
        assert "cp.async.bulk.tensor" in ptx  # TMA loads
        assert "cp.reduce.async.bulk" in ptx  # dQ's bulk reduce-adds
        assert "st.global" in ptx  # dK, dV under a mask
    for dt, d in (("bf16", 128), ("fp16", 64)):
        compile_helpers(dt, d)


if __name__ == "__main__":  # registers and spills of each variant on this Triton
    import sys

    import triton

    from attnmem.kernels.dev.compile_sm90 import _ptxas_usage

    print(f"triton {triton.__version__}")
    for d in (64, 128):
        for dt in ("fp16", "bf16"):
            for c in (False, True):
                for mha in (False, True):
                    ck = compile_varlen(dt, d, c, mha)
                    r, sp = _ptxas_usage(ck.asm["ptx"])
                    print(f"{dt} d={d} causal={c} mha={mha}: {r} registers, {sp} bytes "
                          f"spilled, {ck.metadata.shared / 1024:.1f} KiB shared", flush=True)
        compile_helpers("bf16", d)
        print(f"stats/cast d={d}: compiled")
    sys.exit(0)
