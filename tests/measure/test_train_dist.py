"""The sharded training-step harness (attnmem.measure.train_dist) on 2 CPU processes (gloo).

What runs: ``python -m attnmem.measure.train_dist --nproc-per-node 2`` (which starts
``torch.distributed.run --standalone``: the command a GPU machine runs, gloo in place of NCCL) on
the CPU tests' tiny Llama (2 layers, hidden 64, vocab 128; random init, no download), DDP and
FSDP2 (fully_shard), bf16, amp_bf16 and fp32, checkpointing off and on. What it proves:

1. both shardings run end to end under the harness and rank 0 writes one row per rank;
2. the bytes each rank holds, counted from its tensors after a step (the storages of its local
   parameters, a DTensor's local tensor under FSDP2; their gradients; AdamW's two moments;
   DDP's gradient buckets through a comm hook) equal attnmem.calc.parallel.layout_bytes's per-GPU
   weights, gradients, optimizer state and DDP's persistent buckets exactly;
3. the losses of DDP and FSDP on 2 ranks (the mean of the ranks' losses, step by step, fp32)
   equal a one-process run of the same steps on the whole global batch;
4. FSDP2 pads each parameter's first dimension to a multiple of the world size (a model whose
   vocabulary and MLP width are odd, in a separate 2-process run): weights and gradients are
   the padded shards on every rank, AdamW's moments the unpadded local rows, so calc's
   Ψ/N is exact only where N divides every first dimension (the measured difference is
   asserted, not hidden).

Every subprocess runs in its own session with a time limit; past it the whole group is
killed, so a hung rank cannot hang CI. Ports: torchrun's --standalone picks a free one.
The real-GPU run is marked ``gpu`` and needs 2 GPUs.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from pathlib import Path

import pytest

if __name__ != "__main__":  # run as a script (the padding test's ranks, below) it needs no helper
    from _procs import run_in_session

from attnmem.measure import train_dist as td

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
SEQ = 32
STEPS = 3


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# ---- in-process: refusals (no process group) ------------------------------------------------

def _args(**kw) -> argparse.Namespace:
    base = ["--model", "tiny-llama", "--seq-len", "32", "--attention", "sdpa_math"]
    ns = td.build_parser().parse_args(base)
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


@pytest.mark.parametrize("kw, world, match", [
    ({"sharding": ["zero9"]}, 2, r"unknown sharding\(s\) zero9; accepted: ddp, fsdp"),
    ({"model": ["gpt5"]}, 2, r"unknown model\(s\) gpt5; accepted: .*tiny-llama"),
    ({"precision": ["fp8"]}, 2, r"unknown precision\(s\) fp8; accepted: bf16, amp_bf16"),
    ({"global_batch": 3}, 2, r"--global-batch 3 must be a positive multiple of the world "
                             r"size 2"),
    ({}, 1, r"world size 1: a sharded step needs at least 2 processes"),
    ({"steps": 2}, 2, r"--steps must be at least 3"),
    ({"seq_len": ["x"]}, 2, r"--seq-len must be whole numbers"),
    ({"batch": 2, "global_batch": 4}, 2, r"--batch .* or --global-batch .*not both"),
])
def test_bad_arguments_are_refused_with_what_is_accepted(kw, world, match) -> None:
    with pytest.raises(td.Refusal, match=match):
        td.configs_from_args(_args(**kw), world)


def test_global_batch_divides_into_per_gpu_batches() -> None:
    cfgs = td.configs_from_args(_args(global_batch=6, sharding=["ddp", "fsdp"]), 3)
    assert {c.base.batch for c in cfgs} == {2}
    assert [c.sharding for c in cfgs] == ["ddp", "fsdp"]


def test_a_model_calc_refuses_is_refused(monkeypatch) -> None:
    import dataclasses

    real = td.calc_model
    monkeypatch.setattr(td, "calc_model",
                        lambda name, layers: dataclasses.replace(real(name, layers),
                                                                 num_experts=8))
    with pytest.raises(td.Refusal, match=r"calc refuses model 'tiny-llama' on 2 GPUs with "
                                         r"sharding 'fsdp': .*not counted"):
        td.configs_from_args(_args(sharding=["fsdp"]), 2)


def test_without_torchrun_it_says_how_to_run_it(monkeypatch, capsys) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert td.main(["--model", "tiny-llama"]) == 2
    assert "torchrun --nproc-per-node N -m attnmem.measure.train_dist" in capsys.readouterr().err


def test_a_bad_sharding_from_the_command_line_is_one_message(tmp_path) -> None:
    """The launcher form checks the arguments before any rank starts: one line, no traceback
    (under torchrun itself, torchrun adds its own report of the ranks' exit codes)."""
    res = run_in_session([sys.executable, "-m", "attnmem.measure.train_dist", "--nproc-per-node", "2",
                "--sharding", "zero9", "--model", "tiny-llama", "--out", str(tmp_path / "x.csv")],
               timeout=120)
    assert res.returncode != 0
    assert "error: unknown sharding(s) zero9; accepted: ddp, fsdp" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "x.csv").exists()


