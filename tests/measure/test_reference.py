"""attnmem.measure.reference: the bundled H200 rows read in the store's columns, an absent
file read as no rows, and the rows of one shape (kv_heads missing reads as heads)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnmem.measure.reference import reference_rows, reference_trace, select_rows, trace_rows
from attnmem.measure.store import COLUMNS


def test_bundled_reference_and_absent_files(tmp_path: Path) -> None:
    rows = reference_rows()
    assert list(rows.columns) == list(COLUMNS) and len(rows) > 0
    assert reference_rows(tmp_path / "absent.csv").empty
    assert reference_trace(tmp_path / "absent.csv").empty


def test_select_rows_of_one_shape() -> None:
    base = dict(impl="triton", batch=1, heads=32, head_dim=128, dtype="fp16", causal=False)
    df = pd.DataFrame([{**base, "kv_heads": None}, {**base, "kv_heads": 8},
                       {**base, "kv_heads": 32, "dtype": "bf16"}])
    assert select_rows(df, ["triton"], 1, 32, 0, 128, "fp16", False).index.tolist() == [0]
    assert select_rows(df, ["triton"], 1, 32, 8, 128, "fp16", False).index.tolist() == [1]
    assert select_rows(df, ["naive"], 1, 32, 0, 128, "fp16", False).empty
    assert select_rows(df.iloc[:0], ["triton"], 1, 32, 0, 128, "fp16", False).empty


def test_trace_rows_of_the_picked_calls() -> None:
    trace = pd.DataFrame({"impl": ["naive", "naive", "triton"], "causal": ["True", "false", "FALSE"],
                          "kernel": ["(all)"] * 3})
    assert trace_rows(trace, ["naive"], False).index.tolist() == [1]
    assert trace_rows(trace, [], False).index.tolist() == [1, 2]
    assert trace_rows(trace.drop(columns="causal"), ["triton"], True).index.tolist() == [2]
