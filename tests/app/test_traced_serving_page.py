"""A model outside calc's rules on the Serving page (issue 42, item 5): a tiny OLMo-2
config.json gets vLLM's KV blocks, concurrent requests and longest request counted from
transformers' own modules (attnmem.trace.serving.traced_serving), "at least" where the
activation term is the trace's upper bound, each part's source said; what cannot be counted
is said, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _frames import grids  # noqa: E402  (HTML tables and grids alike)
from streamlit.testing.v1 import AppTest  # noqa: E402

from attnmem.calc.gpus import torch_total_bytes  # noqa: E402
from attnmem.trace.serving import traced_serving  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "attnmem" / "pages" / "serving.py")
GPU = "NVIDIA H100 80GB"
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1000, pad_token_id=None)
TINY = transformers.Olmo2Config(num_hidden_layers=2, **SMALL).to_dict()


def upload(config: dict, **query: str) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=180)
    for k, v in {"model": "Custom config.json", "gpu": GPU, "s": "4096", "mnbt": "1024",
                 "seqs": "32", **query}.items():
        at.query_params[k] = v
    at.run()
    at.file_uploader(key="cfg_file").set_value(
        ("tiny-olmo2.json", json.dumps(config).encode(), "application/json")).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_blocks_requests_and_longest_request_are_traced_with_their_sources() -> None:
    at = upload(TINY)
    assert not at.error and not at.warning, [e.value for e in (*at.error, *at.warning)]
    got = {m.label: m.value for m in at.metric}
    r = traced_serving(TINY, torch_total_bytes(GPU), 4096, max_num_batched_tokens=1024,
                       max_num_seqs=32)
    cap = r.capacity
    assert r.capacity_is_lower_bound  # the activation term is the trace's upper bound
    assert got["KV blocks available"] == f"≥ {cap.num_blocks:,}"
    assert got["Concurrent requests of 4,096 tokens"] == "32"  # capped by max_num_seqs
    assert got["Longest context of one request (tokens)"] == f"≥ {cap.max_context:,}"
    caps = " ".join(c.value for c in at.caption).replace("\\", "")
    assert "model type 'olmo2', which calc's rules do not cover" in caps
    assert "weights: trace: 202,240 parameters of Olmo2ForCausalLM" in caps
    assert "activation peak: bound: transformers' Olmo2ForCausalLM" in caps
    assert "KV cache: trace: 64 K+V elements per token" in caps
    parts = grids(at)[0].value
    assert set(parts["from"]) >= {"trace", "bound", "settings"}
    assert int(parts.set_index("part")["bytes"]["weights"].replace(",", "")) == \
        cap.weights_bytes
    assert any("Not available for a model outside calc's rules" in i.value for i in at.info)


def test_what_cannot_be_counted_is_said() -> None:
    at = upload(TINY, wdtype="int4")
    shown = " ".join(w.value for w in at.warning).replace("\\", "")
    assert "Serving cannot be counted" in shown and "weights 'int4'" in shown
    assert not at.metric
    at = upload({**TINY, "model_type": "surely_not_a_model"})
    shown = " ".join(w.value for w in at.warning).replace("\\", "")
    assert "cannot be counted" in shown and "surely_not_a_model" in shown
