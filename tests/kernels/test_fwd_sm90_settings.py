"""Settings of the Hopper (Gluon) forward that are not its default yet (kernels/flash/NOTES.md
step 13d): EXP2_EMU, part of the probabilities computed by a polynomial on the FMA units.

CPU: the polynomial's arithmetic (the same float32 operations as `fwd_sm90._exp2_poly`, in
torch) is within 1e-4 of 2^x; compiled for sm_90, the unmasked loops hold 16 fewer exp2 unit
instructions per quarter moved; bad values are refused before anything runs; the A/B tool's
arguments. GPU (marked ``gpu``, compute capability 9.x): O and lse2 against the fp32
reference for every setting, at d = 64 (three warpgroups) and 128, causal and not, ragged, GQA.
"""

from __future__ import annotations

import argparse
import inspect
import math

import pytest
from _hopper import hopper_reason

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def _k90():
    try:
        from kernels.flash import fwd_sm90
    except Exception as e:  # Triton without Gluon's Hopper API
        pytest.skip(f"kernels.flash.fwd_sm90 does not import here: {type(e).__name__}: {e}")
    return fwd_sm90


def _exp2_poly_torch(x: torch.Tensor, coeffs) -> torch.Tensor:
    """`_exp2_poly`'s operations in float32 torch, one rounding per operation as on the GPU."""
    x = torch.clamp(x.float(), min=-125.0)
    c = torch.tensor(12582912.0)
    t = x + c
    f = x - (t - c)
    p = coeffs[3] * f + coeffs[2]
    p = p * f + coeffs[1]
    p = p * f + coeffs[0]
    bits = p.view(torch.int32) + (t.view(torch.int32) << 23)
    return bits.view(torch.float32)


def test_polynomial_exp2_is_within_1e4_of_exp2():
    k90 = _k90()
    coeffs = [torch.tensor(v, dtype=torch.float32) for v in k90.EXP2_POLY]
    g = torch.Generator().manual_seed(0)
    x = -torch.empty(1_000_000).exponential_(0.125, generator=g)  # mean -8, as scores lie
    x = torch.cat([x, torch.tensor([0.0, -1e-7, -0.5, -0.5000001, -1.0, -60.3, -124.9, -125.0])])
    got = _exp2_poly_torch(x, coeffs).double()
    want = torch.exp2(x.double())
    rel = ((got - want).abs() / want).max().item()
    assert rel < 1e-4, rel
    # below -125 (probabilities no 16-bit P keeps): 2^-125 (to the polynomial's error at 0),
    # not garbage from an exponent field that wrapped
    low = _exp2_poly_torch(torch.tensor([-126.0, -1e4]), coeffs).double() / 2.0**-125
    assert ((low - 1).abs() < 1e-4).all(), low


def _mufu(d: int, consumers: int, stages: int, emu: int) -> tuple[set, set]:
    """MUFU counts of the unmasked and of the masked key loops (non-causal kernel: each
    consumer's two loops in code order, unmasked first, as `_consumer` writes them)."""
    from kernels.bench import compile_sm90 as cs
    from kernels.bench import sass_loops

    ck = cs.compile_variant("bf16", d, False, 128, stages, consumers, emu)
    loops = sass_loops.loops(sass_loops.sass(ck.asm["cubin"]))
    assert ck.metadata.shared <= 227 * 1024
    assert len(loops) == 2 * consumers, loops
    return {lp.mufu for lp in loops[0::2]}, {lp.mufu for lp in loops[1::2]}


@pytest.mark.parametrize("d, consumers, stages", [(64, 3, 2), (128, 2, 2)])
def test_each_quarter_moves_16_exp2_per_thread_off_the_exp2_unit(d, consumers, stages):
    """Compiled for sm_90 (no GPU): a consumer's unmasked step issues 64 exp2 for P and 2 for
    the row rescale (66 MUFU); EXP2_EMU = 1 leaves 50, 2 leaves 34; the masked steps keep 66."""
    _k90()
    try:
        base = _mufu(d, consumers, stages, 0)
    except Exception as e:  # no ptxas / cuobjdump / sm_90 backend in this Triton
        pytest.skip(f"sm_90 compile unavailable here: {type(e).__name__}: {e}")
    assert base == ({66}, {66}), base
    assert _mufu(d, consumers, stages, 1) == ({50}, {66})  # the masked steps keep exp2
    assert _mufu(d, consumers, stages, 2) == ({34}, {66})


