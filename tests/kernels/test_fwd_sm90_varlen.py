"""The Hopper (Gluon) forward on packed sequences (`fwd_sm90.attention_forward_sm90_packed`,
``flash_attention(..., cu_seqlens=...)`` on a compute capability 9.x GPU).

Oracle: each sequence alone through the fp32 eager reference
(``attnmem.kernels.flash.reference.attention_reference``); the packed output, its base-2 log-sum-exp
and the gradients (the Triton packed backward reading this forward's O and lse2) must stay
within twice plain eager's error in the same dtype plus a floor, row for row, as
tests/kernels/test_varlen.py bounds the portable packed path. Every buffer the kernels
allocate is NaN-filled first (`common.empty`), so a row no program writes shows.

What the packed kernel adds to the dense one, and where each is tested:

- tiles that run past a sequence's end read the next sequence's keys and queries: the keys
  must be masked (a row that saw a neighbour's key fails the reference) and the queries'
  rows discarded;
- no program writes O or lse2 past its sequence's end (the next sequence's program owns those
  rows): `test_gpu_nothing_written_past_the_last_sequence` leaves rows after the last
  sequence outside every sequence and checks they keep their NaN, at ends on and off the 64-row
  halves and 128/192-row tiles;
- q as (1, H, T, d) and as FlashAttention's (T, H, d) (a transposed view reaches the kernel).

Lengths 1, 97, 128, 700 and 4,096 among others, GQA 2:1, fp16 and bf16, d = 64 and 128, causal
and not, two and three consumer warpgroups. CPU: the route decisions are in
tests/kernels/test_route_packed.py; the compile for sm_90 (registers, spills) runs here.
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
LENS = [97, 1, 128, 700, 4096, 64, 193, 129]  # across the 64-row halves and 128/192-row tiles
LOG2E = 1.4426950408889634

needs_hopper = pytest.mark.skipif(REASON is not None, reason=f"Hopper forward: {REASON}")


@contextlib.contextmanager
def counting_packed_sm90():
    """A list that gets one entry per call of `fwd_sm90.attention_forward_sm90_packed` (the
    route calls it through the module, so a wrapper there sees every call)."""
    from attnmem.kernels.flash import fwd_sm90

    real, seen = fwd_sm90.attention_forward_sm90_packed, []

    def wrapper(*args, **kwargs):
        seen.append(args[-3:])  # (stages, block_n, consumers)
        return real(*args, **kwargs)

    fwd_sm90.attention_forward_sm90_packed = wrapper
    try:
        yield seen
    finally:
        fwd_sm90.attention_forward_sm90_packed = real


def _starts(lens) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")


def _reference(q, k, v, do, starts, causal, dtype_hi):
    """Per sequence, the reference in ``dtype_hi``: output, lse2 (base 2, (1, H, T)) and the
    gradients of q, k, v for the upstream gradient ``do``."""
    from attnmem.kernels.flash.reference import attention_reference

    leaves = [t.detach().to(dtype_hi).requires_grad_() for t in (q, k, v)]
    outs, lses = [], []
    H, H_kv, d = q.shape[1], k.shape[1], q.shape[3]
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        qs, ks, vs = (t[:, :, a:b] for t in leaves)
        outs.append(attention_reference(qs, ks, vs, causal))
        with torch.no_grad():
            kk = ks.repeat_interleave(H // H_kv, dim=1)
            sc = (qs @ kk.transpose(-2, -1)) / math.sqrt(d)
            if causal:
                n = b - a
                sc = sc.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=sc.device)
                                    .tril(), float("-inf"))
            lses.append(torch.logsumexp(sc, -1) * LOG2E)
    out = torch.cat(outs, 2)
    out.backward(do.to(dtype_hi))
    return out.detach(), torch.cat(lses, 2), [t.grad for t in leaves]


def _packed(lens, H, H_kv, d, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    T = sum(lens)
    q = torch.randn(1, H, T, d, generator=g).to("cuda", dtype)
    k = torch.randn(1, H_kv, T, d, generator=g).to("cuda", dtype)
    v = torch.randn(1, H_kv, T, d, generator=g).to("cuda", dtype)
    do = torch.randn(1, H, T, d, generator=g).to("cuda", dtype)
    return q, k, v, do


def check_packed_sm90(lens, H, H_kv, d, causal, dtype, config, flat=False):
    """The packed call with ``config`` (forcing the Hopper forward) against the reference:
    output, lse2 (from the route's forward on the same inputs) and the three gradients."""
    from attnmem.kernels.flash import route
    from attnmem.kernels.flash.api import flash_attention
    from attnmem.kernels.flash.common import Packed

    q, k, v, do = _packed(lens, H, H_kv, d, dtype)
    cu = _starts(lens)
    starts = cu.tolist()
    T = sum(lens)
    if flat:  # FlashAttention's (T, H, d), contiguous: the kernel gets its transposed view
        leaves = [t[0].transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v)]
        views = [t.detach().transpose(0, 1).unsqueeze(0) for t in leaves]
        assert views[0].stride()[1:] == (d, H * d, 1)
    else:
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        views = [q, k, v]
    with poison_empty(), counting_packed_sm90() as calls:
        out = flash_attention(*leaves, causal=causal, cu_seqlens=cu, config=config)
        if flat:
            assert out.shape == (T, H, d)
            out.backward(do[0].transpose(0, 1))
            out = out.transpose(0, 1).unsqueeze(0)
        else:
            out.backward(do)
        packed = Packed(cu, cu, max(lens), max(lens))
        o2, lse2 = route.attention_forward(*views, causal, 1 / math.sqrt(d), config, None,
                                           packed)
    assert len(calls) == 2, "the packed calls did not run the Hopper packed forward"
    grads = [t.grad.transpose(0, 1).unsqueeze(0) if flat else t.grad for t in leaves]
    ref, ref_lse, ref_grads = _reference(q, k, v, do, starts, causal, torch.float32)
    base, _, base_grads = _reference(q, k, v, do, starts, causal, dtype)
    assert out.dtype == dtype
    _within("out", out.detach(), ref, base, FLOOR[dtype])
    _within("out (second call)", o2, ref, base, FLOOR[dtype])
    assert lse2.shape == (1, H, T) and lse2.dtype == torch.float32
    # lse2 from the same 16-bit q, k with fp32 products and sums: only the summation order
    # and exp2's approximation differ from the fp32 reference (a masking error moves it by
    # O(0.1) or more)
    torch.testing.assert_close(lse2, ref_lse.float(), atol=2e-3, rtol=0)
    for name, gr, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads, strict=True):
        _within(name, gr, r, b, FLOOR[dtype])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 80, 96, 128])
