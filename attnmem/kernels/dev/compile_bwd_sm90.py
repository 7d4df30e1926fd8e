# Measured: registers, spills, shared memory of the Gluon backward (sm_90, no GPU).
"""Compile the Hopper (Gluon) backward for sm_90 on a machine without a GPU and print, per
variant, what the compiler made of it: registers per thread, spilled bytes, shared memory.

    python -m attnmem.kernels.dev.compile_bwd_sm90 [--dims 64 128] [--mha] [--loops] [--dump DIR]
        [--block-m N] [--stages N] [--dq-split-d 0|1] [--early-stats 0|1] [--dq-flat 0|1]

Triton's compiler and ptxas run on the CPU (as attnmem.kernels.dev.compile_sm90 does for the
forward); only launching needs the GPU. Exit status 1 if a variant fails to compile or spills.
"""

from __future__ import annotations

import argparse
import os

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from attnmem.kernels.dev import sass_loops
from attnmem.kernels.dev.compile_sm90 import _ptxas_usage
from attnmem.kernels.flash import bwd_sm90 as b90

_DT = {"fp16": b90.gl.float16, "bf16": b90.gl.bfloat16}


def _desc_type(dtype: str, gdt, rows: int, d: int) -> str:
    lay = b90.gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], gdt)
    return f"tensordesc<{dtype}[1, 1, {rows}, {d}],{lay!r}>"


