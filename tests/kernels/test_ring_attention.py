"""Ring attention (attnmem.kernels.ring) against single-device attention, on CPU processes.

The ring runs in 2 and 3 processes (torch.multiprocessing, forked, gloo, a FileStore in a
temporary folder) with our Triton kernel under Triton's CPU interpreter: TRITON_INTERPRET=1
must be set before triton is first imported, so the distributed runs happen in a child
process started from this file as a script (with that variable set), one for both world
sizes; its forked ranks inherit it. Nothing in the pytest process switches to interpreter
mode. Each rank compares its output rows and ALL its gradients (dq of its queries, dk and dv of its key block, the
contributions of every rank summed) with the eager fp32 reference on the full sequence,
sharded the same way; the parent checks every rank's report. The one-device simulator
(attnmem.measure.ring.simulate) is checked in the same child: each simulated rank's output and dq
must equal the reference's rows.

Tiny shapes (B = 1, H = 2, s = 48, d = 16) keep the interpreter quick.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

B, H, S, D = 1, 2, 48, 16
# (causal, kv_heads) cases per world size
CASES = {2: [(True, 2), (False, 1)], 3: [(True, 1), (False, 2)]}
TOL = 2e-4


def _inputs(causal: bool, kv_heads: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g)
    k = torch.randn(B, kv_heads, S, D, generator=g)
    v = torch.randn(B, kv_heads, S, D, generator=g)
    do = torch.randn(B, H, S, D, generator=g)
    return q, k, v, do


def _reference(q, k, v, do, causal):
    from attnmem.kernels.flash.reference import attention_reference

    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o = attention_reference(q, k, v, causal)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


def _quick() -> None:
    """In the interpreter child and its ranks: tests/_interp.py's cheaper interpreter."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _interp import quick_interpreter

    quick_interpreter()


def _worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    _quick()

    from attnmem.kernels import ring_attention
    from attnmem.kernels.ring import shard

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world)
    report = []
    try:
        for i, (causal, kv_heads) in enumerate(CASES[world]):
            q, k, v, do = _inputs(causal, kv_heads, 100 + i)
            ref = _reference(q, k, v, do, causal)
            ql, kl, vl = (shard(t, rank, world, causal).requires_grad_() for t in (q, k, v))
            o = ring_attention(ql, kl, vl, causal=causal)
            o.backward(shard(do, rank, world, causal))
            got = (o.detach(), ql.grad, kl.grad, vl.grad)
            errs = {name: (g - shard(r, rank, world, causal)).abs().max().item()
                    for name, g, r in zip(("o", "dq", "dk", "dv"), got, ref, strict=True)}
            report.append({"causal": causal, "kv_heads": kv_heads, "errors": errs})
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def _simulated(world: int) -> list[dict]:
    """Every rank of the ring simulated in this one process: output and dq rows."""
    from attnmem.kernels.ring import ring_attention_with, shard
    from attnmem.measure.ring.simulate import SimulatedRing

    report = []
    for i, (causal, kv_heads) in enumerate(CASES[world]):
        q, k, v, do = _inputs(causal, kv_heads, 200 + i)
        ref_o, ref_dq, _, _ = _reference(q, k, v, do, causal)
        blocks = [(shard(k, r, world, causal), shard(v, r, world, causal))
                  for r in range(world)]
        for r in range(world):
            ql = shard(q, r, world, causal).requires_grad_()
            o = ring_attention_with(SimulatedRing(r, world, blocks), ql, *blocks[r], causal)
            o.backward(shard(do, r, world, causal))
            report.append({"rank": r, "causal": causal, "errors": {
                "o": (o.detach() - shard(ref_o, r, world, causal)).abs().max().item(),
                "dq": (ql.grad - shard(ref_dq, r, world, causal)).abs().max().item()}})
    return report


