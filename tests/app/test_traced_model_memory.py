"""A model outside calc's rules on the Model memory page (issue 42, item 5): a tiny OLMo-2
config.json gets its traced parameters and weights (attnmem.trace.weights.trace_weights) and
generate()'s traced peak (attnmem.trace.generate.trace_inference, SDPA), with the "counted
from" line and what is not available said; never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from streamlit.testing.v1 import AppTest  # noqa: E402

from attnmem.calc import format_bytes  # noqa: E402
from attnmem.pages.ui import traced  # noqa: E402
from attnmem.trace.generate import trace_inference  # noqa: E402
from attnmem.trace.weights import trace_weights  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "attnmem" / "pages" / "model_memory.py")
GPU = "NVIDIA H100 80GB"
TINY = transformers.Olmo2Config(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=1000, pad_token_id=None).to_dict()
S = 256


@pytest.fixture(autouse=True)
def short_search(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(traced, "SEARCH_BUDGET_S", 0.5)
    traced.longest_prompt.cache_clear()
    yield
    traced.longest_prompt.cache_clear()


def upload(config: dict, **query: str) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=180)
    for k, v in {"model": "Custom config.json", "gpu": GPU, "s": str(S), **query}.items():
        at.query_params[k] = v
    at.run()
    at.file_uploader(key="cfg_file").set_value(
        ("tiny-olmo2.json", json.dumps(config).encode(), "application/json")).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_weights_and_generates_peak_are_traced() -> None:
    at = upload(TINY)
    assert not at.error and not at.warning, [e.value for e in (*at.error, *at.warning)]
    got = {m.label: m.value for m in at.metric}
    w = trace_weights(TINY)
    assert got["Parameters (traced)"] == f"{w.param_count / 1e9:,.3f} B"
    assert got["Weights at bf16 (traced)"] == format_bytes(w.weight_bytes(2), "GB")
    t = trace_inference(TINY, 1, S, 1, attention="sdpa", dtype="bf16")
    assert got["SDPA (torch's choice): peak"] == format_bytes(t.peak_bytes, "GB")
    caps = " ".join(c.value for c in at.caption).replace("\\", "")
    assert f"{w.param_count:,} parameters" in caps
    assert "meta-device trace of transformers' own modules" in caps
    assert any("Not available for a model outside calc's rules" in i.value for i in at.info)


def test_what_the_trace_does_not_run_is_said() -> None:
    at = upload(TINY, wdtype="int4")
    shown = " ".join(w.value for w in at.warning).replace("\\", "")
    assert "cannot be traced" in shown and "weights 'int4'" in shown
    at = upload({**TINY, "model_type": "surely_not_a_model"})
    shown = " ".join(w.value for w in at.warning).replace("\\", "")
    assert "cannot be traced" in shown and "surely_not_a_model" in shown
    assert not at.metric
