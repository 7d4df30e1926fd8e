"""Measured attention calls read back for the GPU measurement page: the bundled H200
reference (data/attention_calls_h200.csv, rows of ``python -m attnmem.measure`` in the
store's columns, attnmem.measure.store.COLUMNS), its trace fingerprint
(data/attention_calls_trace_h200.csv, the kernels one call launches) and the rows of one shape
out of any results. pandas only (no torch): the page reads them without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from attnmem.measure.store import COLUMNS, read_csv_rows

DATA = Path(__file__).resolve().parents[2] / "data"
REFERENCE_CSV = DATA / "attention_calls_h200.csv"
REFERENCE_TRACE_CSV = DATA / "attention_calls_trace_h200.csv"


def reference_rows(path: Path = REFERENCE_CSV) -> pd.DataFrame:
    """The bundled reference rows in the store's columns (none when the file is absent)."""
    if not path.exists():
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.DataFrame(read_csv_rows(path), columns=list(COLUMNS))


def reference_trace(path: Path = REFERENCE_TRACE_CSV) -> pd.DataFrame:
    """The bundled trace fingerprint (empty when the file is absent)."""
    if not path.exists():
        return pd.DataFrame()
    return pd.read_csv(path)


def select_rows(df: pd.DataFrame, impls: Iterable[str], b: int, h: int, hkv: int, d: int,
                dtype: str, causal: bool) -> pd.DataFrame:
    """The rows of one shape (a missing kv_heads reads as heads; hkv 0 means H)."""
    if df.empty:
        return df
    kv = hkv or h
    m = ((df["impl"].isin(impls)) & (df["batch"] == b) & (df["heads"] == h)
         & (df["kv_heads"].fillna(df["heads"]) == kv) & (df["head_dim"] == d)
         & (df["dtype"] == dtype) & (df["causal"] == causal))
    return df[m]


def trace_rows(trace: pd.DataFrame, impls: Iterable[str], causal: bool) -> pd.DataFrame:
    """The trace rows of these implementations (all of them when none is picked) with this
    mask, where the trace records it (the string "True"/"False" in any case)."""
    impls = list(impls)
    rows = trace[trace["impl"].isin(impls)] if impls else trace
    if "causal" in rows:
        rows = rows[rows["causal"].astype(str).str.lower() == str(causal).lower()]
    return rows
