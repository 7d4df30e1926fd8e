"""The attnmem command line as a person meets it (issue 32, item 7): lengths written as 128k,
1M or 32,768; help that names every default; a plain table with units instead of Python
dicts; a --help that imports neither torch, pandas nor calc; and the pages' numbers."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import attnmem.calc
import attnmem.calc.serving
import attnmem.calc.units
from attnmem import cli
from attnmem.calc.gpus import torch_total_bytes
from attnmem.calc.training_step import PRECISIONS
from attnmem.calc.units import format_bytes
from attnmem.cli import main

ROOT = Path(__file__).parents[2]
LLAMA = "Llama 3.1 8B"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def run_text(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The error of a refused command line: exit status 2, one line, no traceback."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


# --- lengths ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, tokens", [
    ("131072", 131072), ("131,072", 131072), ("131_072", 131072), ("128k", 131072),
    ("128K", 131072), ("1M", 1 << 20), ("1m", 1 << 20), ("1.5k", 1536), ("32,768", 32768),
    (" 4096 ", 4096), ("1", 1), ("100,000,000", 100_000_000),
])
def test_seq_len_takes_the_ways_people_write_lengths(capsys: pytest.CaptureFixture[str],
                                                     text: str, tokens: int) -> None:
    out = run_json(capsys, "memory", "--model", "GPT-2 (124M)", "--seq-len", text)
    assert out["seq_len"] == tokens


@pytest.mark.parametrize("text", ["12,8", "1e6", "abc", "0", "-5", "1.3k", "200M", "", "4 096",
                                  "1,0000", "128kb", "nan", "١٢٨"])
def test_a_bad_length_is_named_with_what_is_accepted(capsys: pytest.CaptureFixture[str],
                                                     text: str) -> None:
    err = refused(capsys, "memory", "--model", LLAMA, "--seq-len", text)
    assert f"--seq-len: {text!r} is not accepted" in err
    assert "128k" in err and "1M" in err and "100,000,000" in err


def test_every_length_and_count_option_takes_the_same_forms(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "memory", "--model", "GPT-2 (124M)", "--seq-len", "1k",
                   "--batch", "1,024")
    assert out["batch"] == 1024
    out = run_json(capsys, "train", "--model", "GPT-2 (124M)", "--seq-len", "1k", "--batch", "2")
    assert out["peak_bytes"] == attnmem.calc.training_step(attnmem.calc.MODELS["GPT-2 (124M)"], 2, 1024,
                                                   attention="sdpa_flash").peak_bytes
    out = run_json(capsys, "serve", "--model", LLAMA, "--seq-len", "32k",
                   "--max-num-batched-tokens", "16k", "--max-num-seqs", "1,000",
                   "--non-torch-bytes", "0.5GiB", "--cuda-graph-bytes", "400MB",
                   "--activation-bytes", "2,000,000,000")
    assert (out["seq_len"], out["max_num_seqs"]) == (32768, 1000)
    assert (out["non_torch_bytes"], out["cuda_graph_bytes"]) == (2**29, 400 * 10**6)
    assert out["activation_bytes"] == 2 * 10**9 and not out["activation_estimated"]
    assert "--batch: '2M' is not accepted" in refused(
        capsys, "memory", "--model", LLAMA, "--seq-len", "1k", "--batch", "2M")
    assert "--non-torch-bytes: '1.5B' is not accepted" in refused(
        capsys, "serve", "--model", LLAMA, "--seq-len", "1k", "--non-torch-bytes", "1.5B")
    assert "'1.5' is not accepted" in refused(
        capsys, "serve", "--model", LLAMA, "--seq-len", "1k", "--gpu-memory-utilization", "1.5")


# --- help ------------------------------------------------------------------------------------------


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in cli._parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", ["memory", "train", "serve"])
def test_help_explains_every_option_and_names_its_default(command: str) -> None:
    sub = _subparsers()[command]
    text = sub.format_help()
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{command} {action.option_strings} has no help"
        says_default = "%(default)s" in action.help or "default:" in action.help
        assert action.required or says_default or action.option_strings == ["--json"], (
            f"{command} {action.option_strings} does not name its default")
    assert "default: NVIDIA H100 80GB)" in " ".join(text.split())
    assert "(default: sdpa_flash)" in " ".join(text.split())


def test_serve_help_names_vllms_defaults() -> None:
    text = " ".join(_subparsers()["serve"].format_help().split())
    for default in ("(default: 0.9)", "(default: 16)", "default: 8192)", "(default: 256)",
                    f"(default: {attnmem.calc.serving.DEFAULT_NON_TORCH_BYTES} bytes = 338 MiB)"):
        assert default in text


@pytest.mark.parametrize("args", [["--help"], ["memory", "--help"], ["serve", "--help"]])
def test_help_imports_neither_torch_pandas_nor_calc(args: list[str]) -> None:
    """The first --help took 8.5 s: calc imports pandas. Help must come from argparse alone."""
    code = ("import sys\nfrom attnmem.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "heavy = [m for m in ('torch', 'pandas', 'numpy', 'calc', 'streamlit') "
            "if m in sys.modules]\nprint('IMPORTED', heavy, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "IMPORTED []" in done.stderr, done.stderr
    assert "usage: attnmem" in done.stdout


def test_the_parsers_copies_of_calcs_defaults_are_calcs() -> None:
    """--help does not import attnmem.calc, so the parser carries copies; they must not drift."""
    assert cli.DEFAULT_GPU == attnmem.calc.DEFAULT_GPU
    assert cli.IMPLEMENTATIONS == tuple(attnmem.calc.IMPLEMENTATIONS)
    assert cli.TRAIN_ATTENTIONS == tuple(attnmem.calc.TRAIN_ATTENTIONS)
    assert cli.DTYPES == tuple(attnmem.calc.DTYPES)
    assert cli.PRECISIONS == tuple(PRECISIONS)
    assert (cli.MAX_SEQ_LEN, cli.MAX_BATCH) == (attnmem.calc.units.MAX_SEQ_LEN, attnmem.calc.units.MAX_BATCH)
    s = attnmem.calc.serving
    assert (cli.DEFAULT_GPU_MEMORY_UTILIZATION, cli.DEFAULT_BLOCK_SIZE, cli.BLOCK_SIZES,
            cli.DEFAULT_MAX_NUM_BATCHED_TOKENS, cli.DEFAULT_MAX_NUM_SEQS,
            cli.DEFAULT_NON_TORCH_BYTES, cli.DEFAULT_CUDA_GRAPH_BYTES) == (
        s.DEFAULT_GPU_MEMORY_UTILIZATION, s.DEFAULT_BLOCK_SIZE, tuple(s.BLOCK_SIZES),
        s.DEFAULT_MAX_NUM_BATCHED_TOKENS, s.DEFAULT_MAX_NUM_SEQS,
        s.DEFAULT_NON_TORCH_BYTES, s.DEFAULT_CUDA_GRAPH_BYTES)


# --- plain output --------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["memory", "--model", LLAMA, "--seq-len", "8k", "--gpu", "H100 80GB"],
    ["memory", "--model", "DeepSeek-V3 (MLA, MoE)", "--seq-len", "32k", "--gpu", "H200"],
    ["memory", "--model", "Qwen3-Next 80B-A3B (hybrid)", "--seq-len", "1000", "--batch", "64",
     "--gpu", "H200", "--weight-dtype", "int4"],
    ["memory", "--model", "GPT-2 (124M)", "--seq-len", "16", "--unit", "GiB"],
    ["train", "--model", LLAMA, "--seq-len", "8k", "--gpu", "H100 80GB"],
    ["train", "--model", "GPT-2 (124M)", "--seq-len", "1k", "--checkpointing"],
    ["serve", "--model", LLAMA, "--seq-len", "32k", "--gpu", "H200"],
    ["serve", "--model", LLAMA, "--seq-len", "1M", "--gpu", "T4"],
])
def test_plain_output_is_a_table_with_units_not_python(capsys: pytest.CaptureFixture[str],
                                                       args: list[str]) -> None:
    text = run_text(capsys, *args)
    assert "{" not in text and "(('" not in text and "True" not in text, text
    assert "0.00 " not in text  # small sizes switch to MB/KB
    assert " GB" in text or " GiB" in text


def test_memory_plain_shows_the_peak_its_phase_and_trained_context(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON fields the lead added (the peak of generate(), its phase and parts, the
    trained-context flags) are in both forms, with the same numbers."""
    args = ["memory", "--model", LLAMA, "--seq-len", "256k", "--gpu", "H200"]
    out = run_json(capsys, *args)
    for key in ("peak_phase", "peak_parts", "total_is_lower_bound", "trained_context",
                "seq_len_past_trained_context", "longest_context_past_trained_context"):
        assert key in out
    assert out["seq_len_past_trained_context"] and out["peak_phase"] and out["peak_parts"]
    assert sum(out["peak_parts"].values()) + out["state_bytes"] == out["total_bytes"]
    text = run_text(capsys, *args)
    assert out["peak_phase"] in text
    assert format_bytes(out["total_bytes"]) in text
    for part, n in out["peak_parts"].items():
        assert any(part in line and format_bytes(n) in line for line in text.splitlines())
    assert f"{out['longest_context']:,} tokens" in text
    assert f"past the {out['trained_context']:,} tokens this model was trained for" in text


