"""Trace fingerprint: which GPU kernels one attention call launches, and what they cost.

For one configuration, ``fingerprint(cfg)`` runs the call once to warm up, then once under
``torch.profiler`` (CPU + CUDA activities), exports the Kineto trace and reads its GPU events:
kernels (``cat == 'kernel'``), copies (``gpu_memcpy``) and fills (``gpu_memset``). One row per
distinct kernel name: how many launches, total GPU microseconds, share of the call's GPU time,
and the bytes that copies/fills moved (the trace's ``args.bytes``). One summary row
(``kernel == '(all)'``) per call.

What it shows (see attnmem/measure/NOTES.md): the eager path's separate matmul, scale, fill,
softmax and matmul kernels (``masked_fill`` launches one more elementwise kernel than
``masked_fill_`` -- the out-of-place copy); the math backend's fp32 casts (``to``/copy kernels
around its matmuls); the fused backends' single forward kernel.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
from collections import defaultdict
from typing import Any

from attnmem.measure import registry
from attnmem.measure.harness import PointConfig

TRACE_COLUMNS = ("impl", "mode", "seq_len", "batch", "heads", "kv_heads", "head_dim", "dtype",
                 "causal", "kernel", "category", "count", "gpu_us", "share", "bytes", "status",
                 "message")
MAX_NAME = 160


def _short_name(name: str) -> str:
    name = " ".join(name.split())
    return name if len(name) <= MAX_NAME else name[: MAX_NAME - 1] + "…"


def summarise(events: list[dict[str, Any]], base: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows (one per kernel name, then '(all)') from Kineto trace events of one call."""
    agg: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: {"count": 0, "us": 0.0, "bytes": 0})
    cats = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    for ev in events:
        cat = cats.get(str(ev.get("cat", "")).lower())
        if cat is None or ev.get("ph") != "X":
            continue
        key = (_short_name(str(ev.get("name", "?"))), cat)
        a = agg[key]
        a["count"] += 1
        a["us"] += float(ev.get("dur", 0.0))
        a["bytes"] += int((ev.get("args") or {}).get("bytes", 0) or 0)
    total_us = sum(a["us"] for a in agg.values()) or 1.0
    rows = []
    for (name, cat), a in sorted(agg.items(), key=lambda kv: -kv[1]["us"]):
        rows.append({**base, "kernel": name, "category": cat, "count": int(a["count"]),
                     "gpu_us": round(a["us"], 2), "share": round(a["us"] / total_us, 4),
                     "bytes": int(a["bytes"]), "status": "ok", "message": ""})
    rows.append({**base, "kernel": "(all)", "category": "total",
                 "count": int(sum(a["count"] for a in agg.values())),
                 "gpu_us": round(sum(a["us"] for a in agg.values()), 2), "share": 1.0,
                 "bytes": int(sum(a["bytes"] for a in agg.values())), "status": "ok",
                 "message": ""})
    return rows


def fingerprint(cfg: PointConfig) -> list[dict[str, Any]]:
    """Profile one call of cfg on the GPU; rows as described in the module docstring."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    base = {"impl": cfg.impl, "mode": cfg.mode, "seq_len": cfg.seq_len, "batch": cfg.batch,
            "heads": cfg.heads, "kv_heads": cfg.h_kv, "head_dim": cfg.head_dim,
            "dtype": cfg.dtype, "causal": bool(cfg.causal)}
    dtype = registry.canonical_dtype(cfg.dtype)
    ok, why = registry.available(cfg.impl, dtype, cfg.head_dim, causal=cfg.causal,
                                 backward=cfg.backward, heads=cfg.heads, kv_heads=cfg.h_kv)
    if not ok:
        return [{**base, "kernel": "", "category": "", "count": 0, "gpu_us": 0.0, "share": 0.0,
                 "bytes": 0, "status": "unavailable", "message": why}]
    fn = registry.get(cfg.impl, dtype=dtype, head_dim=cfg.head_dim, causal=cfg.causal,
                      backward=cfg.backward, gqa=cfg.h_kv != cfg.heads).fn
    tdt = registry.torch_dtype(dtype)
    b, h, hkv, s, d = cfg.batch, cfg.heads, cfg.h_kv, cfg.seq_len, cfg.head_dim
    t = {  # fresh random inputs; the call reads them from here so that clearing frees them
        "q": torch.randn(b, h, s, d, device="cuda", dtype=tdt, requires_grad=cfg.backward),
        "k": torch.randn(b, hkv, s, d, device="cuda", dtype=tdt, requires_grad=cfg.backward),
        "v": torch.randn(b, hkv, s, d, device="cuda", dtype=tdt, requires_grad=cfg.backward),
        "do": torch.randn(b, h, s, d, device="cuda", dtype=tdt),
    }

    def call() -> None:
        if cfg.backward:
            fn(t["q"], t["k"], t["v"], bool(cfg.causal), None).backward(t["do"])
            for name in ("q", "k", "v"):
                t[name].grad = None
        else:
            with torch.no_grad():
                fn(t["q"], t["k"], t["v"], bool(cfg.causal), None)

    call()  # warm-up: compilation and autotuning stay out of the trace
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh).get("traceEvents", [])
    finally:
        os.unlink(path)
    t.clear()
    gc.collect()
    torch.cuda.empty_cache()
    return summarise(events, base)
