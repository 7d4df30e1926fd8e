"""attnmem.hub against a fake Hub on localhost (HF_ENDPOINT): found, gated, missing, no
config.json, oversized, offline with and without a cache, unknown architecture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnmem.calc.params import param_count
from attnmem.calc.presets import MODELS
from attnmem.hub import HubError, check_repo_id, fetch_config_dict, fetch_model
from tests.cli.fake_hub import FakeHub

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf_configs"


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    with FakeHub() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        fake.files["deepseek-ai/DeepSeek-V3"] = (FIXTURES / "DeepSeek-V3.json").read_bytes()
        yield fake


def test_fetches_and_parses_the_published_config(hub: FakeHub) -> None:
    model = fetch_model("deepseek-ai/DeepSeek-V3")
    assert model.name == "deepseek-ai/DeepSeek-V3"
    assert param_count(model) == param_count(MODELS["DeepSeek-V3 (MLA, MoE)"])
    assert any(r.startswith("GET /deepseek-ai/DeepSeek-V3/resolve/main/config.json")
               for r in hub.requests)


def test_not_found_gated_and_no_config_are_told_apart(hub: FakeHub) -> None:
    with pytest.raises(HubError, match="was not found"):
        fetch_config_dict("nobody/nothing")
    hub.gated.add("meta-llama/Gated")
    with pytest.raises(HubError, match="gated.*HF_TOKEN"):
        fetch_config_dict("meta-llama/Gated")
    hub.no_config.add("someone/gguf-only")
    with pytest.raises(HubError, match="no config.json"):
        fetch_config_dict("someone/gguf-only")


def test_gated_repo_opens_with_hf_token(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.gated.add("meta-llama/Gated")
    hub.files["meta-llama/Gated"] = (FIXTURES / "Llama-3.1-8B.json").read_bytes()
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    assert fetch_config_dict("meta-llama/Gated")["model_type"] == "llama"


def test_oversized_config_is_refused_before_download(hub: FakeHub) -> None:
    hub.files["big/repo"] = b"{}"
    hub.declared_size["big/repo"] = 50_000_000
    with pytest.raises(HubError, match="50,000,000 bytes"):
        fetch_config_dict("big/repo")
    assert not any(r.startswith("GET /big/repo") for r in hub.requests)


def test_not_a_language_model_config(hub: FakeHub) -> None:
    hub.files["state-spaces/mamba"] = json.dumps(
        {"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24,
         "vocab_size": 50280}).encode()
    with pytest.raises(HubError, match="'mamba'.*without attention"):
        fetch_model("state-spaces/mamba")
    hub.files["x/nested"] = b'{"a": ' * 40 + b"1" + b"}" * 40
    with pytest.raises(HubError, match="not usable JSON"):
        fetch_config_dict("x/nested")


def test_offline_uses_the_cache_and_says_when_it_is_empty(
        hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    fetch_config_dict("deepseek-ai/DeepSeek-V3")  # fills the cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(hub.requests)
    assert fetch_config_dict("deepseek-ai/DeepSeek-V3")["model_type"] == "deepseek_v3"
    assert len(hub.requests) == before  # no request made offline
    with pytest.raises(HubError, match="cache"):
        fetch_config_dict("other/model")


def test_no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(HubError, match="cannot reach"):
        fetch_config_dict("deepseek-ai/DeepSeek-V3")


@pytest.mark.parametrize("bad", ["", "noslash", "a/b/c", "../etc/passwd", "a/..", "x y/z",
                                 "org/na--me", 7, None])
def test_bad_ids_are_refused_by_name(bad: object) -> None:
    with pytest.raises(HubError, match="not a Hugging Face model id"):
        check_repo_id(bad)
