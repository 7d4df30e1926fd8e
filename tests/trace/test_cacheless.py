"""Models whose forward returns no cache, and prompts past learned position embeddings (GPT-1,
which transformers runs eager only). Models that keep their state elsewhere (RecurrentGemma,
RWKV): tests/trace/test_refused_tail.py."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnmem.trace.generate import trace_inference  # noqa: E402


def _gpt1(n_positions: int = 64) -> dict:
    from transformers import OpenAIGPTConfig

    d = OpenAIGPTConfig(vocab_size=101, n_positions=n_positions, n_embd=32, n_layer=2,
                        n_head=4).to_dict()
    d["architectures"] = ["OpenAIGPTLMHeadModel"]
    return d


def test_a_model_without_a_cache_is_run_as_generate_runs_it():
    """GPT-1 returns no cache: generate() feeds the whole sequence each step, so the last
    decode step is a forward over the prompt and the new tokens, and nothing is cached."""
    one = trace_inference(_gpt1(), 2, 20, 1, attention="eager", dtype="bf16")
    four = trace_inference(_gpt1(), 2, 20, 4, attention="eager", dtype="bf16")
    assert one.kv_cache_bytes == 0 and four.kv_cache_bytes == 0
    assert four.peak_bytes >= one.peak_bytes  # 23 tokens in the last forward against 20


def test_a_prompt_past_learned_positions_says_why():
    with pytest.raises(ValueError, match=r"past the model's .*\(64\).*at most 64 tokens"):
        trace_inference(_gpt1(64), 1, 100, 1, attention="eager", dtype="bf16")
