"""A longest trainable context past the context the model was trained for is flagged, on the
Training step page and in `attnmem train` (the standard every "longest context" in the app and
the CLI follows); a packed row counts its longest sequence, whose positions restart."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

import attnmem.calc
from attnmem.cli import main

PAGE = str(Path(__file__).parents[2] / "attnmem" / "pages" / "training.py")
PHI3 = "Phi-3 mini (3.8B)"  # trained for 4,096 tokens
H200 = "NVIDIA H200 141GB"


def _page(params: dict[str, str]) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    for k, v in params.items():
        at.query_params[k] = v
    return at.run()


def test_training_page_flags_a_longest_context_past_the_trained_one() -> None:
    # cuDNN first: it takes the sliding-window mask Phi-3's 2,047-token window needs past
    # 2,046 tokens (flash has no kernel there, so its longest context is 2,046)
    at = _page({"model": PHI3, "gpu": H200, "s": "1024", "ckpt": "true",
                "attns": "sdpa_cudnn"})
    assert not at.exception
    longest = attnmem.calc.max_train_seq_len(attnmem.calc.MODELS[PHI3], attnmem.calc.torch_total_bytes(H200), 1,
                                     attention="sdpa_cudnn", checkpointing=True)
    assert attnmem.calc.max_train_seq_len(attnmem.calc.MODELS[PHI3], attnmem.calc.torch_total_bytes(H200), 1,
                                  attention="sdpa_flash", checkpointing=True) == 2046
    assert longest > 4096  # the premise: memory allows more than the model was trained for
    notes = [x.value for x in at.caption if "trained for" in x.value]
    assert notes and "4,096 tokens" in notes[0]


def test_training_page_says_nothing_when_the_longest_is_within() -> None:
    at = _page({"model": "Llama 3.1 8B", "s": "1024"})  # 131,072 trained; H100 fits less
    assert not at.exception
    assert not [x.value for x in at.caption if "this model was trained for" in x.value]


def test_attnmem_train_flags_the_step_and_the_longest_context(capsys) -> None:
    assert main(["train", "--model", PHI3, "--seq-len", "1000", "--checkpointing",
                 "--gpu", H200, "--impl", "sdpa_cudnn", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["trained_context"] == 4096 and r["longest_context"] > 4096
    assert r["longest_context_past_trained_context"] and not r["seq_len_past_trained_context"]
    assert main(["train", "--model", PHI3, "--seq-len", "1000", "--checkpointing",
                 "--gpu", H200, "--impl", "sdpa_cudnn"]) == 0
    assert "(past the 4,096 tokens this model was trained for)" in capsys.readouterr().out
    # a packed row: its longest sequence counts, not the total
    assert main(["train", "--model", PHI3, "--packed", "4000,4000", "--impl", "triton", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert not r["seq_len_past_trained_context"] and r["longest_context"] is None
    assert main(["train", "--model", PHI3, "--packed", "5000,100", "--impl", "triton", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["seq_len_past_trained_context"]
