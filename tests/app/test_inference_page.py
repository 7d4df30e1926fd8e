"""attnmem/pages/inference.py renders attnmem.calc.inference_step's numbers for the URL's inputs, names and
replaces bad URL values, shows calc's refusals as messages (never a traceback), and puts the
bundled H200 rows beside the current prediction with their errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from _frames import grids  # HTML tables and grids alike
from hypothesis import Phase, given, settings
from hypothesis import strategies as st_
from streamlit.testing.v1 import AppTest

import attnmem.calc
from attnmem.calc.inference_step import (
    INFER_ATTENTION_LABELS,
    INFER_ATTENTIONS,
    inference_step,
    max_inference_seq_len,
)

ROOT = Path(__file__).parents[2]
PAGE = str(ROOT / "attnmem" / "pages" / "inference.py")
H100, H200 = "NVIDIA H100 80GB", "NVIDIA H200 141GB"


def run(params: dict[str, str]) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    for k, v in params.items():
        at.query_params[k] = v
    return at.run()


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def frame_with(at: AppTest, column: str) -> pd.DataFrame:
    return next(d.value for d in grids(at) if column in d.value.columns)


def test_default_load_shows_calc_numbers() -> None:
    at = run({})
    assert not at.exception, [e.value for e in at.exception]
    model = attnmem.calc.MODELS["Llama 3.1 8B"]
    m = inference_step(model, 1, 8192, 128, attention="sdpa")
    got = metrics(at)
    assert got["SDPA (torch's choice): peak"] == attnmem.calc.format_bytes(m.peak_bytes, "GB")
    assert any(m.peak_phase in x.value for x in at.caption)
    s_max = max_inference_seq_len(model, attnmem.calc.torch_total_bytes(attnmem.calc.DEFAULT_GPU), 1, 128, attention="sdpa")
    assert got["Longest prompt (+128 new)"] == f"{s_max:,} tokens"
    # the longest prompt passes Llama 3.1's 131,072 trained positions: the page says so
    assert s_max > 131_072
    assert any("131,072 tokens this model was trained for" in x.value for x in at.info)
    assert any("Fits one" in x.value for x in at.success)


def test_url_parameters_round_trip() -> None:
    params = {"model": "Qwen2.5 7B", "gpu": H200, "b": "2", "s": "20000", "new": "64",
              "wdtype": "fp16", "kvdtype": "fp8_e4m3", "attn": "eager", "cache": "static",
              "chunk": "4096", "unit": "GiB"}
    at = run(params)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.warning, [w.value for w in at.warning]
    for key, value in params.items():
        assert at.query_params[key] == value, key
    assert at.selectbox(key="model").value == "Qwen2.5 7B"
    assert at.selectbox(key="attn").value == "eager"
    assert at.selectbox(key="cache").value == "static"
    assert at.number_input(key="s").value == 20000
    assert at.number_input(key="chunk").value == 4096
    m = inference_step(attnmem.calc.MODELS["Qwen2.5 7B"], 2, 20000, 64, attention="eager",
                       weight_dtype="fp16", kv_dtype="fp8_e4m3", cache="static",
                       prefill_chunk=4096)
    assert metrics(at)["transformers eager: peak"] == attnmem.calc.format_bytes(m.peak_bytes, "GiB")


def test_hostile_url_values_are_named_and_replaced_by_the_default() -> None:
    at = run({"cache": "[x](javascript:alert(1))", "s": "1e999", "attn": "<b>x</b>",
              "chunk": "-1"})
    assert not at.exception, [e.value for e in at.exception]
    warned = " ".join(w.value for w in at.warning)
    for key in ("cache", "s", "attn", "chunk"):
        assert f"URL parameter \\'{key}\\'" in warned, key
    assert "javascript:" not in warned  # escaped: no live link
    default = inference_step(attnmem.calc.MODELS["Llama 3.1 8B"], 1, 8192, 128, attention="sdpa")
    assert metrics(at)["SDPA (torch's choice): peak"] == attnmem.calc.format_bytes(default.peak_bytes, "GB")
    assert at.query_params["cache"] == "dynamic" and at.query_params["s"] == "8192"


def test_a_hybrid_the_calc_refuses_is_a_message() -> None:
    assert "Jamba v0.1 (hybrid)" in attnmem.calc.MODELS
    at = run({"model": "Jamba v0.1 (hybrid)"})
    assert not at.exception, [e.value for e in at.exception]
    assert any("cannot be computed" in e.value and "hybrids" in e.value for e in at.error)
    assert not at.metric
    assert at.query_params["model"] == "Jamba v0.1 (hybrid)"  # the URL still says what was asked


def test_an_attention_the_model_cannot_run_is_named_under_the_chart() -> None:
    """Gemma 2 soft-caps its logits: calc runs only eager attention on it."""
    at = run({"model": "Gemma 2 9B", "s": "4096"})
    assert not at.exception, [e.value for e in at.exception]
    assert any("cannot run this model" in e.value and "soft" in e.value for e in at.error)
    assert any("Not drawn" in x.value and "FlashAttention" in x.value and "soft" in x.value
               for x in at.markdown)
    assert list(frame_with(at, "where")["implementation"]) == ["transformers eager"]
    at = run({"model": "Gemma 2 9B", "s": "4096", "attn": "eager"})
    m = inference_step(attnmem.calc.MODELS["Gemma 2 9B"], 1, 4096, 128, attention="eager")
    assert metrics(at)["transformers eager: peak"] == attnmem.calc.format_bytes(m.peak_bytes, "GB")


def test_weights_alone_past_the_gpu_say_so_instead_of_zero() -> None:
    at = run({"model": "Llama 3.1 405B", "gpu": H100})
    assert not at.exception
    assert any("Nothing fits: the weights alone" in e.value for e in at.error)
    assert not any(m.label.startswith("Longest prompt") for m in at.metric)


def test_the_parts_table_is_each_peak_by_part() -> None:
    """Two tables of the same rows (each fits a 1280 px window): peak, where and the held
    parts; then the transients. Together they hold every part of every peak."""
    at = run({"s": "32768"})
    assert not at.exception
    held, transients = frame_with(at, "KV cache"), frame_with(at, "hidden states")
    assert list(held["implementation"]) == list(transients["implementation"])
    model = attnmem.calc.MODELS["Llama 3.1 8B"]
    for attention in ("sdpa", "eager", "triton"):
        m = inference_step(model, 1, 32768, 128, attention=attention)
        name = INFER_ATTENTION_LABELS[attention]
        row = held[held["implementation"] == name].iloc[0]
        assert row["peak"] == attnmem.calc.format_bytes(m.peak_bytes, "GB")
        assert row["KV cache"] == attnmem.calc.format_bytes(m.parts["KV cache"], "GB")
        assert row["where"] == m.peak_phase
        both = {**row.to_dict(), **transients[transients["implementation"] == name].iloc[0].to_dict()}
        for part, n_bytes in m.parts.items():
            if n_bytes:
                assert both[part] == attnmem.calc.format_bytes(n_bytes, "GB"), part
    # Llama runs every one but forced memory-efficient SDPA (grouped-query: no kernel), which
    # is named under the chart with the reason
    assert len(held) == len(INFER_ATTENTIONS) - 1
    assert INFER_ATTENTION_LABELS["sdpa_efficient"] not in list(held["implementation"])
    assert any("Not drawn" in x.value and "no grouped" in x.value for x in at.markdown)


def test_chunked_prefill_table_is_calc_numbers() -> None:
    at = run({"s": "32768", "chunk": "3000"})
    assert not at.exception
    table = frame_with(at, "saved")
    assert list(table["prefill chunk"]) == ["whole prompt", "512", "2,048", "3,000", "8,192"]
    model = attnmem.calc.MODELS["Llama 3.1 8B"]
    whole = inference_step(model, 1, 32768, 128, attention="sdpa")
    chunked = inference_step(model, 1, 32768, 128, attention="sdpa", prefill_chunk=2048)
    row = table[table["prefill chunk"] == "2,048"].iloc[0]
    assert row["peak"] == attnmem.calc.format_bytes(chunked.peak_bytes, "GB")
    assert row["saved"] == attnmem.calc.format_bytes(whole.peak_bytes - chunked.peak_bytes, "GB")
    assert chunked.peak_bytes < whole.peak_bytes


def test_measured_rows_of_the_shown_model_with_their_errors() -> None:
    import attnmem.pages.ui.inference as inf

    measured = inf.read_measured()
    if measured.empty:
        pytest.skip("no data/inference_steps_h200.csv bundled")
    at = run({})
    assert not at.exception
    table = frame_with(at, "measured peak")
    ok = measured[(measured["status"] == "ok") & (measured["model"] == "llama3.1-8b")]
    assert len(table) == len(ok) > 0 and set(table["model"]) == {"llama3.1-8b"}
    # one row recomputed here: the page's error is calc's prediction against the measured peak
    r = ok.iloc[0]
    chunk = None if pd.isna(r["prefill_chunk"]) else int(r["prefill_chunk"])
    m = inference_step(attnmem.calc.MODELS["Llama 3.1 8B"], int(r["batch"]), int(r["prompt_len"]),
                       int(r["new_tokens"]), attention=r["attention"], cache=r["cache"],
                       prefill_chunk=chunk)
    err = (m.peak_bytes - r["peak_bytes"]) / r["peak_bytes"]
    assert table.iloc[0]["error"] == f"{err:+.2%}"
    assert table.iloc[0]["measured peak"] == attnmem.calc.format_bytes(int(r["peak_bytes"]), "GB")
    assert any("attnmem.measure --infer --plan h200" in x.value for x in at.caption)


def test_measured_rows_show_their_other_columns_one_click_away() -> None:
    """The measured rows fit a 1280 px window with the inputs and the peak; the checkbox (URL
    mcols) adds the prefill's peaks, where and the timings, with the same rows."""
    import attnmem.pages.ui.inference as inf

    if inf.read_measured().empty:
        pytest.skip("no data/inference_steps_h200.csv bundled")
    at = run({})
    short = frame_with(at, "measured peak")
    assert list(short.columns) == ["model", "batch", "prompt", "new", "attention", "cache", "chunk",
                                   "measured peak", "computed peak", "error"]
    box = next(b for b in at.checkbox if b.label.startswith("Show all"))
    assert "prefill ms (measured)" in box.help
    box.check().run()
    full = frame_with(at, "measured peak")
    assert at.query_params["mcols"] == "true"
    assert {"prefill peak (measured)", "prefill peak (computed)", "prefill error",
            "where (computed)", "prefill ms (measured)", "decode ms/token (measured)"} <= set(full.columns)
    assert full[list(short.columns)].equals(short)
    assert list(frame_with(run({"mcols": "true"}), "measured peak").columns) == list(full.columns)


