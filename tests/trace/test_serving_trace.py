"""vLLM serving for models outside calc's rules (attnmem.trace.serving): the KV layout read
from transformers' cache layers agrees with calc's rules where both exist, the profile run's
traced activation is above calc's count of vLLM's modules (the "bound" the pages call it), and
what cannot be counted is refused or left out with the reason."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnmem.calc import ModelConfig  # noqa: E402
from attnmem.calc.inference_step import CUBLAS_WORKSPACE_BYTES  # noqa: E402
from attnmem.calc.serving import (  # noqa: E402
    activation_peak_estimate,
    page_bytes,
    pool_settings,
    sequence_bytes,
    serving_capacity,
)
from attnmem.calc.serving_layout import (  # noqa: E402
    KVLayout,
    layout_capacity,
    layout_page_bytes,
    layout_sequence_bytes,
)
from attnmem.trace.serving import (  # noqa: E402
    FROM_BOUND,
    FROM_GIVEN,
    FROM_NONE,
    trace_kv_layout,
    trace_profile_run,
    traced_serving,
)
from attnmem.trace.weights import trace_weights  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1000, pad_token_id=None)
GPU = "NVIDIA H100 80GB"


def cfg(name: str, **kw) -> dict:
    c = getattr(transformers, name)(**{**SMALL, **kw})
    return {**c.to_dict(), "model_type": c.model_type}


def olmo2() -> dict:
    return cfg("Olmo2Config", num_hidden_layers=2)


def test_a_dense_layout_is_two_kv_heads_times_head_dim_per_layer() -> None:
    lay = trace_kv_layout(olmo2()).layout
    assert (lay.full_layers, lay.sliding_layers, lay.state_layers) == (2, 0, 0)
    assert lay.elements_per_token == 2 * 2 * (64 // 4)  # K and V, H_kv = 2, d = 16


@pytest.mark.parametrize("name,kw", [
    ("LlamaConfig", {"num_hidden_layers": 3}),
    ("Gemma3TextConfig", {"num_hidden_layers": 7, "head_dim": 16, "sliding_window": 40}),
    ("Gemma2Config", {"num_hidden_layers": 4, "head_dim": 16, "sliding_window": 24}),
    ("Qwen3Config", {"num_hidden_layers": 2, "head_dim": 32}),
])
def test_the_traced_layout_pages_as_calcs_rules_do(name: str, kw: dict) -> None:
    """Where calc has rules, the layout read from transformers' cache layers gives the same
    KV block and the same bytes per request as calc.serving (grouping of sliding and full
    layers included), at every length, block size and KV dtype tried."""
    d = cfg(name, **kw)
    model = ModelConfig.from_hf_config(d, name=name)
    lay = trace_kv_layout(d).layout
    for bs, kvd in ((16, "bf16"), (32, "fp8_e4m3"), (1, "fp32")):
        assert layout_page_bytes(lay, bs, kvd) == page_bytes(model, bs, kvd)
        for s in (1, 23, 40, 41, 64, 1000, 5000):
            assert layout_sequence_bytes(lay, s, bs, kvd, 512) == \
                sequence_bytes(model, s, bs, kvd, "bf16", 512), (bs, kvd, s)


def test_llama4_chunked_layers_are_counted_as_full_attention() -> None:
    d = cfg("Llama4TextConfig", num_hidden_layers=4, head_dim=16, num_local_experts=4,
            interleave_moe_layer_step=2, attention_chunk_size=32, intermediate_size_mlp=128)
    chunked = sum(t == "chunked_attention" for t in
                  transformers.Llama4TextConfig(**{**SMALL, "num_hidden_layers": 4,
                                                   "attention_chunk_size": 32}).layer_types)
    lay = trace_kv_layout(d).layout
    assert chunked > 0 and lay.chunked_layers == chunked
    assert (lay.full_layers, lay.sliding_layers) == (4, 0)
    r = traced_serving(d, GPU, 4096, max_num_batched_tokens=256, activation_bytes=0)
    assert r.capacity_is_lower_bound and "counted as full attention" in r.sources["KV cache"]


def test_a_hybrids_state_is_what_transformers_cache_holds() -> None:
    """Qwen3-Next's gated delta layers: conv state (1, 2·key_dim + value_dim, kernel) in the
    model dtype and recurrent state (1, v_heads, k_dim, v_dim) in fp32, per request; its one
    attention layer pages as calc's rules page it."""
    kw = dict(num_hidden_layers=4, head_dim=16, linear_num_value_heads=4,
              linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
              moe_intermediate_size=32, shared_expert_intermediate_size=32)
    d = cfg("Qwen3NextConfig", **kw)
    lay = trace_kv_layout(d).layout
    conv = (2 * 2 * 16 + 4 * 16) * 4 * 2
    recurrent = 4 * 16 * 16 * 4
    assert (lay.full_layers, lay.state_layers) == (1, 3)
    assert lay.state_bytes == 3 * (conv + recurrent)
    model = ModelConfig.from_hf_config(d, name="q3n")
    assert layout_page_bytes(lay, 16, "bf16") == page_bytes(model, 16, "bf16")
    r = traced_serving(d, GPU, 1000, max_num_batched_tokens=256)
    assert "state" in r.sources and r.capacity.bytes_per_sequence == \
        layout_sequence_bytes(lay, 1000, 16, "bf16", 256)


