# Measured: a hash of each kernel variant's PTX for sm_90 (no GPU).
"""Compile the kernels (Triton forward, dQ, dK/dV, and the Gluon Hopper forward) for sm_90
without a GPU and print a short hash of each variant's PTX, with source line records removed.

    python -m attnmem.kernels.dev.ptx_fingerprint > before.txt   # edit the kernels' source
    python -m attnmem.kernels.dev.ptx_fingerprint > after.txt; diff before.txt after.txt
    python -m attnmem.kernels.dev.ptx_fingerprint --atomic   # also the atomic-dQ dK/dV variants
    python -m attnmem.kernels.dev.ptx_fingerprint --varlen   # also the packed-sequence variants
    python -m attnmem.kernels.dev.ptx_fingerprint --dump DIR  # also write each variant's PTX there

Each variant is compiled the way a launch compiles it: constexpr parameters that the host
leaves at their defaults take those defaults, arguments the host passes as None are
constexprs, and an integer the host passes as 1 is specialised away. The hash leaves out source line
records and the kernel's own name. A refactor of the kernel source (a shared helper, moved
code, a renamed kernel) that leaves every hash equal changed nothing the GPU runs: no device
time is needed to show that.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import itertools
import os
import re

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from attnmem.kernels.flash import bwd as bwd  # noqa: E402
from attnmem.kernels.flash import fwd as fwd  # noqa: E402


def _defaults(fn) -> dict:
    """The constexpr parameters of ``fn`` that have a default, with it (a launch that does not
    name them compiles them at that value)."""
    return {p.name: p.default for p in fn.params
            if p.is_constexpr and p.default is not inspect.Parameter.empty}


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


def _hash(ptx: str) -> str:
    # source positions and the labels that only the debug sections refer to move with the
    # source text, and the kernel's own name (the entry symbol and its parameters' names) with
    # the Python function's name; what the GPU runs does not
    entry = re.search(r"\.entry\s+(\w+)", ptx)
    if entry:
        ptx = re.sub(rf"\b{re.escape(entry.group(1))}", "KERNEL", ptx)
    ptx = "\n".join(line for line in ptx.splitlines()
                    if not re.match(r"\s*(\.loc|\.file|//|\$L__tmp\d+:)", line))
    ptx = re.sub(r"\.section\s+\.debug.*", "", ptx, flags=re.S)
    return hashlib.sha256(ptx.encode()).hexdigest()[:12]


def _compile(fn, tensors, constexprs, num_warps, num_stages):
    consts = {**_defaults(fn), **{k: v for k, v in constexprs.items() if k in fn.arg_names}}
    src = ASTSource(fn, _signature(fn, tensors, consts), constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def _report(label: str, ck, dump: str | None) -> None:
    ptx = ck.asm["ptx"]
    print(f"{label} {_hash(ptx)}", flush=True)
    if dump:
        os.makedirs(dump, exist_ok=True)
        with open(os.path.join(dump, re.sub(r"[^\w=]+", "_", label).strip("_") + ".ptx"),
                  "w") as f:
            f.write(ptx)


def _triton_variants(atomic: bool, dump: str | None, varlen: bool = False) -> None:
    h = "*fp16"
    for d, causal, use_desc in itertools.product((64, 80, 128), (False, True), (False, True)):
        bd = fwd.block_d(d)
        if use_desc and bd != d:
            continue
        meta = dict(HEAD_DIM=d, BLOCK_D=bd, EVEN_D=bd == d, CAUSAL=causal, IEEE=False,
                    BLOCK_M=128, BLOCK_N=64, CU_Q=None, CU_K=None)  # dense calls pass None
        tensors = {n: h for n in ("Q", "K", "V", "Out")} | {"LSE2": "*fp32"}
        consts = dict(meta, USE_DESC=use_desc)
        if use_desc:
            tensors |= {"desc_k": f"tensordesc<fp16[64, {d}]>",
                        "desc_v": f"tensordesc<fp16[64, {d}]>"}
        else:
            consts |= {"desc_k": None, "desc_v": None}
        _report(f"fwd  d={d:3d} causal={int(causal)} desc={int(use_desc)}",
                _compile(fwd.fwd_kernel, tensors, consts, 8, 3), dump)
        if use_desc:
            continue
        tensors = {n: h for n in ("Q", "K", "V", "Out", "DO", "DQ", "DK", "DV")}
        tensors |= {"LSE2": "*fp32", "DELTA": "*fp32"}
        _report(f"dq   d={d:3d} causal={int(causal)}       ",
                _compile(bwd.bwd_dq_kernel, tensors, dict(meta), 8, 3), dump)
        dkdv = dict(meta, BLOCK_M=64, BLOCK_N=128, DQ_ACC=None, DQ_DESC=None, ATOMIC_DQ=False)
        _report(f"dkdv d={d:3d} causal={int(causal)}       ",
                _compile(bwd.bwd_dkdv_kernel, tensors, dkdv, 8, 3), dump)
        if atomic:  # the atomic-dQ variant (element-wise adds): compiles, and its hash
            consts = {key: val for key, val in dkdv.items() if key != "DQ_ACC"}
            consts["ATOMIC_DQ"] = True
            _report(f"dkdv atomic d={d:3d} causal={int(causal)}",
                    _compile(bwd.bwd_dkdv_kernel, tensors | {"DQ_ACC": "*fp32"}, consts, 8, 2),
                    dump)
        if varlen:  # packed sequences (cu_seqlens): pointer loads, two-kernel backward
            cu = {"CU_Q": "*i32", "CU_K": "*i32"}
            vmeta = {key: val for key, val in meta.items() if key not in cu} | {"VARLEN": True}
            fwd_t = {n: h for n in ("Q", "K", "V", "Out")} | {"LSE2": "*fp32"} | cu
            _report(f"fwd  varlen d={d:3d} causal={int(causal)}",
                    _compile(fwd.fwd_kernel, fwd_t, dict(vmeta, USE_DESC=False, desc_k=None,
                                                         desc_v=None), 8, 3), dump)
            _report(f"dq   varlen d={d:3d} causal={int(causal)}",
                    _compile(bwd.bwd_dq_kernel, tensors | cu, dict(vmeta), 8, 3), dump)
            _report(f"dkdv varlen d={d:3d} causal={int(causal)}",
                    _compile(bwd.bwd_dkdv_kernel, tensors | cu,
                             dict(vmeta, BLOCK_M=64, BLOCK_N=128, DQ_ACC=None, DQ_DESC=None,
                                  ATOMIC_DQ=False), 8, 3), dump)


def _sm90_variants(dump: str | None) -> None:
    """The Gluon forward at its default schedules (d = 128: two consumer warpgroups; d = 64:
    three), fp16 and bf16, with and without the causal mask."""
    try:
        from triton.experimental.gluon._runtime import GluonASTSource

        from attnmem.kernels.flash import fwd_sm90 as k90
    except Exception as e:  # a Triton without Gluon's Hopper API
        print(f"sm90 skipped: {type(e).__name__}: {e}")
        return
    gl = k90.gl
    for d, dtype, causal in itertools.product((64, 128), ("fp16", "bf16"), (False, True)):
        nc, st = k90.default_schedule(d, 1 << 20, 1 << 20, causal)
        bn = k90.TILES[d][0]
        gdt = {"fp16": gl.float16, "bf16": gl.bfloat16}[dtype]
        lay_m = gl.NVMMASharedLayout.get_default_for([1, 1, k90.HALF_M, d], gdt)
        lay_n = gl.NVMMASharedLayout.get_default_for([1, 1, bn, d], gdt)
        desc_m = f"tensordesc<{dtype}[1, 1, {k90.HALF_M}, {d}],{lay_m!r}>"
        desc_n = f"tensordesc<{dtype}[1, 1, {bn}, {d}],{lay_n!r}>"
        fn = k90.attn_fwd_sm90_kernel
        tensors = {"q_desc": desc_m, "k_desc": desc_n, "v_desc": desc_n, "o_desc": desc_m,
                   "LSE2": "*fp32"}
        # what the host passes: the schedule as constexprs; a PERSISTENT/PINGPONG switch (where
        # the kernel has one) off and the batch-head count BH as 1, specialised away
        given = {"CAUSAL": causal, "STAGES": st, "num_warps": k90.NUM_WARPS, "CONSUMERS": nc,
                 "PINGPONG": False, "PERSISTENT": False, "BH": 1}
        consts = {**_defaults(fn), **{k: v for k, v in given.items() if k in fn.arg_names}}
        src = GluonASTSource(fn, _signature(fn, tensors, consts), constexprs=consts)
        ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": k90.NUM_WARPS})
        _report(f"sm90 d={d:3d} {dtype} causal={int(causal)} consumers={nc} stages={st}", ck,
                dump)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--atomic", action="store_true", help="also the atomic-dQ dK/dV variants")
    ap.add_argument("--varlen", action="store_true",
                    help="also the packed-sequence (cu_seqlens) variants")
    ap.add_argument("--no-sm90", action="store_true", help="skip the Gluon Hopper forward")
    ap.add_argument("--dump", help="write each variant's PTX into this folder")
    args = ap.parse_args(argv)
    print(f"triton {triton.__version__}")
    _triton_variants(args.atomic, args.dump, args.varlen)
    if not args.no_sm90:
        _sm90_variants(args.dump)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
