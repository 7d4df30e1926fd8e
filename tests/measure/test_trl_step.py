"""attnmem.measure.train.trl_step: the TRL text's handling (no trl needed) and, where trl
imports, one real SFTTrainer step of the tiny model on the CPU that checks the trainer ran
the batch, length, checkpointing, optimizer and attention calc's trl_kwargs counted.

The first H100 run of a packed step forced SDPA's flash backend and stopped in the step with
torch's "No available kernel": TRL's padding-free batch makes transformers pass a block-diagonal
mask to SDPA, which flash refuses. Here: the packed step's SDPA calls are recorded on the CPU
(each carries that mask), the plan runs SDPA unforced as TRL users get it (torch then picks the
memory-efficient backend, which calc counts), and forcing flash on a packed run is refused
before anything is built."""

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


def test_plan_runs_sdpa_as_trl_does():
    """No --attention: transformers' default sdpa, no backend forced; calc counts flash for full
    rows and the memory-efficient backend for padding-free rows (their mask rules flash out)."""
    dense = trl_step.plan("per_device_train_batch_size=2 max_length=64", 1, "/tmp/x")
    assert (dense.attention, dense.attn_implementation, dense.forced) == ("sdpa_flash", "sdpa",
                                                                         None)
    packed = trl_step.plan("per_device_train_batch_size=2 max_length=64 packing=true", 1,
                           "/tmp/x")
    assert (packed.attention, packed.attn_implementation, packed.forced) == (
        "sdpa_efficient", "sdpa", None)
    eager = trl_step.plan('{"packing": true, "model_init_kwargs": '
                          '{"attn_implementation": "eager"}}', 1, "/tmp/x")
    assert (eager.attention, eager.attn_implementation, eager.forced) == ("eager", "eager", None)
    assert "model_init_kwargs" not in eager.sft_args  # the harness builds the model


def test_plan_forces_a_named_backend():
    p = trl_step.plan("packing=true", 1, "/tmp/x", attention="sdpa_efficient")
    assert (p.attention, p.attn_implementation, p.forced) == ("sdpa_efficient", "sdpa",
                                                             "sdpa_efficient")
    p = trl_step.plan("max_length=64", 1, "/tmp/x", attention="sdpa_flash")
    assert p.forced == "sdpa_flash"


def test_forcing_flash_on_a_packed_run_is_refused_before_the_step():
    """The first GPU run's failure: flash forced over TRL's padding-free rows."""
    with pytest.raises(ValueError) as err:
        trl_step.plan("per_device_train_batch_size=2 max_length=4096 packing=true", 1, "/tmp/x",
                      attention="sdpa_flash")
    said = str(err.value)
    assert "attention 'sdpa_flash' with TRL's padding-free rows" in said
    assert "No available kernel" in said and "takes no mask" in said
    assert "torch picks sdpa_efficient" in said


@pytest.mark.parametrize("text, attention, words", [
    ('{"model_init_kwargs": {"dtype": "float32"}}', None, "model_init_kwargs dtype"),
    ('{"model_init_kwargs": {"attn_implementation": "eager"}}', "eager", "give one"),
    ('{"model_init_kwargs": {"attn_implementation": "flash_attention_2"}}', None,
     "flash_attention_2"),
    ("max_length=64", "flex", "attention 'flex': accepted"),
])
def test_plan_refuses_attention_it_cannot_run(text, attention, words):
    with pytest.raises(ValueError) as err:
        trl_step.plan(text, 1, "/tmp/x", attention=attention)
    assert words in str(err.value)


def test_sdpa_mismatches_check_the_backend_calc_counted():
    flash_call = ("none", True, True)
    masked_call = ("bool 1x1x48x48", False, False)
    # CUDA: the backend torch's dispatcher picked
    seen = trl_step.Seen(sdpa_calls=[masked_call], sdpa_backends=["EFFICIENT_ATTENTION"])
    assert trl_step.sdpa_mismatches(seen, "sdpa_efficient", cuda=True) == []
    out = trl_step.sdpa_mismatches(seen, "sdpa_flash", cuda=True)
    assert out == ["SDPA backend EFFICIENT_ATTENTION, calc counted sdpa_flash "
                   "(FLASH_ATTENTION)"]
    # CPU: the premise of calc's choice (flash takes no mask; efficient is picked for one)
    assert trl_step.sdpa_mismatches(trl_step.Seen(sdpa_calls=[flash_call]), "sdpa_flash",
                                    cuda=False) == []
    out = trl_step.sdpa_mismatches(trl_step.Seen(sdpa_calls=[masked_call]), "sdpa_flash",
                                   cuda=False)
    assert len(out) == 1 and "mask bool 1x1x48x48" in out[0] and "takes no mask" in out[0]
    out = trl_step.sdpa_mismatches(trl_step.Seen(sdpa_calls=[flash_call]), "sdpa_efficient",
                                   cuda=False)
    assert len(out) == 1 and "needs mask" in out[0]
    assert trl_step.sdpa_mismatches(trl_step.Seen(), "sdpa_efficient", cuda=False) == [
        "no SDPA call seen in the measured step, calc counted sdpa_efficient"]
    assert trl_step.sdpa_mismatches(trl_step.Seen(sdpa_calls=[flash_call]), "eager",
                                    cuda=False) == ["SDPA called under attention 'eager'"]


def test_progress_lines_are_flushed_to_stderr(capsys):
    trl_step.say("building the model")
    err = capsys.readouterr().err
    assert err.startswith("[trl_step ") and err.endswith("s] building the model\n")


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


@pytest.mark.parametrize("text, attention, shape, ckpt, optim, calls", [
    # full rows, SDPA as TRL runs it: no mask, is_causal, GQA in SDPA -> flash counted
    ("per_device_train_batch_size=2 max_length=32 optim=adamw_torch", None, "2x32", True,
     "AdamW", "mask none, is_causal=True, enable_gqa=True"),
    # packed (padding-free): the block-diagonal bool mask reaches every SDPA call (what made
    # CUDA's forced flash stop), k and v repeated -> memory-efficient counted
    ("per_device_train_batch_size=3 max_length=16 packing=true gradient_checkpointing=false "
     "optim=sgd", None, "1x48", False, "SGD",
     "mask bool 1x1x48x48, is_causal=False, enable_gqa=False"),
    ("per_device_train_batch_size=3 max_length=16 packing=true optim=sgd", "eager", "1x48",
     True, "SGD", ""),
])
def test_one_real_sft_step_on_cpu(tmp_path, capsys, text, attention, shape, ckpt, optim,
                                  calls):
    _trl_or_skip()
    out = tmp_path / "row.csv"
    extra = ["--attention", attention] if attention else []
    assert trl_step.main(["--model", "tiny-llama", "--trl-args", text, "--device", "cpu",
                          "--out", str(out), *extra]) == 0
    import csv

    (row,) = list(csv.DictReader(out.open()))
    assert row["mismatches"] == ""
    assert row["input_shape"] == shape
    assert row["checkpointing"] == str(ckpt)
    assert row["optimizer_class"].startswith(optim)
    assert row["sdpa_calls"] == calls and row["sdpa_forced"] == ""
    want = attention or ("sdpa_efficient" if "packing" in text else "sdpa_flash")
    assert row["attention"] == want
    assert int(row["calc_peak_bytes"]) > 0 and row["peak_bytes"] == ""  # no CUDA here
    err = capsys.readouterr().err  # each stage said as it began, the step's too
    for stage in ("importing torch", "building the model on cpu", "building SFTTrainer",
                  "step 1 of 1 begins", "forward and backward done", "row appended"):
        assert stage in err, stage
