"""attnmem.measure.train.trl_step: the TRL text's handling (no trl needed) and, where trl
imports, one real SFTTrainer step of the tiny model on the CPU that checks the trainer ran
the batch, length, checkpointing and optimizer calc's trl_kwargs counted."""

from __future__ import annotations

import importlib.util

import pytest

from attnmem.measure.train import trl_step


def test_plan_adds_the_harness_settings_and_counts_rows():
    p = trl_step.plan("per_device_train_batch_size=3 max_length=64 "
                      "gradient_accumulation_steps=2", 2, "/tmp/x")
    assert p.sft_args["max_steps"] == 2 and p.sft_args["save_strategy"] == "no"
    assert p.sft_args["report_to"] == "none" and p.sft_args["output_dir"] == "/tmp/x"
    assert p.max_length == 64 and p.rows == 3 * 2 * 2
    assert (p.mapping.batch, p.mapping.seq_len) == (3, 64)


def test_plan_uses_trl_defaults_and_packing_shape():
    p = trl_step.plan("", 1, "/tmp/x")
    assert (p.max_length, p.rows) == (1024, 8)  # SFTConfig max_length, TrainingArguments batch
    p = trl_step.plan('{"packing": true, "per_device_train_batch_size": 2, "max_length": 8}',
                      1, "/tmp/x")
    assert (p.mapping.batch, p.mapping.seq_len) == (1, 16)
    assert p.mapping.kwargs["packed_lengths"] == (8, 8)


@pytest.mark.parametrize("text, words", [
    ("max_steps=3", "max_steps: set by this harness"),
    ("output_dir=/x report_to=wandb", "output_dir, report_to"),
    ("fp16=true", "fp16=True"),
    ("optim=lion", "optim='lion'"),
    ("max_length", "is not key=value"),
    ("gradient_accumulation_steps=0", "gradient_accumulation_steps=0"),
])
def test_plan_refuses_with_the_value(text, words):
    with pytest.raises(ValueError, match="accepted|key=value") as err:
        trl_step.plan(text, 1, "/tmp/x")
    assert words in str(err.value)


def test_plan_refuses_bad_steps():
    with pytest.raises(ValueError, match="steps=0"):
        trl_step.plan("", 0, "/tmp/x")


def test_mismatches_name_each_difference():
    from attnmem.calc.train_levers import trl_kwargs

    m = trl_kwargs({"per_device_train_batch_size": 2, "max_length": 16})
    ok = trl_step.Seen(input_shapes=[(2, 16)], checkpointing=True, optimizer_class="AdamW",
                       optimizer_fused=True)
    assert trl_step.mismatches(ok, m) == []
    bad = trl_step.Seen(input_shapes=[(2, 12)], checkpointing=False, optimizer_class="AdamW",
                        optimizer_fused=False)
    out = trl_step.mismatches(bad, m)
    assert any("(2, 12)" in x for x in out) and any("checkpointing False" in x for x in out)
    assert any("fused=False" in x for x in out)
    assert trl_step.mismatches(trl_step.Seen(), m)[0] == "no forward seen in the measured step"


def test_cli_names_a_bad_model(capsys):
    with pytest.raises(SystemExit):
        trl_step.main(["--model", "nope", "--trl-args", "", "--device", "cpu",
                       "--out", "/tmp/never.csv"])
    assert "model 'nope': accepted:" in capsys.readouterr().err


def _trl_or_skip():
    if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
        pytest.skip("trl/datasets not installed here: pip install --no-deps the wheels "
                    "trl 1.16.0, datasets 5.2.0, dill 0.4.1, multiprocess 0.70.19 (+ xxhash) "
                    "into a folder on PYTHONPATH (NOTES.md, Fine-tuning recipes)")
    return pytest.importorskip("trl")


@pytest.mark.parametrize("text, shape, ckpt, optim", [
    ("per_device_train_batch_size=2 max_length=32 optim=adamw_torch", "2x32", True,
     "AdamW"),
    ("per_device_train_batch_size=3 max_length=16 packing=true gradient_checkpointing=false "
     "optim=sgd", "1x48", False, "SGD"),
])
def test_one_real_sft_step_on_cpu(tmp_path, text, shape, ckpt, optim):
    _trl_or_skip()
    out = tmp_path / "row.csv"
    assert trl_step.main(["--model", "tiny-llama", "--trl-args", text, "--device", "cpu",
                          "--attention", "eager", "--out", str(out)]) == 0
    import csv

    (row,) = list(csv.DictReader(out.open()))
    assert row["mismatches"] == ""
    assert row["input_shape"] == shape
    assert row["checkpointing"] == str(ckpt)
    assert row["optimizer_class"].startswith(optim)
    assert int(row["calc_peak_bytes"]) > 0 and row["peak_bytes"] == ""  # no CUDA here
