"""ModelConfig.from_hf_config, the presets, and parameter counts against published figures."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmem.calc import hf_defaults
from attnmem.calc.models import ModelConfig
from attnmem.calc.params import active_param_count, param_breakdown, param_count
from attnmem.calc.presets import MODELS, PRESET_HF_CONFIGS, fixture_name
from attnmem.calc.weights import weight_bytes

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf_configs"

# Published parameter counts: (count, exact?, source). "exact" counts are the number of
# parameters stored in the released checkpoint (Hugging Face Hub safetensors metadata shown on
# the model page; the same figures appear in keras-hub's preset tables); the others are the
# rounded figures printed in the model card.
PUBLISHED: dict[str, tuple[int, bool, str]] = {
    "Llama 3.1 8B": (8_030_261_248, True, "HF meta-llama/Llama-3.1-8B safetensors (8.03B)"),
    "Llama 3.1 70B": (70_553_706_496, True, "HF meta-llama/Llama-3.1-70B safetensors (70.6B)"),
    "Llama 3.1 405B": (405_853_388_800, True, "HF meta-llama/Llama-3.1-405B safetensors"),
    "Llama 3.2 1B": (1_235_814_400, True, "HF meta-llama/Llama-3.2-1B safetensors (1.23B)"),
    "Llama 3.2 3B": (3_212_749_824, True, "HF meta-llama/Llama-3.2-3B safetensors (3.21B)"),
    "Mistral 7B v0.1": (7_241_732_096, True, "HF mistralai/Mistral-7B-v0.1 safetensors"),
    "Mixtral 8x7B": (46_702_792_704, True, "HF mistralai/Mixtral-8x7B-v0.1 safetensors"),
    "Qwen2.5 7B": (7_610_000_000, False, "Qwen/Qwen2.5-7B model card: 7.61B"),
    "Qwen2.5 72B": (72_700_000_000, False, "Qwen/Qwen2.5-72B model card: 72.7B"),
    "Qwen3 30B-A3B (MoE)": (30_500_000_000, False, "Qwen/Qwen3-30B-A3B model card: 30.5B"),
    "Gemma 2 9B": (9_241_705_984, True, "HF google/gemma-2-9b safetensors; keras-hub gemma2"),
    "Gemma 2 27B": (27_227_128_320, True, "HF google/gemma-2-27b safetensors; keras-hub"),
    # The card's 27B (27.4B stored) includes the ~0.4B SigLIP vision encoder; the language
    # model alone is what llama.cpp reports as n_params for the text GGUF of gemma-3-27b-it.
    "Gemma 3 27B (text)": (27_009_346_304, True, "llama.cpp n_params, gemma-3-27b-it text"),
    "Phi-3 mini (3.8B)": (3_821_079_552, True, "HF microsoft/Phi-3-mini-4k-instruct; keras-hub"),
    # Issue 19 families. DeepSeek-V3's HF page shows 685B: the 671B main model plus the 14B
    # multi-token-prediction module (num_nextn_predict_layers), which transformers does not build.
    "DeepSeek-V3 (MLA, MoE)": (671_000_000_000, False, "deepseek-ai/DeepSeek-V3 card: 671B total"),
    "DeepSeek-V2-Lite (MLA, MoE)": (15_700_000_000, False, "deepseek-ai/DeepSeek-V2-Lite card: 15.7B"),
    # The card's 80B; the HF page's 81.3B adds the MTP layer (mtp_num_hidden_layers).
    "Qwen3-Next 80B-A3B (hybrid)": (80_000_000_000, False, "Qwen/Qwen3-Next-80B-A3B card: 80B"),
    "Jamba v0.1 (hybrid)": (51_600_000_000, False, "ai21labs/Jamba-v0.1 HF page: 51.6B (card: 52B)"),
    "GPT-2 (124M)": (124_439_808, True, "HF openai-community/gpt2 safetensors (124M)"),
    "GPT-2 XL (1.5B)": (1_557_611_200, True, "HF openai-community/gpt2-xl safetensors (1.5B)"),
    # Issue 30 presets (tests/calc/test_models_now.py checks them in detail).
    "gpt-oss-20b (MoE, MXFP4)": (20_910_000_000, False, "gpt-oss card arXiv 2508.10925 T1: 20.91B"),
    "gpt-oss-120b (MoE, MXFP4)": (116_830_000_000, False, "gpt-oss card T1: 116.83B"),
    "Kimi-K2 (MLA, MoE, fp8)": (1_030_000_000_000, False, "HF moonshotai/Kimi-K2-Instruct: 1.03T"),
    "Qwen2.5 7B Instruct AWQ (int4)": (7_610_000_000, False, "Qwen2.5-7B-Instruct card: 7.61B"),
}


@pytest.fixture
def hand_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read as the bare command-line install does: transformers not importable."""
    monkeypatch.setattr(hf_defaults, "_config_mapping", lambda: (None, ""))


