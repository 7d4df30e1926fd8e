"""Exact values and properties of the analytic model (scores, KV cache, fits, sweeps)."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

import attnmem.calc
from attnmem.calc import (
    GPUS,
    IMPLEMENTATIONS,
    ModelConfig,
    attention_peak_bytes,
    dtype_bytes,
    format_bytes,
    format_gb,
    format_gib,
    kv_cache_bytes,
    largest_fitting,
    max_seq_len,
    score_matrix_bytes,
    sweep_param,
    sweep_seq_len,
)

LLAMA_8B_SHAPE = ModelConfig(
    name="llama-like", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
    head_dim=128, intermediate_size=14336, vocab_size=128256)


def test_importing_calc_pulls_in_no_ui_or_gpu_package() -> None:
    code = ("import sys, attnmem.calc; bad = [m for m in ('streamlit', 'torch', 'triton', 'plotly') "
            "if m in sys.modules]; print(','.join(bad)); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, f"calc imported: {done.stdout} {done.stderr}"


def test_worked_example_of_the_design() -> None:
    n = score_matrix_bytes(1, 32, 4096, 2)
    assert n == 1_073_741_824
    assert format_gb(n) == "1.07 GB" and format_gib(n) == "1.00 GiB"
    assert format_gb(score_matrix_bytes(1, 32, 8192, "fp16")) == "4.29 GB"


@pytest.mark.parametrize(
    ("name", "expected"),
    [("fp32", 4), ("tf32", 4), ("bf16", 2), ("fp16", 2), ("fp8_e4m3", 1), ("fp8_e5m2", 1),
     ("int8", 1), ("int4", Fraction(1, 2)), ("float16", 2), ("bfloat16", 2), ("float32", 4)],
)
def test_dtype_bytes(name: str, expected) -> None:
    assert dtype_bytes(name) == expected


def test_int4_halves_and_rounds_up() -> None:
    assert score_matrix_bytes(1, 1, 3, "int4") == 5  # 4.5 bytes need 5
    assert score_matrix_bytes(1, 1, 4, 0.5) == 8


def test_format_bytes_units() -> None:
    assert format_bytes(1_073_741_824, "GiB") == "1.00 GiB"
    assert format_bytes(8 * 2**20, "GiB") == "8.00 MiB"
    assert format_bytes(1500, "GB") == "1.50 KB"
    assert format_bytes(12, "GB") == "12 B"
    with pytest.raises(ValueError, match="unit must be 'GB' or 'GiB'"):
        format_bytes(1, "TB")


def test_huge_inputs_compute_exactly() -> None:
    b, h, s = 1_000_000, 100_000, 100_000_000
    assert score_matrix_bytes(b, h, s, 4) == b * h * s * s * 4  # Python ints do not overflow


@pytest.mark.parametrize(
    ("args", "fragment"),
    [((0, 32, 4096, 2), "batch must be a whole number from 1"),
     ((1, -3, 4096, 2), "heads must be a whole number from 1"),
     ((1, 32, 10**8 + 1, 2), "seq_len must be a whole number from 1 to 100,000,000"),
     ((1, 32, 4096.5, 2), "seq_len must be a whole number"),
     ((1, 32, "4096", 2), "seq_len must be a whole number"),
     ((1, 32, float("nan"), 2), "seq_len must be a whole number"),
     ((1, 32, 4096, 0), "bytes_per_element must be above 0"),
     ((1, 32, 4096, float("inf")), "bytes_per_element must be a finite number"),
     ((1, 32, 4096, "fp12"), "unknown dtype 'fp12'")],
)
def test_score_matrix_refuses_bad_input(args, fragment) -> None:
    with pytest.raises(ValueError) as info:
        score_matrix_bytes(*args)
    assert fragment in str(info.value)


@given(st.integers(1, 1000), st.integers(1, 1000), st.integers(1, 10**6),
       st.sampled_from(["fp32", "bf16", "fp8_e4m3", "int4"]))
def test_score_matrix_properties(b, h, s, dtype) -> None:
    one = score_matrix_bytes(b, h, s, dtype)
    assert isinstance(one, int) and one > 0
    assert score_matrix_bytes(b, h, 2 * s, dtype) == 4 * one or dtype == "int4"
    assert score_matrix_bytes(2 * b, h, s, "fp16") == 2 * score_matrix_bytes(b, h, s, "fp16")
    assert score_matrix_bytes(b, 3 * h, s, "fp16") == 3 * score_matrix_bytes(b, h, s, "fp16")
    assert score_matrix_bytes(b, h, s, "fp32") == 2 * score_matrix_bytes(b, h, s, "fp16")


def test_kv_cache_llama_8b_128k() -> None:
    # 2 · 32 layers · 8 KV heads · 128 dims · 2 bytes = 131,072 bytes per token (128 KiB).
    assert kv_cache_bytes(LLAMA_8B_SHAPE, 1, 1, "bf16") == 131_072
    assert kv_cache_bytes(LLAMA_8B_SHAPE, 1, 131_072, "bf16") == 16 * 2**30


def test_kv_cache_sliding_window_holds_at_most_the_window() -> None:
    mistral_like = ModelConfig(
        name="m", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=14336, vocab_size=32000, sliding_window=4096, sliding_window_layers=32)
    assert kv_cache_bytes(mistral_like, 1, 100_000, 2) == kv_cache_bytes(mistral_like, 1, 4096, 2)
    half = ModelConfig(**{**mistral_like.__dict__, "sliding_window_layers": 16})
    per_token_layer = 2 * 8 * 128 * 2
    assert kv_cache_bytes(half, 1, 10_000, 2) == per_token_layer * (16 * 10_000 + 16 * 4096)


@given(st.integers(1, 64), st.integers(1, 100_000), st.sampled_from([1, 2, 4, 8, 32]))
def test_kv_cache_gqa_never_above_mha(b, s, kv_heads) -> None:
    gqa = ModelConfig(**{**LLAMA_8B_SHAPE.__dict__, "num_kv_heads": kv_heads})
    mha = ModelConfig(**{**LLAMA_8B_SHAPE.__dict__, "num_kv_heads": 32})
    assert 0 <= kv_cache_bytes(gqa, b, s, 2) <= kv_cache_bytes(mha, b, s, 2)


def test_gpu_table() -> None:
    assert GPUS["NVIDIA H200 141GB"] == 143_771 * 2**20
    assert len(GPUS) >= 10 and all(isinstance(v, int) and v > 0 for v in GPUS.values())


@given(st.sampled_from(IMPLEMENTATIONS), st.integers(10**6, 2 * 10**11), st.integers(1, 8),
       st.sampled_from([8, 32]), st.booleans(), st.booleans())
def test_max_seq_len_is_exact(impl, budget, b, h, causal, backward) -> None:
    s = max_seq_len(impl, budget, b, h, 128, "fp16", causal, backward)
    if s:
        assert attention_peak_bytes(impl, b, h, s, 128, "fp16", causal, backward) <= budget
    assert attention_peak_bytes(impl, b, h, s + 1, 128, "fp16", causal, backward) > budget


def test_max_seq_len_none_fits_and_h200_figures() -> None:
    assert max_seq_len("naive", 10, 1, 32, 128, "fp16") == 0
    h200 = GPUS["NVIDIA H200 141GB"]
    naive = max_seq_len("naive", h200, 1, 32, 128, "fp16")
    flash = max_seq_len("sdpa_flash", h200, 1, 32, 128, "fp16")
    assert 32_768 < naive < 40_000 and flash > 100 * naive


def test_largest_fitting_hits_the_upper_limit() -> None:
    assert largest_fitting(lambda s: 0, 5, hi=1000) == 1000
    with pytest.raises(ValueError, match="budget_bytes must be a number"):
        largest_fitting(lambda s: s, "lots")


def test_model_memory_and_fit() -> None:
    mem = attnmem.calc.model_memory(LLAMA_8B_SHAPE, 1, 8192, "bf16", "bf16", "bf16", "naive")
    assert mem.kv_cache_bytes == 131_072 * 8192
    assert mem.scores_bytes == score_matrix_bytes(1, 32, 8192, 2)
    # The total is generate()'s prefill peak (naive = transformers' eager attention there),
    # well above the old weights + cache + one attention call.
    peak = attnmem.calc.inference_step(LLAMA_8B_SHAPE, 1, 8192, 1, attention="eager")
    assert mem.total_bytes == peak.peak_bytes and not mem.total_is_lower_bound
    assert mem.total_bytes > mem.weights_bytes + mem.kv_cache_bytes + mem.attention_bytes
    gpt2 = attnmem.calc.model_memory(attnmem.calc.MODELS["GPT-2 (124M)"], 1, 1024, "bf16", "bf16", "bf16", "naive")
    assert gpt2.total_is_lower_bound and "not modelled" in gpt2.not_modelled
    assert gpt2.total_bytes == gpt2.weights_bytes + gpt2.kv_cache_bytes + gpt2.attention_bytes
    h100 = GPUS["NVIDIA H100 80GB"]
    s = attnmem.calc.model_max_seq_len(LLAMA_8B_SHAPE, h100, 1, "bf16", "bf16", "bf16", "sdpa_flash")
    fits = attnmem.calc.model_memory(LLAMA_8B_SHAPE, 1, s, "bf16", "bf16", "bf16", "sdpa_flash")
    over = attnmem.calc.model_memory(LLAMA_8B_SHAPE, 1, s + 1, "bf16", "bf16", "bf16", "sdpa_flash")
    assert fits.total_bytes <= h100 < over.total_bytes
    assert attnmem.calc.gpus_needed(3 * h100 + 1, h100) == 4 and attnmem.calc.gpus_needed(0, h100) == 1


def test_training_view_checkpointing_and_flash() -> None:
    naive = attnmem.calc.training_attention_bytes(LLAMA_8B_SHAPE, 1, 4096, "bf16", "naive", False)
    ckpt = attnmem.calc.training_attention_bytes(LLAMA_8B_SHAPE, 1, 4096, "bf16", "naive", True)
    flash = attnmem.calc.training_attention_bytes(LLAMA_8B_SHAPE, 1, 4096, "bf16", "sdpa_flash", False)
    one_layer_p = score_matrix_bytes(1, 32, 4096, 2)
    assert naive - ckpt == 31 * one_layer_p  # L - 1 layers keep their probabilities
    assert flash < ckpt < naive


def test_sweeps_are_dataframes() -> None:
    df = sweep_seq_len(IMPLEMENTATIONS, [1024, 2048], 1, 32, 128, "fp16")
    assert list(df.columns) == ["impl", "kind", "seq_len", "peak_bytes", "score_bytes"]
    assert len(df) == 2 * len(IMPLEMENTATIONS)
    naive = df[df.impl == "naive"].set_index("seq_len").peak_bytes
    assert naive[2048] > 3.8 * naive[1024]  # s² term, plus the linear output
    dfb = sweep_param("batch", [1, 2, 4], ["naive"], 1024, 1, 32, 128, "fp16")
    assert list(dfb.peak_bytes) == [dfb.peak_bytes[0] * k for k in (1, 2, 4)]
    with pytest.raises(ValueError, match="name must be one of batch, heads"):
        sweep_param("layers", [1], ["naive"], 1024, 1, 32, 128, "fp16")
    assert attnmem.calc.default_seq_lens(128, 1_048_576)[0] == 128
    assert attnmem.calc.default_seq_lens(128, 1_048_576)[-1] == 1_048_576
