"""attnmem/pages/serving.py renders its answer from attnmem.calc.serving_capacity, and takes its inputs from
the URL (a bad value is refused with a warning, never a crash)."""

from __future__ import annotations

from pathlib import Path

from _frames import grids  # HTML tables and grids alike
from streamlit.testing.v1 import AppTest

import attnmem.calc
from attnmem.calc.serving import DEFAULT_CUDA_GRAPH_BYTES, DEFAULT_NON_TORCH_BYTES, serving_capacity

PAGE = str(Path(__file__).parents[2] / "attnmem" / "pages" / "serving.py")


def run(params: dict[str, str]) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    for k, v in params.items():
        at.query_params[k] = v
    return at.run()


def test_metrics_are_calc_numbers_from_url_inputs() -> None:
    at = run({"model": "DeepSeek-V2-Lite (MLA, MoE)", "s": "16384", "util": "0.8",
              "kvdtype": "fp8_e4m3"})
    assert not at.exception
    cap = serving_capacity(attnmem.calc.MODELS["DeepSeek-V2-Lite (MLA, MoE)"], attnmem.calc.DEFAULT_GPU,
                           16384, kv_dtype="fp8_e4m3", gpu_memory_utilization=0.8,
                           cuda_graph_bytes=DEFAULT_CUDA_GRAPH_BYTES // 2**20 * 2**20,
                           non_torch_bytes=DEFAULT_NON_TORCH_BYTES // 2**20 * 2**20)
    values = {m.label: m.value for m in at.metric}
    assert values["KV blocks available"] == f"{cap.num_blocks:,}"
    assert values["Longest context of one request (tokens)"] == f"{cap.max_context:,}"


def test_bad_url_value_is_refused_not_crashed() -> None:
    at = run({"util": "1.7", "block": "17"})
    assert not at.exception


def test_quantized_checkpoint_as_stored_and_torch_total_budget() -> None:
    """Issue 30: a quantized checkpoint's weights default to 'as stored'; the budget is taken
    from the memory torch can use (our H200's measured mem_get_info total), the spec figure
    shown beside it and not used."""
    name, h200 = "gpt-oss-20b (MoE, MXFP4)", "NVIDIA H200 141GB"
    at = run({"model": name, "gpu": h200})
    assert not at.exception
    assert at.selectbox(key="wdtype").value == "checkpoint"
    cap = serving_capacity(attnmem.calc.MODELS[name], h200, 32768, weight_dtype="checkpoint",
                           cuda_graph_bytes=DEFAULT_CUDA_GRAPH_BYTES // 2**20 * 2**20,
                           non_torch_bytes=DEFAULT_NON_TORCH_BYTES // 2**20 * 2**20)
    assert cap.gpu_bytes == 150_109_880_320
    values = {m.label: m.value for m in at.metric}
    assert values["KV blocks available"] == f"{cap.num_blocks:,}"
    table = grids(at)[0].value
    rows = dict(zip(table["part"], table["bytes"], strict=True))
    assert rows["GPU memory torch can use (used)"] == 150_109_880_320
    assert rows["GPU memory on the spec sheet (not used)"] == attnmem.calc.GPUS[h200]
    assert rows["weights"] == attnmem.calc.weight_bytes(attnmem.calc.MODELS[name], "checkpoint")
    assert any("measured" in c.value and "2026" in c.value for c in at.caption)
    # a plain model keeps bf16, and a GPU without a sourced torch figure says the spec is used
    at = run({"model": "Llama 3.1 8B", "gpu": "NVIDIA L4 24GB"})
    assert at.selectbox(key="wdtype").value == "bf16"
    assert "checkpoint" not in at.selectbox(key="wdtype").options
    assert any("spec" in c.value and "no torch total" in c.value for c in at.caption)