def llama_like(**overrides: object) -> dict:
    """A small valid Llama-style config.json dict, with overrides."""
    config: dict = {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 688,
        "vocab_size": 1000,
    }
    config.update(overrides)
    return config


# ----------------------------------------------------------------- presets vs published ----


def test_at_least_twelve_presets_all_published() -> None:
    assert len(MODELS) >= 12
    assert set(PUBLISHED) == set(MODELS)
    for model in MODELS.values():
        assert model.source.startswith("https://huggingface.co/")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_published(name: str) -> None:
    published, exact, _source = PUBLISHED[name]
    computed = param_count(MODELS[name])
    assert abs(computed - published) / published <= 0.005, (name, computed, published)
    if exact:
        assert computed == published


def test_moe_active_params_match_model_cards() -> None:
    # Mixtral 8x7B model card / Jiang et al. arXiv 2401.04088: 12.9B active of 46.7B.
    mixtral = active_param_count(MODELS["Mixtral 8x7B"])
    assert abs(mixtral - 12_900_000_000) / 12_900_000_000 <= 0.005
    # Qwen3-30B-A3B model card: "3.3B activated" (3.35B, the card truncates to one decimal).
    qwen = active_param_count(MODELS["Qwen3 30B-A3B (MoE)"])
    assert 3_300_000_000 <= qwen < 3_400_000_000
    for model in MODELS.values():
        if model.num_experts == 1:
            assert active_param_count(model) == param_count(model)


def test_qwen2_moe_shared_expert_counts() -> None:
    # Qwen/Qwen1.5-MoE-A2.7B config.json; model card: 14.3B in total, 2.7B activated.
    config = {
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 32768,
    }
    model = ModelConfig.from_hf_config(config)
    assert abs(param_count(model) - 14.3e9) / 14.3e9 <= 0.005
    assert abs(active_param_count(model) - 2.7e9) / 2.7e9 <= 0.005
    assert model.sliding_window is None and model.sliding_window_layers == 0


def test_breakdown_sums_to_count() -> None:
    for model in MODELS.values():
        parts = param_breakdown(model)
        assert sum(parts.values()) == param_count(model)
        assert all(isinstance(v, int) and v >= 0 for v in parts.values())


def test_weight_bytes_of_presets() -> None:
    llama = MODELS["Llama 3.1 8B"]
    assert weight_bytes(llama, "bf16") == 2 * 8_030_261_248  # 16.06 GB in bf16
    assert weight_bytes(llama, 2) == weight_bytes(llama, "bfloat16")
    assert weight_bytes(llama, "int4") == 8_030_261_248 // 2
    gpt2 = MODELS["GPT-2 (124M)"]
    assert weight_bytes(gpt2, "fp32") == 4 * 124_439_808
    assert weight_bytes(replace(gpt2, vocab_size=50_258), 0.5) == math.ceil(
        param_count(replace(gpt2, vocab_size=50_258)) / 2
    )


