"""What `attnmem` says about the GPU, the model file and the length it was given (issue 45,
item 8): an ambiguous --gpu lists only the GPUs it matched and what would pick one, --json
names the GPU it resolved, a missing config.json is "not found" with its path, a training step
without --seq-len says how to give one, and serve uses the dtypes it is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import attnmem.calc
from attnmem.calc.serving import serving_capacity
from attnmem.cli import main

LLAMA = "Llama 3.1 8B"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The error of a refused command line: exit status 2, one line, no traceback."""
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(list(args)))
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err, captured
    assert captured.err.count("\n") == 1, captured.err
    return captured.err


def gpus_named(text: str) -> set[str]:
    return {g for g in attnmem.calc.GPUS if g in text}


# --- --gpu ------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, hits", [
    ("H100", {"NVIDIA H100 80GB", "NVIDIA H100 NVL 94GB"}),
    ("a100", {"NVIDIA A100 40GB", "NVIDIA A100 80GB"}),
    ("AMD", {"AMD MI300X 192GB", "AMD MI325X 256GB"}),
])
def test_an_ambiguous_gpu_lists_exactly_the_gpus_it_matched(
        capsys: pytest.CaptureFixture[str], spec: str, hits: set[str]) -> None:
    err = refused(capsys, "memory", "--model", LLAMA, "--seq-len", "1k", "--gpu", spec)
    assert f"--gpu {spec!r} matches {len(hits)} GPUs" in err
    assert gpus_named(err) == hits, err


def test_an_ambiguous_gpu_says_what_would_pick_each_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The message offers a spelling for each GPU it matched; each of those spellings is then
    accepted and picks that GPU."""
    err = refused(capsys, "memory", "--model", LLAMA, "--seq-len", "1k", "--gpu", "H100")
    assert "--gpu 'H100 80GB'" in err and "--gpu 'H100 NVL'" in err, err
    for spelling, gpu in (("H100 80GB", "NVIDIA H100 80GB"), ("H100 NVL", "NVIDIA H100 NVL 94GB")):
        out = run_json(capsys, "memory", "--model", LLAMA, "--seq-len", "1k", "--gpu", spelling)
        assert out["gpu"] == gpu


@pytest.mark.parametrize("spec", ["Z99", "", "  "])
def test_a_gpu_that_matches_none_lists_every_gpu(capsys: pytest.CaptureFixture[str],
                                                 spec: str) -> None:
    err = refused(capsys, "memory", "--model", LLAMA, "--seq-len", "1k", "--gpu", spec)
    assert f"--gpu {spec!r} is not a GPU attnmem knows" in err, err
    assert "matches" not in err.split(";")[0]  # no "matches 0 GPUs" / "matches 16 GPUs"
    assert gpus_named(err) == set(attnmem.calc.GPUS)


def test_a_gpu_name_in_any_case_is_that_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "memory", "--model", LLAMA, "--seq-len", "1k", "--gpu",
                   "nvidia h100 80gb")
    assert out["gpu"] == "NVIDIA H100 80GB"


# --- --json names the resolved GPU ------------------------------------------------------------


@pytest.mark.parametrize("command", ["memory", "train", "serve"])
def test_json_carries_the_resolved_gpus_full_name(capsys: pytest.CaptureFixture[str],
                                                  command: str) -> None:
    out = run_json(capsys, command, "--model", LLAMA, "--seq-len", "4k", "--gpu", "h200")
    assert out["gpu"] == "NVIDIA H200 141GB"
    assert out["gpu_bytes"] == attnmem.calc.gpus.torch_total_bytes("NVIDIA H200 141GB")


def test_json_names_the_default_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "serve", "--model", LLAMA, "--seq-len", "4k")
    assert out["gpu"] == attnmem.calc.DEFAULT_GPU


# --- a config.json path -------------------------------------------------------------------------


def test_a_missing_config_file_is_not_found(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no" / "such" / "config.json"
    err = refused(capsys, "memory", "--model", str(missing), "--seq-len", "1k")
    assert "not found" in err and str(missing) in err, err
    assert "presets:" not in err  # a path is not a misspelled preset


def test_a_missing_relative_config_file_is_not_fetched_from_the_hub(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """models/config.json has the shape of a Hub id (owner/name); a name ending in .json is a
    file, so it is reported missing with its full path, not looked up on the Hub."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network, should the Hub be asked
    err = refused(capsys, "train", "--model", "models/config.json", "--seq-len", "1k")
    assert "not found" in err and str(tmp_path / "models" / "config.json") in err, err
    assert "huggingface" not in err.lower() and "cache" not in err, err


def test_a_folder_is_not_a_config_file(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text("{}")
    err = refused(capsys, "memory", "--model", str(tmp_path), "--seq-len", "1k")
    assert "is a folder" in err and str(tmp_path / "config.json") in err, err


def test_a_bad_config_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "mine.json"
    bad.write_text("{not json")
    err = refused(capsys, "serve", "--model", str(bad), "--seq-len", "1k")
    assert str(bad) in err and "not valid JSON" in err, err


# --- train without --seq-len -------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ["none", "lora", "qlora"])
def test_train_without_seq_len_uses_the_training_pages_default(
        capsys: pytest.CaptureFixture[str], adapter: str) -> None:
    """train without --seq-len runs at the Training step page's default length and says so;
    memory and serve, whose pages start at other lengths, still ask for one."""
    from attnmem.cli import TRAIN_SEQ_LEN

    root = Path(__file__).resolve().parents[2]
    page = (root / "attnmem" / "pages" / "training.py").read_text(encoding="utf-8")
    assert f'"s": IntParam({TRAIN_SEQ_LEN}, 1, MAX_SEQ_LEN)' in page
    assert run_json(capsys, "train", "--model", LLAMA, "--adapter", adapter)["seq_len"] == 4096
    assert main(["train", "--model", LLAMA, "--adapter", adapter]) == 0
    assert "s = 4,096 tokens (the default; --seq-len sets it)" in capsys.readouterr().out
    assert "--seq-len" in refused(capsys, "memory", "--model", LLAMA)


# --- serve's dtypes -------------------------------------------------------------------------------


def test_serve_uses_the_weight_and_kv_dtypes_it_is_given(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "serve", "--model", LLAMA, "--seq-len", "8k", "--weight-dtype",
                   "fp8_e4m3", "--kv-dtype", "fp8_e4m3")
    cap = serving_capacity(attnmem.calc.MODELS[LLAMA], "NVIDIA H100 80GB", 8192,
                           weight_dtype="fp8_e4m3", kv_dtype="fp8_e4m3")
    assert (out["weights_bytes"], out["page_bytes"]) == (cap.weights_bytes, cap.page_bytes)
    assert out["weights_bytes"] < run_json(capsys, "serve", "--model", LLAMA,
                                           "--seq-len", "8k")["weights_bytes"]


def test_serve_refuses_an_unknown_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, "serve", "--model", LLAMA, "--seq-len", "8k", "--kv-dtype", "fp7")
    assert "'fp7'" in err and "fp8_e4m3" in err, err
