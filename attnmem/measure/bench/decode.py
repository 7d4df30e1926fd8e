"""``python -m attnmem.measure.bench --preset decode --out DIR``: decode against a KV cache.

Each shape is a serving step: B sequences, each with ``new`` new queries (1: a decode step;
8: speculative decoding or a short prefill chunk) against a cache of ``cache`` valid keys,
Llama-3-8B's heads (H = 32, H_kv = 8, d = 128), bf16; causal bottom-right (query i of ``new``
sees keys 0 .. cache - new + i). Implementations, all on the same inputs in one process:

- ``triton``: our split-KV path (`attnmem.kernels.flash.decode.decode_attention`) on the
  cache as transformers stores it, (B, H_kv, S, d);
- ``sdpa_flash``, ``sdpa_efficient``: SDPA under ``sdpa_kernel(backend)`` with
  ``enable_gqa=True``; at new > 1 the bottom-right mask is
  ``torch.nn.attention.bias.causal_lower_right`` (which these two kernels take without a
  materialised mask);
- ``sdpa_cudnn``, ``sdpa_math``: the same, at new > 1 with a materialised boolean mask
  (1, 1, new, S) built before the timing (math only where its fp32 scores B·H·new·S stay
  under 1 GiB);
- ``fa4``: ``flash_attn.cute.flash_attn_func`` on (B, S, H_kv, d) copies of the cache (its
  layout), causal (FA's bottom-right alignment), asked for automatic split-KV
  (``num_splits=0``) and, where that keyword is refused, with its defaults (the row's note
  says which); 'unavailable' where flash_attn.cute does not import.

A backend that refuses a shape gets its reason as the status, no time. Every output is
checked against an fp32 reference on the valid keys (relative L2 error <= 2e-2) before it
gets a time. Times: ``triton.testing.do_bench`` medians (warm-up 10 ms, 40 ms of repeats),
``--rounds`` interleaved rounds (each implementation in turn, per round), median of the
rounds. The table gives each peer's µs, the fastest peer, and ``fastest / ours`` (above 1:
ours is faster); the summary the median and the worst of that ratio, and our bandwidth
(bytes a call must move: q, the valid K and V, O, and our partials; over the time) against
the H100 SXM's 3.35 TB/s.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import os
import statistics
import sys
from dataclasses import asdict, dataclass

__all__ = ["DECODE_SHAPES", "DecodeRow", "DecodeShape", "bytes_moved", "run_decode",
           "summary", "table"]

PEERS = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math", "fa4")
IMPLS = ("triton", *PEERS)
REL_ERR_MAX = 2e-2
#: H100 SXM HBM3 bandwidth (NVIDIA H100 datasheet: 3.35 TB/s); a copy reaches about 3.0.
H100_BYTES_PER_S = 3.35e12
MATH_MAX_SCORE_BYTES = 1 << 30


@dataclass(frozen=True)
class DecodeShape:
    batch: int
    cache: int  # valid keys per sequence
    new: int  # new queries per sequence
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    dtype: str = "bf16"

    def label(self) -> str:
        return f"B={self.batch} cache={self.cache} new={self.new}"


#: B 1-64 x cache 1k-128k x 1 and 8 new queries, without the calls whose cache passes 2M
#: tokens (8 GiB of K and V: B = 64 stops at 32k, B = 16 at 128k) so the run stays short.
DECODE_SHAPES: tuple[DecodeShape, ...] = tuple(
    DecodeShape(b, c, n) for b in (1, 4, 16, 64) for c in (1024, 8192, 32768, 131072)
    for n in (1, 8) if b * c <= 2 * 1024 * 1024)


@dataclass
class DecodeRow:
    impl: str
    batch: int
    cache: int
    new: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    us: float
    rel_err: float
    status: str
    bytes_moved: int
    note: str
    gpu: str
    torch_version: str
    triton_version: str
    fa4_version: str
    timestamp: str


def bytes_moved(sh: DecodeShape) -> int:
    """What one call of ours must move through HBM at least: q and O (B·H·new·d·e each), the
    valid K and V (2·B·H_kv·cache·d·e), and with S > 1 chunks the fp32 partials written and
    read back (2·B·H·new·S·(d + 1)·4; attnmem.calc.decode_split.decode_plan)."""
    from attnmem.calc.decode_split import decode_plan

    e = 2 if sh.dtype in ("bf16", "fp16") else 4
    rows = sh.batch * sh.heads * sh.new
    plan = decode_plan(sh.batch, sh.heads, sh.kv_heads, sh.new, sh.cache, sh.head_dim)
    part = 2 * rows * plan.splits * (sh.head_dim + 1) * 4 if plan.partial else 0
    return 2 * rows * sh.head_dim * e + 2 * sh.batch * sh.kv_heads * sh.cache * sh.head_dim * e \
        + part


def _reference(q, k, v, causal: bool):
    """fp32 attention over every key of k, v (the valid ones), bottom-right causal; one
    sequence at a time, GQA by grouping the query heads (no K/V copy per query head)."""
    import torch

    B, H, n, d = q.shape
    H_kv, S = k.shape[1], k.shape[2]
    G = H // H_kv
    out = torch.empty(B, H, n, d, dtype=torch.float32, device=q.device)
    for b in range(B):
        qb = q[b].float().reshape(H_kv, G * n, d)
        s = qb @ k[b].float().transpose(-1, -2) / math.sqrt(d)  # (H_kv, G·n, S)
        if causal and n > 1:
            i = torch.arange(n, device=q.device).repeat(G)[:, None]
            j = torch.arange(S, device=q.device)[None, :]
            s = s.masked_fill(j > S - n + i, float("-inf"))
        out[b] = (torch.softmax(s, -1) @ v[b].float()).reshape(H, n, d)
    return out


class _FA4:
    """FlashAttention-4 with automatic split-KV where the installed version takes it."""

    def __init__(self):
        from attnmem.measure import registry

        self.fn = registry._fa4_func()  # ImportError: 'unavailable'
        self.kwargs: dict | None = None
        self.note = ""

    def __call__(self, q, k, v, causal):
        if self.kwargs is not None:
            res = self.fn(q, k, v, causal=causal, **self.kwargs)
        else:
            try:
                res = self.fn(q, k, v, causal=causal, num_splits=0)
                self.kwargs, self.note = {"num_splits": 0}, "fa4 num_splits=0 (automatic)"
            except (TypeError, ValueError, AssertionError, RuntimeError) as exc:
                res = self.fn(q, k, v, causal=causal)
                self.kwargs = {}
                self.note = f"fa4 defaults (num_splits=0 refused: {str(exc)[:60]})"
        return res[0] if isinstance(res, tuple) else res


def _callables(sh: DecodeShape, q, k, v, fa4_state: dict):
    """impl -> (call(), note) on this shape's tensors, or impl -> status string."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    from attnmem.kernels.flash.decode import decode_attention

    n, S = sh.new, sh.cache
    causal = n > 1
    out: dict = {"triton": (lambda: decode_attention(q, k, v, None, causal=True), "")}
    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
                "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_math": SDPBackend.MATH}
    dense_mask = None
    if causal:
        dense_mask = torch.ones(n, S, dtype=torch.bool, device=q.device).tril(S - n)[None, None]
    for name, backend in backends.items():
        if name == "sdpa_math" and sh.batch * sh.heads * n * S * 4 > MATH_MAX_SCORE_BYTES:
            out[name] = "skipped: fp32 scores over 1 GiB"
            continue
        if not causal:
            mask, how = None, ""
        elif name in ("sdpa_flash", "sdpa_efficient"):
            mask, how = causal_lower_right(n, S), "causal_lower_right"
        else:
            mask, how = dense_mask, "bool mask (1, 1, new, S)"

        def call(backend=backend, mask=mask):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

        out[name] = (call, how)
    if "fa4" not in fa4_state:
        try:
            fa4_state["fa4"] = _FA4()
        except ImportError as exc:
            fa4_state["fa4"] = f"unavailable: {exc}"
    fa4 = fa4_state["fa4"]
    if isinstance(fa4, str):
        out["fa4"] = fa4
    else:
        qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # (B, s, H, d)
        out["fa4"] = (lambda: fa4(qb, kb, vb, True).transpose(1, 2), "")
    return out