@pytest.mark.parametrize("bad", ["fp12", "", 0, -2, float("nan"), None, True])
def test_weight_bytes_refuses_bad_bytes_per_param(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        weight_bytes(MODELS["GPT-2 (124M)"], bad)  # type: ignore[arg-type]


# ------------------------------------------------------------- fixtures and round trips ----


@pytest.mark.parametrize("name", sorted(PRESET_HF_CONFIGS))
def test_fixture_round_trip(name: str) -> None:
    repo, config = PRESET_HF_CONFIGS[name]
    path = FIXTURES / fixture_name(repo)
    loaded = json.loads(path.read_text())
    assert loaded == config  # the fixture is the dict the preset was built from
    parsed = ModelConfig.from_hf_config(loaded, name=name)
    assert replace(parsed, source=MODELS[name].source, defaults_from="") == MODELS[name]
    again = ModelConfig.from_hf_config(json.loads(json.dumps(loaded)), name=name)
    assert again == parsed


def test_every_fixture_is_a_preset() -> None:
    names = {fixture_name(repo) for repo, _ in PRESET_HF_CONFIGS.values()}
    assert {p.name for p in FIXTURES.glob("*.json")} == names


def test_name_defaults() -> None:
    assert ModelConfig.from_hf_config(llama_like()).name == "llama"
    named = llama_like(_name_or_path="org/my-model")
    assert ModelConfig.from_hf_config(named).name == "org/my-model"
    assert ModelConfig.from_hf_config(named, name="Mine").name == "Mine"


# --------------------------------------------------------- architecture quirks, one each ----


def test_llama_defaults() -> None:
    m = MODELS["Llama 3.1 8B"]
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim) == (
        32,
        4096,
        32,
        8,
        128,
    )
    assert not m.tie_embeddings and m.gated_mlp and m.sliding_window is None
    assert m.max_position_embeddings == 131072
    assert not ModelConfig.from_hf_config(llama_like()).tie_embeddings  # Llama default
    assert MODELS["Llama 3.2 1B"].tie_embeddings and MODELS["Llama 3.2 1B"].head_dim == 64


def test_missing_kv_heads_means_mha_and_head_dim_from_hidden() -> None:
    config = llama_like()
    del config["num_key_value_heads"]
    m = ModelConfig.from_hf_config(config)
    assert m.num_kv_heads == m.num_heads == 8
    assert m.head_dim == 32
    m = ModelConfig.from_hf_config(llama_like(num_key_value_heads=None, head_dim=None))
    assert m.num_kv_heads == 8 and m.head_dim == 32


def test_explicit_head_dim_wins() -> None:
    m = MODELS["Gemma 2 9B"]
    assert m.head_dim == 256 != m.hidden_size // m.num_heads
    # head_dim given: hidden need not divide by heads (Gemma 2 27B: 4608 / 32 = 144, d = 128)
    assert MODELS["Gemma 2 27B"].head_dim == 128
    assert ModelConfig.from_hf_config(llama_like(head_dim=64)).head_dim == 64


def test_hidden_not_dividing_heads_is_refused_for_transformers_reason() -> None:
    """LlamaConfig refuses hidden 250 over 8 heads even with head_dim given: transformers
    cannot build that model, and the refusal says so in its words."""
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match=r"LlamaConfig cannot build.*250"):
        ModelConfig.from_hf_config(llama_like(hidden_size=250, head_dim=32))


def test_explicit_head_dim_wins_by_hand(hand_mode: None) -> None:
    assert ModelConfig.from_hf_config(llama_like(hidden_size=250, head_dim=32)).head_dim == 32


def test_mistral_window_on_every_layer_mixtral_none() -> None:
    mistral = MODELS["Mistral 7B v0.1"]
    assert mistral.sliding_window == 4096 and mistral.sliding_window_layers == 32
    mixtral = MODELS["Mixtral 8x7B"]
    assert mixtral.sliding_window is None and mixtral.sliding_window_layers == 0
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2)
    later = {**PRESET_HF_CONFIGS["Mistral 7B v0.1"][1], "sliding_window": None}  # v0.2+
    assert ModelConfig.from_hf_config(later).sliding_window_layers == 0


