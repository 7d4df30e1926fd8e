"""`attnmem memory` for a model whose type calc has no rules for: the meta-device trace answers
(attnmem.trace.inference), says so, and refuses what it cannot run with both reasons."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnmem.cli import main  # noqa: E402
from attnmem.trace.generate import trace_inference  # noqa: E402


def _olmo2(tmp_path) -> tuple[str, dict]:
    cfg = transformers.Olmo2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=1000, pad_token_id=None)
    d = {**cfg.to_dict(), "model_type": "olmo2"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    return str(path), d


def test_a_type_without_rules_is_traced_and_says_so(tmp_path, capsys) -> None:
    path, d = _olmo2(tmp_path)
    assert main(["memory", "--model", path, "--seq-len", "300", "--batch", "2",
                 "--gpu", "H100 80GB", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    t = trace_inference(d, 2, 300, 1, attention="sdpa_flash")
    assert r["total_bytes"] == t.peak_bytes
    assert r["total_bytes"] == (r["weights_bytes"] + r["kv_cache_bytes"]
                                + r["workspace_bytes"] + r["activation_bytes"])
    assert r["counted_from"].startswith("trace: transformers") and "'olmo2'" in \
        r["counted_from"]
    assert r["fits"] is True and r["longest_context"] is None
    assert main(["memory", "--model", path, "--seq-len", "300", "--gpu", "H100 80GB"]) == 0
    text = capsys.readouterr().out
    assert "counted from the trace" in text and "not searched for a traced model" in text


def test_what_the_trace_cannot_run_is_refused_with_both_reasons(tmp_path, capsys) -> None:
    path, _ = _olmo2(tmp_path)
    assert main(["memory", "--model", path, "--seq-len", "300", "--gpu", "H100 80GB",
                 "--kv-dtype", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "'olmo2' is not one this calculator has rules for" in err
    assert "one dtype" in err and "fp8" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model_type": "olmo2", "hidden_size": 64, "vocab_size": 100,
                               "num_hidden_layers": 1, "pad_token_id": None,
                               "num_attention_heads": 4,
                               "intermediate_size": -5}))  # no such layer
    assert main(["memory", "--model", str(bad), "--seq-len", "300",
                 "--gpu", "H100 80GB"]) == 2
    err = capsys.readouterr().err
    assert "rules for" in err and "and the trace:" in err


def test_longest_searches_a_traced_model(tmp_path, capsys) -> None:
    """--longest: the longest prompt that fits, confirmed by traces on both sides."""
    path, d = _olmo2(tmp_path)
    assert main(["memory", "--model", path, "--seq-len", "300", "--gpu", "H100 80GB",
                 "--longest", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    s = r["longest_context"]
    assert s > 300 and "confirmed by a trace" in r["longest_context_how"]
    assert trace_inference(d, 1, s, 1, attention="sdpa_flash").peak_bytes <= r["gpu_bytes"]
    if s < (1 << 20) - 1:
        assert trace_inference(d, 1, s + 1, 1, attention="sdpa_flash").peak_bytes > \
            r["gpu_bytes"]


@pytest.mark.parametrize("cls_name,extra,counted_as", [
    ("Qwen3NextConfig", {"linear_num_value_heads": 4, "linear_num_key_heads": 2,
                         "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                         "num_experts": 4, "num_experts_per_tok": 2,
                         "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
                         "num_hidden_layers": 4, "head_dim": 16}, ""),
    ("GptOssConfig", {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16,
                      "num_hidden_layers": 2}, "eager"),
])
def test_a_lower_bound_from_the_rules_is_traced_instead(tmp_path, capsys, cls_name: str,
                                                        extra: dict, counted_as: str) -> None:
    """Hybrids and gpt-oss: calc's inference rules give only a lower bound; with --trace the
    trace counts the whole generate() (gpt-oss has no SDPA path in transformers: its eager
    attention)."""
    cfg = getattr(transformers, cls_name)(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=1000, pad_token_id=None, **extra)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg.to_dict(), "model_type": cfg.model_type}))
    assert main(["memory", "--model", str(path), "--seq-len", "256", "--gpu", "H100 80GB",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_is_lower_bound"]  # rules, no --trace
    assert main(["memory", "--model", str(path), "--seq-len", "256", "--gpu", "H100 80GB",
                 "--json", "--trace"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert "calc's rules give only a lower bound" in r["counted_from"]
    assert counted_as in r["counted_as"]
    assert r["activation_bytes"] > 0 and r["total_bytes"] > r["weights_bytes"]


def test_a_hostile_size_is_refused_before_anything_is_built(tmp_path, capsys) -> None:
    """10^9 layers would hold the process for hours building modules: refused at once, with
    the key, the value and the limit."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "olmo2", "hidden_size": 64,
                                "num_attention_heads": 4, "num_hidden_layers": 10**9}))
    assert main(["memory", "--model", str(path), "--seq-len", "100",
                 "--gpu", "H100 80GB"]) == 2
    err = capsys.readouterr().err
    assert "'num_hidden_layers' is 1,000,000,000" in err and "at most 512 layers" in err
