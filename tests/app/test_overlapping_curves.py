"""Curves that coincide stay visible (issue 32, item 4: Scaling's masked_fill curve was hidden
under masked_fill_): where a curve lies within 3% of one drawn before it at every point, it is
drawn dashed with open markers, so the one underneath shows through. Checked on both Scaling
charts and on GPU measurement's chart (bundled H200 data, no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120


def _traces(page: str, **query: str) -> list[list[dict]]:
    at = AppTest.from_file(str(ROOT / "attnmem" / "pages" / f"{page}.py"), default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = value
    at.session_state["_open_scaling_param_chart"] = True  # Scaling's second chart, opened
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return [json.loads(ch.proto.spec)["data"] for ch in at.get("plotly_chart")]


def _by_name(traces: list[dict]) -> dict[str, dict]:
    return {tr.get("name", ""): tr for tr in traces}


def test_scaling_draws_masked_fill_and_masked_fill_apart_on_both_charts() -> None:
    charts = _traces("scaling", impls=["naive", "naive_inplace", "sdpa_math"])
    assert len(charts) == 2
    for traces in charts:
        named = _by_name(traces)
        first, second = named["Eager (masked_fill)"], named["Eager (masked_fill_)"]
        assert first["y"] == second["y"]  # the two coincide: the reason for the rule
        assert second["line"]["dash"] == "dash" and second["marker"]["symbol"] == "circle-open"
        assert first["line"].get("dash", "solid") == "solid"
        assert named["SDPA math"]["line"].get("dash", "solid") == "solid"  # apart: unchanged


def test_measure_draws_coinciding_model_curves_apart() -> None:
    traces = _by_name(_traces("measure")[0])
    first = traces["Eager (masked_fill) (model)"]
    second = traces["Eager (masked_fill_) (model)"]
    assert first["line"]["dash"] == "dot" and second["line"]["dash"] == "dash"
    assert traces["Eager (masked_fill_) (measured)"]["marker"]["symbol"] == "circle-open"
    assert traces["SDPA math (model)"]["line"]["dash"] == "dot"
