"""A training step traced on the meta device (attnmem.trace.training) against the GPU: the
bundled H200 rows (data/training_steps_h200.csv) of the harness's own models, and calc's rules
where no row exists. Rows: bf16, no adapters, no packing (what the trace runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pd = pytest.importorskip("pandas")

from attnmem.calc.models import ModelConfig  # noqa: E402
from attnmem.calc.training_step import training_step  # noqa: E402
from attnmem.measure import train_models  # noqa: E402
from attnmem.trace.training import trace_training  # noqa: E402

ROWS = Path(__file__).resolve().parents[2] / "data" / "training_steps_h200.csv"
#: (model, attention, checkpointing, batch, seq_len): eager at long s (its softmax backward's
#: CUDA temporary), fused backends, checkpointing, a wide vocabulary, MoE
CASES = [("llama3-8b-2l", "eager", False, 1, 8192), ("llama3-8b-2l", "eager", True, 1, 12000),
         ("llama3-8b-2l", "sdpa_flash", False, 1, 32768),
         ("llama3-8b-2l", "sdpa_cudnn", True, 1, 8192),
         ("qwen2.5-7b-2l", "sdpa_flash", False, 1, 4096),
         ("mixtral-8x7b-2l", "sdpa_flash", False, 1, 4096)]


def _row(model: str, attention: str, ckpt: bool, batch: int, s: int) -> pd.Series:
    df = pd.read_csv(ROWS)
    hit = df[(df.model == model) & (df.attention == attention) & (df.checkpointing == ckpt)
             & (df.batch == batch) & (df.seq_len == s) & (df.precision == "bf16")
             & (df.status == "ok") & (df.adapter.isna() | (df.adapter == "none"))
             & df.packed_lengths.isna()]
    if hit.empty:
        pytest.skip(f"no bundled row for {model} {attention} {ckpt} {batch} {s}")
    return hit.iloc[0]


@pytest.mark.parametrize("model,attention,ckpt,batch,s", CASES)
def test_trace_matches_the_measured_peak(model: str, attention: str, ckpt: bool, batch: int,
                                         s: int) -> None:
    row = _row(model, attention, ckpt, batch, s)
    t = trace_training(train_models.hf_config(model, int(row.layers)), batch, s,
                       attention=attention, checkpointing=ckpt)
    assert abs(t.peak_bytes - row.peak_bytes) <= 0.002 * row.peak_bytes, (
        t.peak_bytes, row.peak_bytes)
    assert abs(t.before_step_bytes - row.before_step_bytes) <= 0.002 * row.before_step_bytes


def test_lora_and_a_type_without_rules() -> None:
    """LoRA through peft: the adapters are the only trainable parameters, and the step holds
    less than full training's; a type calc has no rules for (OLMo-2) gets a step."""
    pytest.importorskip("peft")
    d = train_models.hf_config("llama3.2-1b-2l", 2)
    full = trace_training(d, 1, 512, attention="sdpa_flash")
    lora = trace_training(d, 1, 512, attention="sdpa_flash", lora_rank=8)
    assert 0 < lora.trainable_params < full.trainable_params // 100
    assert lora.peak_bytes < full.peak_bytes
    assert lora.model_class == full.model_class == "LlamaForCausalLM"  # not peft's wrapper
    cfg = transformers.Olmo2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=1000, pad_token_id=None)
    olmo = trace_training({**cfg.to_dict(), "model_type": "olmo2"}, 2, 256)
    assert olmo.peak_bytes > olmo.before_step_bytes > olmo.weights_bytes


def test_rules_and_trace_agree_where_no_row_exists() -> None:
    d = train_models.hf_config("qwen3-4b-2l", 2)
    want = training_step(ModelConfig.from_hf_config(d), 2, 3000, attention="sdpa_flash",
                         precision="bf16", checkpointing=True)
    got = trace_training(d, 2, 3000, attention="sdpa_flash", checkpointing=True)
    assert abs(got.peak_bytes - want.peak_bytes) <= 0.01 * want.peak_bytes


@pytest.mark.parametrize("kw,match", [({"seq_len": 1}, "seq_len"), ({"dtype": "fp16"}, "fp16"),
                                      ({"checkpointing": "yes"}, "checkpointing"),
                                      ({"lora_rank": 0}, "lora_rank")])
def test_bad_inputs_name_the_value(kw: dict, match: str) -> None:
    args = {"batch": 1, "seq_len": 64}
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        trace_training(train_models.hf_config("tiny-llama", 2), **args)
