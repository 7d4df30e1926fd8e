"""The layer shortcut (attnmem.trace.layer_blocks): generate()'s events of a deep model built
from traces of the same model with a few layers, equal to a trace of the full depth event for
event, on dense, sliding-window (Gemma 2 and 3 patterns), MoE (a dense first layer; Llama 4's
interleave) and hybrid layouts; refused, with the full trace answering, where its check fails;
and the length model (attnmem.trace.lengths) built on it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnmem.trace import inference, layer_blocks, lengths  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1000, pad_token_id=None)
Q3N = dict(head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
           linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
           num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=32)


def cfg(name: str, **kw) -> dict:
    c = getattr(transformers, name)(**{**SMALL, **kw})
    return {**c.to_dict(), "model_type": c.model_type}


#: layout -> (config, attentions traced, the (head, period) the plan must find)
LAYOUTS = {
    "dense": (cfg("Olmo2Config", num_hidden_layers=7), ("sdpa", "eager"), (1, 1)),
    "sliding window inside the prompt": (
        cfg("MistralConfig", num_hidden_layers=7, sliding_window=50), ("sdpa",), (1, 1)),
    "Gemma 2 (local, global)": (
        cfg("Gemma2Config", num_hidden_layers=14, sliding_window=50, head_dim=16), ("eager",),
        (2, 2)),
    "Gemma 3 (5 local, 1 global)": (
        cfg("Gemma3TextConfig", num_hidden_layers=26, sliding_window=40, head_dim=16),
        ("sdpa",), (2, 6)),
    "MoE, first layer dense (GLM-4.5)": (
        cfg("Glm4MoeConfig", num_hidden_layers=9, n_routed_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, first_k_dense_replace=1), ("sdpa", "eager"), (2, 1)),
    "Llama 4 (chunked and full, MoE every 2nd)": (
        cfg("Llama4TextConfig", num_hidden_layers=22, head_dim=16, num_local_experts=4,
            interleave_moe_layer_step=2, attention_chunk_size=32, intermediate_size_mlp=128),
        ("sdpa",), (2, 4)),
    "SmolLM3 (no RoPE every 4th)": (cfg("SmolLM3Config", num_hidden_layers=22), ("sdpa",),
                                    (2, 4)),
}

#: hybrids: state-space or linear-attention layers beside attention ones
HYBRIDS = {
    "Nemotron-H": cfg("NemotronHConfig",
                      layers_block_type=["mamba", "moe", "mamba", "attention"] * 6,
                      mamba_num_heads=8, mamba_head_dim=16, n_routed_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=32,
                      moe_shared_expert_intermediate_size=32, head_dim=16),
    "LFM2": cfg("Lfm2Config", num_hidden_layers=21,
                layer_types=["conv", "conv", "full_attention"] * 7),
    "Qwen3-Next": cfg("Qwen3NextConfig", num_hidden_layers=22, **Q3N),
}

#: (batch, prompt, new tokens): one prefill; a prefill, a setup prefill and decode steps
INPUTS = {"sdpa": (2, 100, 1), "eager": (1, 70, 5)}


def _full(text: str, attention: str):
    b, s, n = INPUTS[attention]
    return inference.record(text, b, s, n, attention, "bf16")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_short_traces_give_the_full_trace_event_for_event(layout: str) -> None:
    d, attentions, block = LAYOUTS[layout]
    text = json.dumps(d, sort_keys=True)
    for attention in attentions:
        pl = layer_blocks.plan_for(text, attention, "bf16")
        assert pl is not None and (pl.head, pl.period) == block
        b, s, n = INPUTS[attention]
        got = layer_blocks.record(text, b, s, n, attention, "bf16")
        assert layer_blocks.plan_for(text, attention, "bf16") is not None  # the check held
        want = _full(text, attention)
        assert got.events == layer_blocks.canonical(want.events)
        assert (got.cache_bytes, got.weights_bytes, got.model_class) == (
            want.cache_bytes, want.weights_bytes, want.model_class)


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_hybrids_events_expand_exactly(name: str) -> None:
    """The events expand exactly, and the cache's bytes (the recurrent and convolution states
    in each layer's lists too) are the model's tensors left alive at the end, so the shortcut
    answers for hybrids as for dense models."""
    text = json.dumps(HYBRIDS[name], sort_keys=True)
    pl = layer_blocks.plan_for(text, "eager", "bf16")
    assert pl is not None and pl.depth > pl.check_depth
    b, s, n = INPUTS["eager"]
    short = inference.record(pl.short_text, b, s, n, "eager", "bf16")
    want = _full(text, "eager")
    assert layer_blocks.expand(short.events, pl.layers_name, pl.short_depth, pl.head,
                               pl.period, pl.depth) == layer_blocks.canonical(want.events)
    got = layer_blocks.record(text, b, s, n, "eager", "bf16")
    assert got.events == layer_blocks.canonical(want.events) or got.events == want.events
    assert got.cache_bytes == want.cache_bytes
    assert layer_blocks.cache_bytes(want.events) == want.cache_bytes
    assert not isinstance(layer_blocks.plan(text, "bf16", "eager"), str)


def test_a_failed_check_refuses_the_shortcut_and_the_full_trace_answers(monkeypatch) -> None:
    """The longer short model's trace is the proof: one event more there (as where a layer
    behaved differently past the short model's depth) and the full model is traced."""
    d = cfg("Olmo2Config", num_hidden_layers=7, rms_norm_eps=2e-6)
    text = json.dumps(d, sort_keys=True)
    pl = layer_blocks.plan_for(text, "sdpa", "bf16")
    assert pl is not None
    real = inference.record

    def spoiled(t: str, *args):
        rec = real(t, *args)
        if t != pl.check_text:
            return rec
        i = max(i for i, ev in enumerate(rec.events) if ev[0] == "a")
        extra = ("a", 10**6, 512, rec.events[i][3])
        return inference.Recorded((*rec.events[:i], extra, *rec.events[i:]),
                                   rec.weights_bytes, rec.cache_bytes, rec.model_class)

    monkeypatch.setattr(inference, "record", spoiled)
    got = layer_blocks.record(text, 1, 64, 1, "sdpa", "bf16")
    why = layer_blocks.plan(text, "bf16", "sdpa")
    assert isinstance(why, str) and "differs from their trace at event" in why
    assert got.events == real(text, 1, 64, 1, "sdpa", "bf16").events