def test_qwen2_window_only_when_enabled() -> None:
    qwen = MODELS["Qwen2.5 7B"]
    assert qwen.sliding_window is None and qwen.sliding_window_layers == 0
    assert qwen.attention_bias and not qwen.attention_out_bias  # q/k/v bias, none on o
    enabled = {**PRESET_HF_CONFIGS["Qwen2.5 7B"][1], "use_sliding_window": True}
    enabled.update(sliding_window=4096, max_window_layers=20)  # first 20 layers global
    m = ModelConfig.from_hf_config(enabled)
    assert m.sliding_window == 4096 and m.sliding_window_layers == 8


def test_gemma_alternating_and_patterned_windows() -> None:
    g2 = MODELS["Gemma 2 9B"]
    assert g2.sliding_window == 4096 and g2.sliding_window_layers == 21  # half of 42
    assert g2.tie_embeddings and g2.norms_per_layer == 4 and not g2.qk_norm
    g3 = MODELS["Gemma 3 27B (text)"]
    assert g3.sliding_window == 1024 and g3.sliding_window_layers == 62 - 62 // 6  # 5:1
    assert g3.vocab_size == 262_208 and g3.qk_norm and g3.tie_embeddings
    assert g3.max_position_embeddings == 131_072
    config = json.loads(json.dumps(PRESET_HF_CONFIGS["Gemma 3 27B (text)"][1]))
    config["text_config"]["sliding_window_pattern"] = 2
    assert ModelConfig.from_hf_config(config).sliding_window_layers == 31
    # Gemma 1: tied, head_dim 256, no window, 2 norms per block
    gemma7b = llama_like(
        model_type="gemma", hidden_size=3072, num_attention_heads=16, num_key_value_heads=16
    )
    g1 = ModelConfig.from_hf_config({**gemma7b, "head_dim": 256})
    assert g1.tie_embeddings and g1.head_dim == 256 and g1.norms_per_layer == 2


def test_layer_types_list_counts_sliding_layers() -> None:
    types = ["sliding_attention"] * 3 + ["full_attention"]
    m = ModelConfig.from_hf_config(llama_like(sliding_window=512, layer_types=types))
    assert m.sliding_window == 512 and m.sliding_window_layers == 3
    m = ModelConfig.from_hf_config(llama_like(sliding_window=None, layer_types=types))
    assert m.sliding_window is None and m.sliding_window_layers == 0


def test_phi3_window_and_no_biases() -> None:
    phi = MODELS["Phi-3 mini (3.8B)"]
    assert phi.sliding_window == 2047 and phi.sliding_window_layers == 32
    assert not (phi.attention_bias or phi.mlp_bias or phi.norm_bias or phi.tie_embeddings)
    assert phi.num_kv_heads == phi.num_heads == 32


def test_gpt2_keys() -> None:
    gpt2 = MODELS["GPT-2 (124M)"]
    assert (gpt2.num_layers, gpt2.hidden_size, gpt2.num_heads, gpt2.head_dim) == (12, 768, 12, 64)
    assert gpt2.intermediate_size == 4 * 768 and not gpt2.gated_mlp
    assert gpt2.attention_bias and gpt2.attention_out_bias and gpt2.mlp_bias and gpt2.norm_bias
    assert gpt2.tie_embeddings and gpt2.learned_positions == 1024
    inner = {**PRESET_HF_CONFIGS["GPT-2 (124M)"][1], "n_inner": 1000}
    assert ModelConfig.from_hf_config(inner).intermediate_size == 1000
    untied = {**PRESET_HF_CONFIGS["GPT-2 (124M)"][1], "tie_word_embeddings": False}
    assert param_count(ModelConfig.from_hf_config(untied)) == 124_439_808 + 50257 * 768


