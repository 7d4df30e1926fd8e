"""The training-step harness (attnmem.measure.train) and its model list.

On the CPU: the row schema, the configs (their parameter counts in transformers against calc,
built on the meta device: no memory, no download), the procedure on a tiny Llama (memory
counters read nothing on the CPU; status, loss, timing and messages are checked), refusals,
the runner's budget and OOM rules (a fake child), the command line (a real child). GPU tests
are marked ``gpu``.
"""

from __future__ import annotations

import csv
import math
import queue
import subprocess
import sys
from pathlib import Path

import pytest

from attnmem.measure import model_common
from attnmem.measure import train_models as tm
from attnmem.measure.harness import STATUSES
from attnmem.measure.train import cli as tcli
from attnmem.measure.train import config as tconfig
from attnmem.measure.train import plan as tplan
from attnmem.measure.train import predict, procedure, worker
from attnmem.measure.train import store as tstore

UNRULED_TRAIN = tplan.UNRULED_MODELS

ROOT = Path(__file__).resolve().parents[2]

#: The columns the training page and calc's tests read (issue 17).
REQUIRED = ("model", "arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "tied",
            "batch", "seq_len", "attention", "precision", "checkpointing", "params",
            "before_step_bytes", "peak_bytes", "reserved_bytes", "step_ms", "status", "message",
            "predicted_peak_bytes", "predicted_before_bytes", "gpu", "torch", "transformers",
            "timestamp")


def test_schema_has_every_required_column_and_documents_it():
    assert set(REQUIRED) <= set(tconfig.TRAIN_COLUMNS)
    assert len(set(tconfig.TRAIN_COLUMNS)) == len(tconfig.TRAIN_COLUMNS)
    doc = tconfig.__doc__
    for col in tconfig.TRAIN_COLUMNS:
        assert f"\n    {col} " in doc, f"column {col} is not described in the module docstring"


def test_statuses_are_the_attention_points_statuses():
    for status in ("ok", "oom", "unavailable", "skipped", "error", "timeout", "crashed"):
        assert status in STATUSES


def test_import_is_light():
    code = ("import sys, attnmem.measure.train.cli, attnmem.measure.train_models, "
            "attnmem.measure.cli, attnmem.kernels.hf\n"
            "bad = [m for m in ('torch', 'transformers', 'triton', 'streamlit') if m in sys.modules]\n"
            "assert not bad, bad\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------------------------------------
# The configs.
# ---------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", tm.NAMES)
def test_param_count_matches_calc_and_shape_fields_match_config(name):
    """Built on the meta device (no memory): transformers' parameters = attnmem.calc.param_count."""
    from transformers import AutoModelForCausalLM

    from attnmem.calc import ModelConfig, param_count

    d = tm.hf_config(name)
    hf = tm.build_config(dict(d))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    real = sum(p.numel() for p in model.parameters())
    try:
        calc_model = ModelConfig.from_hf_config(d, name=name)
    except ValueError:  # a type without calc's rules (issue 42): predicted by the trace
        assert name in UNRULED_TRAIN
    else:
        assert real == param_count(calc_model)
    shape = tconfig.shape_fields(hf)
    assert shape["layers"] == tm.MODELS[name][1] == d["num_hidden_layers"]
    assert shape["hidden"] == d["hidden_size"] and shape["vocab"] == d["vocab_size"]
    assert shape["heads"] % shape["kv_heads"] == 0


def test_the_model_list_covers_the_issue():
    shapes = {n: tconfig.shape_fields(tm.build_config(n)) for n in tm.NAMES if n != "tiny-llama"}
    archs = {s["arch"] for s in shapes.values()}
    assert {"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text"} <= archs
    assert any(s["heads"] == s["kv_heads"] for s in shapes.values())  # MHA
    assert any(s["heads"] > s["kv_heads"] for s in shapes.values())  # GQA
    assert any(s["tied"] for s in shapes.values()) and any(not s["tied"] for s in shapes.values())
    assert any(s["vocab"] >= 100_000 for s in shapes.values())
    assert any(s["sliding_window"] for s in shapes.values())
    # real widths: Llama 3.1 8B
    s = shapes["llama3-8b-2l"]
    assert (s["hidden"], s["intermediate"], s["heads"], s["kv_heads"], s["vocab"]) == (
        4096, 14336, 32, 8, 128256)


def test_sliding_layers_follow_the_modeling_code():
    assert model_common.sliding_layers(tm.build_config("llama3-8b-2l")) == []
    assert model_common.sliding_layers(tm.build_config("qwen2.5-7b-2l")) == []  # use_sliding_window off
    assert model_common.sliding_layers(tm.build_config("mistral-7b-2l")) == [(0, 4096), (1, 4096)]
    assert model_common.sliding_layers(tm.build_config("gemma2-9b-2l")) == [(0, 4096)]
    assert model_common.sliding_layers(tm.build_config("gemma3-27b-2l")) == [(0, 1024), (1, 1024)]
    with pytest.raises(TypeError):
        model_common.sliding_layers({"sliding_window": 4})


def test_bad_model_names_and_layers_are_refused():
    with pytest.raises(ValueError, match="unknown training model 'gpt5'"):
        tm.hf_config("gpt5")
    with pytest.raises(ValueError, match="layers must be a whole number >= 1, got 0"):
        tm.hf_config("llama3-8b-2l", layers=0)
    assert tm.hf_config("llama3-8b-2l", layers=6)["num_hidden_layers"] == 6


# ---------------------------------------------------------------------------------------------
# The procedure on the CPU (tiny Llama).
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attention, precision, ckpt", [
    ("eager", "fp32", False), ("sdpa_math", "bf16", True), ("eager", "amp_bf16", False)])
