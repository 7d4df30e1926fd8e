"""The multi-GPU ring measurement (attnmem.measure.ring.multi) on 2 CPU processes (gloo).

tests/kernels/test_ring_attention.py already checks that the ring's output and gradients on
2 and 3 gloo processes equal one-device attention; this file does not repeat it. It checks
what measure_multi adds, with our kernel under Triton's interpreter (TRITON_INTERPRET=1 in
the child processes only) on tiny shapes (B = 1, H = 2, d = 16, fp32):

1. ``python -m attnmem.measure.ring.multi --nproc-per-node 2`` runs end to end: one row per
   rank, pass and length, calc's per-rank prediction beside it, the call time and the one-GPU
   time with the scaling efficiency; torch's context_parallel rows say why they cannot run on
   the CPU;
2. an out-of-memory error on ONE rank in the middle of the backward (injected from a given
   length on by the rank script tests/kernels/ring_oom_rank.py, which patches measure_multi in
   its own process) is survived: that rank drains the ring, every rank records ``oom``, and
   the run goes on;
3. the longest-context search (doubling, then bisecting, over multiples of 2c x unit) finds
   the longest length that ran, with that injected limit, and the forward's search runs to
   its limit;
4. in-process: the search on made-up limits, and the send sequence the drain replays is the
   one attnmem/kernels/ring/ring.py issues (counted through the one-device simulator with stand-in
   kernels).

Subprocesses run in a session of their own with a time limit (the whole group is killed past
it); torchrun --standalone picks a free port. The real-GPU run is marked ``gpu``.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from _procs import run_in_session

torch = pytest.importorskip("torch")

from attnmem.measure.ring import multi as mm  # noqa: E402


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# ---- in-process ---------------------------------------------------------------------------------

@pytest.mark.parametrize("limit_ok, unit, start, cap", [
    (100, 8, 16, 1000), (7, 8, 16, 1000), (1000, 8, 16, 1000), (16, 8, 16, 1000),
    (515, 32, 64, 4096), (3, 1, 1, 10),
])
def test_search_finds_the_longest_multiple_that_runs(limit_ok, unit, start, cap) -> None:
    good, bad, tries = mm.search_longest(lambda s: s <= limit_ok, start, unit, cap)
    want = min(limit_ok, cap) // unit * unit
    assert good == want
    assert all(s % unit == 0 and s <= cap for s, _ in tries)
    assert all(ok == (s <= limit_ok) for s, ok in tries)
    if want < cap // unit * unit:
        assert bad == good + unit  # bisected down to one unit
    assert len(tries) == len({s for s, _ in tries})  # no length tried twice


def test_search_rejects_a_bad_range() -> None:
    with pytest.raises(ValueError, match="unit"):
        mm.search_longest(lambda s: True, 8, 16, 8)


@pytest.mark.parametrize("c, backward", [(2, False), (2, True), (3, True), (4, True)])
def test_drain_sequence_is_what_the_ring_sends(c, backward, monkeypatch) -> None:
    """Every start() of one rank's call, counted through the simulator: the order of kinds is
    mm.ring_sequence's (so a draining rank issues what its neighbours wait for)."""
    import attnmem.kernels.ring.ring as ring
    from attnmem.measure.ring.simulate import SimulatedRing

    def fwd(q, k, v, causal, scale, cfg):
        B, H, s, d = q.shape
        return q.new_zeros((B, H, s, d)), q.new_zeros((B, H, s), dtype=torch.float32)

    def bwd(do, q, k, v, o, lse, causal, scale, cfg):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    monkeypatch.setattr(ring, "_kernels", lambda: (fwd, bwd))

    class Counting(SimulatedRing):
        def __init__(self, *a):
            super().__init__(*a)
            self.kinds: list[tuple[str, str]] = []
            self.phase = ""

        def begin(self, phase):
            super().begin(phase)
            self.phase = phase

        def start(self, tensors, kind):
            self.kinds.append((self.phase, kind))
            return super().start(tensors, kind)

    m, s = 8, 8 * c
    blocks = [(torch.zeros(1, 1, m, 4), torch.zeros(1, 1, m, 4)) for _ in range(c)]
    for r in range(c):
        q = torch.zeros(1, 1, m, 4, requires_grad=backward)
        k, v = (t.clone().requires_grad_(backward) for t in blocks[r])
        comm = Counting(r, c, blocks)
        o = ring.ring_attention_with(comm, q, k, v, True)
        if backward:
            o.backward(torch.zeros_like(o))
        assert comm.kinds == mm.ring_sequence(c, backward), (r, comm.kinds)
    assert s == 8 * c


@pytest.mark.parametrize("argv, match", [
    (["--impls", "flash3"], r"unknown implementation\(s\) flash3; accepted: triton, sdpa_flash"),
    (["--passes", "bwd"], r"unknown pass\(es\) bwd; accepted: fwd, fwd\+bwd"),
    (["--seq-lens", "100"], r"--seq-lens 100: causal zigzag shards need a multiple of 2c = 8"),
    (["--heads", "6", "--kv-heads", "4"], r"--heads 6 must be a multiple of --kv-heads 4"),
])
def test_bad_arguments_are_refused(argv, match) -> None:
    args = mm.build_parser().parse_args(["--out", "x", *argv])
    with pytest.raises(mm.Refusal, match=match):
        mm.check_args(args, 4)
    with pytest.raises(mm.Refusal, match="at least 2 processes"):
        mm.check_args(mm.build_parser().parse_args(["--out", "x"]), 1)


