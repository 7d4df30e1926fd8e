"""Compile the split-KV decode kernel (attnmem/kernels/flash/decode.py) for sm_90 on the CPU
and print registers, spilled bytes, shared memory and the global load instructions per
setting: ``python -m attnmem.kernels.dev.compile_decode``. Strides and pointers carry the
divisibility-by-16 attributes the JIT gives a contiguous cache; the head-dim strides are 1.
Each setting is compiled as the split kernel of a split plan (PARTIAL), with the fused
combine where `attnmem.calc.decode_split.fused_combine` gives it to the tile and, for
those, again without (the second-kernel design) beside it; the last column counts the
synchronisation in the PTX (the counter's atomic, barriers, L1-bypassing loads)."""

from __future__ import annotations

import collections
import re

#: (dtype, d, BLOCK_M, BLOCK_N, warps, stages): the decode plan's tiles at d = 64-256
SETTINGS = [("bf16", 128, 16, 128, 4, 3), ("bf16", 128, 16, 64, 4, 3), ("bf16", 128, 128, 128, 8, 3),
            ("fp16", 64, 32, 128, 4, 3), ("bf16", 80, 64, 128, 4, 3), ("bf16", 256, 64, 64, 8, 2)]


def compile_split(dt: str, d: int, bm: int, bn: int, warps: int, stages: int,
                  fused: bool | None = None):
    """The compiled split kernel; ``fused`` None: as the plan's rule would launch it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnmem.kernels.flash import decode as dk

    sig = {"Q": f"*{dt}", "K": f"*{dt}", "V": f"*{dt}", "Out": f"*{dt}", "O_PART": "*fp32",
           "LSE_PART": "*fp32", "COUNTERS": "*i32", "KV_LENS": "constexpr"}
    for n in ("q", "k", "v", "o"):
        for x in ("b", "h", "m" if n in "qo" else "n", "d"):
            sig[f"stride_{n}{x}"] = "constexpr" if x == "d" else "i32"
    for n in ("H", "H_kv", "GROUP", "s_q", "kv_len_all", "s_cache", "split_len", "n_splits"):
        sig[n] = "i32"
    sig["qk_scale"] = "fp32"
    from attnmem.calc.decode_split import fused_combine

    bd = 1 << (d - 1).bit_length()
    if fused is None:
        fused = fused_combine(2, bm, d)
    consts = dict(HEAD_DIM=d, BLOCK_D=bd, EVEN_D=bd == d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=True,
                  PER_SEQ=False, PARTIAL=True, FUSED=fused,
                  COMBINE_S=dk._combine_step(bm, bd, warps), IEEE=False, KV_LENS=None,
                  stride_qd=1, stride_kd=1, stride_vd=1, stride_od=1)
    sig.update({k: "constexpr" for k in consts})
    aligned = ("Q", "K", "V", "Out", "O_PART", "LSE_PART", "COUNTERS") + tuple(
        k for k, t in sig.items() if k.startswith("stride_") and t == "i32")
    names = list(sig)  # the kernel's parameters in order: attrs are keyed by (index,)
    src = ASTSource(dk.decode_split_kernel, sig, constexprs=consts,
                    attrs={(names.index(k),): [["tt.divisibility", 16]] for k in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def main() -> None:
    from attnmem.calc.decode_split import fused_combine
    from attnmem.kernels.dev.compile_sm90 import _ptxas_usage

    for s in SETTINGS:
        for fused in (True, False) if fused_combine(2, s[2], s[1]) else (False,):
            ck = compile_split(*s, fused=fused)
            ptx = ck.asm["ptx"]
            loads = collections.Counter(re.findall(r"\b(ld\.global[.\w]*|cp\.async[.\w]*)",
                                                   ptx))
            sync = collections.Counter(re.findall(
                r"\b(atom\.[.\w]*|bar\.sync|ld\.global\.cg[.\w]*)", ptx))
            print(s, "fused" if fused else "kernel combine", "regs, spilled bytes:",
                  _ptxas_usage(ptx), "shared:", ck.metadata.shared,
                  "loads:", dict(loads.most_common(4)), "sync:", dict(sync))

if __name__ == "__main__":
    main()
