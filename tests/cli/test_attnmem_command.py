"""The attnmem command line: the numbers the calc functions give, --json, and bad input
answered with one line and exit status 2 (no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import attnmem.calc
import attnmem.calc.gpus
from attnmem.calc.serving import serving_capacity
from attnmem.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf_configs"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_memory_prints_what_calc_computes(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "memory", "--model", "DeepSeek-V3 (MLA, MoE)", "--seq-len", "32768",
                   "--gpu", "H200", "--kv-dtype", "bf16")
    model = attnmem.calc.MODELS["DeepSeek-V3 (MLA, MoE)"]
    assert out["kv_cache_bytes"] == attnmem.calc.kv_cache_bytes(model, 1, 32768, "bf16")
    assert out["kv_cache_bytes"] == 61 * 32768 * (512 + 64) * 2  # the latent, 2.3 GB
    assert out["kv_cache_expanded_bytes"] == 61 * 32768 * 128 * (192 + 128) * 2
    assert out["params"] == attnmem.calc.param_count(model)


def test_memory_reads_a_config_file_path(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "memory", "--model", str(FIXTURES / "Jamba-v0.1.json"),
                   "--seq-len", "4096")
    assert out["params"] == attnmem.calc.param_count(attnmem.calc.MODELS["Jamba v0.1 (hybrid)"])
    assert out["state_bytes"] > 0


def test_memory_counts_a_hybrids_state_in_the_total_as_the_page_does(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The Model memory page adds a hybrid's constant state (at the attention dtype) to the
    total and searches the longest context in what it leaves; the command line did neither
    (Qwen3-Next, B = 64, int4 weights, H200: 41.94 GB and 52,786 tokens against the page's
    44.47 GB and 51,582)."""
    model = attnmem.calc.MODELS["Qwen3-Next 80B-A3B (hybrid)"]
    gpu = attnmem.calc.gpus.torch_total_bytes("NVIDIA H200 141GB")  # what "fits" uses, as the pages
    out = run_json(capsys, "memory", "--model", model.name, "--seq-len", "1000", "--batch", "64",
                   "--gpu", "H200", "--weight-dtype", "int4", "--kv-dtype", "fp8_e4m3")
    state = attnmem.calc.kv.state_bytes(model, 64, "bf16")  # the attention dtype, not the KV cache's
    mm = attnmem.calc.model_memory(model, 64, 1000, "int4", "fp8_e4m3", "bf16", "sdpa_flash")
    assert out["state_bytes"] == state > 0
    assert out["total_bytes"] == mm.total_bytes + state
    assert out["longest_context"] == attnmem.calc.model_max_seq_len(
        model, gpu - state, 64, "int4", "fp8_e4m3", "bf16", "sdpa_flash")


def test_serve_matches_serving_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "serve", "--model", "Llama 3.1 8B", "--seq-len", "32768", "--gpu",
                   "H200", "--gpu-memory-utilization", "0.8", "--block-size", "32")
    cap = serving_capacity(attnmem.calc.MODELS["Llama 3.1 8B"], "NVIDIA H200 141GB", 32768,
                           gpu_memory_utilization=0.8, block_size=32)
    assert out["num_blocks"] == cap.num_blocks and out["max_context"] == cap.max_context
    assert out["decode_attention_bytes"] < out["prefill_attention_bytes"]


def test_train_runs(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "train", "--model", "GPT-2 (124M)", "--seq-len", "1024",
                   "--checkpointing")
    assert out["model"] == "GPT-2 (124M)"


def test_train_answers_for_its_gpu_and_takes_every_training_attention(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--gpu used to be accepted and ignored by train; it now gives the Training page's
    answers for one GPU (fits, longest context), and --impl takes attnmem.calc.TRAIN_ATTENTIONS
    (transformers' eager among them, which was refused)."""
    model, gpu = attnmem.calc.MODELS["Llama 3.1 8B"], attnmem.calc.gpus.torch_total_bytes("NVIDIA H100 80GB")
    out = run_json(capsys, "train", "--model", model.name, "--seq-len", "8192", "--gpu", "H100 80GB",
                   "--impl", "eager")
    step = attnmem.calc.training_step(model, 1, 8192, attention="eager")
    assert out["peak_bytes"] == step.peak_bytes and out["gpu_bytes"] == gpu
    assert out["fits"] == (step.peak_bytes <= gpu)
    assert out["longest_context"] == attnmem.calc.max_train_seq_len(model, gpu, 1, attention="eager",
                                                            precision="bf16",
                                                            checkpointing=False)


def test_serve_refuses_a_batch_it_would_ignore(capsys: pytest.CaptureFixture[str]) -> None:
    """Serving works out how many sequences fit; a --batch was accepted and ignored."""
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", "Llama 3.1 8B", "--seq-len", "1024", "--batch", "8"])
    assert exit_.value.code == 2
    assert "--batch" in capsys.readouterr().err


def test_train_refuses_dtypes_it_would_ignore(capsys: pytest.CaptureFixture[str]) -> None:
    """A training step's weights follow its precision (--act-dtype bf16 | amp_bf16): a
    --weight-dtype fp32 used to be accepted and silently ignored (bf16 weights printed)."""
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--model", "Llama 3.1 8B", "--seq-len", "1024", "--weight-dtype", "fp32"])
    assert exit_.value.code == 2
    assert "--weight-dtype" in capsys.readouterr().err
    out = run_json(capsys, "train", "--model", "Llama 3.1 8B", "--seq-len", "1024",
                   "--act-dtype", "amp_bf16")
    assert out["weights_bytes"] == attnmem.calc.weight_bytes(attnmem.calc.MODELS["Llama 3.1 8B"], "fp32")


@pytest.mark.parametrize("args, says", [
    (["memory", "--model", "no such model", "--seq-len", "10"], "'no such model' is not a preset"),
    (["memory", "--model", "Llama 3.1 8B", "--seq-len", "10", "--gpu", "Z99"], "--gpu 'Z99'"),
    (["memory", "--model", "Llama 3.1 8B", "--seq-len", "10", "--kv-dtype", "fp7"], "fp7"),
])
def test_bad_input_names_the_value(capsys: pytest.CaptureFixture[str], args: list[str],
                                   says: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_unknown_architecture_file_is_refused(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A type neither calc's rules nor transformers know is refused with both reasons; one
    transformers builds (Mamba) is answered by the trace where torch is here."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "not_a_model", "hidden_size": 768,
                               "num_hidden_layers": 2, "vocab_size": 10}))
    assert main(["memory", "--model", str(cfg), "--seq-len", "10"]) == 2
    err = capsys.readouterr().err
    assert "'not_a_model'" in err and "not a type this transformers builds" in err
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg.write_text(json.dumps({"model_type": "mamba", "hidden_size": 64,
                               "num_hidden_layers": 2, "vocab_size": 10}))
    assert main(["memory", "--model", str(cfg), "--seq-len", "10", "--json"]) == 0
    assert "trace" in json.loads(capsys.readouterr().out)["counted_from"]


def test_console_entry_runs_as_a_module() -> None:
    done = subprocess.run([sys.executable, "-m", "attnmem", "memory", "--model", "GPT-2 (124M)",
                           "--seq-len", "1024", "--json"], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["seq_len"] == 1024