def test_an_unmeasured_model_shows_every_row_and_a_cut_shape_its_own() -> None:
    import attnmem.pages.ui.inference as inf

    if inf.read_measured().empty:
        pytest.skip("no data/inference_steps_h200.csv bundled")
    at = run({"model": "Llama 3.1 70B"})
    assert not at.exception
    assert any("was not measured" in x.value for x in at.markdown)
    assert frame_with(at, "measured peak")["model"].nunique() >= 6
    at = run({"model": "measured shape: gemma3-27b-12l", "s": "4096"})
    assert not at.exception
    assert set(frame_with(at, "measured peak")["model"]) == {"gemma3-27b-12l"}


def test_compared_rows_error_is_prediction_against_measurement() -> None:
    import attnmem.pages.ui.inference as inf
    from attnmem.measure import infer_models

    model = attnmem.calc.ModelConfig.from_hf_config(infer_models.hf_config("llama3.2-1b"), name="x")
    m = inference_step(model, 2, 3000, 8, attention="sdpa", prefill_chunk=1024)
    df = pd.DataFrame([{"model": "llama3.2-1b", "layers": None, "batch": 2, "prompt_len": 3000,
                        "new_tokens": 8, "attention": "sdpa", "cache": "dynamic",
                        "prefill_chunk": 1024, "status": "ok",
                        "peak_bytes": round(m.peak_bytes * 1.01),
                        "prefill_peak_bytes": m.prefill_peak_bytes},
                       {"model": "llama3.2-1b", "status": "oom", "peak_bytes": None}])
    out = inf.compared_rows(df)
    assert len(out) == 1  # the OOM row has no peak to compare
    assert out.loc[0, "predicted peak"] == m.peak_bytes
    assert abs(out.loc[0, "peak error"] - (m.peak_bytes / round(m.peak_bytes * 1.01) - 1)) < 1e-12
    assert out.loc[0, "prefill error"] == 0


