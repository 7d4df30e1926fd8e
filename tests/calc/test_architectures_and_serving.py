"""Issue 19: MLA, MoE with shared experts and dense first layers, hybrids, unknown types,
and the vLLM-style serving accounting. Expected values are written out from the formulas'
sources (DeepSeek-V2 paper, transformers modeling files, vLLM kv_cache_utils.py), not from
the code under test."""

from __future__ import annotations

import pytest

from attnmem.calc.kv import kv_cache_bytes, mla_expanded_kv_bytes, state_bytes
from attnmem.calc.models import KNOWN_MODEL_TYPES, ModelConfig
from attnmem.calc.params import active_param_count, param_breakdown, param_count
from attnmem.calc.presets import MODELS, PRESET_HF_CONFIGS
from attnmem.calc.serving import decode_attention_bytes, sequence_bytes, serving_capacity

V3 = MODELS["DeepSeek-V3 (MLA, MoE)"]
GIB = 2**30


def test_deepseek_v3_latent_cache_is_2_3_gb_at_32k_not_57() -> None:
    # 61 layers x 32,768 tokens x (kv_lora_rank 512 + rope 64) x 2 bytes
    assert kv_cache_bytes(V3, 1, 32768, "bf16") == 61 * 32768 * 576 * 2 == 2_302_672_896
    # eager: K of 128 heads x (128 + 64) and V of 128 heads x 128
    assert mla_expanded_kv_bytes(V3, 1, 32768, "bf16") == 61 * 32768 * 128 * 320 * 2


def test_deepseek_v3_parameters_by_part() -> None:
    parts = param_breakdown(V3)
    attn = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256
            + 128 * 128 * 7168)
    assert parts["attention"] == 61 * attn
    expert = 3 * 7168 * 2048
    moe = 256 * expert + expert + 256 * 7168  # routed + 1 ungated shared + router
    assert parts["mlp"] == 58 * moe + 3 * 3 * 7168 * 18432  # first_k_dense_replace = 3
    # Card: "671B total parameters with 37B activated" (activated: without the embedding table)
    active = active_param_count(V3) - parts["embeddings"]
    assert 36.5e9 <= active < 37.5e9


def test_deepseek_v2_lite_direct_query_and_active() -> None:
    lite = MODELS["DeepSeek-V2-Lite (MLA, MoE)"]
    assert lite.q_lora_rank == 0  # null in its config: q is projected directly
    # Card: 15.7B total, 2.4B activated (without the embedding table, as for V3)
    active = active_param_count(lite) - param_breakdown(lite)["embeddings"]
    assert abs(active - 2.4e9) / 2.4e9 < 0.03


def test_hybrids_cache_only_attention_layers_and_count_state() -> None:
    jamba = MODELS["Jamba v0.1 (hybrid)"]
    assert jamba.kv_layers == 4 and jamba.state_layers == 28
    assert kv_cache_bytes(jamba, 1, 1000, 2) == 4 * 1000 * 2 * 8 * 128 * 2
    d_inner = 8192  # mamba_expand 2 x 4096; vLLM mamba1_state_shape
    assert state_bytes(jamba, 3, 2) == 3 * 28 * (3 * d_inner + d_inner * 16) * 2
    qn = MODELS["Qwen3-Next 80B-A3B (hybrid)"]
    assert qn.kv_layers == 12 and qn.state_layers == 36
    conv_dim = 2 * 16 * 128 + 32 * 128  # gated_delta_net_state_shape
    assert state_bytes(qn, 1, 2) == 36 * (3 * conv_dim + 32 * 128 * 128) * 2


def test_hybrid_training_attention_counts_attention_layers_only() -> None:
    """Jamba has attention in 4 of its 32 layers: the training view's eager probabilities are
    kept by those 4, not by all 32 (the Mamba layers keep no s x s tensor)."""
    from attnmem.calc.peak import attention_peak_bytes
    from attnmem.calc.scores import score_matrix_bytes
    from attnmem.calc.training import training_attention

    jamba = MODELS["Jamba v0.1 (hybrid)"]
    ta = training_attention(jamba, 1, 4096, "bf16", "naive", False)
    assert ta.layers == 4
    probs = score_matrix_bytes(1, 32, 4096, 2)  # B·H·s²·e, what each attention layer keeps
    peak = attention_peak_bytes("naive", 1, 32, 4096, 128, "bf16", causal=True, backward=True,
                                kv_heads=8)
    assert ta.total_bytes == 3 * probs + peak
    assert training_attention(MODELS["Llama 3.1 8B"], 1, 4096, "bf16", "naive", False).layers == 32


