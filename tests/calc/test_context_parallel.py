"""calc.context_parallel: per-rank memory of ring attention, its schedule and its traffic.

The replay of attnmem/kernels/ring/ring.py is checked against the ring's real allocations in
tests/kernels/test_ring_attention.py (stand-in kernels, CPU) and on a GPU by
attnmem.measure.ring.one_rank; here: hand-derived cases, the rank search, the folding of
equal steps, c = 1, input checks, traffic formulas and the longest context searches.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from attnmem import calc
from attnmem.calc import context_parallel as cp

MIB = 2**20


def test_exported_from_calc() -> None:
    for name in ("context_parallel_peak_bytes", "context_parallel_memory", "ring_comm_bytes",
                 "ring_schedule", "max_context_parallel_seq_len", "CP_IMPLEMENTATIONS"):
        assert hasattr(calc, name), name


def test_pure_imports() -> None:
    tree = ast.parse(Path(cp.__file__).read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    outside = {m for m in mods if m not in ("__future__", "dataclasses")
               and not m.startswith("attnmem.calc.") and m != "attnmem.calc"}
    assert not outside, outside


@pytest.mark.parametrize("impl", cp.CP_IMPLEMENTATIONS)
@pytest.mark.parametrize("backward", [False, True])
def test_one_gpu_is_the_plain_call(impl: str, backward: bool) -> None:
    args = (impl, 1, 32, 8192, 128, "bf16", True, backward)
    assert (cp.context_parallel_peak_bytes(*args, world_size=1)
            == calc.attention_peak_bytes(*args))


def test_forward_by_hand_non_causal_two_ranks() -> None:
    """Step 1 is the peak: the received K/V pair, the fp32 running output and log-sum-exp,
    the step's output and log-sum-exp and the merge's two row vectors:
    2·KV·e + R·d·4 + R·4 + R·d·e + R·4 + 2·R·4 (R = B·H·m rows, KV = B·H_kv·m·d)."""
    B, H, s, d, c, e = 1, 32, 16384, 128, 2, 2
    m = s // c
    R, KV = B * H * m, B * H * m * d
    want = 2 * KV * e + R * d * 4 + R * 4 + R * d * e + R * 4 + 2 * R * 4
    got = cp.context_parallel_peak_bytes("triton", B, H, s, d, "bf16", False, False, c)
    assert got == want == 339_738_624


def test_terms_sum_to_peak_and_name_the_parts() -> None:
    terms = cp.context_parallel_terms("triton", 1, 32, 131072, 128, "bf16", True, True, 4)
    assert sum(b for _, b in terms) == cp.context_parallel_peak_bytes(
        "triton", 1, 32, 131072, 128, "bf16", True, True, 4)
    labels = " | ".join(lab for lab, _ in terms)
    for part in ("dQ accumulator, fp32", "dK, dV being sent", "dK, dV being received",
                 "received for the next step", "output, saved for the backward"):
        assert part in labels


@pytest.mark.parametrize("impl", cp.CP_IMPLEMENTATIONS)
@pytest.mark.parametrize("c", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("backward", [False, True])
def test_worst_rank_is_the_max_over_all_ranks(impl: str, c: int, backward: bool) -> None:
    s = 2 * c * 1024
    per_rank = [cp.context_parallel_peak_bytes(impl, 1, 8, s, 64, "bf16", True, backward, c,
                                               rank=r) for r in range(c)]
    assert cp.context_parallel_peak_bytes(impl, 1, 8, s, 64, "bf16", True, backward, c) == max(
        per_rank)


@pytest.mark.parametrize("c", [3, 4, 7])
@pytest.mark.parametrize("causal", [False, True])
def test_folding_equal_steps_changes_nothing(c: int, causal: bool, monkeypatch) -> None:
    s = 2 * c * 2048
    folded = [cp.context_parallel_peak_bytes("triton", 1, 16, s, 128, "bf16", causal, True, c,
                                             kv_heads=4, rank=r) for r in range(c)]

    def unfolded(rank, c, causal):
        return [(cp.ring_step_kind(rank, c, t, causal), t + 1 < c) for t in range(c)]

    theirs = [cp.context_parallel_peak_bytes("sdpa_flash", 1, 16, s, 128, "bf16", causal, True,
                                             c, rank=r) for r in range(c)]
    monkeypatch.setattr(cp, "_steps", unfolded)
    monkeypatch.setattr(cp, "_torch_steps", lambda rank, c, causal: [
        (t, cp.ring_step_kind(rank, c, t, causal)) for t in range(c)])
    full = [cp.context_parallel_peak_bytes("triton", 1, 16, s, 128, "bf16", causal, True, c,
                                           kv_heads=4, rank=r) for r in range(c)]
    assert folded == full
    assert theirs == [cp.context_parallel_peak_bytes("sdpa_flash", 1, 16, s, 128, "bf16",
                                                     causal, True, c, rank=r) for r in range(c)]


def test_memory_per_gpu_falls_with_c_and_torch_holds_all_kv() -> None:
    s = 131072
    ours = [cp.context_parallel_peak_bytes("triton", 1, 32, s, 128, "bf16", True, True, c)
            for c in (2, 4, 8, 16)]
    assert ours == sorted(ours, reverse=True)
    # two ranks hold about what one GPU holds (fp32 accumulators and the double buffers cost
    # what halving the sequence saves): inputs plus extra peak within 10% of the plain call
    one, two = (cp.context_parallel_memory("triton", 1, 32, s, 128, "bf16", True, True, c)
                for c in (1, 2))
    assert abs(two.total_bytes - one.total_bytes) < 0.1 * one.total_bytes
    # torch's all-gather keeps every rank's K/V: at c = 16 more than ours by about 2·s·H·d·e
    theirs = cp.context_parallel_peak_bytes("sdpa_flash", 1, 32, s, 128, "bf16", True, True, 16)
    assert theirs - ours[-1] > 2 * s * 32 * 128 * 2 * 0.9
    m = cp.context_parallel_memory("triton", 1, 32, s, 128, "bf16", True, True, 8)
    assert m.local_seq_len == s // 8
    assert m.inputs_bytes == 4 * (s // 8) * 32 * 128 * 2  # q, k, v, dO
    assert m.total_bytes == m.inputs_bytes + m.peak_extra_bytes


@pytest.mark.parametrize("bad, match", [
    (dict(seq_len=1000, world_size=3, causal=True), "multiples of 6"),
    (dict(seq_len=1001, world_size=2, causal=False), "multiples of 2"),
    (dict(world_size=0), "world_size"),
    (dict(impl="ring"), "accepted: triton"),
    (dict(impl="sdpa_flash", kv_heads=8), "kv_heads"),
    (dict(dtype="int8"), "accepted: fp16"),
    (dict(rank=4, world_size=4), "rank"),
])
def test_bad_input_names_value_and_what_is_accepted(bad: dict, match: str) -> None:
    args = dict(impl="triton", batch=1, heads=32, seq_len=4096, head_dim=128, dtype="bf16",
                causal=True, backward=True, world_size=4, kv_heads=None)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        cp.context_parallel_peak_bytes(**args)


def test_schedule_and_chunks() -> None:
    assert cp.ring_schedule(4)[1] == [1, 0, 3, 2]
    assert [row[0] for row in cp.ring_schedule(5)] == list(range(5))
    assert cp.zigzag_chunks(1, 4) == (1, 6)
    kinds = [cp.ring_step_kind(2, 4, t, True) for t in range(4)]
    assert kinds == ["causal", "kv_half", "kv_half", "q_half"]
    assert {cp.ring_step_kind(0, 4, t, False) for t in range(4)} == {"full"}


def test_comm_volume_formula() -> None:
    """Forward (c-1)·2·B·H_kv·(s/c)·d·e; backward that again plus c·2·B·H_kv·(s/c)·d·4."""
    B, H, H_kv, s, d, c = 1, 32, 8, 131072, 128, 8
    kv = B * H_kv * (s // c) * d
    v = cp.ring_comm_bytes(B, H, s, d, "bf16", c, kv_heads=H_kv)
    assert v.forward_bytes == (c - 1) * 2 * kv * 2
    assert v.backward_bytes == (c - 1) * 2 * kv * 2 + c * 2 * kv * 4
    assert v.total_bytes == v.forward_bytes + v.backward_bytes
    assert cp.ring_comm_bytes(B, H, s, d, "bf16", 1).total_bytes == 0


def test_longest_attention_context_is_exact_and_a_multiple_of_2c() -> None:
    budget = 10 * 10**9
    for c in (1, 2, 4, 8):
        s = cp.max_context_parallel_attention_seq_len("triton", budget, 1, 32, 128, "bf16",
                                                      world_size=c)
        unit = 2 * c if c > 1 else 1
        assert s % unit == 0 and s > 0
        fits = cp.context_parallel_memory("triton", 1, 32, s, 128, "bf16", True, True, c)
        over = cp.context_parallel_memory("triton", 1, 32, s + unit, 128, "bf16", True, True, c)
        assert fits.total_bytes <= budget < over.total_bytes


def test_longest_trainable_context_grows_with_gpus() -> None:
    model = calc.MODELS["Llama 3.1 8B"]
    gpu = calc.GPUS["NVIDIA H200 141GB"] if "NVIDIA H200 141GB" in calc.GPUS else max(
        calc.GPUS.values())
    lens = [cp.max_context_parallel_seq_len(model, gpu, c) for c in (1, 2, 8, 32)]
    assert lens == sorted(lens) and lens[0] > 0 and lens[-1] > 8 * lens[0]
    for c, s in zip((1, 2, 8, 32), lens, strict=True):
        assert s % (2 * c if c > 1 else 1) == 0
        t = cp.context_parallel_training(model, c, s)
        assert t.total_bytes <= gpu
    with pytest.raises(ValueError, match="gpu_bytes"):
        cp.max_context_parallel_seq_len(model, -1, 2)


def test_training_on_one_gpu_is_training_step() -> None:
    from attnmem.calc.training_step import training_step

    model = calc.MODELS["Llama 3.1 8B"]
    t = cp.context_parallel_training(model, 1, 8192)
    assert t.total_bytes == training_step(model, 1, 8192, attention="triton",
                                          checkpointing=True).peak_bytes
    t8 = cp.context_parallel_training(model, 8, 8 * 8192)
    step = training_step(model, 1, 8192, attention="triton", checkpointing=True, gpus=8,
                         sharding="fsdp")
    assert t8.local_seq_len == 8192 and t8.total_bytes >= step.peak_bytes
    assert t8.ring_backward_bytes > t8.plain_backward_bytes  # the ring's buffers cost more


# ---- hostile input (the contract of tests/calc/test_fuzz_hostile_inputs.py) ------------------

try:
    from _robust import HOSTILE, Hang, assert_clear_error, time_limit
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    HOSTILE = None

_VALID = {
    "impl": st.sampled_from(cp.CP_IMPLEMENTATIONS) if HOSTILE is not None else None,
    "batch": st.integers(1, 4) if HOSTILE is not None else None,
    "heads": st.sampled_from([8, 16, 32]) if HOSTILE is not None else None,
    "seq_len": st.sampled_from([1024, 4096, 12288, 65536]) if HOSTILE is not None else None,
    "head_dim": st.sampled_from([64, 128]) if HOSTILE is not None else None,
    "dtype": st.sampled_from(["bf16", "fp16", "fp32", "bfloat16"]) if HOSTILE is not None
    else None,
    "causal": st.booleans() if HOSTILE is not None else None,
    "backward": st.booleans() if HOSTILE is not None else None,
    "world_size": st.sampled_from([1, 2, 3, 4, 8]) if HOSTILE is not None else None,
    "kv_heads": st.sampled_from([None, 8]) if HOSTILE is not None else None,
}
_FUZZED = {
    "context_parallel_peak_bytes": list(_VALID),
    "context_parallel_terms": list(_VALID),
    "context_parallel_memory": list(_VALID),
    "ring_comm_bytes": ["batch", "heads", "seq_len", "head_dim", "dtype", "world_size",
                        "kv_heads", "backward", "impl"],
    "ring_schedule": ["world_size"],
}


@pytest.mark.skipif(HOSTILE is None, reason="hypothesis or tests/_robust.py missing")
@pytest.mark.parametrize("name", sorted(_FUZZED))
def test_hostile_input_gives_a_clear_error_or_a_valid_answer(name: str) -> None:
    fn = getattr(cp, name)
    args = _FUZZED[name]

    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def run(data) -> None:
        kw, hostile = {}, []
        for arg in args:
            if data.draw(st.integers(0, 3), label=f"{arg}?") == 0:
                kw[arg] = data.draw(HOSTILE, label=arg)
                hostile.append(arg)
            else:
                kw[arg] = data.draw(_VALID[arg], label=arg)
        call = f"{name}(**{kw!r})"
        try:
            with time_limit(5):
                got = fn(**kw)
        except Hang:
            raise
        except Exception as err:  # noqa: BLE001
            assert_clear_error(err, args, call)
            return
        assert got is not None, call

    run()


@pytest.mark.skipif(HOSTILE is None, reason="hypothesis or tests/_robust.py missing")
def test_hostile_small_entry_points() -> None:
    for bad in (None, -1, 0, 1.5, "2", 10**400, True, [2]):
        for fn, call in ((cp.ring_step_kind, lambda b: cp.ring_step_kind(b, 4, 1, True)),
                         (cp.ring_step_kind, lambda b: cp.ring_step_kind(0, b, 1, True)),
                         (cp.zigzag_chunks, lambda b: cp.zigzag_chunks(b, 4)),
                         (cp.zigzag_chunks, lambda b: cp.zigzag_chunks(0, b))):
            try:
                call(bad)
            except (ValueError, TypeError) as err:
                assert any(n in str(err) for n in ("rank", "world_size", "step")), (fn, bad, err)
    model = calc.MODELS["Llama 3.1 8B"]
    for kw in ({"gpu_bytes": float("nan")}, {"gpu_bytes": "80e9"}, {"world_size": 0},
               {"batch": -1}, {"impl": "x"}, {"checkpointing": "yes"}):
        args = dict(model=model, gpu_bytes=80 * 10**9, world_size=2)
        args.update(kw)
        with pytest.raises((ValueError, TypeError)):
            cp.max_context_parallel_seq_len(**args)


def test_bundled_h200_ring_measurements_are_predicted_exactly() -> None:
    """data/ring_one_rank_h200.csv (attnmem.measure.ring.one_rank on an H200): the current
    model reproduces every measured peak to the byte."""
    import csv

    path = Path(__file__).resolve().parents[2] / "data" / "ring_one_rank_h200.csv"
    if not path.exists():
        pytest.skip("data/ring_one_rank_h200.csv not bundled")
    rows = [r for r in csv.DictReader(open(path)) if r["status"] == "ok"]
    assert rows
    for r in rows:
        want = cp.context_parallel_peak_bytes(
            r["impl"], int(r["batch"]), int(r["heads"]), int(r["seq_len"]), int(r["head_dim"]),
            r["dtype"], r["causal"] == "True", r["pass"] == "fwd+bwd", int(r["world_size"]),
            int(r["kv_heads"]), rank=int(r["rank"]))
        assert int(r["peak_bytes"]) == want, r