#: Widths where each moment is tens of MB, so that the 32 MiB cuBLAS workspace cannot carry
#: the comparison: a dense model whose MLP dominates, a MoE whose experts do.
BOUND_CONFIGS = [
    ("LlamaConfig", {"hidden_size": 512, "intermediate_size": 1792, "num_hidden_layers": 2,
                     "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 8000}),
    ("Qwen3MoeConfig", {"hidden_size": 256, "moe_intermediate_size": 1024, "num_experts": 8,
                        "num_experts_per_tok": 2, "num_hidden_layers": 2, "head_dim": 32,
                        "num_attention_heads": 8, "num_key_value_heads": 2,
                        "vocab_size": 8000}),
]


@pytest.mark.parametrize("name,kw", BOUND_CONFIGS)
def test_the_profile_trace_is_above_calcs_count_of_vllms_forward(name: str, kw: dict) -> None:
    """The bound: over 4,096 tokens, where the forward's moments dominate, transformers'
    modules hold more than calc counts vLLM's fused modules to hold
    (attnmem.calc.serving.activation_moments), the trace's cuBLAS workspace left out."""
    d = cfg(name, **kw)
    model = ModelConfig.from_hf_config(d, name=name)
    p = trace_profile_run(d, 4096, 256)
    assert p.attention == "sdpa" and p.rows == 256
    assert p.activation_bytes - CUBLAS_WORKSPACE_BYTES >= \
        activation_peak_estimate(model, 4096, "bf16", 256) > 40 * 10**6


def test_the_profile_traces_sampler_holds_what_vllms_does() -> None:
    """Over 64 tokens with 256 rows the sampler dominates: the logits of 64 rows (rows are
    capped at the tokens) in bf16, their fp32 copy and the dummy run's hidden states (64, h),
    which vLLM's profile run still holds; blocks rounded up to 512 bytes."""
    d = cfg("LlamaConfig", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
            vocab_size=256_000)
    p = trace_profile_run(d, 64, 256)
    assert p.rows == 64
    logits = 64 * 256_000
    assert p.activation_bytes - CUBLAS_WORKSPACE_BYTES >= logits * (2 + 4) + 64 * 64 * 2
    assert ("|_to_copy", 1, logits * 4) in p.at_peak


def test_the_whole_answer_uses_the_traced_terms() -> None:
    d = olmo2()
    r = traced_serving(d, GPU, 4096, max_num_batched_tokens=512, max_num_seqs=64)
    w = trace_weights(d)
    prof = trace_profile_run(d, 512, 64)
    assert r.activation_from == FROM_BOUND and r.capacity_is_lower_bound
    assert not r.capacity_is_upper_bound
    expect = layout_capacity(r.layout.layout, pool_settings(GPU, 4096, max_num_batched_tokens=512,
                                                            max_num_seqs=64),
                             w.weight_bytes(2), prof.activation_bytes, True)
    assert r.capacity == expect
    assert r.sources["weights"].startswith("trace:")
    assert r.sources["activation peak"].startswith("bound:")
    given = traced_serving(d, GPU, 4096, activation_bytes=3 * 2**30)
    assert given.activation_from == FROM_GIVEN and given.capacity.activation_bytes == 3 * 2**30
    assert not given.capacity_is_lower_bound and not given.capacity_is_upper_bound


def test_an_untraceable_activation_leaves_an_upper_bound_with_the_reason(monkeypatch) -> None:
    """A profile trace refused as too slow (Jamba's Mamba scan, a Python loop over the tokens
    on meta, its fold refused and the limit of ops made tiny for the test, as for a loop that
    cannot be folded): the KV and state are still counted, and the capacity is said to be an
    upper bound."""
    import attnmem.trace.inference as inference
    import attnmem.trace.loops as loops

    monkeypatch.setattr(loops, "_check", lambda events, bounds: ("refused here", set()))
    monkeypatch.setattr(inference, "LIMITS", loops.Limits(ops=1_000, steps=10**9))
    d = cfg("JambaConfig", num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1,
            expert_layer_period=100, num_experts=1)
    r = traced_serving(d, GPU, 4096)
    assert r.activation_from == FROM_NONE and r.capacity_is_upper_bound
    assert "cannot be folded (refused here)" in r.activation_refused
    assert r.capacity.activation_bytes == 0 and r.capacity.num_blocks > 0
    assert r.layout.layout.state_layers == 1 and r.layout.layout.state_bytes > 0


@pytest.mark.parametrize("name,kw,why", [
    ("MambaConfig", {"num_hidden_layers": 2}, "no attention layer"),
    ("DeepseekV3Config", {"num_hidden_layers": 1, "kv_lora_rank": 16, "q_lora_rank": 16,
                          "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
                          "n_routed_experts": 4, "num_experts_per_tok": 2,
                          "moe_intermediate_size": 32}, "latent"),
])
def test_what_cannot_be_counted_is_refused_with_the_reason(name: str, kw: dict,
                                                           why: str) -> None:
    d = cfg(name, **kw)
    with pytest.raises(ValueError, match=why):
        traced_serving(d, GPU, 4096)


def test_quantized_weights_and_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="weights 'int4'"):
        traced_serving(olmo2(), GPU, 4096, weight_dtype="int4")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        traced_serving(olmo2(), GPU, 4096, gpu_memory_utilization=1.5)


def test_a_layout_refuses_what_vllm_groups_otherwise() -> None:
    with pytest.raises(ValueError, match="attention layer"):
        KVLayout(0, 0, None, 64, 2, 100)
    with pytest.raises(ValueError, match="state layers"):
        KVLayout(1, 3, 128, 64, 2, 100)
    cap = serving_capacity(ModelConfig.from_hf_config(cfg("LlamaConfig", num_hidden_layers=3),
                                                      name="l"), GPU, 2048,
                           activation_bytes=2**30)
    lay = trace_kv_layout(cfg("LlamaConfig", num_hidden_layers=3)).layout
    same = layout_capacity(lay, pool_settings(GPU, 2048), cap.weights_bytes, 2**30, False)
    assert same == cap