@pytest.mark.parametrize("dtype,flat", [(torch.float16, True), (torch.bfloat16, False)],
                         ids=["fp16_flat", "bf16_bhsd"])
def test_gpu_packed_sm90_matches_reference(dtype, flat, d, causal, monkeypatch):
    """Two consumer warpgroups (d = 64, 80, 96 forced, d = 128 the default's schedule), GQA
    2:1; at d = 80 and 96 (SETTINGS.sm90_padded_dims) the half where a sequence ends stores
    D-wide rows from 128-wide tiles."""
    from attnmem.kernels.flash.config import SETTINGS, KernelConfig

    monkeypatch.setattr(SETTINGS, "sm90_padded_dims", True)
    check_packed_sm90(LENS, 4, 2, d, causal, dtype, KernelConfig(sm90=True), flat=flat)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("flat,causal", [(False, True), (True, False)],
                         ids=["bhsd_causal", "flat_full"])
def test_gpu_packed_sm90_three_warpgroups_match_reference(flat, causal):
    """Three consumer warpgroups (192-row tiles, the d = 64 default past 2,048/4,096)."""
    from attnmem.kernels.flash.config import KernelConfig

    check_packed_sm90(LENS, 4, 4, 64, causal, torch.bfloat16,
                      KernelConfig(sm90=True, sm90_consumers=3, sm90_stages=2), flat=flat)


@pytest.mark.gpu
@needs_hopper
def test_gpu_packed_default_route_takes_the_hopper_forward():
    """No config: d = 128 packed calls run the Hopper packed forward, and match."""
    check_packed_sm90([700, 1, 97], 4, 1, 128, True, torch.bfloat16, None)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("end", [1, 64, 97, 128, 150, 192, 700])
def test_gpu_nothing_written_past_the_last_sequence(end, consumers):
    """Rows after the last sequence belong to no sequence: the kernel must leave them as they
    were (NaN), in O and lse2, wherever the sequence ends inside its tile; and the rows it
    owns must be written (no NaN left). A store that ran past a sequence's end would write
    them, as it would overwrite the next sequence's rows in a real batch."""
    from attnmem.kernels.flash import fwd_sm90
    from attnmem.kernels.flash.common import Packed

    first = 300  # a sequence before, so the last one starts at an offset
    T = first + end + 200
    q, k, v, _ = _packed([T], 2, 2, 64, torch.bfloat16, seed=end)
    cu = torch.tensor([0, first, first + end], dtype=torch.int32, device="cuda")
    for causal in (False, True):
        with poison_empty():
            o, lse2 = fwd_sm90.attention_forward_sm90_packed(
                q, k, v, causal, LOG2E / 8, Packed(cu, cu, max(first, end), max(first, end)),
                2 if consumers == 3 else None, None, consumers)
        torch.cuda.synchronize()
        owned = first + end
        assert not o[:, :, :owned].isnan().any() and not lse2[:, :, :owned].isnan().any()
        assert o[:, :, owned:].isnan().all(), "O written past the last sequence's end"
        assert lse2[:, :, owned:].isnan().all(), "lse2 written past the last sequence's end"


