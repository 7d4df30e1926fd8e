"""Hub ids on the Model memory and Serving pages (attnmem/pages/ui/hub_model.py), against the fake Hub on
localhost (tests/cli/fake_hub.py through HF_ENDPOINT; no network): a good id renders that model
and stays in the URL, gated / unknown / no config.json / not a language model / no network each
give one clear st.error, a garbage id in the URL or in the box is refused by name. Also the
architecture figures of the Model memory page: the MLA expanded K/V beside the latent and the
constant state of hybrids, both computed by calc."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _frames import grids  # HTML tables and grids alike
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_
from streamlit.testing.v1 import AppTest

from attnmem.calc import (
    DEFAULT_GPU,
    MODELS,
    ModelConfig,
    format_bytes,
    model_max_seq_len,
    model_memory,
)
from attnmem.calc.gpus import torch_total_bytes
from attnmem.calc.kv import mla_expanded_kv_bytes, state_bytes
from attnmem.calc.serving import DEFAULT_CUDA_GRAPH_BYTES, DEFAULT_NON_TORCH_BYTES, serving_capacity
from attnmem.hub import REPO_ID_RULE
from tests.cli.fake_hub import FakeHub

ROOT = Path(__file__).resolve().parents[2]
MODEL_PAGE = str(ROOT / "attnmem" / "pages" / "model_memory.py")
SERVING_PAGE = str(ROOT / "attnmem" / "pages" / "serving.py")
FIXTURES = ROOT / "tests" / "fixtures" / "hf_configs"
HUB = "Hugging Face Hub id"
V3 = "deepseek-ai/DeepSeek-V3"
TIMEOUT = 60
MIB = 2**20


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    with FakeHub() as fake:  # a new port each time: the pages' cache keys include the endpoint
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        fake.files[V3] = (FIXTURES / "DeepSeek-V3.json").read_bytes()
        fake.files["Qwen/Qwen3-Next-80B-A3B-Instruct"] = (
            FIXTURES / "Qwen3-Next-80B-A3B-Instruct.json").read_bytes()
        yield fake


def run(page: str, **query: str) -> AppTest:
    at = AppTest.from_file(page, default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def fixture_model(file: str, repo_id: str) -> ModelConfig:
    return ModelConfig.from_hf_config(json.loads((FIXTURES / file).read_text()), name=repo_id)


def url(at: AppTest, key: str) -> str | None:
    value = at.query_params.get(key)
    return value[0] if isinstance(value, list) else value


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def refusals(at: AppTest) -> list[str]:
    """st.error messages that refuse an input (icon 'block'; 'does not fit' verdicts are not)."""
    return [e.value for e in at.error if e.icon == ":material/block:"]


def errors(at: AppTest) -> str:
    return " | ".join(refusals(at))


def unescape(text: str) -> str:
    """Messages are markdown-escaped (md_escape) before Streamlit shows them."""
    return text.replace("\\", "")


# --- Model memory page ------------------------------------------------------------------------


def test_good_id_renders_that_model_and_stays_in_the_url(hub: FakeHub) -> None:
    at = run(MODEL_PAGE, model=HUB, hub=V3)
    assert not refusals(at) and not at.warning
    model = fixture_model("DeepSeek-V3.json", V3)
    values = metrics(at)
    # DeepSeek-V3's checkpoint is fp8 (quantization_config): the weights default to as stored
    # (issue 30), and "fits" uses the memory torch can use
    assert at.selectbox(key="wdtype").value == "checkpoint" and url(at, "wdtype") == "checkpoint"
    naive = model_memory(model, 1, 8192, "checkpoint", "bf16", "bf16", "naive").total_bytes
    assert values["Standard (eager): total"] == format_bytes(naive, "GB")
    gpu = torch_total_bytes(DEFAULT_GPU)
    longest = model_max_seq_len(model, gpu, 1, "checkpoint", "bf16", "bf16", "sdpa_flash")
    assert (f"{longest:,}" if longest else "none") in values.values()
    assert any(V3 in unescape(cap.value) and "parameters" in cap.value for cap in at.caption)
    assert any(f"{hub.url}/{V3}" in unescape(cap.value) for cap in at.caption)  # cited source
    assert url(at, "hub") == V3 and url(at, "model") == HUB
    assert at.text_input(key="_hub_box").value == V3
    # MLA: the eager expanded K/V beside the latent
    assert values["K/V expanded per head (eager)"] == format_bytes(
        mla_expanded_kv_bytes(model, 1, 8192, "bf16"), "GB")


def test_fetched_once_then_cached(hub: FakeHub) -> None:
    run(MODEL_PAGE, model=HUB, hub=V3)
    before = len(hub.requests)
    assert before >= 1
    run(MODEL_PAGE, model=HUB, hub=V3, b="2")
    run(SERVING_PAGE, model=HUB, hub=V3)
    assert len(hub.requests) == before


def test_gated_id_says_to_set_hf_token(hub: FakeHub) -> None:
    hub.gated.add("meta-llama/Llama-3.1-8B")
    at = run(MODEL_PAGE, model=HUB, hub="meta-llama/Llama-3.1-8B")
    assert len(refusals(at)) == 1
    msg = unescape(errors(at))
    assert "meta-llama/Llama-3.1-8B is gated" in msg and "HF_TOKEN" in msg
    assert any("default model is shown: Llama 3.1 8B" in unescape(i.value) for i in at.info)
    assert url(at, "hub") == "meta-llama/Llama-3.1-8B"  # the link reproduces this view


def test_gated_id_opens_with_a_token(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.gated.add("meta-llama/Llama-3.1-8B")
    hub.files["meta-llama/Llama-3.1-8B"] = (FIXTURES / "Llama-3.1-8B.json").read_bytes()
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    at = run(MODEL_PAGE, model=HUB, hub="meta-llama/Llama-3.1-8B")
    assert not refusals(at)
    assert any("meta-llama/Llama-3.1-8B" in unescape(cap.value) for cap in at.caption)


def test_unknown_id_says_not_found(hub: FakeHub) -> None:
    at = run(MODEL_PAGE, model=HUB, hub="nobody/nothing-here")
    assert len(refusals(at)) == 1 and "nobody/nothing-here was not found" in unescape(errors(at))
    assert not at.warning  # a well-formed id: the URL value itself is fine


def test_no_config_and_not_a_language_model(hub: FakeHub) -> None:
    hub.no_config.add("someone/gguf-only")
    at = run(MODEL_PAGE, model=HUB, hub="someone/gguf-only")
    assert "has no config.json" in unescape(errors(at))
    hub.files["state-spaces/mamba-130m"] = json.dumps(
        {"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24,
         "vocab_size": 50280}).encode()
    # Serving traces it too (attnmem.trace.serving) and says why it cannot be counted: no
    # attention layer, so no KV blocks; calc's refusal beside it
    at = run(SERVING_PAGE, model=HUB, hub="state-spaces/mamba-130m")
    msg = unescape(" ".join(w.value for w in at.warning))
    assert not errors(at) and not at.metric
    assert "no attention layer" in msg and "not a language-model config" in msg
    # Model memory traces a type outside calc's rules (attnmem.pages.ui.traced_memory_view)
    at = run(MODEL_PAGE, model=HUB, hub="state-spaces/mamba-130m")
    assert not errors(at) and any(m.label == "Parameters (traced)" for m in at.metric)
    assert "cannot be traced" in unescape(" ".join(w.value for w in at.warning))


def test_no_network_is_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    at = run(MODEL_PAGE, model=HUB, hub=V3)
    assert "cannot reach http://127.0.0.1:9" in unescape(errors(at))


def test_offline_reads_the_cache_and_says_when_it_is_empty(
        hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    run(MODEL_PAGE, model=HUB, hub=V3)  # online once: config.json is now in HF_HUB_CACHE
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(hub.requests)
    at = run(MODEL_PAGE, model=HUB, hub=V3, s="4096")
    assert not refusals(at) and len(hub.requests) == before
    assert any(V3 in unescape(cap.value) and "parameters" in cap.value for cap in at.caption)
    at = run(MODEL_PAGE, model=HUB, hub="Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert "HF_HUB_OFFLINE" in unescape(errors(at)) and len(hub.requests) == before


@pytest.mark.parametrize("garbage", ["../../etc/passwd", "x y/z", "[a](javascript:alert(1))",
                                     "org/na--me", "noslash", "a/b/c", "org/name.git",
                                     "o/" + "n" * 300])
def test_garbage_id_in_the_url_is_refused_by_name(hub: FakeHub, garbage: str) -> None:
    at = run(MODEL_PAGE, model=HUB, hub=garbage)
    assert not hub.requests  # nothing was fetched
    warned = [unescape(w.value) for w in at.warning]
    assert len(warned) == 1
    assert "URL parameter 'hub'" in warned[0] and "a Hugging Face model id, owner/name" in warned[0]
    assert garbage[:20] in warned[0]
    assert url(at, "hub") is None  # dropped back to the default (none): not written back
    assert any("default model is shown" in unescape(i.value) for i in at.info)


def test_typed_id_loads_and_garbage_typed_is_refused(hub: FakeHub) -> None:
    at = run(MODEL_PAGE, model=HUB)
    assert url(at, "hub") is None and not refusals(at)
    at.text_input(key="_hub_box").input("Qwen/Qwen3-Next-80B-A3B-Instruct").run()
    assert not at.exception and not refusals(at)
    assert url(at, "hub") == "Qwen/Qwen3-Next-80B-A3B-Instruct"
    at.text_input(key="_hub_box").input("not an id!").run()
    assert not at.exception
    msg = unescape(errors(at))
    assert "'not an id!' is not a Hugging Face model id" in msg
    assert url(at, "hub") == "Qwen/Qwen3-Next-80B-A3B-Instruct"  # the last valid id stays
    at.selectbox(key="model").set_value("Mistral 7B v0.1").run()  # a preset: no hub in the URL
    assert not at.exception and url(at, "hub") is None


def test_hub_hybrid_shows_its_constant_state(hub: FakeHub) -> None:
    at = run(MODEL_PAGE, model=HUB, hub="Qwen/Qwen3-Next-80B-A3B-Instruct", b="4")
    model = fixture_model("Qwen3-Next-80B-A3B-Instruct.json", "Qwen/Qwen3-Next-80B-A3B-Instruct")
    table = grids(at)[0].value
    row = table[table["part"] == "recurrent state"]
    assert len(row) == 1
    assert row.iloc[0]["Standard (eager)"] == format_bytes(state_bytes(model, 4, "bf16"), "GB")
    # the formulas are listed under the table (a long one is cut off inside the grid)
    listed = [m.value.replace("\\", "") for m in at.markdown]  # markdown-escaped text
    assert any("recurrent state" in m and "attnmem.calc.kv.state_bytes" in m for m in listed)


# --- architecture figures with presets (no Hub) -----------------------------------------------


def test_mla_preset_shows_latent_and_expanded() -> None:
    name = "DeepSeek-V2-Lite (MLA, MoE)"
    at = run(MODEL_PAGE, model=name, s="32768", b="2")
    model = MODELS[name]
    values = metrics(at)
    latent = model_memory(model, 2, 32768, "bf16", "bf16", "bf16", "naive").kv_cache_bytes
    assert values["KV cache: MLA latent (in the totals)"] == format_bytes(latent, "GB")
    assert values["K/V expanded per head (eager)"] == format_bytes(
        mla_expanded_kv_bytes(model, 2, 32768, "bf16"), "GB")
    helps = {m.label: m.proto.help for m in at.metric}
    assert "Computed" in helps["K/V expanded per head (eager)"]
    assert "kv_lora_rank + qk_rope_head_dim" in helps["KV cache: MLA latent (in the totals)"]


def test_hybrid_preset_counts_state_in_total_and_longest_context() -> None:
    name, gpu = "Jamba v0.1 (hybrid)", "NVIDIA H200 141GB"
    at = run(MODEL_PAGE, model=name, gpu=gpu, adtype="fp32")
    model = MODELS[name]
    state = state_bytes(model, 1, "fp32")  # at the attention (activation) dtype
    assert state > 0
    mm = model_memory(model, 1, 8192, "bf16", "bf16", "fp32", "naive")
    assert metrics(at)["Standard (eager): total"] == format_bytes(mm.total_bytes + state, "GB")
    shown = [m.value for m in at.metric if m.label == "Longest context (tokens)"]
    # fp32 attention: eager alone (FlashAttention-2 takes fp16/bf16 only, and the page says so)
    for impl, value in zip(("naive",), shown, strict=True):
        longest = model_max_seq_len(model, torch_total_bytes(gpu) - state, 1, "bf16", "bf16", "fp32", impl)
        assert longest > 0 and value == f"{longest:,}"
        assert longest < model_max_seq_len(model, torch_total_bytes(gpu), 1, "bf16", "bf16", "fp32", impl)
    assert any("FlashAttention-2 runs fp16 and bf16 inputs only" in cap.value
               for cap in at.caption)
    assert any("4 of 32 layers are attention" in unescape(cap.value) for cap in at.caption)


def test_standard_model_shows_neither() -> None:
    at = run(MODEL_PAGE)
    assert "K/V expanded per head (eager)" not in metrics(at)
    assert "recurrent state" not in set(grids(at)[0].value["part"])


# --- Serving page ------------------------------------------------------------------------------


def test_serving_page_takes_a_hub_id(hub: FakeHub) -> None:
    at = run(SERVING_PAGE, model=HUB, hub=V3, s="16384")
    assert not refusals(at) and not at.warning
    model = fixture_model("DeepSeek-V3.json", V3)
    cap = serving_capacity(model, torch_total_bytes(DEFAULT_GPU), 16384,
                           cuda_graph_bytes=DEFAULT_CUDA_GRAPH_BYTES // MIB * MIB,
                           non_torch_bytes=DEFAULT_NON_TORCH_BYTES // MIB * MIB)
    assert metrics(at)["KV blocks available"] == f"{cap.num_blocks:,}"
    assert url(at, "hub") == V3


def test_serving_page_gated_unknown_and_garbage(hub: FakeHub) -> None:
    hub.gated.add("meta-llama/Llama-3.1-70B")
    at = run(SERVING_PAGE, model=HUB, hub="meta-llama/Llama-3.1-70B")
    assert "is gated" in unescape(errors(at)) and "HF_TOKEN" in unescape(errors(at))
    at = run(SERVING_PAGE, model=HUB, hub="nobody/nothing-here")
    assert "was not found" in unescape(errors(at))
    at = run(SERVING_PAGE, model=HUB, hub="<script>")
    assert any("URL parameter 'hub'" in unescape(w.value) for w in at.warning)
    assert not [r for r in hub.requests if "script" in r]


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=st_.one_of(st_.from_regex(r"[A-Za-z0-9._/-]{1,12}", fullmatch=True),
                      st_.text(max_size=40), st_.sampled_from(["%00", "'; DROP", "a/b\n", "/"])))
def test_fuzzed_hub_values_never_raise_and_only_good_ids_are_fetched(hub: FakeHub, raw: str) -> None:
    hub.requests.clear()
    at = run(MODEL_PAGE if len(raw) % 2 else SERVING_PAGE, model=HUB, hub=raw)
    well_formed = re.fullmatch(REPO_ID_RULE, raw.strip()) is not None
    if not well_formed:
        assert not hub.requests
    if raw.strip() and not well_formed:
        assert any("URL parameter 'hub'" in unescape(w.value) for w in at.warning)