def test_tiny_step_on_cpu(attention, precision, ckpt):
    r = procedure.measure_train_step(tconfig.TrainConfig("tiny-llama", 32, attention, precision, ckpt))
    assert r.status == "ok", r.message
    assert r.params == 90432 and r.layers == 2 and r.kv_heads == 2 and r.arch == "llama"
    assert abs(r.loss - math.log(128)) < 0.5  # random init: about ln(vocab)
    assert r.steps == 3 and r.step_ms > 0
    assert r.peak_bytes is None and r.before_step_bytes is None  # no allocator on the CPU
    assert r.gpu == "cpu" and r.transformers == transformers.__version__
    assert ("use_reentrant=False" in r.message) == ckpt
    assert r.timestamp and r.wall_s > 0


def test_prediction_is_calc_training_step():
    import attnmem.calc

    cfg = tconfig.TrainConfig("llama3-8b-2l", 1024, "sdpa_flash", "bf16", False)
    hf = tm.hf_config(cfg.model)
    peak, before, why = predict.predict(cfg, hf)
    m = attnmem.calc.training_step(attnmem.calc.ModelConfig.from_hf_config(hf, name=cfg.model), 1, 1024,
                           attention="sdpa_flash", precision="bf16", checkpointing=False)
    assert why == "" and (peak, before) == (m.peak_bytes, m.before_step_bytes)


def test_triton_refusal_is_unavailable_before_building_anything():
    # a sliding window shorter than s runs through the kernel's own window
    assert model_common.kernels_hf_check(tm.build_config("mistral-7b-2l"), 8192) == []
    g = procedure.measure_train_step(tconfig.TrainConfig("gemma2-9b-2l", 1000, "triton", "bf16"))
    assert g.status == "unavailable" and "soft-capped" in g.message
    assert g.params is None and g.wall_s < 30  # the 9B-wide model was never built


def test_fa4_is_unavailable_where_not_installed():
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    r = procedure.measure_train_step(tconfig.TrainConfig("tiny-llama", 16, "fa4", "bf16"))
    assert r.status == "unavailable" and "FlashAttention4" in r.message


def test_architecture_without_sdpa_is_unavailable():
    """transformers refuses SDPA for Gemma 2 at build time: a result, not an error. (Tiny
    widths: the refusal comes before any weight exists.)"""
    r = model_common.unavailable_error(ValueError(
        "Gemma2ForCausalLM does not support an attention implementation through "
        "torch.nn.functional.scaled_dot_product_attention yet."))
    assert r
    assert model_common.unavailable_error(RuntimeError("No available kernel. Aborting execution."))
    assert not model_common.unavailable_error(RuntimeError("CUDA error: illegal memory access"))


@pytest.mark.parametrize("cfg, words", [
    (tconfig.TrainConfig("nope", 16, "eager", "bf16"), "unknown model"),
    (tconfig.TrainConfig("tiny-llama", 16, "flashy", "bf16"), "unknown attention"),
    (tconfig.TrainConfig("tiny-llama", 16, "eager", "fp8"), "unknown precision"),
    (tconfig.TrainConfig("tiny-llama", 1, "eager", "bf16"), "seq_len"),
    (tconfig.TrainConfig("tiny-llama", 16, "eager", "bf16", steps=0), "steps"),
])
def test_bad_configs_are_error_rows(cfg, words):
    r = procedure.measure_train_step(cfg)
    assert r.status == "error" and words in r.message


