"""`attnmem train --gpus --sharding --ep` (issue 34: expert parallelism as a layout dimension):
the numbers equal attnmem.calc.training_step's for that layout, the defaults are one GPU, and a layout
calc refuses is one line naming the value."""

from __future__ import annotations

import json

import pytest

import attnmem.calc
from attnmem.cli import _parser, main

MIXTRAL = "Mixtral 8x7B"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sharding_choices_are_calcs() -> None:
    train = _parser()._subparsers._group_actions[0].choices["train"]
    sharding = next(a for a in train._actions if a.dest == "sharding")
    assert tuple(sharding.choices) == attnmem.calc.SHARDINGS


@pytest.mark.parametrize("args, layout", [
    ([], dict(gpus=1, sharding="none", ep=1)),
    (["--ep", "8"], dict(gpus=8, sharding="none", ep=8)),
    (["--gpus", "16", "--ep", "4", "--sharding", "zero3"], dict(gpus=16, sharding="zero3", ep=4)),
])
def test_layout_numbers_equal_calc(capsys: pytest.CaptureFixture[str], args: list[str],
                                   layout: dict) -> None:
    out = run_json(capsys, "train", "--model", MIXTRAL, "--seq-len", "4k", "--checkpointing",
                   *args)
    m = attnmem.calc.training_step(attnmem.calc.MODELS[MIXTRAL], 1, 4096, attention="sdpa_flash",
                           checkpointing=True, **layout)
    assert out["peak_bytes"] == m.peak_bytes
    assert out["weights_bytes"] == m.weights_bytes
    assert out["layout"] == {"gpus": layout["gpus"], "tp": 1, "sharding": layout["sharding"],
                             "ep": layout["ep"]}


def test_text_names_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--model", MIXTRAL, "--seq-len", "4k", "--ep", "8"]) == 0
    assert "per GPU of 8: sharding none, expert parallel over 8 ranks" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["--gpus", "6", "--ep", "3"], "ep (3) must divide the experts per layer (8)"),
    (["--gpus", "8", "--ep", "3"], "ep (3) must divide the data-parallel ranks"),
    (["--ep", "0"], "--ep"),
])
def test_refusals_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str],
                               says: str) -> None:
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["train", "--model", MIXTRAL, "--seq-len", "4k", *args]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_dense_model_with_ep_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--model", "Llama 3.1 8B", "--seq-len", "4k", "--ep", "2"]) == 2
    assert "dense" in capsys.readouterr().err
