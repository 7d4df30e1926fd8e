"""`attnmem train` for a model whose type calc has no rules for (issue 42, item 5): one training
step traced on the meta device (attnmem.trace.training), full training and LoRA in bf16, with a
"counted from" line; the options the trace does not run are refused, each named, with what it
runs; never a traceback."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from attnmem.calc.train_lora import LORA_TARGET_SETS  # noqa: E402
from attnmem.cli import main  # noqa: E402
from attnmem.trace.training import trace_training  # noqa: E402

S = 256


def _olmo2(tmp_path) -> tuple[str, dict]:
    cfg = transformers.Olmo2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=1000, pad_token_id=None)
    d = {**cfg.to_dict(), "model_type": "olmo2"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    return str(path), d


def test_full_training_is_traced_and_says_so(tmp_path, capsys) -> None:
    path, d = _olmo2(tmp_path)
    assert main(["train", "--model", path, "--seq-len", str(S), "--batch", "2",
                 "--gpu", "H100 80GB", "--checkpointing", "--impl", "eager", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    t = trace_training(d, 2, S, attention="eager", checkpointing=True)
    assert (r["peak_bytes"], r["before_step_bytes"], r["weights_bytes"]) == (
        t.peak_bytes, t.before_step_bytes, t.weights_bytes)
    assert r["trainable_params"] == t.trainable_params and r["adapter"] == "none"
    assert r["counted_from"].startswith("trace: transformers") and "'olmo2'" in r["counted_from"]
    assert r["fits"] is True and r["longest_context"] is None
    assert r["at_peak"][0] == list(t.at_peak[0])
    assert main(["train", "--model", path, "--seq-len", str(S), "--gpu", "H100 80GB"]) == 0
    text = capsys.readouterr().out
    assert "Olmo2ForCausalLM" in text and "training step" in text
    assert "counted from the trace" in text and "not searched for a traced model" in text
    assert "peak of the step" in text and "before the step" in text


def test_default_length_is_said(tmp_path, capsys) -> None:
    path, _ = _olmo2(tmp_path)
    assert main(["train", "--model", path, "--gpu", "H100 80GB", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["seq_len"] == 4096 and r["seq_len_is_default"] is True


def test_lora_is_traced_through_peft(tmp_path, capsys) -> None:
    path, d = _olmo2(tmp_path)
    assert main(["train", "--model", path, "--seq-len", str(S), "--gpu", "H100 80GB",
                 "--adapter", "lora", "--rank", "8", "--targets", "all-linear", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    t = trace_training(d, 1, S, attention="sdpa_flash", lora_rank=8,
                       lora_targets=LORA_TARGET_SETS["all-linear"])
    assert r["peak_bytes"] == t.peak_bytes and r["trainable_params"] == t.trainable_params
    assert r["adapter"] == "lora" and r["lora_rank"] == 8 and r["adapter_dtype"] == "fp32"
    assert r["lora_targets"] == list(LORA_TARGET_SETS["all-linear"])
    full = trace_training(d, 1, S, attention="sdpa_flash")
    assert r["trainable_params"] < full.trainable_params
    assert main(["train", "--model", path, "--seq-len", str(S), "--gpu", "H100 80GB",
                 "--adapter", "lora", "--rank", "8"]) == 0
    assert "LoRA (peft): rank 8" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "named"), [
    (["--adapter", "qlora"], "--adapter qlora"),
    (["--adapter", "lora", "--adapter-dtype", "bf16"], "--adapter-dtype bf16"),
    (["--act-dtype", "amp_bf16"], "--act-dtype amp_bf16"),
    (["--optimizer", "adamw_8bit"], "--optimizer adamw_8bit"),
    (["--liger"], "--liger"),
    (["--offload-activations"], "--offload-activations"),
    (["--adapter", "qlora", "--checkpointing", "--kbit-prepare"], "--kbit-prepare"),
    (["--packed", "100,156"], "--packed"),
    (["--impl", "triton"], "--impl triton"),
    (["--impl", "fa4"], "--impl fa4"),
    (["--gpus", "2"], "--gpus 2"),
    (["--cheapest"], "--cheapest"),
    (["--trl-args", "per_device_train_batch_size=2"], "as --trl-args set them"),
])
def test_what_the_trace_does_not_run_is_refused_by_name(tmp_path, capsys, extra, named) -> None:
    path, _ = _olmo2(tmp_path)
    args = ["train", "--model", path, "--gpu", "H100 80GB", *extra]
    if "--packed" not in extra:
        args += ["--seq-len", str(S)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "'olmo2' is not one this calculator has rules for" in err
    assert f"does not run {named}" in err or named in err
    assert "It runs full training or --adapter lora" in err and "Traceback" not in err


def test_no_kernel_and_a_config_transformers_cannot_run(tmp_path, capsys) -> None:
    path, _ = _olmo2(tmp_path)  # grouped-query heads: no memory-efficient kernel
    assert main(["train", "--model", path, "--seq-len", str(S), "--gpu", "H100 80GB",
                 "--impl", "sdpa_efficient"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnmem train: error: --impl sdpa_efficient:") and "kernel" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model_type": "olmo2", "hidden_size": 64, "vocab_size": 100,
                               "num_hidden_layers": 1, "pad_token_id": None,
                               "num_attention_heads": 4, "intermediate_size": -5}))
    assert main(["train", "--model", str(bad), "--seq-len", str(S),
                 "--gpu", "H100 80GB"]) == 2
    err = capsys.readouterr().err
    assert "rules for" in err and "and the trace" in err and "Traceback" not in err