# ---------------------------------------------------------------------------------------------
# The runner: budget, OOM series (a fake child), and the command line (a real child).
# ---------------------------------------------------------------------------------------------
class _FakeProc:
    returncode = 0

    def poll(self):
        return None


class _FakeChild:
    """Answers like the worker: OOM from s = 64 on, ok below."""

    started = 0

    def __init__(self, env):
        _FakeChild.started += 1
        self.proc = _FakeProc()
        self.messages = queue.Queue()
        self.done = 0

    def send(self, msg):
        cfg = tconfig.TrainConfig.from_dict(msg["cfg"])
        status = "oom" if cfg.seq_len >= 64 else "ok"
        row = tconfig.TrainResult(model=cfg.model, seq_len=cfg.seq_len, attention=cfg.attention,
                             precision=cfg.precision, checkpointing=cfg.checkpointing,
                             status=status)
        self.messages.put({"result": row.to_row(), "restart": False})

    def close(self):
        pass

    def kill(self):
        pass


def test_runner_skips_longer_after_oom_and_after_the_budget(monkeypatch, tmp_path):
    monkeypatch.setattr(worker, "_TrainChild", _FakeChild)
    cfgs = tplan.expand(["tiny-llama"], [32, 64, 128], ["eager", "sdpa_math"], ["bf16"], [False])
    seen = []
    s = worker.run_train(cfgs, lock_dir=tmp_path, on_result=lambda r, i, n: seen.append((i, n)))
    got = [(r.attention, r.seq_len, r.status) for r in s.results]
    assert got == [("eager", 32, "ok"), ("eager", 64, "oom"), ("eager", 128, "skipped"),
                   ("sdpa_math", 32, "ok"), ("sdpa_math", 64, "oom"),
                   ("sdpa_math", 128, "skipped")]
    assert "s=64 of the same series" in s.results[2].message
    assert seen[-1] == (5, 6)
    s = worker.run_train(cfgs, lock_dir=tmp_path, budget_s=0)
    assert {r.status for r in s.results} == {"skipped"}
    assert "time budget of 0 s" in s.results[0].message