def test_nemotron_h_pattern_decides_layers() -> None:
    cfg = {"model_type": "nemotron_h", "hybrid_override_pattern": "M-M*-",
           "num_hidden_layers": 5, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
           "vocab_size": 100, "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 1,
           "ssm_state_size": 8, "conv_kernel": 4}
    m = ModelConfig.from_hf_config(cfg)
    assert (m.kv_layers, m.state_layers, m.mlp_layers) == (1, 2, 2)
    parts = param_breakdown(m)
    assert parts["mlp"] == 2 * 2 * 64 * 128  # relu2: up and down only
    d_inner, conv_dim = 64, 64 + 2 * 8
    mixer = (64 * (d_inner + conv_dim + 4) + conv_dim * 4 + conv_dim + 3 * 4 + d_inner
             + d_inner * 64)
    assert parts["state mixers"] == 2 * mixer
    assert parts["norms"] == (5 + 1) * 64  # one norm per block
    with pytest.raises(ValueError, match="'hybrid_override_pattern'.*'E'"):
        ModelConfig.from_hf_config({**cfg, "hybrid_override_pattern": "M-ME*"})


@pytest.mark.parametrize("mt", ["mamba", "falcon_mamba"])
def test_attention_free_models_are_refused(mt: str) -> None:
    with pytest.raises(ValueError, match=f"'{mt}'.*without attention"):
        ModelConfig.from_hf_config({"model_type": mt, "hidden_size": 8, "vocab_size": 9})


def test_unknown_type_names_it_and_lists_known() -> None:
    d = dict(PRESET_HF_CONFIGS["Llama 3.1 8B"][1], model_type="brand_new_arch")
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf_config(d)
    assert "'brand_new_arch'" in str(err.value)
    assert all(t in str(err.value) for t in KNOWN_MODEL_TYPES)


def test_presets_match_their_cards() -> None:
    for name, published in (("DeepSeek-V3 (MLA, MoE)", 671e9),
                            ("DeepSeek-V2-Lite (MLA, MoE)", 15.7e9),
                            ("Qwen3-Next 80B-A3B (hybrid)", 80e9),
                            ("Jamba v0.1 (hybrid)", 51.6e9)):
        assert abs(param_count(MODELS[name]) - published) / published <= 0.005, name
    # Mixtral-style MoE: Jamba card "12B active"
    assert abs(active_param_count(MODELS["Jamba v0.1 (hybrid)"]) - 12e9) / 12e9 < 0.01


# ----------------------------------------------------------------------------- serving ----

LLAMA = MODELS["Llama 3.1 8B"]


def test_blocks_and_concurrency_follow_vllm() -> None:
    gpu = 80 * GIB
    cap = serving_capacity(LLAMA, gpu, 32768, gpu_memory_utilization=0.9, block_size=16,
                           activation_bytes=GIB, cuda_graph_bytes=0, non_torch_bytes=0)
    pool = int(gpu * 0.9) - 8_030_261_248 * 2 - GIB
    assert cap.kv_pool_bytes == pool
    page = 16 * 2 * 8 * 128 * 2  # FullAttentionSpec.page_size_bytes, one layer
    assert cap.num_blocks == pool // page // 32  # get_num_blocks
    assert cap.max_concurrency == cap.num_blocks // (32768 // 16)
    assert sequence_bytes(LLAMA, cap.max_context, 16, "bf16") <= pool
    assert sequence_bytes(LLAMA, cap.max_context + 1, 16, "bf16") > pool
    fp8 = serving_capacity(LLAMA, gpu, 32768, kv_dtype="fp8_e4m3", activation_bytes=GIB,
                           cuda_graph_bytes=0, non_torch_bytes=0)
    assert fp8.num_blocks == pool // (page // 2) // 32


def test_graphs_outside_the_budget_leave_the_pool_alone() -> None:
    kw = dict(activation_bytes=GIB, non_torch_bytes=0, cuda_graph_bytes=GIB)
    inside = serving_capacity(LLAMA, 80 * GIB, 4096, **kw)
    outside = serving_capacity(LLAMA, 80 * GIB, 4096, cuda_graphs_in_budget=False, **kw)
    assert outside.kv_pool_bytes - inside.kv_pool_bytes == GIB
    assert outside.headroom_bytes == 80 * GIB - int(80 * GIB * 0.9) - GIB


def test_decode_is_linear_in_s_and_far_below_prefill() -> None:
    for impl in ("naive", "sdpa_flash"):
        a = decode_attention_bytes(impl, 1, 32, 8192, 128, "bf16")
        b = decode_attention_bytes(impl, 1, 32, 16384, 128, "bf16")
        assert b <= 2 * a
    assert decode_attention_bytes("naive", 1, 32, 8192, 128, "bf16") == \
        32 * 128 * 2 + 2 * 32 * 8192 * 2


@pytest.mark.parametrize("kw, says", [
    (dict(gpu_memory_utilization=0), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=float("nan")), "gpu_memory_utilization"),
    (dict(block_size=0), "block_size"),
    (dict(kv_dtype="fp7"), "kv_dtype"),
    (dict(cuda_graph_bytes=-1), "cuda_graph_bytes"),
    (dict(activation_bytes=1.5), "activation_bytes"),
])
def test_bad_serving_input_is_named(kw: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        serving_capacity(LLAMA, 80 * GIB, 4096, **kw)
