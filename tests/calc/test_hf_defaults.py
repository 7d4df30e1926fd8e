"""config.json completed by transformers' own config classes (attnmem/calc/hf_defaults.py).

Gemma 3's checkpoints leave out every text_config value equal to Gemma3TextConfig's default;
read by hand rules, Gemma-3-12B got head_dim 240 (hidden / heads) instead of the class's 256,
and Gemma-3-4B was refused for head counts the class supplies. The two configs below are the
text parts of those checkpoints' config.json files as shipped.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest

from attnmem.calc import hf_defaults
from attnmem.calc.models import KNOWN_MODEL_TYPES, ModelConfig
from attnmem.calc.params import param_count
from attnmem.calc.presets import MODELS, PRESET_HF_CONFIGS

transformers = pytest.importorskip("transformers")

_ROPE = {"factor": 8.0, "rope_type": "linear"}
GEMMA3_12B = {  # google/gemma-3-12b-it config.json, vision_config left out
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"hidden_size": 3840, "intermediate_size": 15360,
                    "model_type": "gemma3_text", "num_attention_heads": 16,
                    "num_hidden_layers": 48, "num_key_value_heads": 8,
                    "rope_scaling": _ROPE, "sliding_window": 1024},
    "torch_dtype": "bfloat16",
}
GEMMA3_4B = {  # google/gemma-3-4b-it config.json, vision_config left out
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                    "model_type": "gemma3_text", "num_hidden_layers": 34,
                    "rope_scaling": _ROPE, "sliding_window": 1024},
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def hand_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_defaults, "_config_mapping", lambda: (None, ""))


def _text_class(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    return getattr(cls, "sub_configs", {}).get("text_config", cls)


def test_gemma3_12b_reads_the_class_head_dim() -> None:
    m = ModelConfig.from_hf_config(GEMMA3_12B)
    assert (m.head_dim, m.num_heads, m.num_kv_heads, m.vocab_size) == (256, 16, 8, 262_208)
    assert m.sliding_window == 1024 and m.sliding_window_layers == 40  # 5 local : 1 global
    assert "text_config.head_dim" in m.defaults_from and "Gemma3Config" in m.defaults_from


def test_gemma3_4b_reads_the_class_head_counts() -> None:
    m = ModelConfig.from_hf_config(GEMMA3_4B)
    text = _text_class("gemma3")()
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (
        text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (8, 4, 256)
    assert "text_config.num_attention_heads" in m.defaults_from


@pytest.mark.parametrize("config", [GEMMA3_12B, GEMMA3_4B], ids=["12b", "4b"])
def test_gemma3_counts_what_transformers_builds(config: dict) -> None:
    """The language model's parameters equal those of the model transformers builds from the
    same file (on the meta device: no memory)."""
    import torch

    cfg = transformers.Gemma3TextConfig.from_dict(
        {**config["text_config"], "vocab_size": _text_class("gemma3")().vocab_size})
    with torch.device("meta"):
        model = transformers.Gemma3ForCausalLM(cfg)
    built = sum(p.numel() for p in model.parameters())  # tied lm_head listed once
    assert param_count(ModelConfig.from_hf_config(config)) == built


def test_without_transformers_a_missing_class_default_is_refused(hand_mode: None) -> None:
    with pytest.raises(ValueError, match=r"missing 'head_dim'.*transformers is not installed"):
        ModelConfig.from_hf_config(GEMMA3_12B)
    with pytest.raises(ValueError, match=r"num_attention_heads.*transformers is not installed"):
        ModelConfig.from_hf_config(GEMMA3_4B)


@pytest.mark.parametrize("model_type", sorted(KNOWN_MODEL_TYPES))
def test_class_head_dims_is_what_transformers_declares(model_type: str) -> None:
    """CLASS_HEAD_DIMS (read where transformers is absent) lists exactly the known types whose
    config class declares a fixed head_dim default, with that default."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type!r}")
    params = inspect.signature(_text_class(model_type)).parameters
    declared = params["head_dim"].default if "head_dim" in params else None
    fixed = declared if isinstance(declared, int) else None
    assert hf_defaults.CLASS_HEAD_DIMS.get(model_type) == fixed


@pytest.mark.parametrize("name", sorted(PRESET_HF_CONFIGS))
def test_every_preset_reads_the_same_through_transformers(name: str) -> None:
    """The bundled presets are read as written (no transformers at import); completed by
    their classes they give the same model."""
    completed = ModelConfig.from_hf_config(PRESET_HF_CONFIGS[name][1], name=name)
    assert replace(completed, defaults_from="", source=MODELS[name].source) == MODELS[name]


def test_a_file_the_class_refuses_is_refused_with_its_reason() -> None:
    bad = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 250,
           "num_attention_heads": 8, "head_dim": 32, "intermediate_size": 64, "vocab_size": 10}
    with pytest.raises(ValueError, match=r"transformers .*LlamaConfig cannot build"):
        ModelConfig.from_hf_config(bad)


def test_the_file_is_not_changed() -> None:
    import copy

    before = copy.deepcopy(GEMMA3_12B)
    ModelConfig.from_hf_config(GEMMA3_12B)
    assert before == GEMMA3_12B