# ---- 2 gloo processes: the harness end to end -----------------------------------------------

@pytest.fixture(scope="module")
def dist_rows(tmp_path_factory) -> list[dict[str, str]]:
    out = tmp_path_factory.mktemp("train_dist") / "rows.csv"
    # the launcher form (it starts torchrun --standalone itself)
    res = run_in_session([sys.executable, "-m", "attnmem.measure.train_dist", "--nproc-per-node", "2",
                "--sharding", "ddp", "fsdp", "--model", "tiny-llama", "--seq-len", str(SEQ), "--attention", "sdpa_math",
                "--precision", "bf16", "amp_bf16", "fp32", "--checkpointing", "both",
                "--steps", str(STEPS), "--count-buckets", "--quiet", "--out", str(out)],
               timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return _rows(out)


def test_ddp_and_fsdp_steps_run_and_every_rank_has_a_row(dist_rows) -> None:
    assert list(dist_rows[0]) == list(td.DIST_COLUMNS)
    assert len(dist_rows) == 2 * 3 * 2 * 2  # shardings x precisions x checkpointing x ranks
    for r in dist_rows:
        assert r["status"] == "ok", r["message"]
        assert r["world_size"] == "2" and r["global_batch"] == "2"
        assert float(r["step_ms"]) > 0 and r["steps"] == str(STEPS)
        losses = [float(x) for x in r["losses"].split()]
        assert len(losses) == STEPS + 1
        assert all(abs(x - math.log(128)) < 0.5 for x in losses)  # random init: ~ln(vocab)
        assert r["predicted_weights_bytes"]
        if r["precision"] != "fp32":
            assert int(r["predicted_peak_bytes"]) > 0 and r["predicted_before_bytes"]
        else:
            assert r["predicted_peak_bytes"] == "" and "calc predicts bf16" in r["message"]
    keys = {(r["sharding"], r["precision"], r["checkpointing"]) for r in dist_rows}
    assert len(keys) == 12
    assert {r["rank"] for r in dist_rows} == {"0", "1"}


def test_held_bytes_equal_calc_layout(dist_rows) -> None:
    from attnmem.calc.parallel import layout_bytes, make_layout

    model = td.calc_model("tiny-llama", None)
    for r in dist_rows:
        prec = r["precision"] if r["precision"] != "fp32" else "amp_bf16"  # 4-byte everything
        want = layout_bytes(model, make_layout(model, 2, 1, td.CALC_SHARDING[r["sharding"]]),
                            prec)
        where = (r["sharding"], r["precision"], r["checkpointing"], r["rank"])
        assert int(r["weights_bytes"]) == want["weights"], where
        assert int(r["gradients_bytes"]) == want["gradients"], where
        assert int(r["optimizer_bytes"]) == want["optimizer"], where
        assert int(r["predicted_weights_bytes"]) == want["weights"]
        if r["sharding"] == "ddp":  # the buckets: a second copy of every gradient
            assert int(r["buckets_bytes"]) == want["persistent_buffers"] == want["gradients"]
        else:
            assert r["buckets_bytes"] == "" and want["persistent_buffers"] == 0
            assert int(r["predicted_step_buffers_bytes"]) == want["step_buffers"] > 0


def _single_process_losses(checkpointing: bool) -> list[float]:
    """The same steps in this process on the whole global batch (fp32, no process group)."""
    import torch

    from attnmem.measure import train_models as tm

    torch.set_num_threads(1)
    hf = tm.build_config(tm.hf_config("tiny-llama"))
    model = td.build_model(hf, "fp32", "sdpa_math", checkpointing, "cpu", td.DEFAULT_SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = td.global_ids(hf.vocab_size, 2, SEQ, td.DEFAULT_SEED)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    losses = []
    for _ in range(STEPS + 1):
        with sdpa_kernel(SDPBackend.MATH):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("checkpointing", [False, True])
def test_sharded_losses_equal_one_process_on_the_global_batch(dist_rows, checkpointing) -> None:
    ref = _single_process_losses(checkpointing)
    for sharding in td.SHARDINGS:
        ranks = [r for r in dist_rows if r["sharding"] == sharding and r["precision"] == "fp32"
                 and r["checkpointing"] == str(checkpointing)]
        assert len(ranks) == 2
        per_rank = [[float(x) for x in r["losses"].split()] for r in ranks]
        assert per_rank[0] != per_rank[1]  # each rank has its own rows of the batch
        mean = [sum(xs) / 2 for xs in zip(*per_rank, strict=True)]
        assert mean == pytest.approx(ref, rel=1e-5, abs=1e-5), (sharding, mean, ref)
        # The step changes the loss (1e-5 learning rate: small, but well above the tolerance).
        assert abs(ref[-1] - ref[0]) > 1e-4


# ---- 2 gloo processes: FSDP2's padding on a model with odd first dimensions ------------------

ODD = {"vocab_size": 129, "intermediate_size": 129}


def _odd_worker(rank: int, out_dir: str) -> None:
    """One rank (forked by _odd_ranks): FSDP2 on a tiny Llama with odd vocabulary and MLP
    width; it writes what it holds and the shapes needed to recompute it."""
    import torch
    import torch.distributed as dist

    from attnmem.measure import train_models as tm

    dist.init_process_group("gloo", init_method="file://" + os.path.join(out_dir, "store"),
                            rank=rank, world_size=2)
    world = dist.get_world_size()
    try:
        d = {**tm.hf_config("tiny-llama"), **ODD}
        hf = tm.build_config(d)
        model = td.build_model(hf, "bf16", "sdpa_math", False, "cpu", 0)
        model = td.shard_model(model, "fsdp", "cpu", 0, None)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        ids = td.global_ids(129, world, 16, 0)[rank:rank + 1]
        model(input_ids=ids, labels=ids).loss.backward()
        params = list(model.parameters())
        held = {"weights": td.storage_bytes(params),
                "gradients": td.storage_bytes(p.grad for p in params)}
        opt.step()
        held["optimizer"] = td.storage_bytes(td.optimizer_state_tensors(opt))
        shapes = [list(p.shape) for p in params]
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump({"held": held, "shapes": shapes, "world": world}, fh)
    finally:
        dist.destroy_process_group()


def _odd_ranks(out_dir: str) -> None:
    """Run as a script (this file): 2 gloo ranks forked from one process that has imported
    torch, transformers' Llama and FSDP2 first, so the ranks start with them (spawned ranks
    under torchrun each imported them again: most of this test's time). The launcher form
    of the harness is tested by dist_rows above."""
    import torch
    import torch.multiprocessing as mp
    from torch.distributed.fsdp import fully_shard  # noqa: F401  (imported once, before the fork)

    from attnmem.measure import train_models as tm

    torch.set_num_threads(1)
    td.build_model(tm.build_config({**tm.hf_config("tiny-llama"), **ODD}), "bf16", "sdpa_math",
                   False, "cpu", 0)  # transformers' lazy Llama modules, before the fork
    mp.start_processes(_odd_worker, args=(out_dir,), nprocs=2, join=True, start_method="fork")


def test_fsdp2_pads_shards_where_calc_divides(tmp_path) -> None:
    from attnmem.calc import ModelConfig
    from attnmem.calc.parallel import layout_bytes, make_layout
    from attnmem.measure import train_models as tm

    res = run_in_session([sys.executable, str(Path(__file__).resolve()), str(tmp_path)], timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    world, e = 2, 2  # bf16
    shapes = reports[0]["shapes"]
    padded = sum(-(-s[0] // world) * math.prod(s[1:]) for s in shapes)
    model = ModelConfig.from_hf_config({**tm.hf_config("tiny-llama"), **ODD}, name="odd")
    calc = layout_bytes(model, make_layout(model, world, 1, "fsdp"), "bf16")
    total = sum(math.prod(s) for s in shapes)
    assert calc["weights"] == total * e // world  # calc: Ψ/N
    for rank, rep in enumerate(reports):
        # rows rank*ceil(d0/N) ... of each parameter, unpadded
        local = sum(max(0, min(-(-s[0] // world), s[0] - rank * -(-s[0] // world)))
                    * math.prod(s[1:]) for s in shapes)
        assert rep["held"]["weights"] == padded * e, rank  # padded shards, every rank
        assert rep["held"]["gradients"] == padded * e, rank
        assert rep["held"]["optimizer"] == 2 * local * e, rank  # zeros_like of the local rows
    # what calc leaves out: the padding (embedding, lm_head, gate and up have 129 rows)
    assert padded * e - calc["weights"] == 384
    assert reports[0]["held"]["optimizer"] - calc["optimizer"] == 768
    assert reports[1]["held"]["optimizer"] - calc["optimizer"] == -768


# ---- on 2 or more GPUs ----------------------------------------------------------------------

def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs at least 2 CUDA GPUs")
def test_gpu_sharded_steps_hold_what_calc_says(tmp_path) -> None:
    """llama3-8b-2l at 1,024 tokens on 2 GPUs (NCCL): every row ok, the held bytes equal calc's
    layout, and the peak is reported against the per-GPU prediction."""
    out = tmp_path / "rows.csv"
    res = run_in_session([*TORCHRUN, "2", "-m", "attnmem.measure.train_dist", "--sharding", "ddp", "fsdp",
                "--model", "llama3-8b-2l", "--seq-len", "1024", "--attention", "sdpa_flash",
                "--precision", "bf16", "--count-buckets", "--out", str(out)], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = _rows(out)
    assert len(rows) == 4
    for r in rows:
        assert r["status"] == "ok", r["message"]
        assert int(r["weights_bytes"]) == int(r["predicted_weights_bytes"])
        assert int(r["optimizer_bytes"]) == int(r["predicted_optimizer_bytes"])
        assert int(r["peak_bytes"]) > 0 and r["peak_rel_error"] != ""


if __name__ == "__main__":
    _odd_ranks(sys.argv[1])
