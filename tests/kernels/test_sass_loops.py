"""kernels.bench.sass_loops: loops found in a SASS listing, and counted."""

from __future__ import annotations

import pytest

from kernels.bench import sass_loops as sl

# A hand-made listing in cuobjdump's format: an outer loop (0x0010-0x00a0) around an inner one
# (0x0030-0x0070) with a warpgroup MMA and local memory, a loop without MMAs (0x00b0-0x00c0),
# the EXIT, and a barrier-wait retry path after it that branches back into the inner loop.
LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;   /* 0x0 */
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;  /* 0x0 */
        /*0020*/                   STL [R1+0x8], R2 ;       /* 0x0 */
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ; /* 0x0 */
        /*0040*/                   LDL.LU R4, [R1+0x8] ;    /* 0x0 */
        /*0050*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R0+URZ+0x10], R3 ; /* 0x0 */
        /*0060*/              @!P0 BRA 0x00f0 ;             /* 0x0 */
        /*0070*/               @P1 BRA 0x0030 ;             /* 0x0 */
        /*0080*/                   STL [R1+0x4], R5 ;       /* 0x0 */
        /*0090*/                   ISETP.NE.AND P2, PT, R2, RZ, PT ; /* 0x0 */
        /*00a0*/               @P2 BRA 0x0010 ;             /* 0x0 */
        /*00b0*/                   FADD R6, R6, R7 ;        /* 0x0 */
        /*00c0*/               @P3 BRA 0x00b0 ;             /* 0x0 */
        /*00d0*/                   EXIT ;                   /* 0x0 */
        /*00e0*/                   BRA 0x00e0 ;             /* 0x0 */
        /*00f0*/                   SYNCS.PHASECHK.TRANS64 P0, [R0+URZ+0x10], R3 ; /* 0x0 */
        /*0100*/              @!P0 BRA 0x0050 ;             /* 0x0 */
"""


def test_opcode_drops_predicate_and_modifiers() -> None:
    assert sl.opcode("@!P0 LDL.LU R4, [R1+0x8]") == "LDL"
    assert sl.opcode("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ") == "HGMMA"
    assert sl.opcode("") == ""


def test_finds_the_innermost_mma_loop_and_counts_it() -> None:
    got = sl.loops(LISTING)
    # the outer loop contains the inner one, the FADD loop has no MMA, the retry path after
    # the EXIT is no loop, and the self-branch after the EXIT is not either
    assert got == [sl.Loop(start=0x30, end=0x70, instructions=5, hgmma=1, local_loads=1,
                           local_stores=0)]


def test_the_backward_compiles_to_mma_loops() -> None:
    """The Gluon backward's default variant (d = 128, MHA), compiled for sm_90 here: four
    innermost loops (two per consumer warpgroup: masked and unmasked steps), each with the
    step's 32 warpgroup MMA instructions: S^T and dP^T 8 each (K = d = 128 in steps of 16),
    dV and dK 4 each (K = 64 queries), dQ^T 8 (K = 128 keys)."""
    pytest.importorskip("triton.experimental.gluon")
    from kernels.bench import compile_bwd_sm90 as cb

    try:
        got = cb.loop_counts("bf16", 128, False, mha=True)
    except Exception as e:  # no ptxas / cuobjdump / sm_90 backend in this Triton
        pytest.skip(f"sm_90 compile unavailable here: {type(e).__name__}: {e}")
    assert len(got) == 4 and all(lp.hgmma == 32 for lp in got), got
