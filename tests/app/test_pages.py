"""Every page, headless (streamlit.testing.v1.AppTest): runs, shows the right numbers, reacts to
inputs, takes its inputs from the URL and warns (never raises) on bad URL values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _frames import grids  # HTML tables and grids alike
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st_
from streamlit.testing.v1 import AppTest

import attnmem.calc
from attnmem.calc import (
    GPUS,
    MODELS,
    format_bytes,
    max_seq_len,
    model_max_seq_len,
    model_memory,
    score_matrix_bytes,
)
from attnmem.calc.gpus import torch_total_bytes
from attnmem.calc.io_model import flash_io, standard_io
from attnmem.pages.ui.labels import impl_label

ROOT = Path(__file__).resolve().parents[2]
OURS_LABEL = impl_label("triton")  # the Kernel speed page's column of our default path
PAGES = {
    "score": ROOT / "attnmem" / "pages" / "score_matrix.py",
    "model": ROOT / "attnmem" / "pages" / "model_memory.py",
    "scaling": ROOT / "attnmem" / "pages" / "scaling.py",
    "flash": ROOT / "attnmem" / "pages" / "flash_explainer.py",
    "kernel": ROOT / "attnmem" / "pages" / "kernel_speed.py",
}
TIMEOUT = 60  # plotly and pandas import slowly on a cold 2-core machine
FIXTURES = ROOT / "tests" / "fixtures" / "hf_configs"


def run(page: str, **query: str) -> AppTest:
    at = AppTest.from_file(str(PAGES[page]), default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def warnings(at: AppTest) -> list[str]:
    return [w.value for w in at.warning]


# --- every page -------------------------------------------------------------------------------


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_runs_without_exception_and_writes_its_url(page: str) -> None:
    at = run(page)
    assert not warnings(at)
    assert at.query_params.get("unit") in ("GB", ["GB"])
    assert len(at.query_params) > 1  # the page's inputs are in the URL


def test_router_runs_every_page() -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    assert not at.exception
    assert [t.value for t in at.title] == ["Will it fit?"]  # the page a user lands on
    assert at.sidebar.radio(key="unit").value == "GB"
    at.query_params.clear()  # a sidebar click opens a page without the last page's URL inputs
    at.switch_page("attnmem/pages/score_matrix.py").run()
    assert "1.07 GB" in metrics(at).values()
    for path in ("attnmem/pages/model_memory.py", "attnmem/pages/scaling.py", "attnmem/pages/flash_explainer.py",
                 "attnmem/pages/measure.py", "attnmem/pages/kernel_speed.py", "attnmem/pages/score_matrix.py"):
        at.switch_page(path).run()
        assert not at.exception, (path, [e.value for e in at.exception])


def test_unit_is_remembered_across_pages() -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    at.query_params.clear()  # a sidebar click opens a page without the last page's URL inputs
    at.switch_page("attnmem/pages/score_matrix.py").run()
    at.sidebar.radio(key="unit").set_value("GiB").run()
    assert list(metrics(at).values())[0] == "1.00 GiB"
    at.switch_page("attnmem/pages/scaling.py").run()
    assert not at.exception
    assert at.query_params.get("unit") in ("GiB", ["GiB"])
    at.switch_page("attnmem/pages/score_matrix.py").run()
    assert list(metrics(at).values())[0] == "1.00 GiB"


# --- score matrix -----------------------------------------------------------------------------


def test_score_defaults_are_the_worked_example() -> None:
    at = run("score")
    values = list(metrics(at).values())
    assert values[0] == "1.07 GB" and values[1] == "1.00 GiB"
    assert values[2] == "4.29 GB"  # twice the length: four times the memory
    # the formula with the numbers substituted
    assert any("4,096² · 2 bytes = **1,073,741,824 bytes**" in m.value for m in at.markdown)


def test_score_reacts_to_inputs() -> None:
    at = run("score")
    at.number_input(key="s").set_value(8192).run()
    assert list(metrics(at).values())[0] == "4.29 GB"
    assert at.query_params["s"] in ("8192", ["8192"])
    at.select_slider(key="_s_pow2").set_value(1 << 20).run()  # the log slider drives s
    assert at.number_input(key="s").value == 1 << 20
    assert list(metrics(at).values())[0] == format_bytes(score_matrix_bytes(1, 32, 1 << 20, 2))
    at.number_input(key="s").set_value(4096).run()
    at.selectbox(key="dtype").set_value("fp32").run()
    assert list(metrics(at).values())[0] == "2.15 GB"
    at.selectbox(key="dtype").set_value("custom").run()
    at.number_input(key="e").set_value(0.5).run()
    assert list(metrics(at).values())[0] == "268.44 MB"  # below 1 GB: MB, never 0.xx GB
    at.number_input(key="b").set_value(2).run()
    at.number_input(key="h").set_value(64).run()
    assert list(metrics(at).values())[0] == format_bytes(score_matrix_bytes(2, 64, 4096, 0.5))


def test_score_url_prefills_widgets() -> None:
    at = run("score", s="8192", h="32", b="1", dtype="bf16", unit="GiB")
    assert at.number_input(key="s").value == 8192
    assert at.selectbox(key="dtype").value == "bf16"
    assert list(metrics(at).values())[0] == "4.00 GiB"
    assert not warnings(at)


@pytest.mark.parametrize(
    "bad", ["abc", "-5", "0", "NaN", "inf", "1e999", "", "9" * 500, "4.5", "[x](javascript:alert(1))"],
    ids=lambda v: repr(v)[:16],
)
def test_score_bad_url_values_warn_and_use_defaults(bad: str) -> None:
    at = run("score", s=bad)
    assert list(metrics(at).values())[0] == "1.07 GB"
    ws = warnings(at)
    assert len(ws) == 1 and "s" in ws[0] and "whole number" in ws[0]
    assert "](" not in ws[0]  # markdown escaped: no live link


def test_score_repeated_and_other_bad_params() -> None:
    at = AppTest.from_file(str(PAGES["score"]), default_timeout=TIMEOUT)
    at.query_params["s"] = ["1024", "2048"]
    at.query_params["dtype"] = "fp13"
    at.query_params["unit"] = "TB"
    at.query_params["b"] = "-1"
    at.run()
    assert not at.exception
    assert list(metrics(at).values())[0] == "1.07 GB"
    assert len(warnings(at)) == 3  # s, dtype, b (unit falls back quietly where no switch is drawn)


# --- model memory -----------------------------------------------------------------------------


def test_model_defaults_and_verdict() -> None:
    at = run("model")
    m = MODELS["Llama 3.1 8B"]
    gpu = torch_total_bytes("NVIDIA H100 80GB")  # the memory torch can use (issue 30)
    naive = model_memory(m, 1, 8192, "bf16", "bf16", "bf16", "naive").total_bytes
    flash = model_memory(m, 1, 8192, "bf16", "bf16", "bf16", "sdpa_flash").total_bytes
    values = [x.value for x in at.metric]
    assert format_bytes(naive) in values and format_bytes(flash) in values
    assert f"{model_max_seq_len(m, gpu, 1, 'bf16', 'bf16', 'bf16', 'naive'):,}" in values
    assert f"{model_max_seq_len(m, gpu, 1, 'bf16', 'bf16', 'bf16', 'sdpa_flash'):,}" in values
    assert len(at.success) == 2 and "Fits" in at.success[0].value


def test_model_does_not_fit_says_how_many_gpus() -> None:
    at = run("model", model="Llama 3.1 405B", gpu="NVIDIA H100 80GB")
    assert at.error and "Does not fit" in at.error[0].value and "Needs" in at.error[0].value


def test_model_inputs_change_the_numbers() -> None:
    at = run("model")
    at.number_input(key="b").set_value(4).run()
    at.number_input(key="s").set_value(32768).run()
    m = MODELS["Llama 3.1 8B"]
    total = model_memory(m, 4, 32768, "bf16", "bf16", "bf16", "naive").total_bytes
    assert format_bytes(total) in [x.value for x in at.metric]


def test_model_memory_gives_training_to_the_training_page() -> None:
    """One answer per question (issue 32): training memory is the Training step page's
    (attnmem.calc.training_step); Model memory links there instead of an attention-only view. An old
    link with mode=training says where the view went and shows the inference answer."""
    at = run("model", mode="training", ckpt="true")
    assert not warnings(at)
    assert not at.radio and not at.checkbox  # no View switch, no checkpointing box
    assert any("Training step page" in x.value and "attnmem.calc.training_step" in x.value
               for x in at.info), [x.value for x in at.info]
    assert any("(/training)" in x.value for x in at.markdown)  # the link (no router here)
    assert "mode" not in at.query_params and "ckpt" not in at.query_params
    m = MODELS["Llama 3.1 8B"]
    total = model_memory(m, 1, 8192, "bf16", "bf16", "bf16", "naive").total_bytes
    assert format_bytes(total) in [x.value for x in at.metric]
    assert not any("checkpointing" in x.value.lower() for x in at.markdown)


def test_model_memory_links_the_training_page_through_the_router() -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    at.switch_page("attnmem/pages/model_memory.py").run()
    assert not at.exception, [e.value for e in at.exception]
    links = [x.proto for x in at.get("page_link")]
    assert any("Training step" in p.label and p.page.endswith("training") for p in links), links


def test_model_custom_config_paste_good_and_bad() -> None:
    at = run("model", model="Custom config.json")
    at.text_area(key="cfg_text").input("{not json").run()
    assert not at.exception
    assert at.error and "not valid JSON" in at.error[0].value
    at.text_area(key="cfg_text").input(json.dumps([1, 2])).run()
    assert at.error and "JSON object" in at.error[0].value
    at.text_area(key="cfg_text").input("[" * 100_000 + "]" * 100_000).run()
    assert not at.exception and at.error
    good = FIXTURES / "Llama-3.2-1B.json"
    if good.exists():
        at.text_area(key="cfg_text").input(good.read_text()).run()
        assert not at.exception and not at.error
        assert any("custom model" in cap.value for cap in at.caption)
        at.text_area(key="cfg_text").input(json.dumps({"num_hidden_layers": "many"})).run()
        assert at.error  # a bad config after a good one: error shown, last good one kept
        assert any("last config that was valid" in i.value for i in at.info)


def test_model_config_upload() -> None:
    at = run("model", model="Custom config.json")
    good = FIXTURES / "Llama-3.2-1B.json"
    if good.exists():
        at.file_uploader(key="cfg_file").set_value(("[evil](javascript:x).json", good.read_bytes(), "application/json")).run()
        assert not at.exception and not [e for e in at.error if "Could not use" in e.value]
        assert not any("](javascript" in cap.value for cap in at.caption)  # the file name is escaped
    big = b'{"a": "' + b"x" * 1_100_000 + b'"}'
    at.file_uploader(key="cfg_file").set_value(("big.json", big, "application/json")).run()
    assert not at.exception and any("limit" in e.value for e in at.error)
    pickle_bytes = b"\x80\x04\x95\x1c\x00cos\nsystem\n(S'echo pwned'\ntR."
    at.file_uploader(key="cfg_file").set_value(("model.json", pickle_bytes, "application/json")).run()
    assert not at.exception and any("Could not use" in e.value for e in at.error)


def test_model_config_with_duplicate_keys_is_refused() -> None:
    at = run("model", model="Custom config.json")
    good = FIXTURES / "Llama-3.2-1B.json"
    if not good.exists():
        pytest.skip("fixture Llama-3.2-1B.json missing")
    text = good.read_text().rstrip().rstrip("}") + ', "num_hidden_layers": 2}'
    at.text_area(key="cfg_text").input(text).run()
    assert not at.exception and any("twice" in e.value for e in at.error), [e.value for e in at.error]


def test_csv_downloads_escape_formulas_in_any_text_dtype() -> None:
    import pandas as pd

    from attnmem.pages.ui.charts import csv_bytes

    for dtype in (object, "string", "category"):
        df = pd.DataFrame({"model": pd.Series(["=cmd|' /C calc'!A0", "+1", "ok"], dtype=dtype), "b": [1, 2, 3]})
        text = csv_bytes(df).decode()
        assert "\n=" not in text and '"=' not in text and "'=cmd" in text, text


def test_model_bad_url_values() -> None:
    at = run("model", model="<img src=x>", b="NaN", gpu="H9000", wdtype="fp64")
    assert len(warnings(at)) == 4
    assert at.selectbox(key="model").value == "Llama 3.1 8B"


# --- scaling ----------------------------------------------------------------------------------


def test_scaling_defaults_show_where_memory_runs_out() -> None:
    at = run("scaling")
    values = [x.value for x in at.metric]
    assert f"{max_seq_len('naive', GPUS['NVIDIA H200 141GB'], 1, 32, 128, 'fp16'):,}" in values
    # the sequence-length chart drawn; the batch sweep a table, its chart once opened
    assert len(at.get("plotly_chart")) == 1
    sweep = next(t.value for t in at.table if "B" in t.value.columns)
    assert list(sweep["B"])[:3] == ["1", "2", "4"] and len(sweep.columns) > 2
    at.session_state["_open_scaling_param_chart"] = True
    at.run()
    assert len(at.get("plotly_chart")) == 2


def test_scaling_inputs_and_url() -> None:
    at = run("scaling", impls="naive,triton", h="64", gpus="NVIDIA A100 40GB", causal="true")
    values = [x.value for x in at.metric]
    assert f"{max_seq_len('naive', GPUS['NVIDIA A100 40GB'], 1, 64, 128, 'fp16', True):,}" in values
    at.number_input(key="h").set_value(16).run()
    values = [x.value for x in at.metric]
    assert f"{max_seq_len('naive', GPUS['NVIDIA A100 40GB'], 1, 16, 128, 'fp16', True):,}" in values
    assert at.query_params["h"] in ("16", ["16"])


def test_scaling_with_no_implementation_asks_for_one() -> None:
    at = run("scaling")
    at.multiselect(key="impls").set_value([]).run()
    assert not at.exception and at.info


def test_scaling_without_gpus_says_what_it_needs() -> None:
    at = run("scaling", impls="", b="", h="", gpus="NONE")  # found by the URL fuzzer
    assert len(warnings(at)) == 3 and at.info and len(at.get("plotly_chart")) == 1


def test_scaling_bad_url_values() -> None:
    at = run("scaling", impls="naive,evil", smax="3", by="layers", d="1e9")
    assert len(warnings(at)) == 4


# --- FlashAttention explainer ----------------------------------------------------------------


def test_flash_explainer_numbers_and_step_slider() -> None:
    at = run("flash")
    values = list(metrics(at).values())
    assert values[0] == format_bytes(standard_io(1, 32, 4096, 128, 2).total_bytes)
    assert values[2] == "×3.77"
    assert values[1] == format_bytes(flash_io(1, 32, 4096, 128, 2, 128, 64, True).total_bytes)
    at.slider(key="step").set_value(5).run()
    assert not at.exception
    assert any("Step 5 of 9" in md.value for md in at.markdown)
    at.number_input(key="s").set_value(8192).run()
    assert list(metrics(at).values())[0] == format_bytes(standard_io(1, 32, 8192, 128, 2).total_bytes)


def test_flash_explainer_url_and_out_of_range_step() -> None:
    at = run("flash", step="9999", causal="false", n="8", blk="8")
    assert not at.exception  # a single tile: no slider, step clamped
    at = run("flash", step="3", n="8", blk="4", causal="false")
    assert at.slider(key="step").value == 3
    at = run("flash", step="-1", br="7")
    assert len(warnings(at)) == 2


def _kernel_table(at: AppTest):
    """The page's speeds and its ratios to the peers (two tables of the same s, each fits a
    1280 px window) as one frame, column s first."""
    frames = [d.value.set_index("s") for d in grids(at)[:2]]
    if len(frames) == 2 and any(str(col).startswith("default / ") for col in frames[1].columns):
        frames[0] = frames[0].join(frames[1])
    return frames[0].reset_index()


def test_kernel_speed_shows_the_measured_h200_rows() -> None:
    """The page's figures are the bench CSV's, row for row, and the ratio is of the default."""
    from attnmem.measure.speed_results import read_rows

    rows = {(r.impl, r.seq_len): r.tflops for r in read_rows(ROOT / "data" / "kernel_speed_fwd_eager_h200.csv")
            if r.dtype == "bf16" and r.head_dim == 128 and not r.causal and r.mode == "fwd"}
    at = run("kernel")
    t = _kernel_table(at).set_index("s")
    assert t.loc[16384, OURS_LABEL] == round(rows[("triton", 16384)])
    assert t.loc[16384, "SDPA cuDNN"] == round(rows[("sdpa_cudnn", 16384)])
    want = round(rows[("triton", 16384)] / rows[("sdpa_cudnn", 16384)], 2)
    assert t.loc[16384, "default / cuDNN"] == want
    assert any("NVIDIA H200" in c.value for c in at.caption)


def test_kernel_speed_inputs_and_graph_timing() -> None:
    at = run("kernel", kd="64", kcausal="true", kpass="fwd+bwd", kdtype="fp16")
    t = _kernel_table(at)
    assert list(t["s"]) == [1024, 2048, 4096, 8192, 16384]
    # at d = 64 the default path (bench name "triton") switches kernels by length: the ratio
    # column follows it, not one kernel
    from attnmem.measure.speed_results import read_rows

    raw = {r.impl: r.tflops for r in read_rows(ROOT / "data" / "kernel_speed_fwdbwd_eager_h200.csv")
           if (r.dtype, r.head_dim, r.causal, r.mode, r.seq_len) == ("fp16", 64, True, "fwd_bwd", 4096)}
    r = t.set_index("s").loc[4096]
    assert r["default / cuDNN"] == round(raw["triton"] / raw["sdpa_cudnn"], 2)
    graphs = {(r.impl, r.seq_len): r.tflops for r in read_rows(
        ROOT / "data" / "kernel_speed_fwdbwd_graphs_h200.csv")
        if (r.dtype, r.head_dim, r.causal, r.mode) == ("bf16", 128, False, "fwd_bwd")}
    at = run("kernel", ktiming="GPU time (CUDA graphs)", kpass="fwd+bwd")
    t = _kernel_table(at).set_index("s")
    assert list(t.index) == [1024, 2048, 4096, 8192, 16384]
    assert t.loc[1024, "default / FlashAttention-2"] == round(
        graphs[("triton", 1024)] / graphs[("sdpa_flash", 1024)], 2)
    rounds = {r.impl: r.tflops for r in read_rows(
        ROOT / "data" / "kernel_speed_fwd_eager_rounds_h200.csv")
        if (r.dtype, r.head_dim, r.causal, r.mode, r.seq_len) == ("bf16", 128, False, "fwd", 1024)}
    at = run("kernel", ktiming="eager, median of 3 rounds")
    t = _kernel_table(at).set_index("s")
    assert list(t.index) == [1024, 2048]  # that run covers the short lengths only
    assert t.loc[1024, OURS_LABEL] == round(rounds["triton"])
    assert any("--rounds 3" in c.value for c in at.caption)
    rounds_fb = {r.impl: r.tflops for r in read_rows(
        ROOT / "data" / "kernel_speed_fwdbwd_eager_rounds_h200.csv")
        if (r.dtype, r.head_dim, r.causal, r.mode, r.seq_len) == ("bf16", 128, False, "fwd_bwd",
                                                                   2048)}
    at = run("kernel", ktiming="eager, median of 3 rounds", kpass="fwd+bwd")
    t = _kernel_table(at).set_index("s")
    assert list(t.index) == [1024, 2048]
    assert t.loc[2048, "default / FlashAttention-2"] == round(
        rounds_fb["triton"] / rounds_fb["sdpa_flash"], 2)
    at = run("kernel", kd="96", kpass="both")
    assert len(warnings(at)) == 2 and _kernel_table(at) is not None


def test_kernel_speed_gqa_rows() -> None:
    """Grouped-query attention: forward+backward in GPU time from its own bench CSV; other
    choices say where it was measured instead of showing MHA figures under a GQA label."""
    from attnmem.measure.speed_results import read_rows

    gqa = {(r.impl, r.seq_len): r.tflops for r in read_rows(
        ROOT / "data" / "kernel_speed_fwdbwd_gqa_graphs_h200.csv")
        if (r.dtype, r.head_dim, r.causal, r.mode) == ("bf16", 128, True, "fwd_bwd")}
    assert {r.kv_heads for r in read_rows(
        ROOT / "data" / "kernel_speed_fwdbwd_gqa_graphs_h200.csv")} == {8}
    at = run("kernel", kkv="8", ktiming="GPU time (CUDA graphs)", kpass="fwd+bwd",
             kcausal="true")
    t = _kernel_table(at).set_index("s")
    assert t.loc[4096, OURS_LABEL] == round(gqa[("triton", 4096)])
    assert t.loc[4096, "default / FlashAttention-2"] == round(
        gqa[("triton", 4096)] / gqa[("sdpa_flash", 4096)], 2)
    assert any("enable_gqa" in c.value for c in at.caption)
    for other in (dict(kpass="fwd"), dict(ktiming="eager calls", kpass="fwd+bwd"),
                  dict(kdtype="fp16", ktiming="GPU time (CUDA graphs)", kpass="fwd+bwd")):
        at = run("kernel", kkv="8", **other)
        assert not grids(at) and any("measured for" in i.value for i in at.info)



def _peers_csv(folder: Path) -> None:
    """A bench CSV with FlashAttention-4 beside ours, cuDNN and FA2 (made-up figures, GPU
    'test'), plus the bundled CSVs, in a folder the page is pointed at."""
    import csv
    import shutil
    from dataclasses import asdict

    from attnmem.measure.speed_results import Row

    for f in (ROOT / "data").glob("kernel_speed_*_h200.csv"):
        shutil.copy(f, folder / f.name)
    tf = {"triton": 600.0, "sdpa_cudnn": 500.0, "sdpa_flash": 300.0, "fa4": 640.0}
    rows = []
    for impl, x in tf.items():
        for s in (4096, 16384):
            rows.append(Row(impl, "bf16", 1, 32, s, 128, False, "fwd", 1.0, x * s / 16384, 1e-3,
                            "ok", "test GPU", "t", "tr", "2026-12-01T10:20:00+00:00", 32,
                            "4.0.0b36" if impl == "fa4" else ""))
        rows.append(Row(impl, "bf16", 1, 32, 8192, 128, True, "fwd_bwd", 1.0, x / 2, 1e-3, "ok",
                        "test GPU", "t", "tr", "2026-12-01T10:20:00+00:00", 8,
                        "4.0.0b36" if impl == "fa4" else ""))
    with open(folder / "kernel_speed_peers_eager_h200.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(Row.__dataclass_fields__))
        w.writeheader()
        w.writerows(asdict(r) for r in rows)


def test_kernel_speed_shows_fa4_when_the_data_has_it(tmp_path, monkeypatch) -> None:
    """A run with FlashAttention-4 rows: a timing choice of its own, FA4's series and column,
    our default's ratio to it (table and metric), its version in the caption; GQA rows of the
    same file under 8 key/value heads. Without such a file the choice is not offered."""
    _peers_csv(tmp_path)
    monkeypatch.setenv("ATTNMEM_BENCH_DIR", str(tmp_path))
    timing = "eager, 3 rounds, with FlashAttention-4"
    at = run("kernel", ktiming=timing)
    t = _kernel_table(at).set_index("s")
    assert list(t.index) == [4096, 16384]
    assert t.loc[16384, impl_label("fa4")] == 640 and t.loc[16384, OURS_LABEL] == 600
    fa4 = impl_label("fa4")
    assert t.loc[16384, f"default / {fa4}"] == round(600 / 640, 2)
    assert t.loc[16384, "default / cuDNN"] == round(600 / 500, 2)
    assert metrics(at)["÷ FlashAttention-4 at s = 16,384"] == f"{600 / 640:.2f}×"  # no "(CuTe)": fits 1280 px
    assert any("flash-attn-4 4.0.0b36" in c.value and "test GPU" in c.value for c in at.caption)
    at = run("kernel", ktiming=timing, kkv="8", kpass="fwd+bwd", kcausal="true")
    t = _kernel_table(at).set_index("s")
    assert list(t.index) == [8192] and t.loc[8192, f"default / {fa4}"] == round(300 / 320, 2)
    at = run("kernel", ktiming=timing, kkv="8", kpass="fwd")  # GQA measured fwd+bwd only
    assert not grids(at) and any("measured for" in i.value for i in at.info)
    monkeypatch.delenv("ATTNMEM_BENCH_DIR")
    at = run("kernel", ktiming=timing)  # the bundled H200 peer run (data/kernel_speed_peers_eager_h200.csv)
    t = _kernel_table(at).set_index("s")
    assert not warnings(at) and {OURS_LABEL, fa4} <= set(t.columns)
    assert 4096 in t.index and 300 < t.loc[4096, fa4] < 1000  # FA4 measured, in TFLOP/s


def test_kernel_speed_headlines_fa4_from_the_run_that_timed_it(tmp_path, monkeypatch) -> None:
    """Issue 32 item 7: the default timing ran no FlashAttention-4, yet its headline compares
    our default with FA4 too, from the bundled run that timed both side by side (named in the
    metric's help); a choice no run measured FA4 for says so instead of a number."""
    _peers_csv(tmp_path)
    monkeypatch.setenv("ATTNMEM_BENCH_DIR", str(tmp_path))
    fa4 = impl_label("fa4")
    at = run("kernel")  # eager calls: cuDNN and FA2 only in its own file
    assert f"default / {fa4}" not in _kernel_table(at).columns
    got = {m.label: m for m in at.metric}
    head = got["÷ FlashAttention-4 at s = 16,384"]
    assert head.value == f"{600 / 640:.2f}×"
    assert "eager, 3 rounds, with FlashAttention-4" in head.proto.help
    assert {"÷ cuDNN at s = 16,384", "÷ FlashAttention-2 at s = 16,384"} <= set(got)
    bare = tmp_path / "no_fa4"  # the plain eager runs alone: no run has FlashAttention-4
    bare.mkdir()
    for name in ("kernel_speed_fwd_eager_h200.csv", "kernel_speed_fwdbwd_eager_h200.csv"):
        (bare / name).write_bytes((ROOT / "data" / name).read_bytes())
    monkeypatch.setenv("ATTNMEM_BENCH_DIR", str(bare))
    at = run("kernel")
    assert not any("FlashAttention-4" in m.label for m in at.metric) and "÷ cuDNN at s = 16,384" in metrics(at)
    assert any("FlashAttention-4 was not measured" in c.value for c in at.caption)


def test_kernel_speed_offers_the_bundled_target_grid() -> None:
    """The bundled 32-shape grid (data/kernel_speed_targets_eager_h200.csv): fp16, d = 64,
    GQA 4:1, causal forward+backward shows ours, cuDNN and FA4 at s = 4,096 and 16,384 with the
    ratios, the ratio being the file's own numbers."""
    import pandas as pd

    timing = "eager, 3 rounds, FA4 target grid"
    at = run("kernel", ktiming=timing, kdtype="fp16", kd="64", kkv="8", kcausal="true",
             kpass="fwd+bwd")
    t = _kernel_table(at).set_index("s")
    fa4 = impl_label("fa4")
    assert not warnings(at) and list(t.index) == [4096, 16384]
    df = pd.read_csv(ROOT / "data" / "kernel_speed_targets_eager_h200.csv")
    sel = df[(df.dtype == "fp16") & (df.head_dim == 64) & (df.kv_heads == 8) & df.causal
             & (df["mode"] == "fwd_bwd") & (df.seq_len == 16384)].set_index("impl")["tflops"]
    assert t.loc[16384, f"default / {fa4}"] == round(sel["triton"] / sel["fa4"], 2)

EXTREMES = {
    "score": {"b": "65536", "h": "100000", "s": "100000000", "dtype": "custom", "e": "64"},
    "model": {"b": "65536", "s": "100000000", "model": "Llama 3.1 405B"},
    "scaling": {"b": "65536", "h": "100000", "d": "65536", "smax": "16777216", "s2": "100000000",
                "causal": "true", "bwd": "true", "dtype": "fp32"},
    "flash": {"b": "65536", "h": "100000", "s": "100000000", "d": "65536", "br": "16", "bc": "16",
              "n": "32", "blk": "2", "step": "500"},
}


@pytest.mark.parametrize("page", sorted(EXTREMES))
def test_largest_accepted_values_do_not_break_a_page(page: str) -> None:
    at = run(page, **EXTREMES[page])  # run() asserts no exception
    assert not warnings(at)
    assert at.metric


# --- fuzzing the pages through their URLs ----------------------------------------------------

_KEYS = {
    "score": ("b", "h", "s", "dtype", "e", "unit"),
    "model": ("model", "mode", "wdtype", "kvdtype", "adtype", "b", "s", "gpu", "ckpt", "unit"),
    "scaling": ("impls", "b", "h", "d", "dtype", "causal", "bwd", "gpus", "smax", "by", "s2", "unit"),
    "flash": ("n", "blk", "causal", "step", "b", "h", "s", "d", "dtype", "br", "bc", "unit"),
    "kernel": ("kdtype", "kd", "kcausal", "kpass", "ktiming", "unit"),
}
_raw = st_.one_of(
    st_.text(max_size=30),
    st_.sampled_from(["0", "-1", "1", "2", "64", "4096", "1e9", "NaN", "inf", "", "true", "fp8_e4m3",
                      "custom", "naive", "none", "16777216", "training", "heads", "%00", "'; DROP"]),
    st_.integers(-10**12, 10**12).map(str),
)


@pytest.mark.parametrize("page", sorted(_KEYS))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: each run is a page
@given(data=st_.data())
def test_fuzzed_urls_never_raise(page: str, data: st_.DataObject) -> None:
    query = data.draw(st_.dictionaries(st_.sampled_from(_KEYS[page]), _raw, max_size=6))
    at = AppTest.from_file(str(PAGES[page]), default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, (query, [e.value for e in at.exception])
    assert at.metric or at.info  # a page always answers (or says what it needs)


def test_scaling_at_fp32_names_what_it_does_not_draw() -> None:
    """FlashAttention-2, cuDNN and FA4 take fp16/bf16 only: at fp32 the Scaling page draws the
    others and names these instead of pricing calls that cannot run (attnmem.calc.IMPL_DTYPES)."""
    at = run("scaling", dtype="fp32")
    idle = [cap.value for cap in at.caption if cap.value.startswith("Not drawn for fp32")]
    assert idle and all(attnmem.calc.IMPL_LABELS[i] in idle[0] for i in ("sdpa_flash", "sdpa_cudnn", "fa4"))
    assert attnmem.calc.IMPL_LABELS["naive"] not in idle[0]


def test_scaling_names_the_bundled_kernel_past_its_head_dims() -> None:
    """The bundled kernel takes head dims 16-256 (attnmem.calc.IMPL_HEAD_DIMS): at d = 512 the Scaling
    page draws the others and names it, instead of a traceback or a number for a call that
    raises."""
    at = run("scaling", impls="naive,sdpa_flash,triton", d="512")
    narrow = [cap.value for cap in at.caption if cap.value.startswith("Not drawn at head dim")]
    assert narrow and attnmem.calc.IMPL_LABELS["triton"] in narrow[0] and "16-256" in narrow[0]
    assert attnmem.calc.IMPL_LABELS["naive"] not in narrow[0]


def test_model_page_quantized_defaults_as_stored_and_follows_the_model() -> None:
    """Issue 30: a quantized checkpoint opens 'as stored'; switching to a plain model goes back
    to bf16 (the previous default, untouched); MoE models show both active conventions."""
    at = run("model", model="gpt-oss-20b (MoE, MXFP4)")
    assert at.selectbox(key="wdtype").value == "checkpoint"
    assert any("Active per token" in c.value and "without it" in c.value for c in at.caption)
    at.selectbox(key="model").set_value("Llama 3.1 8B").run()
    assert at.selectbox(key="wdtype").value == "bf16"
    at.selectbox(key="model").set_value("Qwen2.5 7B Instruct AWQ (int4)").run()
    assert at.selectbox(key="wdtype").value == "checkpoint"
    at.selectbox(key="wdtype").set_value("fp16").run()  # a value the user picks stays
    at.selectbox(key="model").set_value("gpt-oss-20b (MoE, MXFP4)").run()
    assert at.selectbox(key="wdtype").value == "fp16"


def test_flash_explainer_heatmap_never_reads_minus_zero() -> None:
    """A score that rounds to zero is written 0.0 in the heatmap's cells, not -0.0."""
    import json

    seen = set()
    for chart in run("flash", n="16", blk="4").get("plotly_chart"):
        for trace in json.loads(chart.proto.spec).get("data", []):
            if trace.get("type") == "heatmap":
                seen |= {t for row in trace.get("text", []) for t in row}
    assert seen and "-0.0" not in seen and "0.0" in seen