def _time(call, ref) -> tuple[float, float, str]:
    """(µs, rel err, status) of one round."""
    import torch
    from triton.testing import do_bench

    try:
        with torch.no_grad():
            got = call()
            rel = float((got.float() - ref).norm() / ref.norm())
            if not rel <= REL_ERR_MAX:
                return math.nan, rel, f"wrong: rel err {rel:.2g}"
            ms = do_bench(call, warmup=10, rep=40, return_mode="median")
        return ms * 1e3, rel, "ok"
    except torch.OutOfMemoryError:
        return math.nan, math.nan, "oom"
    except (RuntimeError, ValueError, AssertionError, TypeError) as exc:
        msg = (str(exc).splitlines() or [type(exc).__name__])[0][:100]
        return math.nan, math.nan, f"unsupported: {msg}"


def run_decode(out_dir: str, rounds: int = 3, shapes=DECODE_SHAPES,
               log=print) -> list[DecodeRow]:
    """Time every implementation on every shape (interleaved rounds, median), writing
    ``decode.csv`` under ``out_dir`` as rows come; returns the rows."""
    import torch
    import triton

    from attnmem.measure import registry

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "decode.csv")
    stamp = dict(gpu=torch.cuda.get_device_name(), torch_version=torch.__version__,
                 triton_version=triton.__version__, fa4_version=registry.fa4_version(),
                 timestamp=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    rows: list[DecodeRow] = []
    fa4_state: dict = {}
    with open(path, "w", newline="") as sink:
        writer = csv.DictWriter(sink, fieldnames=list(DecodeRow.__dataclass_fields__))
        writer.writeheader()
        for sh in shapes:
            dtype = registry.torch_dtype(sh.dtype)
            g = torch.Generator(device="cuda").manual_seed(sh.batch * 7919 + sh.cache + sh.new)
            q = torch.randn(sh.batch, sh.heads, sh.new, sh.head_dim, device="cuda", dtype=dtype,
                            generator=g)
            k, v = (torch.randn(sh.batch, sh.kv_heads, sh.cache, sh.head_dim, device="cuda",
                                dtype=dtype, generator=g) for _ in range(2))
            ref = _reference(q, k, v, True)
            calls = _callables(sh, q, k, v, fa4_state)
            got: dict[str, list] = {name: [] for name in IMPLS}
            for _ in range(rounds):
                for name in IMPLS:
                    c = calls[name]
                    got[name].append((math.nan, math.nan, c) if isinstance(c, str)
                                     else _time(c[0], ref))
            moved = bytes_moved(sh)
            for name in IMPLS:
                res = got[name]
                bad = next((r for r in res if r[2] != "ok"), None)
                us = math.nan if bad else statistics.median(r[0] for r in res)
                rel = max((r[1] for r in res if not math.isnan(r[1])), default=math.nan)
                note = "" if isinstance(calls[name], str) else calls[name][1]
                if name == "fa4" and not isinstance(fa4_state.get("fa4"), str):
                    note = fa4_state["fa4"].note
                rows.append(DecodeRow(name, sh.batch, sh.cache, sh.new, sh.heads, sh.kv_heads,
                                      sh.head_dim, sh.dtype, us, rel,
                                      bad[2] if bad else "ok", moved, note, **stamp))
                writer.writerow(asdict(rows[-1]))
                sink.flush()
                log(f"{name:15s} {sh.label():28s} {us:10.1f} us  {rows[-1].status}")
            del q, k, v, ref, calls
            torch.cuda.empty_cache()
    return rows


def _ratios(rows: list[DecodeRow]) -> dict[tuple, tuple[float, str]]:
    """(batch, cache, new) -> (fastest peer's time / ours, fastest peer)."""
    by: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.status == "ok":
            by.setdefault((r.batch, r.cache, r.new), {})[r.impl] = r.us
    out = {}
    for key, t in by.items():
        peers = {p: x for p, x in t.items() if p != "triton"}
        if "triton" in t and peers:
            best = min(peers, key=peers.get)
            out[key] = (peers[best] / t["triton"], best)
    return out


def table(rows: list[DecodeRow]) -> str:
    """Markdown: µs per implementation, the fastest peer, fastest / ours, ours in TB/s."""
    ratio = _ratios(rows)
    keys = sorted({(r.batch, r.cache, r.new) for r in rows})
    by = {(r.impl, r.batch, r.cache, r.new): r for r in rows}
    head = ["B", "cache", "new", *IMPLS, "fastest peer", "fastest/ours", "ours TB/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key in keys:
        cells = [str(x) for x in key]
        for name in IMPLS:
            r = by.get((name, *key))
            cells.append("-" if r is None else f"{r.us:.1f}" if r.status == "ok"
                         else r.status.split(":")[0])
        x, best = ratio.get(key, (math.nan, "-"))
        ours = by.get(("triton", *key))
        tbs = ours.bytes_moved / (ours.us * 1e-6) / 1e12 if ours and ours.status == "ok" \
            else math.nan
        cells += [best, "-" if math.isnan(x) else f"{x:.2f}",
                  "-" if math.isnan(tbs) else f"{tbs:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[DecodeRow]) -> str:
    ratio = _ratios(rows)
    if not ratio:
        return "no shape has both our time and a peer's"
    xs = sorted(x for x, _ in ratio.values())
    worst = min(ratio, key=lambda k: ratio[k][0])
    notes = sorted({r.note for r in rows if r.impl == "fa4" and r.note})
    return (f"fastest peer / ours over {len(xs)} shapes: median {statistics.median(xs):.2f}, "
            f"worst {xs[0]:.2f} (B={worst[0]} cache={worst[1]} new={worst[2]}, against "
            f"{ratio[worst][1]}), {sum(x >= 1.0 for x in xs)} of {len(xs)} >= 1.00 "
            f"(target: median >= 1.00)" + (f"; {'; '.join(notes)}" if notes else "")
            + f"; bandwidth against the H100 SXM's {H100_BYTES_PER_S / 1e12:.2f} TB/s")


def main(out_dir: str, rounds: int) -> int:
    import torch

    if not torch.cuda.is_available():
        print("--preset decode needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = run_decode(out_dir, rounds)
    text = table(rows) + "\n\n" + summary(rows)
    with open(os.path.join(out_dir, "decode.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text)
    return 0
