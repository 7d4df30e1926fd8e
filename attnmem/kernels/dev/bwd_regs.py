# Measured: registers and spills of the Triton dK/dV kernel for sm_90 (ptxas, no GPU).
"""Registers and spills of the dK/dV kernel (default and atomic-dQ variants) as ptxas reports
them for sm_90, compiled on the CPU (no GPU needed), per head dim, causal flag and tile.

    python -m attnmem.kernels.dev.bwd_regs [--dims 64 128]

The last-dim strides are specialised to 1 as the JIT does for contiguous inputs; the other
strides stay plain integers (the JIT would also mark them divisible by 16), so the figures
are close to, not equal to, what a launch compiles.
"""

from __future__ import annotations

import argparse
import itertools

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from attnmem.kernels.dev.compile_sm90 import _ptxas_usage  # noqa: E402
from attnmem.kernels.dev.ptx_fingerprint import _signature  # noqa: E402
from attnmem.kernels.flash import bwd as bwd  # noqa: E402

TILES = [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 2), (64, 64, 4, 2), (32, 128, 4, 3)]
UNIT_STRIDES = ("stride_qd", "stride_kd", "stride_vd", "stride_dod", "stride_dkd", "stride_dvd")


VARIANTS = ("default", "atomic", "atomic_tma")


def usage(d: int, causal: bool, tile: tuple, variant: str) -> tuple[str, str]:
    """(registers, spill-store bytes) of the dK/dV kernel; ``variant`` one of VARIANTS (the
    default backward, atomic dQ with element-wise adds, atomic dQ with bulk reduce-adds)."""
    bm, bn, warps, stages = tile
    atomic, tma = variant != "default", variant == "atomic_tma"
    consts = dict(HEAD_DIM=d, BLOCK_D=d, EVEN_D=True, CAUSAL=causal, IEEE=False, BLOCK_M=bm,
                  BLOCK_N=bn, ATOMIC_DQ=atomic, DQ_TMA=tma, **{n: 1 for n in UNIT_STRIDES})
    tensors = {n: "*fp16" for n in ("Q", "K", "V", "DO", "DK", "DV")}
    tensors |= {"LSE2": "*fp32", "DELTA": "*fp32"}
    if atomic:
        tensors["DQ_ACC"] = "*fp32"
    else:
        consts["DQ_ACC"] = None
    if tma:
        tensors["DQ_DESC"] = f"tensordesc<fp32[1,{bm},{d}]>"
    else:
        consts["DQ_DESC"] = None
    fn = bwd.bwd_dkdv_kernel
    src = ASTSource(fn, _signature(fn, tensors, consts), constexprs=consts)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": warps, "num_stages": stages})
    return _ptxas_usage(ck.asm["ptx"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = ap.parse_args()
    print(f"triton {triton.__version__}; d causal tile variant regs spill_store_bytes")
    for d, causal, tile, variant in itertools.product(args.dims, (False, True), TILES,
                                                      args.variants):
        regs, spill = usage(d, causal, tile, variant)
        print(d, int(causal), tile, variant, regs, spill, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