def test_other_non_gated_families() -> None:
    # EleutherAI/pythia-1.4b config.json; 1,414,647,808 parameters (Biderman et al., "Pythia",
    # arXiv 2304.01373, Table 1 lists the model as 1.4B; the exact count is the checkpoint's).
    pythia = {
        "model_type": "gpt_neox",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "vocab_size": 50304,
        "max_position_embeddings": 2048,
        "rotary_pct": 0.25,
        "tie_word_embeddings": False,
    }
    m = ModelConfig.from_hf_config(pythia)
    assert not m.gated_mlp and m.norm_bias and m.attention_bias and m.mlp_bias
    assert param_count(m) == 1_414_647_808
    # microsoft/phi-2 config.json; 2,779,683,840 stored (HF safetensors). The lm_head bias
    # (51,200 values) is not modelled: 0.002% short.
    phi2 = {
        "model_type": "phi",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "vocab_size": 51200,
        "max_position_embeddings": 2048,
        "partial_rotary_factor": 0.4,
        "tie_word_embeddings": False,
    }
    m = ModelConfig.from_hf_config(phi2)
    assert m.norms_per_layer == 1
    assert param_count(m) == 2_779_683_840 - 51_200


def test_text_config_falls_back_to_top_level() -> None:
    nested = {"model_type": "llava", "tie_word_embeddings": True, "text_config": llama_like()}
    m = ModelConfig.from_hf_config(nested)
    assert m.tie_embeddings and m.num_layers == 4
    assert m.name == "llama"  # the inner model_type wins


def test_llama_attention_bias_covers_output_projection() -> None:
    plain = ModelConfig.from_hf_config(llama_like())
    biased = ModelConfig.from_hf_config(llama_like(attention_bias=True, mlp_bias=True))
    h, d = 256, 32
    per_layer = (8 + 2 * 2) * d + h + (2 * 688 + h)  # q,k,v biases + o bias + gate,up,down
    assert param_count(biased) - param_count(plain) == 4 * per_layer


# ------------------------------------------------------------------- malformed configs ----