def _main(worlds: list[int], out_dir: str) -> None:
    """Every world size in this one process: the simulator, then the ranks. The ranks are
    forked from it, so they start with torch, triton and the kernels already imported (spawned
    ranks would each import them again: most of this file's CPU time)."""
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    _quick()
    for world in worlds:
        out = os.path.join(out_dir, str(world))
        os.makedirs(out)
        sim = _simulated(world)
        with open(os.path.join(out, "simulated.json"), "w") as f:
            json.dump(sim, f)
        mp.start_processes(_worker, args=(world, os.path.join(out, "store"), out),
                           nprocs=world, join=True, start_method="fork")


@pytest.fixture(scope="module")
def ring_reports() -> dict[int, tuple[list[dict], list[list[dict]]]]:
    """World sizes 2 and 3 in one child process: {world: (simulated rows, each rank's report)}."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.run([sys.executable, os.path.abspath(__file__),
                               ",".join(map(str, CASES)), tmp],
                              env=env, cwd=root, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        out = {}
        for world in CASES:
            d = os.path.join(tmp, str(world))
            out[world] = (json.load(open(os.path.join(d, "simulated.json"))),
                          [json.load(open(os.path.join(d, f"rank{r}.json")))
                           for r in range(world)])
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_ring_matches_single_device(ring_reports, world: int) -> None:
    sim, reports = ring_reports[world]
    assert len(sim) == world * len(CASES[world])
    for row in sim:
        assert max(row["errors"].values()) < TOL, row
    for rank, report in enumerate(reports):
        assert len(report) == len(CASES[world])
        for case in report:
            assert set(case["errors"]) == {"o", "dq", "dk", "dv"}
            assert max(case["errors"].values()) < TOL, (rank, case)


# ---- in-process: sharding and the step schedule (no kernel runs) ------------------------------

def test_zigzag_shard_roundtrip_and_layout() -> None:
    from attnmem.kernels.ring import shard, unshard, zigzag_shard

    x = torch.arange(24.0).view(1, 1, 24, 1)
    shards = [zigzag_shard(x, r, 3) for r in range(3)]
    # 6 chunks of 4: rank 0 holds chunks 0 and 5, rank 1 chunks 1 and 4, rank 2 chunks 2 and 3
    assert shards[0].flatten().tolist() == [0, 1, 2, 3, 20, 21, 22, 23]
    assert shards[2].flatten().tolist() == [8, 9, 10, 11, 12, 13, 14, 15]
    assert torch.equal(unshard(shards, causal=True), x)
    plain = [shard(x, r, 4, causal=False) for r in range(4)]
    assert torch.equal(unshard(plain, causal=False), x)


@pytest.mark.parametrize("bad", [(25, 3, True), (26, 4, False), (24, 0, True)])
def test_shard_rejects_bad_splits(bad) -> None:
    from attnmem.kernels.ring import shard

    s, c, causal = bad
    with pytest.raises(ValueError, match="seq_len|world_size"):
        shard(torch.zeros(1, 1, s, 1), 0, c, causal)


@pytest.mark.parametrize("c", [2, 3, 4, 8])
def test_zigzag_schedule_covers_the_causal_mask_once(c: int) -> None:
    """Every (query chunk, key chunk) pair below the diagonal is computed exactly once over
    all ranks and steps, the diagonal ones with the causal mask; every step past the first
    does the same work."""
    from attnmem.kernels.ring import step_kind

    seen: dict[tuple[int, int], str] = {}
    for r in range(c):
        qchunks = (r, 2 * c - 1 - r)
        for t in range(c):
            j = (r - t) % c
            kchunks = (j, 2 * c - 1 - j)
            kind = step_kind(r, c, t, True)
            pairs = {"causal": [(qchunks[0], kchunks[0]), (qchunks[1], kchunks[0]),
                                (qchunks[1], kchunks[1])],
                     "kv_half": [(qi, kchunks[0]) for qi in qchunks],
                     "q_half": [(qchunks[1], kj) for kj in kchunks]}[kind]
            assert len(pairs) == (3 if kind == "causal" else 2)
            for p in pairs:
                assert p not in seen
                seen[p] = "diag" if p[0] == p[1] else "full"
    want = {(i, j): ("diag" if i == j else "full") for i in range(2 * c) for j in range(i + 1)}
    assert seen == want


def test_local_shapes_are_checked() -> None:
    from attnmem.kernels.ring import ring_attention_with

    class Two:
        rank, size = 0, 2

    q = torch.zeros(1, 2, 9, 16)
    with pytest.raises(ValueError, match="odd"):
        ring_attention_with(Two(), q, q[:, :1], q[:, :1], causal=True)
    with pytest.raises(ValueError, match="GQA"):
        ring_attention_with(Two(), torch.zeros(1, 3, 8, 16), *(torch.zeros(1, 2, 8, 16),) * 2)


# ---- in-process: what one rank allocates, against calc's replay -------------------------------
# The kernel is replaced by stand-ins that allocate what attnmem/kernels/flash/fwd.py and bwd.py
# allocate (O and lse2; delta, dk, dv, the GQA split's partial sums and dq or the atomic-dQ
# buffer, as attnmem.calc.dispatch decides: the rules the kernel calls), so that the ring's own
# tensors are checked here on CPU; the kernel's are checked against H200 measurements by
# tests/calc/test_attention_peak.py, and the whole rank by attnmem.measure.ring.one_rank.

def _tracker(block):
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Live(TorchDispatchMode):
        """Bytes of the storages created inside, freed when their last tensor goes."""

        def __init__(self):
            super().__init__()
            self.now = self.peak = 0
            self.seen: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                st = t.untyped_storage()
                key = st.data_ptr()
                if st.nbytes() == 0 or key in self.seen:
                    continue
                self.seen.add(key)
                size = block(st.nbytes())
                self.now += size
                self.peak = max(self.peak, self.now)

                def gone(key=key, size=size):
                    self.now -= size
                    self.seen.discard(key)

                weakref.finalize(st, gone)
            return out

    return Live()


def _stand_in_kernels():
    from attnmem.calc import dispatch

    def fwd(q, k, v, causal, scale, cfg):
        B, H, s, d = q.shape
        return q.new_empty((B, H, s, d)), q.new_empty((B, H, s), dtype=torch.float32)

    def bwd(do, q, k, v, o, lse, causal, scale, cfg):
        B, H, sq, d = q.shape
        H_kv, sk = k.shape[1], k.shape[2]
        _delta = q.new_empty((B, H, sq), dtype=torch.float32)
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        split = dispatch.kv_split(B, H, H_kv, sq, sk, d, q.element_size())
        if split > 1:
            _parts = (k.new_empty((B, H_kv * split, sk, d)), v.new_empty((B, H_kv * split, sk, d)))
        if dispatch.atomic_dq(B, H, H_kv, sq, sk, d, q.element_size()):
            dq = q.new_zeros((B, H, sq, d), dtype=torch.float32)
            dq = dq.to(q.dtype)
        else:
            dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        return dq.zero_(), dk.zero_(), dv.zero_()

    return fwd, bwd


@pytest.mark.parametrize("shape", [
    # B, H, H_kv, s, d, dtype, causal, backward, c
    (1, 4, 4, 96, 16, torch.float32, True, False, 3),
    (1, 4, 4, 96, 16, torch.float32, True, True, 3),
    (1, 4, 1, 96, 16, torch.float32, True, True, 4),
    (1, 4, 2, 64, 16, torch.float32, False, True, 2),
    (1, 8, 2, 8192, 64, torch.bfloat16, True, True, 4),  # GQA split
    (1, 32, 32, 8192, 64, torch.bfloat16, True, True, 2),  # atomic-dQ backward
    (1, 4, 4, 96, 16, torch.bfloat16, False, True, 3),
])
def test_rank_allocations_match_calc_replay(shape, monkeypatch) -> None:
    import attnmem.kernels.ring.ring as ring
    from attnmem.calc.allocator import round_size
    from attnmem.calc.context_parallel import context_parallel_peak_bytes
    from attnmem.measure.ring.simulate import SimulatedRing

    B, H, H_kv, s, d, dtype, causal, backward, c = shape
    monkeypatch.setattr(ring, "_kernels", _stand_in_kernels)
    m = s // c
    g = torch.Generator().manual_seed(0)
    full_k = torch.randn(B, H_kv, s, d, generator=g).to(dtype)
    full_v = torch.randn(B, H_kv, s, d, generator=g).to(dtype)
    blocks = [(ring.shard(full_k, j, c, causal), ring.shard(full_v, j, c, causal))
              for j in range(c)]
    for r in range(c):
        q = torch.randn(B, H, m, d, generator=g).to(dtype).requires_grad_(backward)
        k, v = (t.clone().requires_grad_(backward) for t in blocks[r])
        do = torch.randn(B, H, m, d, generator=g).to(dtype)
        live = _tracker(round_size)
        for t in [q, k, v, do, full_k, full_v, *[x for bl in blocks for x in bl]]:
            live.seen.add(t.untyped_storage().data_ptr())  # inputs: there before the call
        with live:
            o = ring.ring_attention_with(SimulatedRing(r, c, blocks), q, k, v, causal)
            if backward:
                o.backward(do)
            del o
        want = context_parallel_peak_bytes("triton", B, H, s, d, str(dtype).split(".")[1],
                                           causal, backward, c, H_kv, rank=r)
        assert live.peak == want, (r, live.peak, want)


# ---- on a GPU: the real kernel, one rank simulated ------------------------------------------

def _gpu_call(r, c, blocks, ql, kl, vl, dol, backward):
    from attnmem.kernels.ring import ring_attention_with
    from attnmem.measure.ring.simulate import SimulatedRing

    if backward:
        o = ring_attention_with(SimulatedRing(r, c, blocks), ql, kl, vl, True)
        o.backward(dol)
        return o.detach()
    with torch.no_grad():
        return ring_attention_with(SimulatedRing(r, c, blocks), ql, kl, vl, True)


@pytest.mark.gpu
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("c, kv_heads", [(2, 8), (4, 2)])
def test_gpu_simulated_rank_output_and_peak(c: int, kv_heads: int, backward: bool) -> None:
    """Every rank simulated on one GPU (bf16, s = 8,192, d = 128): output rows and dq against
    the fp32 eager reference; each rank's measured extra peak equals calc's prediction."""
    from attnmem.calc.context_parallel import context_parallel_peak_bytes
    from attnmem.kernels.flash.reference import attention_reference
    from attnmem.kernels.ring import shard

    B, H, s, d, dev = 1, 8, 8192, 128, "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v, do = (torch.randn(B, n, s, d, device=dev, generator=g, dtype=torch.bfloat16)
                   for n in (H, kv_heads, kv_heads, H))
    qr, kr, vr = (t.float().requires_grad_() for t in (q, k, v))
    ref = attention_reference(qr, kr, vr, causal=True)
    ref.backward(do.float())
    blocks = [(shard(k, r, c, True), shard(v, r, c, True)) for r in range(c)]
    for r in range(c):
        ql = shard(q, r, c, True).requires_grad_(backward)
        kl, vl = (t.clone().requires_grad_(backward) for t in blocks[r])
        dol = shard(do, r, c, True)

        o = _gpu_call(r, c, blocks, ql, kl, vl, dol, backward)
        err = (o.float() - shard(ref.detach(), r, c, True)).abs().max().item()
        assert err < 2e-2, (r, err)
        if backward:
            want_dq = shard(qr.grad, r, c, True)
            derr = (ql.grad.float() - want_dq).abs().max().item()
            assert derr < max(5e-2, 2e-2 * want_dq.abs().max().item()), (r, derr)
            ql.grad = kl.grad = vl.grad = None
        del o
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        o = _gpu_call(r, c, blocks, ql, kl, vl, dol, backward)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        del o
        ql.grad = kl.grad = vl.grad = None
        want = context_parallel_peak_bytes("triton", B, H, s, d, "bf16", True, backward, c,
                                           kv_heads, rank=r)
        assert peak == want, (r, peak, want)


if __name__ == "__main__":
    _main([int(w) for w in sys.argv[1].split(",")], sys.argv[2])
