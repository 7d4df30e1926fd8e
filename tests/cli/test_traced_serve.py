"""`attnmem serve` for a model whose type calc has no rules for: vLLM's KV pool counted from
transformers' own modules (attnmem.trace.serving), every figure's source said, and what cannot
be counted refused with both reasons."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnmem.cli import main  # noqa: E402
from attnmem.trace.serving import traced_serving  # noqa: E402

GPU = "NVIDIA H100 80GB"
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1000, pad_token_id=None)


def _write(tmp_path, cls: str, **kw) -> tuple[str, dict]:
    c = getattr(transformers, cls)(**{**SMALL, **kw})
    d = {**c.to_dict(), "model_type": c.model_type}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    return str(path), d


def test_serve_counts_a_type_without_rules_and_says_from_what(tmp_path, capsys) -> None:
    path, d = _write(tmp_path, "Olmo2Config", num_hidden_layers=2)
    assert main(["serve", "--model", path, "--seq-len", "4k", "--gpu", "H100 80GB",
                 "--max-num-batched-tokens", "1024", "--max-num-seqs", "32", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    want = traced_serving(d, GPU, 4096, max_num_batched_tokens=1024, max_num_seqs=32)
    cap = want.capacity
    assert (r["num_blocks"], r["max_concurrency"], r["max_context"], r["kv_pool_bytes"]) == \
        (cap.num_blocks, cap.max_concurrency, cap.max_context, cap.kv_pool_bytes)
    assert r["weights_bytes"] == want.weights_bytes and r["activation_from"] == "bound"
    assert r["capacity_is_lower_bound"] and not r["capacity_is_upper_bound"]
    assert "'olmo2'" in r["counted_from"] and r["kv_elements_per_token_per_layer"] == 64
    assert set(r["sources"]) == {"weights", "KV cache", "activation peak"}
    assert main(["serve", "--model", path, "--seq-len", "4k", "--gpu", "H100 80GB",
                 "--max-num-seqs", "32"]) == 0
    text = capsys.readouterr().out
    assert "Olmo2ForCausalLM" in text and "activation peak (traced upper bound)" in text
    assert "concurrent requests: 32 (capped by max_num_seqs; at least" in text
    assert "counted from:" in text and "  KV cache: trace:" in text


def test_a_logged_activation_figure_replaces_the_bound(tmp_path, capsys) -> None:
    path, _ = _write(tmp_path, "Olmo2Config", num_hidden_layers=2)
    assert main(["serve", "--model", path, "--seq-len", "4096", "--gpu", "H100 80GB",
                 "--activation-bytes", "2GiB", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["activation_bytes"] == 2 * 2**30 and r["activation_from"] == "given"
    assert not r["capacity_is_lower_bound"] and not r["capacity_is_upper_bound"]


def test_a_hybrid_whose_profile_cannot_be_traced_gets_an_upper_bound(tmp_path, capsys,
                                                                     monkeypatch) -> None:
    # Zamba's Mamba scan loops over the tokens; its fold refused and the limit of ops made tiny,
    # as for a loop too slow to trace
    import attnmem.trace.inference as inference
    import attnmem.trace.loops as loops

    monkeypatch.setattr(loops, "_check", lambda events, bounds: ("refused here", set()))
    monkeypatch.setattr(inference, "LIMITS", loops.Limits(ops=1_000, steps=10**9))
    path, _ = _write(tmp_path, "ZambaConfig", num_hidden_layers=3,
                     layers_block_type=["mamba", "hybrid", "hybrid"], attn_hidden_size=128,
                     mamba_d_state=8, n_mamba_heads=2)
    assert main(["serve", "--model", path, "--seq-len", "4096", "--gpu", "H100 80GB"]) == 0
    text = capsys.readouterr().out
    assert "activation peak (not counted)" in text and "an upper bound" in text
    assert "of which state (hybrid layers)" in text and "cannot be folded" in text


def test_what_the_trace_cannot_count_is_refused_with_both_reasons(tmp_path, capsys) -> None:
    path, _ = _write(tmp_path, "Olmo2Config", num_hidden_layers=2)
    assert main(["serve", "--model", path, "--seq-len", "4096", "--gpu", "H100 80GB",
                 "--weight-dtype", "int4", "--act-dtype", "int4"]) == 2
    err = capsys.readouterr().err
    assert "'olmo2' is not one this calculator has rules for" in err and "weights 'int4'" in err
    path, _ = _write(tmp_path, "MambaConfig", num_hidden_layers=2)
    assert main(["serve", "--model", path, "--seq-len", "4096", "--gpu", "H100 80GB"]) == 2
    assert "no attention layer" in capsys.readouterr().err
