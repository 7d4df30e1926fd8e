"""Models outside calc's rules on the Inference and "Will it fit?" pages (issue 42, item 5):
a tiny OLMo-2 config (a type calc has no rules for) uploaded or fetched by Hub id is answered
by attnmem.trace.generate.trace_inference, with its parts, where the peak is and a "counted
from" line; a config transformers cannot build, an input the trace does not run and a missing
torch are said as messages, never a traceback. Tiny configs and short prompts keep it fast."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _frames import grids  # noqa: E402  (HTML tables and grids alike)
from streamlit.testing.v1 import AppTest  # noqa: E402

from attnmem.calc import ModelConfig, format_bytes  # noqa: E402
from attnmem.calc.gpus import torch_total_bytes  # noqa: E402
from attnmem.pages.ui import traced  # noqa: E402
from attnmem.trace.generate import trace_inference  # noqa: E402
from tests.cli.fake_hub import FakeHub  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
INFERENCE = str(ROOT / "attnmem" / "pages" / "inference.py")
FIT = str(ROOT / "attnmem" / "pages" / "will_it_fit.py")
CUSTOM = "Custom config.json"
GPU = "NVIDIA H100 80GB"
TINY = transformers.Olmo2Config(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=1000, pad_token_id=1, bos_token_id=0, eos_token_id=2,
).to_dict()
S, NEW = 256, 4


@pytest.fixture(autouse=True)
def short_search(monkeypatch: pytest.MonkeyPatch):
    """A short search budget (the bracket is then what the page shows) and fresh caches."""
    monkeypatch.setattr(traced, "SEARCH_BUDGET_S", 0.5)
    traced.longest_prompt.cache_clear()
    yield
    traced.longest_prompt.cache_clear()


def upload(page: str, config: dict, name: str = "tiny-olmo2", **query: str) -> AppTest:
    at = AppTest.from_file(page, default_timeout=120)
    for k, v in {"model": CUSTOM, "gpu": GPU, "s": str(S), "new": str(NEW), **query}.items():
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


def test_tiny_olmo2_is_outside_calcs_rules() -> None:
    with pytest.raises(ValueError, match="olmo2"):
        ModelConfig.from_hf_config(TINY)
    assert traced.outside_rules(TINY) and traced.missing() is None


def test_inference_page_answers_an_unruled_config_by_the_trace() -> None:
    at = upload(INFERENCE, TINY)
    assert not at.error and not at.warning, texts(at.error) + texts(at.warning)
    t = trace_inference(TINY, 1, S, NEW, attention="sdpa", dtype="bf16")
    got = metrics(at)
    assert got["SDPA (torch's choice): peak"] == format_bytes(t.peak_bytes, "GB")
    assert any("Fits one" in x.value for x in at.success)
    caps = texts(at.caption)
    assert "meta-device trace of transformers' own modules" in caps
    assert f"Olmo2ForCausalLM, transformers {t.transformers_version}" in caps
    assert "model type 'olmo2'" in caps
    # the parts sum to the peak, each equal to the trace's
    parts = next(d.value for d in grids(at) if "part of the peak" in d.value.columns)
    shown = {r["part of the peak"]: int(r["bytes"].replace(",", "")) for _, r in parts.iterrows()}
    assert shown["peak"] == t.peak_bytes
    assert shown["weights"] == t.weights_bytes
    assert shown["KV cache (after the last step)"] == t.kv_cache_bytes
    assert sum(v for k, v in shown.items() if k != "peak") == t.peak_bytes
    # where the peak is: the trace's largest entries, in its order
    where = next(d.value for d in grids(at) if "module" in d.value.columns)
    first_module, _, first_op = t.at_peak[0][0].rpartition("|")
    assert (where.iloc[0]["module"], where.iloc[0]["op"]) == (first_module, first_op)
    assert int(where.iloc[0]["bytes"].replace(",", "")) == t.at_peak[0][2]
    # the longest prompt: every length it claims fits does fit by the trace
    longest = got[f"Longest prompt (+{NEW} new)"]
    fits = int(re.search(r"[\d,]+", longest).group().replace(",", ""))
    assert trace_inference(TINY, 1, fits, NEW).peak_bytes <= torch_total_bytes(GPU)
    # the calc-only sections are not drawn for it, and the page says so
    assert any("calc's rules" in i.value for i in at.info)
    assert not any("What chunked prefill saves" in m.value for m in at.markdown)


def test_inference_page_rules_path_says_counted_from_rules() -> None:
    at = AppTest.from_file(INFERENCE, default_timeout=60)
    at.query_params["s"] = "1024"
    at.run()
    assert not at.exception
    assert any("Counted from calc's hand-written rules" in c.value for c in at.caption)


def test_a_config_transformers_cannot_build_is_a_warning() -> None:
    bad = {**TINY, "model_type": "surely_not_a_model"}
    at = upload(INFERENCE, bad, name="bad")
    shown = texts(at.warning)
    assert "cannot be traced" in shown and "surely_not_a_model" in shown
    assert "not a type this transformers builds" in shown
    assert "Traceback" not in shown and not at.exception
    assert not at.metric  # no number for it


def test_an_input_the_trace_does_not_run_is_a_warning_naming_it() -> None:
    at = upload(INFERENCE, TINY, attn="triton")
    shown = texts(at.warning)
    assert "the trace does not run attention 'triton'" in shown
    at = upload(INFERENCE, TINY, cache="static")
    assert "static cache" in texts(at.warning)


def test_without_torch_the_refusal_stays_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traced, "missing", lambda: "torch is not installed here (test)")
    at = upload(INFERENCE, TINY)
    shown = texts(at.error)
    assert "Could not use this config" in shown and "olmo2" in shown
    assert "torch is not installed here (test)" in shown


def test_inference_page_traces_a_hub_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with FakeHub() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        fake.files["allenai/tiny-olmo2"] = json.dumps(TINY).encode()
        at = AppTest.from_file(INFERENCE, default_timeout=120)
        for k, v in {"model": "Hugging Face Hub id", "hub": "allenai/tiny-olmo2", "gpu": GPU,
                     "s": str(S), "new": str(NEW)}.items():
            at.query_params[k] = v
        at.run()
    assert not at.exception and not at.error, texts(at.error)
    t = trace_inference(TINY, 1, S, NEW)
    assert metrics(at)["SDPA (torch's choice): peak"] == format_bytes(t.peak_bytes, "GB")
    assert "meta-device trace" in texts(at.caption)
    assert at.query_params["hub"] in ("allenai/tiny-olmo2", ["allenai/tiny-olmo2"])


def test_will_it_fit_answers_inference_by_the_trace_and_refuses_training() -> None:
    at = upload(FIT, TINY, task="inference")
    assert not at.error, texts(at.error)
    t = trace_inference(TINY, 1, S, NEW)
    got = metrics(at)
    assert got["Peak"] == format_bytes(t.peak_bytes)
    assert any("**Fits**" in x.value for x in at.success)
    caps = texts(at.caption)
    assert "meta-device trace of transformers' own modules" in caps
    assert "Counted from calc's hand-written rules" not in caps
    assert any("module" in d.value.columns for d in grids(at))
    at.selectbox(key="task").set_value("training").run()
    assert not at.exception
    shown = texts(at.error)
    assert "model type 'olmo2'" in shown and "generate() only" in shown


def test_longest_prompt_search_is_exact_when_it_finishes() -> None:
    model = traced.Unruled.of(TINY, "tiny", "no rules")
    limit = trace_inference(TINY, 1, 40, 2).peak_bytes  # a GPU that holds about 40 tokens
    lg = traced.longest_prompt(model, limit, 1, 2, "sdpa", "bf16", 16, 60.0)
    assert lg.exact and lg.fits >= 40
    assert trace_inference(TINY, 1, lg.fits, 2).peak_bytes <= limit
    assert trace_inference(TINY, 1, lg.fits + 1, 2).peak_bytes > limit
    short = traced.longest_prompt(model, limit, 1, 2, "sdpa", "bf16", 16, 0.0)  # no budget
    assert not short.exact and short.traces == 1 and short.fits == 16


def test_a_hostile_size_is_refused_before_transformers_builds_anything() -> None:
    huge = {**TINY, "num_hidden_layers": 10**9}
    at = upload(INFERENCE, huge, name="huge")
    shown = texts(at.warning)
    assert "'num_hidden_layers' is 1,000,000,000" in shown and not at.exception
    assert not at.metric


def test_a_quantized_unruled_checkpoint_says_its_weights_are_traced_unquantized() -> None:
    fp8 = {**TINY, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                           "weight_block_size": [128, 128]}}
    at = upload(INFERENCE, fp8, name="fp8")
    assert not at.exception
    assert any("stored quantized (fp8)" in i.value.replace("\\", "") for i in at.info), \
        texts(at.info) + texts(at.warning)
