"""Measure ring attention on c GPUs for real: every rank's peak, the call's time, the longest fit.

    torchrun --nproc-per-node C -m attnmem.measure.ring.multi --out DIR [--quick] [--find-longest]
    python -m attnmem.measure.ring.multi --nproc-per-node C --out DIR ...   (checks, then the same)

One process per GPU (NCCL, with ``NCCL_NVLS_ENABLE=0`` set before it starts; gloo on CPU, where
our kernel runs under ``TRITON_INTERPRET=1``, for tests). Two implementations side by side:

- ``triton``: ours, ``attnmem.kernels.ring.ring_attention`` (point-to-point ring over our kernel,
  zigzag shards);
- ``sdpa_flash`` (``--torch-backends`` adds ``sdpa_efficient``, ``sdpa_cudnn``): PyTorch's
  ``torch.distributed.tensor.experimental.context_parallel`` around
  ``F.scaled_dot_product_attention(is_causal=True)`` under ``sdpa_kernel(<backend>)``, with
  its defaults (all-gather rotation, head-tail load balancing: rank r holds chunks r and
  2c-1-r, as ours). Each rank passes its local shard itself; the context's only buffer is a
  2c-long dummy that switches its load balancer on, so no rank ever holds the full sequence.
  Where it does not import or cannot run (no CUDA) its rows are ``unavailable`` with the
  reason.

Per shape (bf16, B = 1, H = H_kv = 32, d = 128, causal; s = 16k, 64k, 128k; --quick: 16k) and
pass (forward under no_grad; forward + backward, dO allocated before), on every rank, as
``measure_one_rank`` does one rank: a warm-up call, caches emptied, then one call between
``memory_allocated()`` before and ``max_memory_allocated()`` after: the extra peak, against
``attnmem.calc.context_parallel_peak_bytes(impl, ..., world_size=c, rank=r)`` (error_pct); then
``--repeats`` calls (default 3), each after a barrier and between two CUDA events: call_ms,
the median. Rank 0 also times the one-GPU call on the whole sequence (our ``flash_attention``
for triton, SDPA for torch's), and ``scaling_efficiency = one_gpu_ms / (c * call_ms)``.
Rank 0 gathers every rank's row and writes ``DIR/ring_multi_h200.csv`` (``FIELDS``).

``--find-longest``: per implementation and pass, the longest s (a multiple of 2c*128) whose
call runs: doubling from 16k until an attempt runs out of memory, then bisecting between the
last that ran and the first that did not; every attempt is one call on fresh inputs, its
status agreed over the ranks (all-reduce). ``DIR/ring_longest_h200.csv`` (``LONGEST_FIELDS``)
holds each result, the attempts, and calc's prediction for the memory the allocator could
reach when the search began (``attnmem.calc.max_context_parallel_attention_seq_len`` with that
budget). Our ring survives an OOM on one rank: the communicator (``DrainingRing``) counts the
sends and receives a rank has started, and a rank whose call failed frees its tensors and
completes the rest of the ring's sequence with scratch buffers, so the others finish their
call and nothing waits forever. torch's context_parallel cannot be drained that way (its
collectives are inside torch), so its search runs only with ``--find-longest-torch``: an
out-of-memory on some ranks and not others then leaves the rest in a collective until the
process group's timeout (``--collective-timeout``) ends the run (rows written so far stay).

Bad arguments are refused with a message naming the value and what is accepted.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from attnmem.measure import torchrun

FIELDS = ["gpu", "torch", "triton", "timestamp", "impl", "dtype", "batch", "heads", "kv_heads",
          "head_dim", "seq_len", "world_size", "rank", "local_seq_len", "causal", "pass",
          "status", "message", "peak_bytes", "reserved_bytes", "predicted_bytes", "error_pct",
          "call_ms", "one_gpu_ms", "scaling_efficiency", "kv_bytes_per_step",
          "dkv_bytes_per_step"]
LONGEST_FIELDS = ["gpu", "torch", "timestamp", "impl", "dtype", "batch", "heads", "kv_heads",
                  "head_dim", "world_size", "pass", "longest_seq_len", "first_failed_seq_len",
                  "predicted_longest_seq_len", "budget_bytes", "attempts", "message"]
SEQ_LENS = (16384, 65536, 131072)
TORCH_IMPLS = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
SDPA_BACKEND = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_efficient": "EFFICIENT_ATTENTION",
                "sdpa_cudnn": "CUDNN_ATTENTION"}
#: Granularity of the longest-context search: multiples of 2c x this.
SEARCH_UNIT = 128


class Refusal(ValueError):
    """Bad arguments: the message names the value and what is accepted."""


# ---- pure helpers ---------------------------------------------------------------------------

def ring_sequence(world_size: int, backward: bool) -> list[tuple[str, str]]:
    """(phase, kind) of every ``start`` a rank of attnmem/kernels/ring/ring.py issues in one call, in
    order: c-1 key/value hops forward; backward, per step t, the next key/value hop (t < c-1)
    and then this step's dK, dV hop (c of them)."""
    c = world_size
    seq = [("fwd", "kv")] * (c - 1)
    if backward:
        for t in range(c):
            if t + 1 < c:
                seq.append(("bwd", "kv"))
            seq.append(("bwd", "dkv"))
    return seq