def test_launcher_refuses_before_starting_anything(tmp_path) -> None:
    res = run_in_session([sys.executable, "-m", "attnmem.measure.ring.multi", "--nproc-per-node", "2",
                "--out", str(tmp_path), "--impls", "flash3"], timeout=60, env={})
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: unknown implementation(s) flash3")
    assert "Traceback" not in res.stderr


# ---- 2 gloo processes ---------------------------------------------------------------------------

INJECT_FROM = 96  # rank 1 runs out of memory at its backward's first step from 96 tokens on


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    out = tmp_path_factory.mktemp("ring_multi")
    pytest.importorskip("triton")
    rank_script = str(Path(__file__).with_name("ring_oom_rank.py"))
    res = run_in_session([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", rank_script, f"1:bwd:0:{INJECT_FROM}",
                "--out", str(out), "--seq-lens", "64", "128", "--heads", "2", "--head-dim",
                "16", "--dtype", "fp32", "--repeats", "1", "--find-longest",
                "--search-start", "32", "--search-unit", "8", "--search-limit", "256",
                "--collective-timeout", "120"],
               timeout=300, env={"TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return _csv(out / "ring_multi_h200.csv"), _csv(out / "ring_longest_h200.csv")


def test_rows_for_every_rank_with_prediction_and_timing(ring_run) -> None:
    rows, _ = ring_run
    assert list(rows[0]) == mm.FIELDS
    ours = [r for r in rows if r["impl"] == "triton"]
    assert len(ours) == 2 * 2 * 2  # lengths x passes x ranks
    for r in ours:
        assert r["world_size"] == "2" and int(r["local_seq_len"]) == int(r["seq_len"]) // 2
        assert int(r["predicted_bytes"]) > 0
        assert int(r["kv_bytes_per_step"]) == 2 * 2 * int(r["local_seq_len"]) * 16 * 4
        if r["status"] == "ok":
            assert float(r["call_ms"]) > 0 and float(r["one_gpu_ms"]) > 0
            assert float(r["scaling_efficiency"]) == pytest.approx(
                float(r["one_gpu_ms"]) / (2 * float(r["call_ms"])), rel=1e-3)
    torch_rows = [r for r in rows if r["impl"] == "sdpa_flash"]
    assert len(torch_rows) == 8
    assert all(r["status"] == "unavailable" and "context_parallel" in r["message"]
               for r in torch_rows)


def test_an_oom_on_one_rank_is_drained_and_recorded_on_every_rank(ring_run) -> None:
    rows, _ = ring_run
    got = {(r["seq_len"], r["pass"], r["rank"]): r for r in rows if r["impl"] == "triton"}
    for rank in ("0", "1"):
        assert got[("64", "fwd+bwd", rank)]["status"] == "ok"
        assert got[("128", "fwd", rank)]["status"] == "ok"  # the forward never fails
        failed = got[("128", "fwd+bwd", rank)]
        assert failed["status"] == "oom"
    assert "injected out of memory (rank 1, bwd step 0)" in got[("128", "fwd+bwd", "1")][
        "message"]
    assert got[("128", "fwd+bwd", "0")]["message"] == "another rank failed"


def test_longest_context_search_by_running(ring_run) -> None:
    _, longest = ring_run
    assert list(longest[0]) == mm.LONGEST_FIELDS
    by_pass = {r["pass"]: r for r in longest}
    assert set(by_pass) == {"fwd", "fwd+bwd"}
    fwd, both = by_pass["fwd"], by_pass["fwd+bwd"]
    assert fwd["longest_seq_len"] == "256" and fwd["first_failed_seq_len"] == ""
    assert fwd["attempts"] == "32:ok 64:ok 128:ok 256:ok"
    # multiples of 2c x 8 = 32: 64 runs, 96 (the first injected length) does not
    assert both["longest_seq_len"] == "64" and both["first_failed_seq_len"] == "96"
    assert both["attempts"] == "32:ok 64:ok 128:oom 96:oom"


# ---- on 2 or more GPUs ----------------------------------------------------------------------

def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs at least 2 CUDA GPUs")
def test_gpu_ring_on_two_gpus_matches_calc(tmp_path) -> None:
    """--quick on 2 GPUs (NCCL): every rank of our ring within 1% of calc's per-rank peak
    (NCCL's own buffers are outside the caching allocator); torch's rows ran or say why."""
    res = run_in_session([sys.executable, "-m", "attnmem.measure.ring.multi", "--nproc-per-node", "2",
                "--out", str(tmp_path), "--quick"], timeout=600, env={})
    assert res.returncode == 0, res.stderr[-3000:]
    rows = _csv(tmp_path / "ring_multi_h200.csv")
    for r in rows:
        if r["impl"] == "triton":
            assert r["status"] == "ok", r["message"]
            assert abs(float(r["error_pct"])) < 1.0, r
        else:
            assert r["status"] in ("ok", "unavailable"), r["message"]
