"""The measurement page runs headless on a CPU machine (streamlit.testing.v1.AppTest): says
plainly that there is no GPU, shows bundled or stored results with the model's error, survives
hostile URLs, and never writes to the store unless asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from _frames import grids  # HTML tables and grids alike
from streamlit.testing.v1 import AppTest  # noqa: E402

from attnmem.measure.store import COLUMNS, ResultStore  # noqa: E402

PAGE = str(Path(__file__).resolve().parents[2] / "attnmem" / "pages" / "measure.py")


def row(**kw):
    r = {c: None for c in COLUMNS}
    r.update(impl="naive", batch=1, heads=32, kv_heads=32, seq_len=1024, head_dim=128,
             dtype="fp16", causal=False, backward=False, status="ok", median_ms=0.15,
             tflops=114.0, peak_extra_bytes=142_606_336, message="", gpu_name="NVIDIA H200",
             driver="580.159.04", torch_version="2.11.0+cu130", triton_version="3.6.0",
             timestamp="2026-11-30T06:20:45+00:00")
    r.update(kw)
    return r


@pytest.fixture
def db(tmp_path, monkeypatch):
    path = tmp_path / "results.sqlite"
    monkeypatch.setenv("ATTNMEM_DB", str(path))
    return path


def run_page(params: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=180)
    for k, v in (params or {}).items():
        at.query_params[k] = v
    at.run()
    return at


def test_page_runs_without_gpu_and_says_so(db):
    at = run_page()
    assert not at.exception, [e.value for e in at.exception]
    import torch

    if not torch.cuda.is_available():
        assert any("No GPU here" in i.value for i in at.info)
        assert not any(b.label == "Run measurement" for b in at.button)
    assert at.query_params["mode"] == ["both"] or at.query_params["mode"] == "both"


def test_page_shows_a_stored_run_with_model_error(db):
    st = ResultStore(db)
    run = st.new_run(gpu_name="NVIDIA H200", label="t")
    st.add_row(run, row())
    st.add_row(run, row(seq_len=2048, peak_extra_bytes=553_648_128))
    st.add_row(run, row(seq_len=4096, status="oom", peak_extra_bytes=None, median_ms=None,
                        tflops=None, message="CUDA out of memory"))
    st.add_row(run, row(message="=HYPERLINK(\"x\")", seq_len=512, peak_extra_bytes=37_748_736))
    at = run_page({"src": str(run), "mode": "fwd", "lens": "512,1024,2048,4096"})
    assert not at.exception, [e.value for e in at.exception]
    table = grids(at)[0].value
    assert set(table["s"]) == {512, 1024, 2048, 4096}
    ok = table[table["s"] == 1024].iloc[0]
    assert ok["model error %"] == pytest.approx(0.0, abs=0.01)
    assert table[table["s"] == 4096].iloc[0]["status"] == "oom"
    assert len(st.runs()) == 1  # showing changes nothing


def test_page_survives_hostile_url(db):
    at = run_page({"src": "99", "hkv": "abc", "d": "1e999", "dtype": "<b>x", "lens": "5,6",
                   "impls": "evil", "b": "-1", "causal": "maybe", "mode": "[x](javascript:1)"})
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.warning) >= 5
    for w in at.warning:
        assert "<b>" not in w.value and "](javascript" not in w.value


def test_page_with_gqa_mismatch_warns(db):
    at = run_page({"h": "32", "hkv": "5"})
    assert not at.exception
    assert any("multiple of KV heads" in w.value for w in at.warning)


def test_page_without_selection(db):
    at = run_page({"impls": "none"})
    assert not at.exception
    assert any("Pick at least one" in i.value for i in at.info)


def test_fa4_is_selectable_and_says_why_it_is_unavailable(db):
    """FlashAttention-4 is one of the implementations to pick; where flash_attn.cute is not
    installed the page says so with the install hint, and a stored run's unavailable fa4 row
    is listed with its reason beside the measured ones."""
    from attnmem.measure.registry import fa4_installed_reason

    st = ResultStore(db)
    run = st.new_run(gpu_name="NVIDIA H200", label="t")
    st.add_row(run, row(impl="triton", peak_extra_bytes=17_301_504))
    why = "flash_attn.cute is not installed (pip install flash-attn-4)"
    st.add_row(run, row(impl="fa4", status="unavailable", peak_extra_bytes=None,
                        median_ms=None, tflops=None, message=why))
    at = run_page({"src": str(run), "mode": "fwd", "lens": "1024", "impls": "triton,fa4",
                   "fcols": "true"})  # the note is one of the columns "show all" adds
    assert not at.exception, [e.value for e in at.exception]
    chosen = at.multiselect(key="impls")
    assert "fa4" in chosen.options or any("FlashAttention-4" in o for o in chosen.options)
    assert len(chosen.value) == 2
    table = grids(at)[0].value
    fa4 = table[table["status"] == "unavailable"].iloc[0]
    assert "FlashAttention-4" in fa4["implementation"] and fa4["note"] == why
    if fa4_installed_reason():
        assert any("not available here" in c.value and "pip install flash-attn-4" in c.value
                   for c in at.caption)


#: The main column's width in a 1280 px window with the sidebar open (docs/APP.md, "Tables"):
#: a grid whose columns add up to more scrolls sideways there.
MAIN_COLUMN_PX = 820


def _widths(grid) -> dict[str, int]:
    """The column widths the page gave a grid (attnmem.pages.ui.tables.fit_widths), by header."""
    cfg = json.loads(grid.proto.columns)
    return {k: v["width"] for k, v in cfg.items() if "width" in v}


def test_tables_fit_a_laptop_window_and_show_all_adds_the_rest(db):
    """Every table on the page, at its default inputs and with two stored runs (the runs
    table and their comparison), fits the main column at 1280 px (a grid's widths add up to
    at most the column; an HTML table wraps): the points show the
    columns that answer "how far off is the model" and "Show all 12 columns" adds the rest
    (kept in the URL); the per-kernel table wraps instead (st.table)."""
    st = ResultStore(db)
    for label in ("first", "second"):
        run = st.new_run(gpu_name="NVIDIA H200", label=label)
        st.add_row(run, row())
        st.add_row(run, row(seq_len=2048, peak_extra_bytes=553_648_128))
    at = run_page()
    assert not at.exception, [e.value for e in at.exception]
    shown = [tuple(g.value.columns) for g in grids(at)]
    assert any("model error %" in cols for cols in shown)
    assert any("peak_ratio_b_over_a" in cols for cols in shown)  # the comparison is drawn
    assert any("started (UTC)" in cols for cols in shown)  # the runs are listed
    # a data grid (a frame of more than tables.HTML_MAX_ROWS rows; the bundled reference's
    # points at the default inputs) has a width for every column, all within the window; a
    # shorter frame is an HTML table, whose cells wrap at the column's width
    assert at.dataframe
    for grid in at.dataframe:
        cols, widths = tuple(grid.value.columns), _widths(grid)
        assert set(widths) == set(cols), cols  # every shown column was given its width
        assert sum(widths.values()) <= MAIN_COLUMN_PX, (cols, widths)
    kernels = next(t for t in at.table if "kernel" in t.value.columns)  # every kernel: an HTML
    # table whose kernel names wrap anywhere
    assert "col2 p { overflow-wrap: anywhere }" in kernels.proto.arrow_data.styler.styles
    assert list(kernels.value.columns).index("kernel") == 2

    everything = run_page({"fcols": "true", "bcols": "true", "rcols": "true", "ccols": "true"})
    points = [g.value for g in grids(everything) if "model error %" in g.value.columns]
    assert len(points) == 2 and all(len(p.columns) == 12 for p in points)
    assert {"median ms", "TFLOP/s", "note"} <= set(points[0].columns)
    assert any("driver" in g.value.columns for g in grids(everything))
    assert any("predicted_bytes_a" in g.value.columns for g in grids(everything))
    assert everything.query_params["fcols"] in (["true"], "true")
