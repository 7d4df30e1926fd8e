"""`attnmem train --optimizer --kbit-prepare --liger --offload-activations --trl-args --cheapest`
(issue 43): the numbers are attnmem.calc.training_step's, TRL's arguments set batch, length and
levers, the cheapest combination fits, and a bad TRL value is one line naming it."""

from __future__ import annotations

import json

import pytest

import attnmem.calc
from attnmem.cli import main

LLAMA = "Llama 3.1 8B"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_levers_are_calcs(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "train", "--model", LLAMA, "--seq-len", "4096", "--gpu", "H100 80GB",
                 "--liger", "--optimizer", "adamw_8bit")
    want = attnmem.calc.training_step(attnmem.calc.MODELS[LLAMA], 1, 4096,
                                      attention="sdpa_flash", liger=True,
                                      optimizer="adamw_8bit")
    assert r["peak_bytes"] == want.peak_bytes and r["liger"] and r["optimizer"] == "adamw_8bit"


def test_trl_args_and_cheapest(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "train", "--model", LLAMA, "--gpu", "H100 80GB", "--impl", "triton",
                 "--trl-args", "per_device_train_batch_size=2,max_length=8192,packing=true,"
                 "loss_type=nll", "--cheapest")
    assert (r["seq_len"], r["packed_lengths"]) == (16384, [8192, 8192])
    assert r["checkpointing"] and r["optimizer"] == "adamw_fused"  # TRL's defaults
    c = r["cheapest"]
    assert c["fits"] and c["peak_bytes"] <= r["gpu_bytes"]
    assert r["fits"] == (c["levers"] == [])


def test_bad_trl_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["train", "--model", LLAMA, "--trl-args", "optim=lion"]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "lion" in err and "Traceback" not in err and err.count("\n") == 1, err


def test_trl_fused_head_flag_and_trl_text_count_the_same_loss(capsys):
    """--trl-fused-head counts the loss through TRL's fused LM head (calc loss='trl_fused'),
    and pasted TRL arguments (trl 1.16: loss_type nll is that head) set it too: the same peak,
    lower than the model's own loss at 16k, and said in the header and the JSON."""
    import json

    from attnmem.cli import main

    base = ["train", "--model", "Llama 3.1 8B", "--seq-len", "16k", "--checkpointing",
            "--optimizer", "adamw_fused", "--batch", "1", "--json"]
    assert main(base) == 0
    own = json.loads(capsys.readouterr().out)
    assert main([*base, "--trl-fused-head"]) == 0
    fused = json.loads(capsys.readouterr().out)
    assert own["loss"] == "full" and fused["loss"] == "trl_fused"
    assert fused["peak_bytes"] < own["peak_bytes"]
    assert main(["train", "--model", "Llama 3.1 8B", "--json", "--trl-args",
                 "per_device_train_batch_size=1 max_length=16384"]) == 0
    trl = json.loads(capsys.readouterr().out)
    assert trl["loss"] == "trl_fused" and trl["peak_bytes"] == fused["peak_bytes"]
    assert main(["train", "--model", "Llama 3.1 8B", "--seq-len", "16k",
                 "--trl-fused-head"]) == 0
    assert "TRL's fused LM head" in capsys.readouterr().out.splitlines()[0]
