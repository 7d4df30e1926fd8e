# Measured: registers, spills, shared memory of the Gluon forward (sm_90, no GPU).
"""Compile the Hopper (Gluon) forward for sm_90 on a machine without a GPU and print, per
variant, what the compiler made of it: registers per thread, spilled bytes, shared memory.

    python -m attnmem.kernels.dev.compile_sm90 [--dims 64 128] [--consumers 2|3]
        [--loops] [--dump DIR]

Triton's compiler and ptxas run on the CPU; only launching needs the GPU. Spills or shared
memory over the 227 KiB limit show up here before any device time is spent.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from attnmem.kernels.dev import sass_loops  # noqa: E402
from attnmem.kernels.flash import fwd_sm90 as k90  # noqa: E402

_DT = {"fp16": k90.gl.float16, "bf16": k90.gl.bfloat16}


def _ptxas_usage(ptx: str) -> tuple[str, str]:
    """(registers, spill stores in bytes) as ptxas -v reports them for sm_90a."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90)
    ptxas = getattr(ptxas, "path", ptxas)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores", out)
    return (regs.group(1) if regs else "?"), (spill.group(1) if spill else "?")


def compile_variant(dtype: str, d: int, causal: bool, block_n: int, stages: int,
                    consumers: int = 2):
    """The Gluon forward compiled for sm_90 as a launch with these settings compiles it (head
    dim d in tiles of `fwd_sm90.tile_d`)."""
    td = k90.tile_d(d)
    lay_m = k90.gl.NVMMASharedLayout.get_default_for([1, 1, k90.HALF_M, td], _DT[dtype])
    lay_n = k90.gl.NVMMASharedLayout.get_default_for([1, 1, block_n, td], _DT[dtype])
    desc_m = f"tensordesc<{dtype}[1, 1, {k90.HALF_M}, {td}],{lay_m!r}>"
    desc_n = f"tensordesc<{dtype}[1, 1, {block_n}, {td}],{lay_n!r}>"
    sig = {"q_desc": desc_m, "k_desc": desc_n, "v_desc": desc_n, "o_desc": desc_m,
           "LSE2": "*fp32", "H": "i32", "GROUP": "i32", "s_q": "i32", "s_k": "i32",
           "qk_scale": "fp32", "CAUSAL": "constexpr", "STAGES": "constexpr",
           "num_warps": "constexpr", "CONSUMERS": "constexpr", "D": "constexpr"}
    consts = {"CAUSAL": causal, "STAGES": stages, "num_warps": k90.NUM_WARPS,
              "CONSUMERS": consumers, "D": d}
    src = GluonASTSource(k90.attn_fwd_sm90_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": k90.NUM_WARPS})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", help="write ttgir/ptx/sass-less asm of each variant here")
    ap.add_argument("--dims", type=int, nargs="+",
                    default=sorted(k90.HEAD_DIMS + k90.PADDED_HEAD_DIMS))
    ap.add_argument("--stages", type=int, nargs="+", default=None)
    ap.add_argument("--consumers", type=int, default=None, choices=[2, 3],
                    help="consumer warpgroups (default: the kernel's choice per head dim)")
    ap.add_argument("--loops", action="store_true",
                    help="also print each innermost MMA loop of the SASS: instructions, HGMMA, "
                         "MUFU, local loads and stores (attnmem.kernels.dev.sass_loops)")
    args = ap.parse_args()
    print(f"triton {triton.__version__}")
    print("dtype d causal BLOCK_N stages regs spill_bytes shared_KiB")
    bad = 0
    for d in args.dims:
        bn, st0 = k90.TILES[k90.tile_d(d)]
        for st in args.stages or [st0]:
            for dtype in ("fp16", "bf16"):
                for causal in (False, True):
                    try:
                        ck = compile_variant(dtype, d, causal, bn, st,
                                             args.consumers or k90.CONSUMERS[k90.tile_d(d)])
                    except Exception as e:  # report and go on with the next variant
                        print(f"{dtype} {d} {causal} {bn} {st} FAILED: {type(e).__name__}: "
                              f"{str(e)[:2000]}")
                        bad += 1
                        continue
                    ptx = ck.asm["ptx"]
                    regs, spills = _ptxas_usage(ptx)
                    shared = ck.metadata.shared / 1024
                    print(f"{dtype} {d} {causal} {bn} {st} {regs} {spills} {shared:.1f}")
                    if args.loops:
                        for lp in sass_loops.loops(sass_loops.sass(ck.asm["cubin"])):
                            print(f"  loop {lp.start:#07x}: {lp.instructions} instructions, "
                                  f"{lp.hgmma} HGMMA, {lp.mufu} MUFU, {lp.local_loads} LDL, "
                                  f"{lp.local_stores} STL")
                    if args.dump:
                        os.makedirs(args.dump, exist_ok=True)
                        stem = f"{args.dump}/{dtype}_d{d}_c{int(causal)}_n{bn}_s{st}"
                        for ext in ("ttgir", "ptx"):
                            with open(f"{stem}.{ext}", "w") as f:
                                f.write(ck.asm[ext])
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
