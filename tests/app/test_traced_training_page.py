"""Models outside calc's rules on the Training step page (issue 42, item 5): a tiny OLMo-2
config (a type calc has no rules for), uploaded or fetched by Hub id, is answered by
attnmem.trace.training.trace_training (full training and LoRA), with the peak, the memory
before the step, whether it fits, where the peak is and a "counted from" line; inputs the trace
does not run and attentions it cannot trace are warnings naming them; never a traceback. A
config within calc's rules given the same way is computed by the rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from _frames import grids  # noqa: E402  (HTML tables and grids alike)
from streamlit.testing.v1 import AppTest  # noqa: E402

from attnmem.calc import format_bytes  # noqa: E402
from attnmem.calc.train_lora import LORA_TARGET_SETS  # noqa: E402
from attnmem.pages.ui import traced, traced_training  # noqa: E402
from attnmem.trace.training import trace_training  # noqa: E402
from tests.cli.fake_hub import FakeHub  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRAINING = str(ROOT / "attnmem" / "pages" / "training.py")
CUSTOM = "Custom config.json"
GPU = "NVIDIA H100 80GB"
TINY = transformers.Olmo2Config(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=1000, pad_token_id=None).to_dict()
S = 256


@pytest.fixture(autouse=True)
def fresh_answers():
    traced_training.training.cache_clear()
    yield
    traced_training.training.cache_clear()


def upload(config: dict, name: str = "tiny-olmo2", **query: str) -> AppTest:
    at = AppTest.from_file(TRAINING, default_timeout=180)
    for k, v in {"model": CUSTOM, "gpu": GPU, "s": str(S), "attns": "sdpa_flash",
                 **query}.items():
        at.query_params[k] = v
    at.run()
    at.file_uploader(key="cfg_file").set_value(
        (f"{name}.json", json.dumps(config).encode(), "application/json")).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def texts(elements) -> str:
    return " | ".join(e.value for e in elements).replace("\\", "")


def test_full_training_of_an_unruled_config_is_traced() -> None:
    at = upload(TINY, attns="sdpa_flash,eager", ckpt="true")
    assert not at.error and not at.warning, texts(at.error) + texts(at.warning)
    got = metrics(at)
    flash = trace_training(TINY, 1, S, attention="sdpa_flash", checkpointing=True)
    eager = trace_training(TINY, 1, S, attention="eager", checkpointing=True)
    assert got["SDPA FlashAttention-2: peak"] == format_bytes(flash.peak_bytes, "GB")
    assert any("eager" in k and v == format_bytes(eager.peak_bytes, "GB")
               for k, v in got.items()), got
    assert sum("Fits one" in s.value for s in at.success) == 2
    caps = texts(at.caption)
    assert f"Before the step {format_bytes(flash.before_step_bytes, 'GB')}" in caps
    assert f"{flash.trainable_params:,} trainable parameters" in caps
    assert "meta-device trace of transformers' own modules" in caps
    assert f"Olmo2ForCausalLM, transformers {flash.transformers_version}" in caps
    assert "model type 'olmo2'" in caps
    # the parts add up to the peak, where the peak is in the trace's order
    parts = next(d.value for d in grids(at) if "part of the peak" in d.value.columns)
    shown = {r["part of the peak"]: int(r["bytes"].replace(",", "")) for _, r in parts.iterrows()}
    assert shown.pop("peak") == flash.peak_bytes == sum(shown.values())
    where = next(d.value for d in grids(at) if "module" in d.value.columns)
    assert int(where.iloc[0]["bytes"].replace(",", "")) == flash.at_peak[0][2]
    # the answer in one line under the title; what stays rules-only is said
    assert any("traced, not calc's rules" in m.value for m in at.markdown)
    assert any("longest context is not searched" in i.value for i in at.info)
    assert any("Not searched for a model outside calc's rules" in c.value for c in at.caption)


def test_lora_is_traced_through_peft() -> None:
    at = upload(TINY, ft="lora", rank="8", targets="attention")
    assert not at.warning, texts(at.warning)
    t = trace_training(TINY, 1, S, attention="sdpa_flash", lora_rank=8,
                       lora_targets=LORA_TARGET_SETS["attention"])
    assert metrics(at)["SDPA FlashAttention-2: peak"] == format_bytes(t.peak_bytes, "GB")
    assert f"{t.trainable_params:,} trainable parameters" in texts(at.caption)


@pytest.mark.parametrize(("query", "named"), [
    ({"ft": "qlora"}, "QLoRA"),
    ({"prec": "amp_bf16"}, "precision 'amp_bf16'"),
    ({"opt": "adamw_8bit"}, "the optimizer 'adamw_8bit'"),
    ({"liger": "true"}, "Liger's kernels"),
    ({"offload": "true"}, "offloaded activations"),
    ({"pf": "true", "b": "2"}, "padding-free rows"),
    ({"gpus": "2"}, "GPUs 2"),
    ({"ft": "lora", "adt": "bf16"}, "bf16 adapters"),
])
def test_an_input_the_trace_does_not_run_is_a_warning_naming_it(query, named) -> None:
    at = upload(TINY, **query)
    shown = texts(at.warning)
    assert "does not run" in shown and named in shown, shown
    assert "The trace runs full training or LoRA" in shown
    assert not metrics(at).get("SDPA FlashAttention-2: peak")


def test_attentions_the_trace_cannot_run_are_named() -> None:
    at = upload(TINY, attns="triton,sdpa_efficient,sdpa_flash")
    shown = texts(at.warning)
    assert "Not traced" in shown and "attention 'triton'" in shown
    assert "kernel" in shown  # grouped-query heads: no memory-efficient kernel
    assert "SDPA FlashAttention-2: peak" in metrics(at)


def test_the_time_budget_leaves_attentions_untraced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traced, "SEARCH_BUDGET_S", 0.0)
    at = upload(TINY, attns="sdpa_flash,eager")
    assert "SDPA FlashAttention-2: peak" in metrics(at)
    assert any("Not traced within the 0 s budget" in i.value for i in at.info)


def test_a_config_transformers_cannot_build_is_a_warning() -> None:
    at = upload({**TINY, "model_type": "surely_not_a_model"}, name="bad")
    shown = texts(at.warning)
    assert "Not traced" in shown and "surely_not_a_model" in shown
    assert "Traceback" not in shown and not at.metric


def test_without_torch_the_refusal_stays_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traced, "missing", lambda: "torch is not installed here (test)")
    at = upload(TINY)
    shown = texts(at.error)
    assert "olmo2" in shown and "torch is not installed here (test)" in shown


def test_a_hub_model_is_traced_and_a_ruled_upload_computed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with FakeHub() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        fake.files["allenai/tiny-olmo2"] = json.dumps(TINY).encode()
        at = AppTest.from_file(TRAINING, default_timeout=180)
        for k, v in {"model": "Hugging Face Hub id", "hub": "allenai/tiny-olmo2", "gpu": GPU,
                     "s": str(S), "attns": "sdpa_flash"}.items():
            at.query_params[k] = v
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    t = trace_training(TINY, 1, S, attention="sdpa_flash")
    assert metrics(at)["SDPA FlashAttention-2: peak"] == format_bytes(t.peak_bytes, "GB")
    assert at.query_params.get("hub") in ("allenai/tiny-olmo2", ["allenai/tiny-olmo2"])
    # a config calc has rules for, uploaded: computed by the rules (no trace), searches and all
    llama = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=1000).to_dict()
    at = upload({**llama, "model_type": "llama"}, name="tiny-llama")
    assert not at.warning, texts(at.warning)
    assert not any("traced" in m.value for m in at.markdown if "On one" in m.value)
    assert any("Longest context" in m.value for m in at.markdown)