def search_longest(runs: Callable[[int], bool], start: int, unit: int, limit: int
                   ) -> tuple[int, int | None, list[tuple[int, bool]]]:
    """Longest multiple of ``unit`` in [unit, limit] for which ``runs`` is true, assuming it
    is true below some length and false above: double from ``start`` until it fails, then
    bisect. Returns (longest that ran or 0, first that failed or None, attempts in order)."""
    if unit < 1 or limit < unit:
        raise ValueError(f"search needs 1 <= unit <= limit, got unit={unit}, limit={limit}")
    attempts: list[tuple[int, bool]] = []

    def trial(s: int) -> bool:
        ok = bool(runs(s))
        attempts.append((s, ok))
        return ok

    s = max(unit, (min(start, limit) // unit) * unit)
    good, bad = 0, None
    while True:
        if trial(s):
            good = s
            if s >= limit:
                return good, bad, attempts
            s = min(limit // unit * unit, 2 * s)
        else:
            bad = s
            break
    lo, hi = good // unit, bad // unit  # lo runs (0: nothing yet), hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if trial(mid * unit):
            lo = mid
        else:
            hi = mid
    return lo * unit, hi * unit, attempts


# ---- the communicator that survives an OOM ----------------------------------------------------

def _p2p_ring_class() -> type:
    from attnmem.kernels.ring.ring import P2PRing

    class DrainingRing(P2PRing):
        """attnmem.kernels.ring's P2PRing that records what it started, so that a rank whose call
        failed can complete the ring's sequence (``drain``) and its neighbours finish."""

        def __init__(self, group: Any = None):
            super().__init__(group)
            self.issued = 0
            self.pending: list[Any] = []

        def start(self, tensors, kind):
            handle = super().start(tensors, kind)
            self.issued += 1
            self.pending.append(handle)
            return handle

        def wait(self, handle):
            out = super().wait(handle)
            self.pending = [h for h in self.pending if h is not handle]
            return out

        def drain(self, backward: bool, kv_like: Any) -> None:
            """Wait for what is in flight, then start and wait for the rest of the call's
            sequence with scratch buffers shaped like one key (or value) block."""
            import torch

            for h in list(self.pending):
                super().wait(h)
            self.pending = []
            for _phase, kind in ring_sequence(self.size, backward)[self.issued:]:
                dtype = torch.float32 if kind == "dkv" else kv_like.dtype
                pair = tuple(torch.zeros(kv_like.shape, dtype=dtype, device=kv_like.device)
                             for _ in range(2))
                super().wait(super().start(pair, kind))
                self.issued += 1

    return DrainingRing


# ---- one call on every rank -------------------------------------------------------------------

class Ctx:
    """What every attempt needs: torch, the rank, the device, the shape."""

    def __init__(self, torch: Any, rank: int, world: int, dev: str, B: int, H: int, H_kv: int,
                 d: int, dtype: Any):
        self.torch, self.rank, self.world, self.dev = torch, rank, world, dev
        self.B, self.H, self.H_kv, self.d, self.dtype = B, H, H_kv, d, dtype
        self.cuda = dev == "cuda"
        self._mesh = None

    def mesh(self) -> Any:
        """The 1-D device mesh of all ranks (made once: each makes process groups)."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.dev, (self.world,))
        return self._mesh

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def clean(self) -> None:
        import gc

        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()

    def is_oom(self, exc: BaseException) -> bool:
        from attnmem.measure.harness import is_oom

        return is_oom(exc)


def _torch_cp_reason(ctx: Ctx, impl: str) -> str | None:
    """Why torch's context_parallel cannot run here, or None."""
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
    except ImportError as exc:
        return f"torch {ctx.torch.__version__} has no context_parallel ({exc})"
    if not ctx.cuda:
        return ("torch's context_parallel replaces the CUDA SDPA kernels (flash, efficient, "
                "cuDNN) only; the CPU's SDPA has no ring")
    from torch.nn.attention import SDPBackend

    if getattr(SDPBackend, SDPA_BACKEND[impl], None) is None:
        return f"torch {ctx.torch.__version__} has no SDPBackend.{SDPA_BACKEND[impl]}"
    if ctx.H_kv != ctx.H:
        return "torch's ring runs equal query and key/value heads only (--kv-heads = --heads)"
    return None


class Caller:
    """One implementation's call on this rank's local shard of s tokens."""

    def __init__(self, ctx: Ctx, impl: str, s: int, backward: bool):
        self.ctx, self.impl, self.s, self.backward = ctx, impl, s, backward
        self.comm = None
        self.mesh = ctx.mesh() if impl != "triton" else None

    def inputs(self) -> tuple[Any, ...]:
        t, c = self.ctx.torch, self.ctx
        m = self.s // c.world
        kw = dict(device=c.dev, dtype=c.dtype)
        q = t.randn(c.B, c.H, m, c.d, **kw)
        k = t.randn(c.B, c.H_kv, m, c.d, **kw)
        v = t.randn(c.B, c.H_kv, m, c.d, **kw)
        do = t.randn(c.B, c.H, m, c.d, **kw) if self.backward else None
        if self.backward:
            for x in (q, k, v):
                x.requires_grad_(True)
        return q, k, v, do

    def call(self, q, k, v, do) -> None:
        t = self.ctx.torch
        if self.impl == "triton":
            from attnmem.kernels.ring import ring_attention_with

            self.comm = _p2p_ring_class()(None)
            fn = lambda: ring_attention_with(self.comm, q, k, v, True)  # noqa: E731
        else:
            import torch.nn.functional as F
            from torch.distributed.tensor.experimental import context_parallel
            from torch.nn.attention import SDPBackend, sdpa_kernel

            backend = getattr(SDPBackend, SDPA_BACKEND[self.impl])
            dummy = t.zeros(1, 1, 2 * self.ctx.world, dtype=t.int8, device=self.ctx.dev)

            def fn():
                with context_parallel(self.mesh, buffers=[dummy], buffer_seq_dims=[2],
                                      no_restore_buffers={dummy}), sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    if self.backward:
                        o.backward(do)
                    return o
        if self.backward:
            o = fn()
            if self.impl == "triton":
                o.backward(do)
            del o
            q.grad = k.grad = v.grad = None
        else:
            with t.no_grad():
                o = fn()
            del o

    def drain(self) -> None:
        """Complete this call's ring on this rank (ours only; torch's cannot be)."""
        if self.impl != "triton":
            return
        c = self.ctx
        if self.comm is None:  # failed before the call began: the whole sequence is left
            self.comm = _p2p_ring_class()(None)
        kv_like = c.torch.empty(c.B, c.H_kv, self.s // c.world, c.d, dtype=c.dtype,
                                device=c.dev)
        self.comm.drain(self.backward, kv_like)


def one_gpu_ms(ctx: Ctx, impl: str, s: int, backward: bool, repeats: int) -> float | None:
    """Rank 0: the same call on the whole sequence on one device (ours: flash_attention;
    torch's: SDPA under that backend); None if it does not fit."""
    t = ctx.torch
    x = None
    try:
        kw = dict(device=ctx.dev, dtype=ctx.dtype)
        q = t.randn(ctx.B, ctx.H, s, ctx.d, **kw)
        k = t.randn(ctx.B, ctx.H_kv, s, ctx.d, **kw)
        v = t.randn(ctx.B, ctx.H_kv, s, ctx.d, **kw)
        do = t.randn(ctx.B, ctx.H, s, ctx.d, **kw) if backward else None
        x = [q, k, v, do]
        if backward:
            for y in (q, k, v):
                y.requires_grad_(True)
        if impl == "triton":
            from attnmem.kernels.flash.api import flash_attention

            def fn():
                return flash_attention(q, k, v, causal=True)
            ctxm = contextlib.nullcontext
        else:
            import torch.nn.functional as F
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def fn():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def ctxm():
                return sdpa_kernel(getattr(SDPBackend, SDPA_BACKEND[impl]))

        def once():
            with ctxm():
                if backward:
                    fn().backward(do)
                    q.grad = k.grad = v.grad = None
                else:
                    with t.no_grad():
                        fn()

        once()
        return statistics.median(_timed(ctx, once) for _ in range(repeats))
    except Exception as exc:  # noqa: BLE001 - no one-GPU time is a result, not a failure
        if not ctx.is_oom(exc):
            print(f"one-GPU {impl} s={s}: {type(exc).__name__}: {str(exc)[:200]}",
                  file=sys.stderr)
        return None
    finally:
        x = None  # noqa: F841
        ctx.clean()


def _timed(ctx: Ctx, fn: Callable[[], Any]) -> float:
    if ctx.cuda:
        t = ctx.torch
        a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        t.cuda.synchronize()
        return a.elapsed_time(b)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def attempt(ctx: Ctx, caller: Caller, measure: bool, repeats: int) -> dict[str, Any]:
    """One call (``measure``: a warm-up call, the measured call, ``repeats`` timed calls) on
    every rank. After each call the ranks agree on its status (an all-reduce, which also lines
    them up for the next); a rank whose call failed first drains the ring so that the others
    can finish theirs. The first failure ends the attempt on every rank. Never raises for
    OOM."""
    t = ctx.torch
    out: dict[str, Any] = {}
    held: dict[str, Any] = {}

    def first() -> None:
        caller.comm = None
        held["x"] = list(caller.inputs())
        caller.call(*held["x"])
        ctx.sync()

    def measured() -> None:
        ctx.clean()
        if ctx.cuda:
            t.cuda.reset_peak_memory_stats()
        before = t.cuda.memory_allocated() if ctx.cuda else 0
        caller.call(*held["x"])
        ctx.sync()
        if ctx.cuda:
            out["peak_bytes"] = t.cuda.max_memory_allocated() - before
            out["reserved_bytes"] = t.cuda.max_memory_reserved()

    times: list[float] = []

    def timed() -> None:
        times.append(_timed(ctx, lambda: caller.call(*held["x"])))

    plan = [first] + ([measured] + [timed] * repeats if measure else [])
    status, message = "ok", ""
    for fn in plan:
        err, oom = None, False
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - recorded; the ring is drained below
            oom = ctx.is_oom(exc)
            err = f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}"
            del exc
        if err is not None:
            held.clear()
            ctx.clean()
            try:
                caller.drain()
            except Exception as exc:  # noqa: BLE001 - the run cannot continue
                raise RuntimeError(f"rank {ctx.rank}: could not complete the ring after "
                                   f"{err}: {exc}") from None
        worst = _agree(ctx, 0 if err is None else (1 if oom else 2))
        if worst:
            status = ("ok", "oom", "error")[worst]
            message = err or "another rank failed"
            break
    held.clear()
    ctx.clean()
    if status == "ok" and times:
        out["call_ms"] = round(statistics.median(times), 4)
    out["status"], out["message"] = status, message
    return out


def _agree(ctx: Ctx, code: int) -> int:
    """The worst status code over the ranks (0 ok, 1 out of memory, 2 another error)."""
    import torch.distributed as dist

    x = ctx.torch.tensor([code], device=ctx.dev)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return int(x.item())


# ---- the run ----------------------------------------------------------------------------------

def _pred(impl, B, H, s, d, c, H_kv, backward, rank, dtype) -> tuple[int | None, str]:
    from attnmem.calc.context_parallel import context_parallel_peak_bytes

    try:
        return context_parallel_peak_bytes(impl, B, H, s, d, dtype, causal=True,
                                           backward=backward, world_size=c, kv_heads=H_kv,
                                           rank=rank), ""
    except ValueError as exc:
        return None, f"no prediction: {exc}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node C -m attnmem.measure.ring.multi",
        description="Ring attention on c GPUs: per-rank peak against calc, call time and "
                    "scaling against one GPU, and (--find-longest) the longest context.")
    ap.add_argument("--out", required=True, help="folder for the CSV files")
    ap.add_argument("--quick", action="store_true", help="16k tokens only")
    ap.add_argument("--seq-lens", type=int, nargs="*", default=None)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                    help="fp32: CPU tests (Triton's interpreter has no bf16)")
    ap.add_argument("--impls", nargs="*", default=["triton", "sdpa_flash"],
                    help=f"implementations (triton, {', '.join(TORCH_IMPLS)})")
    ap.add_argument("--passes", nargs="*", default=["fwd", "fwd+bwd"], help="fwd, fwd+bwd")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls (median)")
    ap.add_argument("--find-longest", action="store_true",
                    help="search the longest context of our ring (doubling, then bisecting)")
    ap.add_argument("--find-longest-torch", action="store_true",
                    help="also search torch's context_parallel (an asymmetric OOM ends the run "
                         "at --collective-timeout)")
    ap.add_argument("--search-start", type=int, default=16384)
    ap.add_argument("--search-limit", type=int, default=1 << 23,
                    help="longest length tried (tokens)")
    ap.add_argument("--search-unit", type=int, default=SEARCH_UNIT,
                    help="lengths tried are multiples of 2c x this")
    ap.add_argument("--collective-timeout", type=float, default=900.0)
    ap.add_argument("--nproc-per-node", type=int, default=None, metavar="C",
                    help="outside torchrun: check the arguments, then start C processes")
    return ap