def test_memory_plain_says_why_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    text = run_text(capsys, "memory", "--model", "DeepSeek-V3 (MLA, MoE)", "--seq-len", "1k",
                    "--gpu", "T4")
    assert "does not fit" in text and "the weights alone exceed the GPU" in text


def test_train_plain_equals_calc(capsys: pytest.CaptureFixture[str]) -> None:
    model, gpu = attnmem.calc.MODELS[LLAMA], torch_total_bytes("NVIDIA H100 80GB")
    text = run_text(capsys, "train", "--model", LLAMA, "--seq-len", "8k", "--gpu", "H100 80GB")
    step = attnmem.calc.training_step(model, 1, 8192, attention="sdpa_flash")
    assert format_bytes(step.peak_bytes) in text and step.peak_phase in text
    assert format_bytes(step.optimizer_bytes) in text
    assert "does not fit" in text and format_bytes(step.peak_bytes - gpu) in text
    longest = attnmem.calc.max_train_seq_len(model, gpu, 1, attention="sdpa_flash", precision="bf16",
                                     checkpointing=False)
    assert f"{longest:,} tokens" in text


def test_serve_plain_equals_calc(capsys: pytest.CaptureFixture[str]) -> None:
    model = attnmem.calc.MODELS[LLAMA]
    cap = attnmem.calc.serving.serving_capacity(model, "NVIDIA H200 141GB", 32768)
    text = run_text(capsys, "serve", "--model", LLAMA, "--seq-len", "32k", "--gpu", "H200",
                    "--unit", "GiB")
    assert f"KV blocks  {cap.num_blocks:,}".replace("  ", " ") in " ".join(text.split())
    assert f"concurrent requests: {cap.concurrent_sequences:,}" in text
    assert f"longest context of one request: {cap.max_context:,} tokens" in text
    assert format_bytes(cap.kv_pool_bytes, "GiB") in text
    assert "trained for" in text  # Llama 3.1's 131,072 tokens: vLLM would cap max_model_len


# --- the pages' numbers ----------------------------------------------------------------------------


def test_serve_uses_the_serving_pages_overheads(capsys: pytest.CaptureFixture[str]) -> None:
    """The Serving page takes non-torch memory and CUDA graphs in whole MiB; attnmem.calc.serving's
    defaults were 0.33 GiB and 0.36 GiB to the byte, so the page used 337 MiB and 368 MiB and
    `attnmem serve` 354,334,802 and 386,547,057 bytes: two answers to one question."""
    at = AppTest.from_file(str(ROOT / "attnmem" / "pages" / "serving.py"), default_timeout=60).run()
    assert not at.exception
    boxes = {n.label: n.value for n in at.number_input}
    out = run_json(capsys, "serve", "--model", LLAMA, "--seq-len", "32768")
    assert out["non_torch_bytes"] == boxes["Non-torch memory (MiB)"] * 2**20
    assert out["cuda_graph_bytes"] == boxes["CUDA graphs (MiB)"] * 2**20
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["KV blocks available"] == f"{out['num_blocks']:,}"
    assert metrics["Longest context of one request (tokens)"] == f"{out['max_context']:,}"
