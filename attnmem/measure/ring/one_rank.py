"""Measure one rank of ring attention on one GPU: its peak memory and the time of a ring step.

    python -m attnmem.measure.ring.one_rank --out DIR [--quick]

No process group and no second GPU: rank r of a c-rank ring runs its real local work, with
the key/value blocks it would receive copied into freshly allocated receive buffers, as the
real ring allocates them (attnmem/measure/ring/simulate.py). All ranks' key/value blocks exist before
the call (they are inputs, as the other GPUs' memory would be), so what is measured is what
rank r allocates: the same tensors as in a real ring, NCCL's own buffers aside.

For each shape (bf16, B = 1, H = 32, d = 128, causal with zigzag sharding; total lengths of
16k, 64k and 128k tokens; c = 2, 4, 8; ranks 0 and c-1, the two ends of the schedule) and
each pass (forward under no_grad; forward + backward with dO allocated before), the peak
extra memory is measured as the project measures every call (attnmem/measure/harness.py:
max_memory_allocated during the call minus memory_allocated just before, after a warm-up,
caches emptied) and compared with attnmem.calc.context_parallel_peak_bytes for that rank. Each ring
step's local work is timed with CUDA events (median of the steps past the first over three
calls), next to the bytes that a real ring would send per step, so that the link bandwidth
that hides the communication behind the step can be read off.

Writes DIR/ring_one_rank_h200.csv (one row per shape, rank and pass; the app reads it as
data/ring_one_rank_h200.csv) and prints predicted against measured with the error. About a
minute on one H200 (compiles included); --quick runs the 16k shapes only.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import statistics
import sys
import time

FIELDS = ["gpu", "torch", "triton", "timestamp", "impl", "dtype", "batch", "heads", "kv_heads",
          "head_dim", "seq_len", "world_size", "rank", "local_seq_len", "causal", "pass",
          "status", "peak_bytes", "reserved_bytes", "predicted_bytes", "error_pct", "call_ms",
          "step0_ms", "fwd_step_ms", "bwd_step_ms", "kv_bytes_per_step", "dkv_bytes_per_step"]

SEQ_LENS = (16384, 65536, 131072)
WORLD_SIZES = (2, 4, 8)


def _run_one(torch, B, H, H_kv, s, d, c, rank, causal, backward, repeats=3) -> dict:
    from attnmem.calc.context_parallel import context_parallel_peak_bytes
    from attnmem.kernels.ring import ring_attention_with
    from attnmem.measure.ring.simulate import SimulatedRing

    dtype = torch.bfloat16
    dev = "cuda"
    m = s // c
    row = dict(impl="triton", dtype="bf16", batch=B, heads=H, kv_heads=H_kv, head_dim=d,
               seq_len=s, world_size=c, rank=rank, local_seq_len=m, causal=causal,
               **{"pass": "fwd+bwd" if backward else "fwd"})
    row["predicted_bytes"] = context_parallel_peak_bytes(
        "triton", B, H, s, d, "bf16", causal=causal, backward=backward, world_size=c,
        kv_heads=H_kv, rank=rank)
    row["kv_bytes_per_step"] = 2 * B * H_kv * m * d * 2
    row["dkv_bytes_per_step"] = 2 * B * H_kv * m * d * 4 if backward else 0
    blocks = q = k = v = do = None
    try:
        # every rank's key/value block (zigzag shards; their values matter for neither memory
        # nor time): allocated before the call, like the other GPUs' memory
        blocks = []
        for _ in range(c):
            kj = torch.randn(B, H_kv, m, d, device=dev, dtype=dtype)
            vj = torch.randn(B, H_kv, m, d, device=dev, dtype=dtype)
            blocks.append((kj, vj))
        del kj, vj
        q = torch.randn(B, H, m, d, device=dev, dtype=dtype)
        k, v = blocks[rank][0].clone(), blocks[rank][1].clone()
        do = torch.randn(B, H, m, d, device=dev, dtype=dtype) if backward else None
        if backward:
            for t in (q, k, v):
                t.requires_grad_(True)

        def call(comm):
            if backward:
                o = ring_attention_with(comm, q, k, v, causal)
                o.backward(do)
                del o
                q.grad = k.grad = v.grad = None
            else:
                with torch.no_grad():
                    o = ring_attention_with(comm, q, k, v, causal)
                del o

        call(SimulatedRing(rank, c, blocks))  # warm-up: compile, tune
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        call(SimulatedRing(rank, c, blocks))
        torch.cuda.synchronize()
        row["peak_bytes"] = torch.cuda.max_memory_allocated() - before
        row["reserved_bytes"] = torch.cuda.max_memory_reserved()
        calls, fwd_steps, bwd_steps, step0 = [], [], [], []
        for _ in range(repeats):
            comm = SimulatedRing(rank, c, blocks, timing=True)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(comm)
            end.record()
            torch.cuda.synchronize()
            calls.append(start.elapsed_time(end))
            for (phase, t), ms in comm.step_ms().items():
                if t == 0:
                    if phase == "fwd":
                        step0.append(ms)
                elif phase == "fwd":
                    fwd_steps.append(ms)
                else:
                    bwd_steps.append(ms)
        row["call_ms"] = round(statistics.median(calls), 4)
        row["step0_ms"] = round(statistics.median(step0), 4) if step0 else ""
        row["fwd_step_ms"] = round(statistics.median(fwd_steps), 4) if fwd_steps else ""
        row["bwd_step_ms"] = round(statistics.median(bwd_steps), 4) if bwd_steps else ""
        row["status"] = "ok"
        row["error_pct"] = round(100.0 * (row["predicted_bytes"] - row["peak_bytes"])
                                 / row["peak_bytes"], 4)
    except torch.cuda.OutOfMemoryError:
        row["status"] = "oom"
    except Exception as err:  # recorded, not fatal: the other shapes still run
        row["status"] = f"error: {type(err).__name__}: {str(err)[:200]}"
    finally:
        blocks = q = k = v = do = None
        torch.cuda.empty_cache()
    return row


def _mib(x) -> str:
    return f"{x / 2**20:13.1f}" if isinstance(x, int) else f"{'':>13}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for ring_one_rank_h200.csv")
    ap.add_argument("--quick", action="store_true", help="16k tokens only")
    ap.add_argument("--seq-lens", type=int, nargs="*", default=None)
    ap.add_argument("--world-sizes", type=int, nargs="*", default=None)
    ap.add_argument("--kv-heads", type=int, default=32)
    args = ap.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        print("needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    seq_lens = args.seq_lens or ((16384,) if args.quick else SEQ_LENS)
    worlds = args.world_sizes or WORLD_SIZES
    B, H, d = 1, 32, 128
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__,
                timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    path = os.path.join(args.out, "ring_one_rank_h200.csv")
    rows = []
    t0 = time.time()
    print(f"{'s':>7} {'c':>2} {'r':>2} {'pass':>7} {'measured MiB':>13} {'predicted MiB':>14} "
          f"{'error %':>8} {'call ms':>9} {'fwd step':>9} {'bwd step':>9}  status")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for s in seq_lens:
            for c in worlds:
                for backward in (False, True):
                    for rank in sorted({0, c - 1}):
                        row = {**meta, **_run_one(torch, B, H, args.kv_heads, s, d, c, rank,
                                                  True, backward)}
                        rows.append(row)
                        w.writerow({k: row.get(k, "") for k in FIELDS})
                        f.flush()
                        print(f"{s:>7} {c:>2} {rank:>2} {row['pass']:>7} "
                              f"{_mib(row.get('peak_bytes'))} {_mib(row['predicted_bytes'])} "
                              f"{row.get('error_pct', ''):>8} {row.get('call_ms', ''):>9} "
                              f"{row.get('fwd_step_ms', ''):>9} {row.get('bwd_step_ms', ''):>9}"
                              f"  {row['status']}", flush=True)
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        worst = max(ok, key=lambda r: abs(r["error_pct"]))
        print(f"\n{len(ok)} of {len(rows)} ok; largest |error| {abs(worst['error_pct']):.4f}% "
              f"(s={worst['seq_len']}, c={worst['world_size']}, rank {worst['rank']}, "
              f"{worst['pass']}); {time.time() - t0:.0f} s; wrote {path}")
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
