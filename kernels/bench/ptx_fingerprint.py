"""Compile the Triton kernels (forward, dQ, dK/dV) for sm_90 without a GPU and print a short
hash of each variant's PTX, with source line records removed.

    python -m kernels.bench.ptx_fingerprint > before.txt   # edit the kernels' source
    python -m kernels.bench.ptx_fingerprint > after.txt; diff before.txt after.txt
    python -m kernels.bench.ptx_fingerprint --atomic   # also compile the atomic-dQ dK/dV variant

A refactor of the kernel source (a shared helper, moved code) that leaves every hash equal
changed nothing the GPU runs: no device time is needed to show that.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import sys

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels.flash import bwd as bwd  # noqa: E402
from kernels.flash import fwd as fwd  # noqa: E402


def _signature(fn, tensors: dict[str, str], constexprs: dict) -> dict[str, str]:
    """Every parameter of ``fn``: the named tensors' pointer types, constexprs as such, the
    remaining ints as i32 and the scales as fp32."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in tensors:
            sig[name] = tensors[name]
        elif "scale" in name:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def _ptx_hash(fn, tensors, constexprs, num_warps, num_stages) -> str:
    src = ASTSource(fn, _signature(fn, tensors, constexprs), constexprs=constexprs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": num_warps, "num_stages": num_stages})
    # source positions and the labels that only the debug sections refer to move with the
    # source text; what the GPU runs does not
    ptx = "\n".join(line for line in ck.asm["ptx"].splitlines()
                    if not re.match(r"\s*(\.loc|\.file|//|\$L__tmp\d+:)", line))
    ptx = re.sub(r"\.section\s+\.debug.*", "", ptx, flags=re.S)
    return hashlib.sha256(ptx.encode()).hexdigest()[:12]


def main() -> int:
    print(f"triton {triton.__version__}")
    h = "*fp16"
    for d, causal, use_desc in itertools.product((64, 80, 128), (False, True), (False, True)):
        bd = fwd.block_d(d)
        if use_desc and bd != d:
            continue
        meta = dict(HEAD_DIM=d, BLOCK_D=bd, EVEN_D=bd == d, CAUSAL=causal, IEEE=False,
                    BLOCK_M=128, BLOCK_N=64)
        tensors = {n: h for n in ("Q", "K", "V", "Out")} | {"LSE2": "*fp32"}
        consts = dict(meta, USE_DESC=use_desc)
        if use_desc:
            tensors |= {"desc_k": f"tensordesc<fp16[64, {d}]>",
                        "desc_v": f"tensordesc<fp16[64, {d}]>"}
        else:
            consts |= {"desc_k": None, "desc_v": None}
        print(f"fwd  d={d:3d} causal={int(causal)} desc={int(use_desc)} "
              f"{_ptx_hash(fwd._fwd_kernel, tensors, consts, 8, 3)}", flush=True)
        if use_desc:
            continue
        tensors = {n: h for n in ("Q", "K", "V", "Out", "DO", "DQ", "DK", "DV")}
        tensors |= {"LSE2": "*fp32", "DELTA": "*fp32"}
        print(f"dq   d={d:3d} causal={int(causal)}        "
              f"{_ptx_hash(bwd._bwd_dq_kernel, tensors, dict(meta), 8, 3)}", flush=True)
        dkdv = dict(meta, BLOCK_M=64, BLOCK_N=128, DQ_ACC=None, ATOMIC_DQ=False)
        print(f"dkdv d={d:3d} causal={int(causal)}        "
              f"{_ptx_hash(bwd._bwd_dkdv_kernel, tensors, dkdv, 8, 3)}", flush=True)
        if "--atomic" in sys.argv:  # the atomic-dQ variant: compiles, and its hash
            consts = {key: val for key, val in dkdv.items() if key != "DQ_ACC"}
            consts["ATOMIC_DQ"] = True
            atomic = _ptx_hash(bwd._bwd_dkdv_kernel, tensors | {"DQ_ACC": "*fp32"}, consts, 8, 2)
            print(f"dkdv atomic d={d:3d} causal={int(causal)} {atomic}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