BAD_CONFIGS: list[tuple[str, dict, str]] = [
    ("missing hidden", {k: v for k, v in llama_like().items() if k != "hidden_size"},
     "missing 'hidden_size' (or 'n_embd')"),
    ("missing layers", {k: v for k, v in llama_like().items() if k != "num_hidden_layers"},
     "'num_hidden_layers'"),
    ("missing heads", {k: v for k, v in llama_like().items() if k != "num_attention_heads"},
     "'num_attention_heads'"),
    ("missing mlp", {k: v for k, v in llama_like().items() if k != "intermediate_size"},
     "'intermediate_size'"),
    ("missing vocab", {k: v for k, v in llama_like().items() if k != "vocab_size"},
     "'vocab_size'"),
    ("null hidden", llama_like(hidden_size=None), "'hidden_size'"),
    ("junk string", llama_like(num_attention_heads="32x"), "'num_attention_heads'"),
    ("string number", llama_like(hidden_size="4096"), "'hidden_size'"),
    ("negative", llama_like(num_hidden_layers=-1), "'num_hidden_layers'"),
    ("zero", llama_like(num_attention_heads=0), "'num_attention_heads'"),
    ("zero kv", llama_like(num_key_value_heads=0), "'num_key_value_heads'"),
    ("fraction", llama_like(intermediate_size=688.5), "'intermediate_size'"),
    ("nan", llama_like(intermediate_size=float("nan")), "'intermediate_size'"),
    ("inf", llama_like(vocab_size=float("inf")), "'vocab_size'"),
    ("bool", llama_like(num_key_value_heads=True), "'num_key_value_heads'"),
    ("list", llama_like(vocab_size=[1000]), "'vocab_size'"),
    ("absurd", llama_like(num_hidden_layers=10**12), "'num_hidden_layers'"),
    ("kv not dividing", llama_like(num_key_value_heads=3), "'num_key_value_heads' (3)"),
    ("hidden not dividing", llama_like(hidden_size=250), "give 'head_dim'"),
    ("bad head_dim", llama_like(head_dim="128"), "'head_dim'"),
    ("bad tie", llama_like(tie_word_embeddings="yes"), "'tie_word_embeddings'"),
    ("bad window", llama_like(sliding_window=-5), "'sliding_window'"),
    ("bad model_type", llama_like(model_type=7), "'model_type'"),
    ("bad layer_types", llama_like(sliding_window=8, layer_types="sliding"), "'layer_types'"),
    ("short layer_types", llama_like(sliding_window=8, layer_types=["full_attention"]),
     "'layer_types'"),
    ("text_config not dict", {"text_config": [1, 2]}, "'text_config'"),
    ("nested bad", {"text_config": llama_like(hidden_size="x")}, "'text_config.hidden_size'"),
    ("moe without top-k", llama_like(num_local_experts=8), "'num_experts_per_tok'"),
    ("moe top-k too big", llama_like(num_local_experts=8, num_experts_per_tok=9),
     "'num_experts_per_tok'"),
    ("bad mlp_only_layers", llama_like(num_experts=4, num_experts_per_tok=2,
                                       mlp_only_layers=[0, 99]), "'mlp_only_layers'"),
    ("gpt2 missing n_embd", {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "vocab_size": 9},
     "'hidden_size' (or 'n_embd')"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("label", "config", "needle"), BAD_CONFIGS, ids=[b[0] for b in BAD_CONFIGS]
)
def test_malformed_config_raises_naming_the_key(label: str, config: dict, needle: str,
                                                hand_mode: None) -> None:
    """Read by hand (transformers absent): every wrong or missing value is named."""
    with pytest.raises(ValueError) as info:
        ModelConfig.from_hf_config(config)
    message = str(info.value)
    assert message.startswith("config.json")
    assert needle in message, message


WRONG_VALUES = [b for b in BAD_CONFIGS if not b[0].startswith(("missing", "gpt2 missing"))
                and b[0] not in ("hidden not dividing", "text_config not dict")]


@pytest.mark.parametrize("label, config, needle", WRONG_VALUES, ids=[b[0] for b in WRONG_VALUES])
def test_wrong_values_are_named_through_transformers_too(label: str, config: dict,
                                                          needle: str) -> None:
    """Completed by the config class, a value the file gets wrong is still named in the
    file's words (or the class's refusal names it)."""
    pytest.importorskip("transformers")
    with pytest.raises(ValueError) as info:
        ModelConfig.from_hf_config(config)
    message = str(info.value)
    assert message.startswith("config.json")
    assert needle.strip("'").split("'")[0] in message, message


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "intermediate_size", "vocab_size"])
def test_a_missing_value_comes_from_the_class_and_is_named(key: str) -> None:
    """transformers builds a Llama whose config.json leaves out a value with LlamaConfig's
    default; calc reads the same default and says where it came from."""
    transformers = pytest.importorskip("transformers")
    config = {k: v for k, v in llama_like().items() if k != key}
    if key == "hidden_size":
        config["head_dim"] = 32
    m = ModelConfig.from_hf_config(config)
    want = transformers.LlamaConfig.from_dict(dict(config)).to_dict()[key]
    got = {"hidden_size": m.hidden_size, "num_hidden_layers": m.num_layers,
           "num_attention_heads": m.num_heads, "intermediate_size": m.intermediate_size,
           "vocab_size": m.vocab_size}[key]
    assert got == want
    assert m.defaults_from.startswith("LlamaConfig defaults") and key in m.defaults_from


def test_junk_string_message_reads_well() -> None:
    with pytest.raises(ValueError, match=r"'num_attention_heads' must be a whole number.*'32x'"):
        ModelConfig.from_hf_config(llama_like(num_attention_heads="32x"))