def check_args(args: argparse.Namespace, world: int) -> None:
    """Refusal naming the bad value and what is accepted."""
    if world < 2:
        raise Refusal(f"world size {world}: a ring needs at least 2 processes (torchrun "
                      "--nproc-per-node C, C >= 2); one rank is attnmem.measure.ring.one_rank")
    bad = [i for i in args.impls if i not in ("triton", *TORCH_IMPLS)]
    if bad or not args.impls:
        raise Refusal(f"unknown implementation(s) {', '.join(bad) or '(none)'}; accepted: "
                      f"triton, {', '.join(TORCH_IMPLS)}")
    bad = [p for p in args.passes if p not in ("fwd", "fwd+bwd")]
    if bad or not args.passes:
        raise Refusal(f"unknown pass(es) {', '.join(bad) or '(none)'}; accepted: fwd, fwd+bwd")
    kv = args.kv_heads if args.kv_heads is not None else args.heads
    for name, v in (("--heads", args.heads), ("--head-dim", args.head_dim),
                    ("--batch", args.batch), ("--kv-heads", kv), ("--repeats", args.repeats),
                    ("--search-unit", args.search_unit)):
        if v < 1:
            raise Refusal(f"{name} must be >= 1, got {v}")
    if args.heads % kv:
        raise Refusal(f"--heads {args.heads} must be a multiple of --kv-heads {kv} (GQA)")
    for s in args.seq_lens or ():
        if s < 2 * world or s % (2 * world):
            raise Refusal(f"--seq-lens {s}: causal zigzag shards need a multiple of 2c = "
                          f"{2 * world}; accepted: {2 * world}, {4 * world}, ...")
    if args.collective_timeout <= 0:
        raise Refusal(f"--collective-timeout must be > 0, got {args.collective_timeout}")


