"""generate()'s peak traced on the meta device (attnmem.trace.inference) against calc's hand
rules (attnmem.calc.inference_step) on every bundled family the rules cover, and the trace's
answers and refusals for models the rules do not cover.

The rules are within 0.07% of the H200's generate() rows (data/inference_steps_h200.csv), so
agreement here is agreement with the GPU at one remove. The issue's bar is 1%; the families
below agree within 0.1% at full size (the closing note of issue 42 lists them), and the test
holds them to 0.5% at 4 layers (cut so that the suite stays fast)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnmem.calc.backends import NoKernel  # noqa: E402
from attnmem.calc.inference_step import inference_step  # noqa: E402
from attnmem.calc.models import ModelConfig  # noqa: E402
from attnmem.trace.generate import trace_inference  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
#: bundled families with rules, and the layers kept (a whole pattern: Gemma 3's 5 local + 1
#: global, DeepSeek's first dense layer and MoE ones)
FAMILIES = {"Llama-3.2-1B": 4, "Mistral-7B-v0.1": 4, "Qwen2.5-7B": 4, "Phi-3-mini-4k-instruct": 4,
            "Mixtral-8x7B-v0.1": 2, "Qwen3-30B-A3B": 2, "DeepSeek-V2-Lite": 4,
            "gemma-3-27b-it": 6, "gemma-2-9b": 2}


def _cut(name: str, layers: int) -> dict:
    d = json.loads((FIXTURES / f"{name}.json").read_text())
    inner = d.get("text_config", d)
    inner["num_hidden_layers"] = layers
    if "layer_types" in inner:
        inner["layer_types"] = inner["layer_types"][:layers]
    return d


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("attention,batch,prompt,new", [("sdpa", 1, 1024, 2),
                                                        ("eager", 2, 1500, 5)])
def test_trace_agrees_with_the_rules(name: str, attention: str, batch: int, prompt: int,
                                     new: int) -> None:
    if name == "gemma-2-9b" and attention != "eager":
        pytest.skip("Gemma 2 soft-caps its logits: eager only (both refuse SDPA)")
    d = _cut(name, FAMILIES[name])
    want = inference_step(ModelConfig.from_hf_config(d), batch, prompt, new,
                          attention=attention)
    got = trace_inference(d, batch, prompt, new, attention=attention)
    # Gemma 3's checkpoint holds a vision tower that the rules leave out (read_as): compare
    # what generate() adds above the weights there, the whole peak elsewhere
    if name.startswith("gemma-3"):
        assert got.weights_bytes > want.weights_bytes
        g, w = got.peak_bytes - got.weights_bytes, want.peak_bytes - want.weights_bytes
    else:
        # buffers the rules do not size (DeepSeek's rotary tables: 0.5 MiB at 3 layers)
        assert got.weights_bytes == pytest.approx(want.weights_bytes, abs=2**20)
        g, w = got.peak_bytes, want.peak_bytes
    assert abs(g - w) <= 0.005 * w, (name, g, w)
    # the cache's keys and values exactly; the trace also holds the layers' few-byte counters
    assert 0 <= got.kv_cache_bytes - want.kv_cache_bytes <= 4096


def _tiny(cls_name: str, **extra) -> dict:
    cls = getattr(transformers, cls_name)
    cfg = cls(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, pad_token_id=None,
              **extra)
    return {**cfg.to_dict(), "model_type": cfg.model_type}


@pytest.mark.parametrize("cls_name,extra", [
    ("Olmo2Config", {}), ("GraniteConfig", {}), ("SmolLM3Config", {}),
    ("Glm4MoeConfig", {"n_routed_experts": 4, "num_experts_per_tok": 2,
                       "moe_intermediate_size": 32, "first_k_dense_replace": 1}),
])
def test_models_without_rules_get_a_traced_answer(cls_name: str, extra: dict) -> None:
    """Types calc has no rules for: the trace answers, and its parts add up: weights,
    workspace, cache and the activations of the peak moment, the last grown with the
    prompt."""
    d = _tiny(cls_name, **extra)
    with pytest.raises(ValueError):
        ModelConfig.from_hf_config(d)  # no rules: the trace is the only answer
    short = trace_inference(d, 1, 256, 3)
    long = trace_inference(d, 1, 1024, 3)
    for t in (short, long):
        assert t.peak_bytes == t.weights_bytes + t.fixed_bytes + t.kv_cache_bytes + \
            t.activation_bytes
        assert t.activation_bytes > 0 and t.at_peak
    # the cache is (prompt + N − 1) tokens × 2 (k, v) × H_kv × d × 2 bytes × layers
    head = 64 // 4
    assert long.kv_cache_bytes == (1024 + 2) * 2 * 2 * head * 2 * 2
    assert long.activation_bytes > short.activation_bytes


def test_a_forced_backend_without_a_kernel_is_refused_with_the_reason() -> None:
    d = _cut("Mistral-7B-v0.1", 2)
    d["sliding_window"] = 512  # shorter than the prompt: transformers passes a mask
    with pytest.raises(NoKernel, match="flash backend takes no mask"):
        trace_inference(d, 1, 1024, 2, attention="sdpa_flash")
    d = _cut("Llama-3.2-1B", 2)
    with pytest.raises(NoKernel, match="no grouped-query kernel"):
        trace_inference(d, 1, 1024, 2, attention="sdpa_efficient")


def test_what_transformers_cannot_run_is_refused_with_its_reason() -> None:
    d = _tiny("GptOssConfig", num_local_experts=4, num_experts_per_tok=2)
    with pytest.raises(ValueError, match="GptOss"):
        trace_inference(d, 1, 128, 2, attention="sdpa")
    assert trace_inference(d, 1, 128, 2, attention="eager").peak_bytes > 0


@pytest.mark.parametrize("kw,match", [({"batch": 0}, "batch"), ({"prompt_len": -3}, "prompt_len"),
                                      ({"attention": "flash"}, "attention 'flash'"),
                                      ({"dtype": "int8"}, "dtype 'int8'")])
def test_bad_inputs_name_the_value(kw: dict, match: str) -> None:
    args = {"batch": 1, "prompt_len": 64, "new_tokens": 2, "attention": "sdpa", "dtype": "bf16"}
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        trace_inference(_tiny("Olmo2Config"), **args)


def test_a_mixer_looping_over_the_tokens_is_traced_at_length() -> None:
    """Mamba's reference scan loops over every token on meta; the loop is folded
    (attnmem.trace.loops, checked against the unfolded trace in test_refused_tail.py), so a
    prompt of 4,000 tokens, once refused as minutes of tracing, is traced."""
    cfg = transformers.MambaConfig(hidden_size=64, num_hidden_layers=4, vocab_size=1000,
                                   pad_token_id=None)
    d = {**cfg.to_dict(), "model_type": "mamba"}
    long = trace_inference(d, 1, 4000, 1, attention="eager")
    assert long.peak_bytes > trace_inference(d, 1, 64, 2, attention="eager").peak_bytes