@pytest.mark.parametrize("emu, block_n", [(4, 128), (-1, 128), (1, 64)])
def test_bad_exp2_emu_is_refused_before_anything_runs(emu, block_n):
    k90 = _k90()
    q = torch.zeros(1, 1, 64, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match=rf"exp2_emu must be 0, 1, 2 or 3.*got {emu} with "
                                         rf"block_n = {block_n}"):
        k90.attention_forward_sm90(q, q, q, False, 0.1, block_n=block_n, exp2_emu=emu)


def test_ab_fwd_arguments():
    from kernels.bench import ab_fwd

    k90 = _k90()
    assert set(ab_fwd.SETTINGS) <= set(inspect.signature(k90.attention_forward_sm90).parameters)
    args = ab_fwd.parse_args(["--variant", "e:exp2_emu=1,stages=3"])
    assert args.variant == [("e", {"exp2_emu": 1, "stages": 3})]
    assert args.shapes[0] == (1, 32, 32, 8192, 64, True) and args.rounds == 3
    for bad in ("1/32/32/8192/96/1", "1/32/5/8192/64/1", "x/1/1/1/64/0", "1/1/1/1/64"):
        with pytest.raises(argparse.ArgumentTypeError, match="shape"):
            ab_fwd.parse_shape(bad)
    with pytest.raises(SystemExit):
        ab_fwd.parse_args(["--variant", "e:block_m=64"])  # not a forward setting
    with pytest.raises(SystemExit):
        ab_fwd.parse_args([])


def test_ab_fwd_refuses_to_run_without_a_gpu(monkeypatch):
    from kernels.bench import ab_fwd

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        ab_fwd.main(["--variant", "e:exp2_emu=1"])


@pytest.mark.gpu
@pytest.mark.parametrize("emu", [1, 2, 3])
@pytest.mark.parametrize("case", [
    # B, H, H_kv, s_q, s_k, d, causal, consumers, stages
    (2, 4, 4, 1000, 1000, 128, False, 2, 2),
    (1, 8, 2, 1025, 1025, 128, True, 2, 2),  # GQA 4:1
    (1, 4, 4, 300, 4100, 128, False, 2, 2),
    (2, 4, 4, 4100, 4100, 64, True, 3, 2),
    (1, 8, 2, 1000, 1500, 64, False, 3, 2),
], ids=lambda c: "B{}H{}kv{}q{}k{}d{}{}".format(*c[:6], "c" if c[6] else ""))
def test_gpu_exp2_emu_matches_reference(case, emu):
    reason = hopper_reason()
    if reason:
        pytest.skip(reason)
    k90 = _k90()
    from kernels.flash.reference import attention_reference

    B, H, H_kv, s_q, s_k, d, causal, consumers, stages = case
    torch.manual_seed(hash(case) % 2**31)
    for dtype, floor in ((torch.bfloat16, 1.6e-2), (torch.float16, 2e-3)):
        q = torch.randn(B, H, s_q, d, device="cuda", dtype=dtype)
        k = torch.randn(B, H_kv, s_k, d, device="cuda", dtype=dtype)
        v = torch.randn(B, H_kv, s_k, d, device="cuda", dtype=dtype)
        scale = 1 / math.sqrt(d)
        o, lse2 = k90.attention_forward_sm90(q, k, v, causal, scale * math.log2(math.e),
                                             stages=stages, consumers=consumers, exp2_emu=emu)
        ref = attention_reference(q.double(), k.double(), v.double(), causal, scale)
        low = attention_reference(q, k, v, causal, scale)
        err = (o.double() - ref).abs().max().item()
        base = (low.double() - ref).abs().max().item()
        assert err <= 2 * base + floor, (dtype, err, base)
        o0, lse0 = k90.attention_forward_sm90(q, k, v, causal, scale * math.log2(math.e),
                                              stages=stages, consumers=consumers, exp2_emu=0)
        assert (lse2 - lse0).abs().max().item() < 1e-3  # the row statistics barely move