# ---- CPU: the compile for sm_90 --------------------------------------------------------------

def compile_varlen(dtype: str, d: int, causal: bool, consumers: int, stages: int):
    """The packed kernel compiled for sm_90 as a launch with these settings compiles it (no
    GPU: Triton's compiler and ptxas run on the CPU, as attnmem/kernels/dev/compile_sm90.py does for the
    dense kernel)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from attnmem.kernels.flash import fwd_sm90 as k90

    gdt = {"fp16": k90.gl.float16, "bf16": k90.gl.bfloat16}[dtype]
    td = k90.tile_d(d)
    bn = k90.TILES[td][0]
    lay_m = k90.gl.NVMMASharedLayout.get_default_for([1, 1, k90.HALF_M, td], gdt)
    lay_n = k90.gl.NVMMASharedLayout.get_default_for([1, 1, bn, td], gdt)
    desc_m = f"tensordesc<{dtype}[1, 1, {k90.HALF_M}, {td}],{lay_m!r}>"
    desc_n = f"tensordesc<{dtype}[1, 1, {bn}, {td}],{lay_n!r}>"
    sig = {"q_desc": desc_m, "k_desc": desc_n, "v_desc": desc_n, "o_desc": desc_m,
           "O": f"*{dtype}", "LSE2": "*fp32", "CU_Q": "*i32", "CU_K": "*i32", "H": "i32",
           "GROUP": "i32", "total_q": "i32", "qk_scale": "fp32", "CAUSAL": "constexpr",
           "STAGES": "constexpr", "num_warps": "constexpr", "CONSUMERS": "constexpr",
           "D": "constexpr"}
    consts = {"CAUSAL": causal, "STAGES": stages, "num_warps": k90.NUM_WARPS,
              "CONSUMERS": consumers, "D": d}
    src = GluonASTSource(k90.attn_fwd_sm90_varlen_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": k90.NUM_WARPS})


def test_packed_sm90_forward_compiles():
    """The packed kernel compiles for sm_90 at the default schedules (d = 128 two warpgroups,
    d = 64 three), within the 227 KiB of shared memory, keeping the overlap of S_{j+1} with
    O += P_j V_j, with masked register stores (the sequence's last rows) beside the bulk copy,
    and with at most the spills ptxas reported for it on Triton 3.6 and 3.9 (none at d = 128;
    at d = 64 with three warpgroups, 88-152 bytes on 3.9, none on 3.6); and d = 96 in 128-wide
    tiles, whose masked stores are 96 wide (`fwd_sm90.tile_d`)."""
    pytest.importorskip("triton.experimental.gluon")  # only a Triton without Gluon skips
    from attnmem.kernels.dev.compile_sm90 import _ptxas_usage

    for args in (("bf16", 128, True, 2, 2), ("fp16", 64, False, 3, 2), ("bf16", 96, True, 2, 2)):
        ck = compile_varlen(*args)
        regs, spills = _ptxas_usage(ck.asm["ptx"])
        limit = 160 if args[1] == 64 else 0
        assert spills != "?" and int(spills) <= limit, f"{args}: {spills} bytes spilled ({regs})"
        assert ck.metadata.shared <= 227 * 1024
        ptx = ck.asm["ptx"]
        assert ptx.count("wgmma.wait_group.sync.aligned 1") >= 1  # the overlap
        assert "cp.async.bulk.tensor" in ptx  # TMA loads and the full halves' store
        assert "st.global" in ptx  # the masked rows of a sequence's last half, and lse2


if __name__ == "__main__":  # registers and spills of each variant on this Triton
    import sys

    import triton

    from attnmem.kernels.dev.compile_sm90 import _ptxas_usage

    print(f"triton {triton.__version__}")
    for d, nc, st in ((128, 2, 2), (64, 3, 2), (64, 2, 3)):
        for dt in ("fp16", "bf16"):
            for c in (False, True):
                ck = compile_varlen(dt, d, c, nc, st)
                r, sp = _ptxas_usage(ck.asm["ptx"])
                print(f"{dt} d={d} causal={c} consumers={nc} stages={st}: {r} registers, "
                      f"{sp} bytes spilled, {ck.metadata.shared / 1024:.1f} KiB shared")
    sys.exit(0)