def compile_variant(dtype: str, d: int, causal: bool, block_m: int, stages: int,
                    dq_split_d: bool | None = None, mha: bool = False):
    """The compiled kernel for one variant, with the signature the host side launches; ``mha``:
    GROUP = 1 as a constant, as the JIT specialises an integer argument equal to 1 (no GQA)."""
    gdt = _DT[dtype]
    dm = _desc_type(dtype, gdt, block_m, d)
    dn = _desc_type(dtype, gdt, b90.HALF_N, d)
    split_d = b90.DQ_SPLIT_D[d] if dq_split_d is None else bool(dq_split_d)
    # the flat dQ buffer as (rows, 32) in register order (bwd_sm90.flat_tile)
    dq = f"tensordesc<fp32[{b90.FLAT_ROWS}, 32],{b90.STATS_LAYOUT!r}>"
    ptr = f"*{dtype}"
    st = f"tensordesc<fp32[1, {block_m}],{b90.STATS_LAYOUT!r}>"  # lse2 and delta rows
    sig = {"q_desc": dm, "k_desc": dn, "v_desc": dn, "do_desc": dm, "dq_desc": dq,
           "lse_desc": st, "delta_desc": st, "DK": ptr, "DV": ptr, "H": "i32", "H_kv": "i32",
           "GROUP": "i32", "HEADS_PER_GROUP": "i32", "s_q": "i32", "s_k": "i32",
           "qk_scale": "fp32", "sm_scale": "fp32",
           "CAUSAL": "constexpr", "STAGES": "constexpr", "DQ_SPLIT_D": "constexpr",
           "num_warps": "constexpr"}
    consts = {"CAUSAL": causal, "STAGES": stages, "DQ_SPLIT_D": split_d,
              "num_warps": b90.NUM_WARPS}
    if mha:
        sig["GROUP"], consts["GROUP"] = "constexpr", 1
    src = GluonASTSource(b90.attn_bwd_sm90_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": b90.NUM_WARPS})


def loop_counts(dtype: str, d: int, causal: bool, mha: bool = False) -> list:
    """The innermost loops of the default variant's SASS with their local loads and stores
    (attnmem.kernels.dev.sass_loops.Loop), compiled as `run` does; raises if it does not compile."""
    loops: dict = {}
    (row,) = run(dims=(d,), dtypes=(dtype,), causals=(causal,), verbose=False, mha=mha,
                 loops=loops)
    if row[-1] is not None:
        raise RuntimeError(row[-1])
    return loops[(dtype, d, causal)]


def run(dims=b90.HEAD_DIMS, dump: str | None = None, dtypes=("fp16", "bf16"),
        causals=(False, True), block_m: int | None = None, stages: int | None = None,
        verbose: bool = True, dq_split_d: bool | None = None,
        mha: bool = False, loops: dict | None = None) -> list[tuple]:
    """Compile every variant; returns rows (dtype, d, causal, BLOCK_M, stages, regs, spill
    bytes, shared KiB, error or None). ``dq_split_d`` None: bwd_sm90.DQ_SPLIT_D's choice per d
    (the flat dQ staging needs a 64 x 64 partial: other choices fail to compile);
    ``mha``: compiled for GROUP = 1 (compile_variant); ``loops``, when given, receives per
    (dtype, d, causal) the innermost loops of that kernel's SASS (attnmem.kernels.dev.sass_loops)."""
    rows = []
    for d in dims:
        bm, st = b90.TILES[d]
        bm, st = block_m or bm, stages or st
        for dtype in dtypes:
            for causal in causals:
                try:
                    ck = compile_variant(dtype, d, causal, bm, st, dq_split_d, mha)
                except Exception as e:  # report and go on with the next variant
                    rows.append((dtype, d, causal, bm, st, None, None, None,
                                 f"{type(e).__name__}: {str(e)[:3000]}"))
                    if verbose:
                        print(f"{dtype} {d} {causal} {bm} {st} FAILED: {rows[-1][-1]}")
                    continue
                regs, spills = _ptxas_usage(ck.asm["ptx"])
                shared = ck.metadata.shared / 1024
                rows.append((dtype, d, causal, bm, st, regs, spills, shared, None))
                if loops is not None:
                    loops[(dtype, d, causal)] = sass_loops.loops(sass_loops.sass(ck.asm["cubin"]))
                if verbose:
                    print(f"{dtype} {d} {causal} {bm} {st} {regs} {spills} {shared:.1f}")
                if dump:
                    os.makedirs(dump, exist_ok=True)
                    stem = f"{dump}/bwd_{dtype}_d{d}_c{int(causal)}_m{bm}_s{st}"
                    for ext in ("ttgir", "ptx"):
                        with open(f"{stem}.{ext}", "w") as f:
                            f.write(ck.asm[ext])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", help="write the ttgir and ptx of each variant here")
    ap.add_argument("--dims", type=int, nargs="+", default=list(b90.HEAD_DIMS))
    ap.add_argument("--block-m", type=int, default=None)
    ap.add_argument("--stages", type=int, default=None)
    ap.add_argument("--dq-split-d", type=int, choices=(0, 1), default=None,
                    help="dQ^T split between the warpgroups by rows of d (1) or by queries (0); "
                         "default: bwd_sm90.DQ_SPLIT_D per head dim")
    ap.add_argument("--mha", action="store_true",
                    help="compile for GROUP = 1, as the JIT does when there is no GQA")
    ap.add_argument("--loops", action="store_true",
                    help="also print each innermost loop of every variant's SASS with its "
                         "local loads and stores (attnmem.kernels.dev.sass_loops)")
    args = ap.parse_args()
    print(f"triton {triton.__version__}")
    print("dtype d causal BLOCK_M stages regs spill_bytes shared_KiB")
    split_d = None if args.dq_split_d is None else bool(args.dq_split_d)
    loops: dict | None = {} if args.loops else None
    rows = run(args.dims, args.dump, block_m=args.block_m, stages=args.stages,
               dq_split_d=split_d, mha=args.mha, loops=loops)
    if loops:
        print("dtype d causal loop_offset instructions HGMMA local_loads local_stores")
        for (dtype, d, causal), found in loops.items():
            for lp in found:
                print(f"{dtype} {d} {causal} {lp.start:#07x} {lp.instructions} {lp.hgmma} "
                      f"{lp.local_loads} {lp.local_stores}")
    bad = [r for r in rows if r[-1] is not None or r[6] not in ("0",)]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
