"""attnmem/pages/many_gpus.py: its numbers are attnmem.calc.context_parallel's, every input is in the URL, bad
URL values are refused with a warning, the ring picture is a ranks x steps heatmap, and measured points are drawn where the bundled
one-rank CSV has the shape (its reader: tests/measure/test_ring_results.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import attnmem.calc
from attnmem.calc.context_parallel import (
    context_parallel_memory,
    max_context_parallel_seq_len,
    ring_comm_bytes,
)

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "attnmem" / "pages" / "many_gpus.py")
sys.path.insert(0, str(ROOT))


def run(**query: str) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_metrics_are_calc_numbers_from_url_inputs() -> None:
    at = run(model="Llama 3.1 8B", gpu="NVIDIA H100 80GB", c="4", s="65536", pass_="x")
    model = attnmem.calc.MODELS["Llama 3.1 8B"]
    mem = context_parallel_memory("triton", 1, model.num_heads, 65536, model.head_dim, "bf16",
                                  True, True, 4, model.num_kv_heads)
    comm = ring_comm_bytes(1, model.num_heads, 65536, model.head_dim, "bf16", 4,
                           model.num_kv_heads)
    longest = max_context_parallel_seq_len(model, attnmem.calc.GPUS["NVIDIA H100 80GB"], 4)
    values = metrics(at)
    assert values["Per GPU: one attention call"] == attnmem.calc.format_bytes(mem.total_bytes, "GB")
    assert values["Sent per GPU per call"] == attnmem.calc.format_bytes(comm.total_bytes, "GB")
    assert values["Longest context on 4 × H100"] == f"{longest:,}"
    q = dict(at.query_params)
    for key in ("model", "gpu", "impl", "s", "c", "pass", "dtype", "attn", "ckpt", "shard"):
        assert key in q, key
    assert q["c"] in ("4", ["4"]) and q["s"] in ("65536", ["65536"])


def test_ring_heatmap_holds_the_schedule() -> None:
    at = run(c="4", s="8192")
    assert not [ch for ch in at.get("plotly_chart")  # drawn once its expander is opened
                if any(tr.get("type") == "heatmap" for tr in json.loads(ch.proto.spec)["data"])]
    at.session_state["_open_cp_ring"] = True  # opened, as a click on it does
    at.run()
    charts = [json.loads(ch.proto.spec) for ch in at.get("plotly_chart")]
    heat = [tr for ch in charts for tr in ch["data"] if tr.get("type") == "heatmap"]
    assert heat and heat[0]["z"] == attnmem.calc.ring_schedule(4)


def test_s_not_divisible_is_rounded_with_a_note() -> None:
    at = run(c="3", s="1000")
    assert any("using s = 996" in i.value for i in at.info)


@pytest.mark.parametrize("query", [{"c": "0"}, {"c": "65"}, {"impl": "ring"}, {"s": "abc"},
                                   {"pass": "both"}])
def test_bad_url_values_warn_and_fall_back(query: dict) -> None:
    at = run(**query)
    assert at.warning, query


def test_torch_ring_with_gqa_model_says_why_instead_of_crashing() -> None:
    at = run(model="Llama 3.1 8B", impl="sdpa_flash")
    assert at.error and "equal query and key/value heads" in at.error[0].value


def test_torch_ring_with_the_measured_shape_runs() -> None:
    at = run(impl="sdpa_cudnn", attn="H = 32, d = 128 (the measured shape)", c="16")
    assert "Per GPU: one attention call" in metrics(at)
    assert any("No training estimate" in w.value for w in at.warning)  # Llama 3.1 8B is GQA


def test_measured_points_are_drawn_when_the_csv_has_the_shape(tmp_path: Path,
                                                              monkeypatch) -> None:
    """The page reads data/ring_one_rank_h200.csv; with one there for this shape, a
    'measured' trace appears (checked by pointing the reader at a temporary file)."""
    from attnmem.measure.ring.results import DATA, read_ring_measurements

    df = read_ring_measurements(DATA)
    if df is None:
        pytest.skip("no data/ring_one_rank_h200.csv yet (the lead writes it on a GPU)")
    row = df.iloc[0]
    at = run(attn="H = 32, d = 128 (the measured shape)", s=str(int(row["seq_len"])),
             c=str(int(row["world_size"])), **{"pass": str(row["pass"])})
    names = [tr.get("name", "") for ch in at.get("plotly_chart")
             for tr in json.loads(ch.proto.spec)["data"]]
    assert any(n.startswith("measured") for n in names)