def test_the_page_reads_measurements_without_torch() -> None:
    code = ("import sys; import attnmem.pages.ui.inference as i; i.compared_rows(i.read_measured()); "
            "i.measured_shapes(); assert 'torch' not in sys.modules and "
            "'transformers' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_the_router_lists_and_runs_the_page() -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    assert not at.exception
    at.switch_page("attnmem/pages/inference.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "SDPA (torch's choice): peak" in metrics(at)


def test_largest_accepted_values_are_a_message_not_a_traceback() -> None:
    at = run({"b": "65536", "s": "100000000", "new": "100000000", "chunk": "100000000"})
    assert not at.exception, [e.value for e in at.exception]
    assert not at.warning  # every value is accepted by the URL ...
    # ... and calc prices it (a prompt and a generation of 10^8 tokens each): a number, and
    # the verdict that it does not fit, never a traceback.
    assert any(k.endswith(": peak") for k in metrics(at)), metrics(at)


def test_a_hub_id_is_the_model_shown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Hub-id box of the other model pages (attnmem/pages/ui/hub_model.py), against the fake Hub."""
    from tests.cli.fake_hub import FakeHub

    repo = "deepseek-ai/DeepSeek-V3"
    config = ROOT / "tests" / "fixtures" / "hf_configs" / "DeepSeek-V3.json"
    with FakeHub() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        fake.files[repo] = config.read_bytes()
        at = run({"model": "Hugging Face Hub id", "hub": repo, "gpu": H200})
    assert not at.exception, [e.value for e in at.exception]
    model = attnmem.calc.ModelConfig.from_hf_config(json.loads(config.read_text()), name=repo)
    # its checkpoint is fp8 (quantization_config): the weights default to as stored (issue 30)
    assert at.selectbox(key="wdtype").value == "checkpoint"
    m = inference_step(model, 1, 8192, 128, attention="sdpa", weight_dtype="checkpoint")
    assert metrics(at)["SDPA (torch's choice): peak"] == attnmem.calc.format_bytes(m.peak_bytes, "GB")
    assert at.query_params["hub"] == repo
    assert any("weights alone" in e.value for e in at.error)  # 673 GB of fp8 passes one H200


_KEYS = ("model", "gpu", "b", "s", "new", "wdtype", "kvdtype", "attn", "cache", "chunk", "unit")
_RAW = st_.one_of(
    st_.text(max_size=20),
    st_.sampled_from(["0", "-1", "1", "4096", "1e9", "NaN", "inf", "", "static", "eager",
                      "int4", "Jamba v0.1 (hybrid)", "Gemma 2 9B", "100000000", "%00"]),
)


@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(query=st_.dictionaries(st_.sampled_from(_KEYS), _RAW, max_size=6))
def test_fuzzed_urls_never_raise(query: dict[str, str]) -> None:
    at = run(query)
    assert not at.exception, (query, [e.value for e in at.exception])
    assert at.metric or at.error  # an answer, or the reason there is none


def test_a_forced_backend_without_a_kernel_is_named_for_these_inputs() -> None:
    """Mistral 7B at 8,192 tokens with SDPA's flash backend chosen: its 4,096-token window needs
    a mask, which flash cannot take (the H200 found no kernel): the page says so for these
    inputs and draws the implementations that can run them."""
    at = run({"model": "Mistral 7B v0.1", "s": "8192", "attn": "sdpa_flash"})
    assert not at.exception
    assert any("cannot run these inputs" in e.value and "window" in e.value for e in at.error)
    assert INFER_ATTENTION_LABELS["sdpa_flash"] not in list(
        frame_with(at, "KV cache")["implementation"])
