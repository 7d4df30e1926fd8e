# Measured: spills (local loads/stores) inside each loop of a kernel's SASS (no GPU).
"""The loops of a compiled kernel's machine code (SASS) and what each one holds.

ptxas reports a kernel's spilled bytes as one number; where the local loads and stores sit
decides what they cost. One outside the loops costs once per program, one inside a loop over
query blocks costs every step. This module disassembles a cubin with the ``cuobjdump`` that
ships with Triton, finds the loops by their backward branches, and counts per innermost loop
its instructions, warpgroup MMAs (HGMMA), local loads (LDL), local stores (STL) and
special-function instructions (MUFU: exp2 and the like). No GPU is needed. It found that the
Gluon backward's MHA loops held 7-15 local loads per step that the byte count did not show
(attnmem/kernels/flash/NOTES.md, "where the backward's time goes (ncu)").
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(0x[0-9a-f]+)")


@dataclass(frozen=True)
class Loop:
    """One loop of the SASS: byte offsets of its first instruction and of its backward branch,
    and counts over the instructions between them (both included)."""

    start: int
    end: int
    instructions: int
    hgmma: int
    local_loads: int
    local_stores: int
    mufu: int = 0  # special-function unit instructions (MUFU.EX2, ...)


def sass(cubin: bytes) -> str:
    """The SASS text of a cubin, from Triton's bundled ``cuobjdump -sass``."""
    from triton import knobs

    tool = knobs.nvidia.cuobjdump
    path = getattr(tool, "path", tool)
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "k.cubin")
        with open(f, "wb") as out:
            out.write(cubin)
        done = subprocess.run([path, "-sass", f], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {done.stderr.strip()[:500]}")
    return done.stdout


def opcode(instruction: str) -> str:
    """The opcode of one SASS instruction without its predicate and modifiers ("LDL" of
    "@!P0 LDL.LU R4, [R1+0x8]")."""
    parts = instruction.split()
    if parts and parts[0].startswith("@"):
        parts = parts[1:]
    return parts[0].split(".")[0] if parts else ""


def instructions(text: str) -> list[tuple[int, str]]:
    """(byte offset, instruction) for every instruction of a SASS listing, in order."""
    return [(int(m.group(1), 16), m.group(2)) for m in map(_INSTR.search, text.splitlines()) if m]


def loops(text: str) -> list[Loop]:
    """The innermost loops of a SASS listing that contain a warpgroup MMA.

    A loop is a branch to an earlier offset, up to the kernel's last EXIT: the branches placed
    after it are the out-of-line retry paths of barrier waits, which jump back into the body
    without forming a loop. Innermost: no other such loop lies inside it."""
    ins = instructions(text)
    exits = [a for a, t in ins if opcode(t) == "EXIT"]
    last_exit = max(exits) if exits else max((a for a, _ in ins), default=0)
    spans = []
    for a, t in ins:
        m = _BRANCH.search(t)
        if m and a < last_exit and int(m.group(1), 16) < a:
            spans.append((int(m.group(1), 16), a))
    spans = sorted(set(spans))
    inner = [s for s in spans
             if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    out = []
    for lo, hi in inner:
        ops = [opcode(t) for a, t in ins if lo <= a <= hi]
        if "HGMMA" in ops:
            out.append(Loop(lo, hi, len(ops), ops.count("HGMMA"), ops.count("LDL"),
                            ops.count("STL"), ops.count("MUFU")))
    return out