def test_command_line_writes_the_schema(tmp_path, monkeypatch):
    """python -m attnmem.measure --train ...: one real child process (under the Triton
    interpreter, so that our kernel runs on the CPU), eager and ours on a tiny Llama."""
    from attnmem.measure import cli

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # the GPU lock file lives there
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the child inherits it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "rows.csv"
    db = tmp_path / "results.sqlite"
    rc = cli.main(["--train", "--model", "tiny-llama", "--seq-len", "16", "--attention",
                   "eager", "triton", "--precision", "fp32", "--checkpointing", "on", "--out",
                   str(out), "--quiet", "--db", str(db), "--label", "tiny"])
    assert rc == 0
    with open(out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == list(tconfig.TRAIN_COLUMNS)
    typed = tstore.read_rows(out)
    assert typed[0]["checkpointing"] is True and typed[0]["seq_len"] == 16
    assert typed[0]["peak_bytes"] is None and typed[0]["params"] == 90432
    store = tstore.TrainStore(db)
    (run,) = store.runs()
    assert run["label"] == "tiny" and run["n"] == 2
    assert store.rows(run["id"]) == typed
    assert [r["attention"] for r in rows] == ["eager", "triton"]
    for r in rows:
        assert r["status"] == "ok", r["message"]
        assert r["checkpointing"] == "True" and r["model"] == "tiny-llama"
    # each configuration builds its own random model: only the loss scale is comparable
    assert all(abs(float(r["loss"]) - math.log(128)) < 0.5 for r in rows)


def test_repredict_rewrites_predictions(tmp_path):
    rows = [tconfig.TrainResult(model="llama3-8b-2l", layers=2, seq_len=1024, attention="sdpa_flash",
                           precision="bf16", status="ok", peak_bytes=10**10).to_row()]
    src, dst = tmp_path / "a.csv", tmp_path / "b.csv"
    with open(src, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(tconfig.TRAIN_COLUMNS)
        w.writerow(["" if rows[0][c] is None else rows[0][c] for c in tconfig.TRAIN_COLUMNS])
    assert tcli.main(["--repredict", str(src), "--out", str(dst)]) == 0
    (r,) = tstore.read_rows(dst)
    cfg = tconfig.TrainConfig("llama3-8b-2l", 1024, "sdpa_flash", "bf16")
    peak, before, why = predict.predict(cfg, tm.hf_config(cfg.model))
    assert (r["predicted_peak_bytes"], r["predicted_before_bytes"]) == (peak, before)
    if peak is not None:
        assert r["peak_rel_error"] == pytest.approx((peak - 10**10) / 10**10)


def test_read_rows_refuses_other_csvs(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("impl,seq_len\nnaive,1024\n")
    with pytest.raises(ValueError, match="not a training-step CSV"):
        tstore.read_rows(p)


@pytest.mark.parametrize("argv, words", [
    (["--model", "gpt5"], "unknown model(s) gpt5"),
    (["--attention", "flashy"], "unknown attention(s) flashy"),
    (["--seq-len", "10", "x"], "whole numbers"),
    (["--steps", "2"], "at least 3"),
    (["--checkpointing", "maybe"], "checkpointing"),
])
def test_command_line_refuses_bad_input(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        tcli.main(argv + ["--list"])
    assert words in str(info.value)


def test_command_line_lists_both_spellings_of_lists(capsys):
    assert tcli.main(["--model", "tiny-llama", "--seq-len", "16,32", "64", "--attention",
                    "eager", "triton", "--checkpointing", "both", "--list"]) == 0
    out = capsys.readouterr().out
    assert "12 configurations" in out


def test_reference_plan_covers_item_5():
    plan = tplan.reference_plan()
    assert len(plan) == len({(c.model, c.seq_len, c.attention, c.precision, c.checkpointing)
                             for c in plan})  # no duplicates
    assert plan[0].model == "llama3-8b-2l"  # the most important first (a budget cuts the end)
    # a short run already covers every architecture (tied, sliding-window, MHA, GQA)
    assert {c.model for c in plan[:40]} >= {"llama3-8b-2l", "llama2-7b-2l", "llama3.2-1b-2l",
                                            "mistral-7b-2l", "gemma3-27b-2l", "qwen3-4b-2l"}
    models = {c.model for c in plan}
    assert {"llama3-8b-2l", "llama3-8b-4l"} <= models and len(models) >= 5
    assert {"eager", "sdpa_flash", "sdpa_cudnn", "triton"} <= {c.attention for c in plan}
    assert {"bf16", "amp_bf16"} == {c.precision for c in plan}
    assert {True, False} == {c.checkpointing for c in plan}
    lengths = {c.seq_len for c in plan}
    assert min(lengths) <= 1024 and max(lengths) >= 32768
    assert any(s & (s - 1) for s in lengths)  # non-powers of two


# ---------------------------------------------------------------------------------------------
# GPU.
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_before_step_is_linear_in_layers():
    """bf16: two more layers add exactly their weights and two AdamW moments (3 x 2 bytes per
    parameter) to the memory before the step, and the step runs with ours and SDPA flash."""
    rows = {}
    for model in ("llama3-8b-2l", "llama3-8b-4l"):
        for attention in ("sdpa_flash", "triton"):
            r = procedure.measure_train_step(tconfig.TrainConfig(model, 1000, attention, "bf16"))
            assert r.status == "ok", r.message
            assert r.peak_bytes > r.before_step_bytes > 0
            rows[model, attention] = r
    for attention in ("sdpa_flash", "triton"):
        r2, r4 = rows["llama3-8b-2l", attention], rows["llama3-8b-4l", attention]
        extra = r4.before_step_bytes - r2.before_step_bytes
        assert abs(extra - 6 * (r4.params - r2.params)) <= 2 * 2**20


def test_attention_repredict_names_a_training_csv(tmp_path, capsys):
    """`python -m attnmem.measure --repredict` on a training-step CSV says what the file is and
    which command re-predicts it, exit 2, no traceback; a missing file is named the same way."""
    from attnmem.measure.cli import main as attention_main

    src = tmp_path / "steps.csv"
    src.write_text("model,arch,layers,batch,seq_len,predicted_peak_bytes\nx,llama,2,1,8,0\n")
    assert attention_main(["--repredict", str(src), "--out", str(tmp_path / "o.csv")]) == 2
    err = capsys.readouterr().err
    assert "--train --repredict" in err and str(src) in err
    assert attention_main(["--repredict", str(tmp_path / "nope.csv")]) == 2
    assert "nope.csv" in capsys.readouterr().err
