"""The extra peak of one packed call of our kernel measured in a fresh child process: calc's
procedure (attnmem.calc.peak, module docstring) starts from an emptied caching allocator with q, k, v
and dO allocated first. In a pytest process, earlier tests leave segments that the inputs and
the call's tensors are carved from; the free blocks they leave change how the allocator splits
and so what max_memory_allocated reports (seen on the H200: a packed call measured at the
plain sum of its tensors where a fresh process matched calc's replay to the byte)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import gc, json, sys
import torch
from attnmem.kernels import flash_attention
from attnmem.kernels.flash import bwd_sm90

lens, H, H_kv, d, backward = json.loads(sys.argv[1])
T = sum(lens)
starts = [0]
for n in lens:
    starts.append(starts[-1] + n)
cu = torch.tensor(starts, dtype=torch.int32, device="cuda")
q, k, v, do = (torch.randn(1, n, T, d, device="cuda", dtype=torch.bfloat16)
               for n in (H, H_kv, H_kv, H))
hopper = []
real = bwd_sm90.attention_backward_sm90_packed

def counted(*a, **kw):
    hopper.append(1)
    return real(*a, **kw)

bwd_sm90.attention_backward_sm90_packed = counted

def call():
    if backward:
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        flash_attention(*leaves, causal=True, cu_seqlens=cu).backward(do)
        return leaves
    with torch.no_grad():
        return flash_attention(q, k, v, causal=True, cu_seqlens=cu)

held = call()  # compile, tune
del held
gc.collect()
torch.cuda.synchronize()
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
before = torch.cuda.memory_allocated()
cached = torch.cuda.memory_reserved() - before
held = call()
torch.cuda.synchronize()
measured = torch.cuda.max_memory_allocated() - before
print("PEAK " + json.dumps({"measured": measured, "cached_free": cached,
                            "hopper_backward": bool(hopper)}))
"""


def packed_peak(lens: list[int], H: int, H_kv: int, d: int, backward: bool) -> dict:
    """{"measured": extra peak bytes, "cached_free": free bytes the cache held before the
    measured call, "hopper_backward": whether the Hopper packed backward ran} of
    ``flash_attention(q, k, v, causal=True, cu_seqlens=...)`` (bf16, q and dO (1, H, T, d),
    k and v (1, H_kv, T, d)), measured in a child process."""
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps([lens, H, H_kv, d, backward])],
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                         text=True, timeout=600)
    for line in res.stdout.splitlines():
        if line.startswith("PEAK "):
            return json.loads(line[5:])
    raise AssertionError(f"the peak child failed (rc {res.returncode}):\n{res.stderr[-3000:]}")
