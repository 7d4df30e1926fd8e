"""`attnmem train --adapter none|lora|qlora --rank --targets --adapter-dtype --double-quant`
(issue 34, item 4): the options parse, the numbers equal attnmem.calc.training_step's (the Training
page's call, attnmem.calc.finetune.calc_kwargs), and a bad value is one line naming it."""

from __future__ import annotations

import json

import pytest

import attnmem.calc
from attnmem import cli
from attnmem.calc import finetune
from attnmem.calc.gpus import torch_total_bytes
from attnmem.calc.training_step import ADAPTER_DTYPES, LORA_TARGET_SETS, LoRA, lora_adapter_params
from attnmem.cli import main

LLAMA = "Llama 3.1 8B"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as e:
        code = main(list(args))
        raise SystemExit(code)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_the_parsers_copies_are_calcs_and_the_pages() -> None:
    assert cli.ADAPTERS == ("none", *finetune.METHODS[1:])
    assert cli.LORA_TARGETS == tuple(LORA_TARGET_SETS) == finetune.TARGETS
    assert cli.ADAPTER_DTYPES == tuple(ADAPTER_DTYPES)
    assert cli.DEFAULT_LORA_RANK == finetune.DEFAULT_RANK
    assert cli.DEFAULT_LORA_TARGETS == finetune.DEFAULT_TARGETS
    assert cli.DEFAULT_ADAPTER_DTYPE == finetune.DEFAULT_ADAPTER_DTYPE


@pytest.mark.parametrize(("args", "lora", "base"), [
    (["--adapter", "lora"], LoRA(16), "bf16"),
    (["--adapter", "lora", "--rank", "64", "--targets", "attention", "--adapter-dtype", "bf16"],
     LoRA(64, targets="attention", adapter_dtype="bf16"), "bf16"),
    (["--adapter", "qlora", "--rank", "8"], LoRA(8), "nf4"),
    (["--adapter", "qlora", "--double-quant", "--checkpointing"], LoRA(16), "nf4_dq"),
])
def test_adapter_numbers_equal_calc(capsys: pytest.CaptureFixture[str], args: list[str],
                                    lora: LoRA, base: str) -> None:
    out = run_json(capsys, "train", "--model", LLAMA, "--seq-len", "4k", "--gpu", "H100 80GB",
                   *args)
    model = attnmem.calc.MODELS[LLAMA]
    kw = dict(attention="sdpa_flash", checkpointing="--checkpointing" in args, adapters=lora,
              base_dtype=base)
    m = attnmem.calc.training_step(model, 1, 4096, **kw)
    gpu = torch_total_bytes("NVIDIA H100 80GB")
    assert out["peak_bytes"] == m.peak_bytes and out["weights_bytes"] == m.weights_bytes
    assert out["gradients_bytes"] == m.gradients_bytes
    assert out["longest_context"] == attnmem.calc.max_train_seq_len(model, gpu, 1, **kw)
    assert out["fits"] == (m.peak_bytes <= gpu)
    assert (out["adapter"], out["lora_rank"], out["lora_targets"], out["adapter_dtype"],
            out["base_dtype"], out["double_quant"]) == (
        args[1], lora.rank, lora.targets, lora.adapter_dtype, base, base == "nf4_dq")
    assert out["trainable_params"] == lora_adapter_params(model, lora)


def test_full_training_is_the_default_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "train", "--model", "Mixtral 8x7B", "--seq-len", "1k")
    model = attnmem.calc.MODELS["Mixtral 8x7B"]  # a MoE model: counted now
    assert out["peak_bytes"] == attnmem.calc.training_step(model, 1, 1024,
                                                   attention="sdpa_flash").peak_bytes
    assert out["adapter"] == "none" and out["lora_rank"] is None and out["base_dtype"] == "bf16"
    assert out["trainable_params"] == attnmem.calc.param_count(model)


def test_plain_output_names_the_method(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--model", "Llama 3.1 70B", "--seq-len", "4k", "--adapter", "qlora",
                 "--double-quant", "--checkpointing", "--gpu", "H100 80GB"]) == 0
    text = capsys.readouterr().out
    m = attnmem.calc.training_step(attnmem.calc.MODELS["Llama 3.1 70B"], 1, 4096, attention="sdpa_flash",
                           checkpointing=True, adapters=LoRA(16), base_dtype="nf4_dq")
    assert "QLoRA: rank 16, targets all-linear" in text and "double quantization" in text
    assert attnmem.calc.format_bytes(m.peak_bytes, "GB") in text
    assert "{" not in text and "True" not in text


def test_help_names_the_adapter_options_and_defaults() -> None:
    import argparse

    action = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(action.choices["train"].format_help().split())
    for option in ("--adapter", "--rank", "--targets", "--adapter-dtype", "--double-quant"):
        assert option in text
    assert "(default: none)" in text and "(default: 16)" in text
    assert "(default: all-linear)" in text and "(default: fp32)" in text


@pytest.mark.parametrize(("args", "said"), [
    (["--adapter", "dora"], "--adapter: invalid choice: 'dora'"),
    (["--adapter", "lora", "--rank", "0"], "--rank: '0' is not accepted"),
    (["--adapter", "lora", "--rank", "x"], "--rank: 'x' is not accepted"),
    (["--adapter", "lora", "--targets", "mlp"], "--targets: invalid choice: 'mlp'"),
    (["--adapter", "lora", "--adapter-dtype", "fp16"], "--adapter-dtype: invalid choice: 'fp16'"),
    (["--rank", "8"], "--rank applies to --adapter lora or qlora"),
    (["--adapter", "lora", "--double-quant"], "--double-quant applies to --adapter qlora"),
    (["--adapter", "lora", "--act-dtype", "amp_bf16"], "precision 'amp_bf16' with adapters"),
])
def test_bad_adapter_values_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str],
                                         said: str) -> None:
    err = refused(capsys, "train", "--model", LLAMA, "--seq-len", "1k", *args)
    assert said in err, err


def test_what_calc_refuses_is_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, "train", "--model", "Mixtral 8x7B", "--seq-len", "1k",
                  "--adapter", "lora")
    assert "LoRA adapters on a MoE model are not modelled" in err
    err = refused(capsys, "train", "--model", "gpt-oss-20b (MoE, MXFP4)", "--seq-len", "1k")
    assert "only eager is modelled" in err  # gpt-oss: transformers refuses SDPA for it