def _write(path: str, fields: list[str], rows: list[dict[str, Any]], header: bool) -> None:
    with open(path, "w" if header else "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if header:
            w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def _mib(x: Any) -> str:
    return f"{x / 2**20:11.1f}" if isinstance(x, int) else f"{'':>11}"


def run(args: argparse.Namespace, rank: int, world: int, local: int) -> int:
    import torch
    import torch.distributed as dist

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = ""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    H_kv = args.kv_heads if args.kv_heads is not None else args.heads
    ctx = Ctx(torch, rank, world, dev, args.batch, args.heads, H_kv, args.head_dim, dtype)
    c = world
    meta = dict(gpu=torch.cuda.get_device_name(local) if ctx.cuda else "cpu",
                torch=torch.__version__, triton=triton_version,
                timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"))
    seq_lens = args.seq_lens or ((16384,) if args.quick else SEQ_LENS)
    path = os.path.join(args.out, "ring_multi_h200.csv")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        _write(path, FIELDS, [], header=True)
        print(f"{'impl':>14} {'s':>7} {'c':>2} {'pass':>7} {'max MiB':>11} {'pred MiB':>11} "
              f"{'worst err%':>10} {'call ms':>9} {'1-GPU ms':>9} {'eff':>5}  status",
              flush=True)
    n_ok = n_all = 0
    for impl in args.impls:
        reason = _torch_cp_reason(ctx, impl) if impl != "triton" else None
        for s in seq_lens:
            for pname in args.passes:
                backward = pname == "fwd+bwd"
                m = s // c
                row: dict[str, Any] = dict(
                    meta, impl=impl, dtype=args.dtype, batch=args.batch, heads=args.heads,
                    kv_heads=H_kv, head_dim=args.head_dim, seq_len=s, world_size=c, rank=rank,
                    local_seq_len=m, causal=True, **{"pass": pname},
                    kv_bytes_per_step=2 * args.batch * H_kv * m * args.head_dim * dtype.itemsize,
                    dkv_bytes_per_step=(2 * args.batch * H_kv * m * args.head_dim * 4
                                        if backward else 0))
                pred, why = _pred(impl, args.batch, args.heads, s, args.head_dim, c, H_kv,
                                  backward, rank, args.dtype)
                row["predicted_bytes"] = pred
                if reason:
                    row.update(status="unavailable", message=reason)
                else:
                    res = attempt(ctx, Caller(ctx, impl, s, backward), True, args.repeats)
                    row.update(res)
                    if why:
                        row["message"] = "; ".join(x for x in (row.get("message"), why) if x)
                    if row["status"] == "ok" and pred and row.get("peak_bytes"):
                        row["error_pct"] = round(100.0 * (pred - row["peak_bytes"])
                                                 / row["peak_bytes"], 4)
                    one = (one_gpu_ms(ctx, impl, s, backward, args.repeats) if rank == 0
                           else None)
                    box = [one]
                    dist.broadcast_object_list(box, src=0)
                    if box[0] is not None:
                        row["one_gpu_ms"] = round(box[0], 4)
                        if row.get("call_ms"):
                            row["scaling_efficiency"] = round(box[0] / (c * row["call_ms"]), 4)
                rows: list[Any] = [None] * world
                dist.all_gather_object(rows, row)
                if rank == 0:
                    _write(path, FIELDS, rows, header=False)
                    n_all += len(rows)
                    n_ok += sum(r["status"] == "ok" for r in rows)
                    errs = [abs(r["error_pct"]) for r in rows if r.get("error_pct") is not None]
                    peaks = [r["peak_bytes"] for r in rows if r.get("peak_bytes")]
                    r0 = rows[0]
                    print(f"{impl:>14} {s:>7} {c:>2} {pname:>7} "
                          f"{_mib(max(peaks) if peaks else None)} {_mib(r0['predicted_bytes'])} "
                          f"{(max(errs) if errs else ''):>10} {r0.get('call_ms') or '':>9} "
                          f"{r0.get('one_gpu_ms') or '':>9} "
                          f"{r0.get('scaling_efficiency') or '':>5}  {r0['status']} "
                          f"{(r0.get('message') or '')[:100]}", flush=True)
    if args.find_longest or args.find_longest_torch:
        find_longest(args, ctx, meta)
    if rank == 0:
        print(f"{n_ok} of {n_all} rank rows ok; wrote {path}")
    return 0


def find_longest(args: argparse.Namespace, ctx: Ctx, meta: dict[str, Any]) -> None:
    import torch.distributed as dist

    from attnmem.calc.context_parallel import max_context_parallel_attention_seq_len

    t, c = ctx.torch, ctx.world
    path = os.path.join(args.out, "ring_longest_h200.csv")
    if ctx.rank == 0:
        _write(path, LONGEST_FIELDS, [], header=True)
    impls = [i for i in args.impls if i == "triton" or args.find_longest_torch]
    unit = 2 * c * args.search_unit
    for impl in impls:
        reason = _torch_cp_reason(ctx, impl) if impl != "triton" else None
        for pname in args.passes:
            backward = pname == "fwd+bwd"
            ctx.clean()
            budget = None
            if ctx.cuda:  # what the allocator can still reach on this GPU
                free, _total = t.cuda.mem_get_info()
                budget = int(free + t.cuda.memory_reserved() - t.cuda.memory_allocated())
            row = dict(meta, impl=impl, dtype=args.dtype, batch=args.batch, heads=args.heads,
                       kv_heads=ctx.H_kv, head_dim=args.head_dim, world_size=c,
                       **{"pass": pname}, budget_bytes=budget)
            if reason:
                row["message"] = reason
            else:
                def runs(s: int, backward=backward, impl=impl) -> bool:
                    res = attempt(ctx, Caller(ctx, impl, s, backward), False, 1)
                    if res["status"] == "error":
                        raise RuntimeError(f"s={s}: {res['message']}")
                    return res["status"] == "ok"

                try:
                    good, bad, tries = search_longest(runs, args.search_start, unit,
                                                      args.search_limit)
                    row.update(longest_seq_len=good, first_failed_seq_len=bad,
                               attempts=" ".join(f"{s}:{'ok' if ok else 'oom'}"
                                                 for s, ok in tries))
                except RuntimeError as exc:
                    row["message"] = str(exc)[:300]
                if budget is not None:
                    # the smallest budget over the ranks is what every GPU must have
                    b = t.tensor([budget], device=ctx.dev)
                    dist.all_reduce(b, op=dist.ReduceOp.MIN)
                    row["budget_bytes"] = int(b.item())
                    try:
                        row["predicted_longest_seq_len"] = max_context_parallel_attention_seq_len(
                            impl, row["budget_bytes"], args.batch, args.heads, args.head_dim,
                            args.dtype, True, backward, c, ctx.H_kv)
                    except ValueError as exc:
                        row["message"] = f"no prediction: {exc}"
            if ctx.rank == 0:
                _write(path, LONGEST_FIELDS, [row], header=False)
                print(f"longest {impl} c={c} {pname}: {row.get('longest_seq_len')} "
                      f"(first failed {row.get('first_failed_seq_len')}, calc "
                      f"{row.get('predicted_longest_seq_len')}) {row.get('message') or ''}",
                      flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    env = torchrun.ranks()
    if env is None:
        return torchrun.start_ranks(
            argv, args.nproc_per_node, "attnmem.measure.ring.multi",
            lambda n: check_args(args, n),
            "`torchrun --nproc-per-node C -m attnmem.measure.ring.multi --out DIR` or "
            "`python -m attnmem.measure.ring.multi --nproc-per-node C --out DIR`, C >= 2")
    rank, world, local = env
    try:
        check_args(args, world)
    except Refusal as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch.distributed as dist

    try:
        torchrun.init_process_group(args.collective_timeout, local)
    except ValueError as exc:
        print(f"error (rank {rank}): {exc}", file=sys.stderr)
        return 2
    try:
        return run(args, rank, world, local)
    except KeyboardInterrupt:
        return 130
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


if __name__ == "__main__":
    torchrun.exit_rank(main())