def test_the_block_is_the_cheapest_repeat() -> None:
    assert layer_blocks.choose_block([0] * 32) == (1, 1)
    assert layer_blocks.choose_block([1] + [0] * 45) == (2, 1)  # GLM-4.5: a dense first layer
    gemma3 = ([0] * 5 + [1]) * 8
    assert layer_blocks.choose_block(gemma3) == (6, 6)  # 48 - 6 is a multiple of 6
    smollm3 = [0, 0, 0, 1] * 9
    assert layer_blocks.choose_block(smollm3) == (4, 4)
    assert layer_blocks.choose_block([0] * 6) is None  # 2 + 3 layers traced: 1 saved
    assert layer_blocks.choose_block([0] * 7) == (1, 1)
    assert layer_blocks.choose_block(([0] * 7 + [1]) * 4) is None  # Jamba: 16 + 24 of 32
    assert layer_blocks.choose_block(list(range(20))) is None  # no two layers alike


def test_a_forward_that_branches_on_its_layer_index_is_seen() -> None:
    hit = layer_blocks._INDEX_BRANCH.search
    assert hit("if self.layer_idx % 4 == 3:\n    x = x * 2")
    assert hit("use_eda = layer_idx != 0")
    assert not hit("k, v = past_key_values.update(k, v, self.layer_idx)")
    assert not hit("x = self.layers[layer_idx](x)")


def test_a_per_layer_word_is_not_cut() -> None:
    """A string with one letter per layer is cut only where it reads as a layer pattern."""
    assert layer_blocks._pattern("M-M*E-") and not layer_blocks._pattern("silu")


def test_the_length_model_on_the_short_traces_is_the_full_trace() -> None:
    d = cfg("Olmo2Config", num_hidden_layers=8)
    text = json.dumps(d, sort_keys=True)
    m = lengths.length_model(d, 1, 3, "eager", "bf16", 128, 640, at=300)
    assert m is not None and layer_blocks.plan_for(text, "eager", "bf16") is not None
    assert len(m.skeleton) > 3 * len(m.coeffs)  # the skeleton is the full depth's
    for s in (129, 300, 517, 639):
        got = m.peak(s)
        want = inference.result(inference.record(text, 1, s, 3, "eager", "bf16"), 1, s, 3,
                                "eager", "bf16", 0.0)
        assert (got.prefill_peak_bytes, got.decode_peak_bytes, got.kv_cache_bytes,
                got.weights_bytes, got.at_peak) == (
            want.prefill_peak_bytes, want.decode_peak_bytes, want.kv_cache_bytes,
            want.weights_bytes, want.at_peak)


def test_a_quick_first_answer_builds_its_length_model(monkeypatch) -> None:
    """Where the first answer was quick, trace_at builds the length model with it, so the
    first move is a replay: no trace runs for it."""
    d = cfg("Olmo2Config", num_hidden_layers=7, rms_norm_eps=3e-6)
    monkeypatch.setattr(lengths, "BUILD_WITH_FIRST_S", 60.0)
    first = lengths.trace_at(d, 1, 300, 1, attention="eager")
    calls = []
    real = inference.record
    monkeypatch.setattr(inference, "record", lambda *a: calls.append(a) or real(*a))
    moved = lengths.trace_at(d, 1, 333, 1, attention="eager")
    assert calls == []
    want = inference.result(real(json.dumps(d, sort_keys=True), 1, 333, 1, "eager", "bf16"),
                            1, 333, 1, "eager", "bf16", 0.0)
    assert (moved.peak_bytes, moved.at_peak) == (want.peak_bytes, want.at_peak)
    assert first.prompt_len == 300


def test_a_span_stays_on_one_side_of_a_window() -> None:
    d = {"sliding_window": 4096, "max_position_embeddings": 131072, "hidden_size": 4096}
    assert lengths.span_around(3000, d, 1) == (1500, 4093)
    assert lengths.span_around(6000, d, 1) == (4099, 12000)
    assert lengths.span_around(3000) == (1500, 6000)
