"""attnmem.calc.cp_sweep: the Many GPUs page's sweeps are attnmem.calc.context_parallel's
numbers, point by point, with refused points left out (per GPU) or None (longest)."""

from __future__ import annotations

from attnmem.calc import GPUS, MODELS
from attnmem.calc.context_parallel import (
    context_parallel_memory,
    max_context_parallel_attention_seq_len,
    max_context_parallel_seq_len,
)
from attnmem.calc.cp_sweep import (
    C_POINTS,
    MAX_C,
    longest_at,
    longest_sweep,
    per_gpu_sweep,
    round_for,
)


def test_round_for_is_a_multiple_of_2c() -> None:
    assert round_for(1000, 1) == 1000
    assert round_for(1000, 3) == 996  # 6 * 166
    assert round_for(5, 4) == 0


def test_per_gpu_sweep_is_context_parallel_memory() -> None:
    df = per_gpu_sweep("triton", 32, 8, 128, "bf16", 65536, True)
    assert df["GPUs"].tolist() == list(range(1, MAX_C + 1))
    row = df[df["GPUs"] == 6].iloc[0]
    m = context_parallel_memory("triton", 1, 32, round_for(65536, 6), 128, "bf16", True, True, 6, 8)
    assert (row["seq_len"], row["per_gpu_bytes"], row["worst_rank"]) == (65532, m.total_bytes, m.rank)
    # torch's rings take equal heads only: GQA is refused from c = 2 on (c = 1 is the plain call)
    assert per_gpu_sweep("sdpa_cudnn", 32, 8, 128, "bf16", 65536, True)["GPUs"].tolist() == [1]


def test_longest_at_and_sweep() -> None:
    model, gpu = MODELS["Llama 3.1 8B"], GPUS["NVIDIA H100 80GB"]
    row = longest_at(model, gpu, "triton", "bf16", True, True, 32, 8, 128, 4)
    assert row == {"GPUs": 4,
                   "training_seq_len": max_context_parallel_seq_len(
                       model, gpu, 4, impl="triton", checkpointing=True, shard_states=True),
                   "attention_seq_len": max_context_parallel_attention_seq_len(
                       "triton", gpu, 1, 32, 128, "bf16", True, True, 4, 8)}
    refused = longest_at(model, gpu, "sdpa_cudnn", "bf16", True, True, 32, 8, 128, 4)
    assert refused["attention_seq_len"] is None and refused["training_seq_len"] is None
    seen = []
    df = longest_sweep(lambda c: seen.append(c) or {"GPUs": c}, 5)
    assert seen == sorted({*C_POINTS, 5}) and df["GPUs"].tolist() == seen