@pytest.mark.parametrize("not_a_dict", [None, [], "config", 42, ["hidden_size", 4096]])
def test_non_dict_config_raises(not_a_dict: object) -> None:
    with pytest.raises(ValueError, match="config.json must be a JSON object"):
        ModelConfig.from_hf_config(not_a_dict)  # type: ignore[arg-type]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=5,
)
KEYS = sorted(set(llama_like()) | {"head_dim", "sliding_window", "num_local_experts",
              "num_experts_per_tok", "tie_word_embeddings", "text_config", "layer_types",
              "n_embd", "n_layer", "n_head", "use_sliding_window", "mlp_only_layers"})  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), JSON_VALUES), st.booleans())
def test_any_json_either_parses_or_raises_value_error(junk: dict, on_top_of_valid: bool) -> None:
    config = {**llama_like(), **junk} if on_top_of_valid else junk
    try:
        model = ModelConfig.from_hf_config(config)
    except ValueError as err:
        assert str(err).startswith("config.json")
    else:
        assert param_count(model) > 0


# ------------------------------------------------------------------- property tests ----

DIMS = st.integers(1, 8)


@st.composite
def model_configs(draw: st.DrawFn) -> ModelConfig:
    kv = draw(DIMS)
    group = draw(DIMS)
    experts = draw(st.integers(1, 8))
    return ModelConfig(
        name="random",
        num_layers=draw(st.integers(1, 200)),
        hidden_size=draw(st.integers(1, 20_000)),
        num_heads=kv * group,
        num_kv_heads=kv,
        head_dim=draw(st.integers(1, 512)),
        intermediate_size=draw(st.integers(1, 60_000)),
        vocab_size=draw(st.integers(1, 300_000)),
        tie_embeddings=draw(st.booleans()),
        gated_mlp=draw(st.booleans()),
        num_experts=experts,
        experts_per_token=draw(st.integers(1, experts)),
        attention_bias=draw(st.booleans()),
        mlp_bias=draw(st.booleans()),
        norm_bias=draw(st.booleans()),
        learned_positions=draw(st.integers(0, 4096)),
        attention_out_bias=draw(st.booleans()),
        norms_per_layer=draw(st.sampled_from([2, 4])),
        qk_norm=draw(st.booleans()),
    )


@given(model_configs())
def test_param_count_is_a_positive_int(model: ModelConfig) -> None:
    count = param_count(model)
    assert isinstance(count, int) and count > 0
    assert 0 < active_param_count(model) <= count


@given(model_configs())
def test_gqa_never_more_params_than_mha(model: ModelConfig) -> None:
    mha = replace(model, num_kv_heads=model.num_heads)
    assert param_count(model) <= param_count(mha)
    mqa = replace(model, num_kv_heads=1)
    assert param_count(mqa) <= param_count(model)


@given(model_configs())
def test_tying_never_adds_params(model: ModelConfig) -> None:
    tied = param_count(replace(model, tie_embeddings=True))
    untied = param_count(replace(model, tie_embeddings=False))
    assert untied - tied == model.vocab_size * model.hidden_size


@given(model_configs(), st.integers(1, 8), st.integers(1, 8))  # e·k ≤ 64 B (units limit)
def test_weight_bytes_linear_in_bytes_per_param(model: ModelConfig, e: int, k: int) -> None:
    assert weight_bytes(model, e) == e * param_count(model)
    assert weight_bytes(model, k * e) == k * weight_bytes(model, e)
    assert weight_bytes(model, 0.5) == math.ceil(param_count(model) / 2)
    assert weight_bytes(model, "int4") == weight_bytes(model, 0.5)
    assert weight_bytes(model, "fp16") == 2 * weight_bytes(model, "int8")


@given(st.integers(1, 64), st.integers(1, 8), st.integers(1, 4))
def test_parsed_gqa_below_mha(kv: int, group: int, layers: int) -> None:
    heads = kv * group
    base = llama_like(num_hidden_layers=layers, num_attention_heads=heads, head_dim=16,
                      hidden_size=16 * heads)
    gqa = ModelConfig.from_hf_config({**base, "num_key_value_heads": kv})
    mha = ModelConfig.from_hf_config({**base, "num_key_value_heads": heads})
    assert param_count(gqa) <= param_count(mha)
