"""Parameters of the model transformers builds on the meta device (attnmem/trace/weights.py)
equal calc's hand rules on every bundled family, exactly."""

from __future__ import annotations

import pytest

from attnmem.calc.params import param_count
from attnmem.calc.presets import MODELS, PRESET_HF_CONFIGS

pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnmem.trace.weights import trace_weights  # noqa: E402


@pytest.mark.parametrize("name", list(PRESET_HF_CONFIGS))
def test_traced_parameters_equal_the_rules(name: str) -> None:
    traced = trace_weights(PRESET_HF_CONFIGS[name][1])
    assert traced.language_model_count == param_count(MODELS[name]), traced.parts


def test_tied_weights_are_counted_once() -> None:
    traced = trace_weights(PRESET_HF_CONFIGS["Llama 3.2 1B"][1])  # tie_word_embeddings: true
    assert traced.tied == ("lm_head.weight",)
    assert traced.parts["lm_head"] == 0  # its storage is the embedding's, counted there


def test_a_model_calc_has_no_rules_for_is_counted() -> None:
    """OLMo-2 (q/k norms over all heads, post-norms): no hand rules, built and counted."""
    olmo2 = {"model_type": "olmo2", "hidden_size": 256, "intermediate_size": 512,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
             "vocab_size": 1000}
    t = trace_weights(olmo2)
    h, i, v, L = 256, 512, 1000, 2
    per_layer = 4 * h * h + 3 * h * i + 2 * h + 2 * h  # q,k,v,o; MLP; 2 post-norms; q/k norms
    assert t.param_count == 2 * v * h + L * per_layer + h
    assert t.other_buffer_bytes > 0  # rotary inv_freq, fp32, not in the state dict


def test_buffers_are_not_parameters() -> None:
    t = trace_weights(PRESET_HF_CONFIGS["GPT-2 (124M)"][1])
    assert t.param_count == param_count(MODELS["GPT-2 (124M)"])
    assert t.weight_bytes(2) >= 2 * t.param_count


def test_a_config_transformers_refuses_names_why() -> None:
    with pytest.raises(ValueError, match="not a type this transformers builds"):
        trace_weights({"model_type": "no_such_model"})
