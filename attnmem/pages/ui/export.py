"""CSV exports that a spreadsheet cannot run: formula-injection escaping (OWASP "CSV injection").

A spreadsheet opening a CSV treats a cell that starts with `=`, `+`, `-` or `@` as a formula
(`=cmd|' /C calc'!A0` starts a program in old Excel; `=HYPERLINK(...)` leaks data), and a
leading tab or carriage return can hide such a start; an unquoted carriage return inside a
cell starts a new row, so text cells are always quoted. Any text that reached our tables from a
user (a model name from an uploaded file name, a run label, a CSV's message column) must be
exported with a leading apostrophe, which spreadsheets show as plain text.

Works on any pandas dtype (object, the `str` dtype that pandas 3 gives text columns,
categoricals): every cell that is a Python str is checked, numbers are left as numbers.
"""

from __future__ import annotations

import csv
import io

import pandas as pd

from attnmem.measure.store import FORMULA_START, neutralise

__all__ = ["FORMULA_START", "escape_cell", "safe_csv_bytes", "safe_frame"]

# One copy of the cell rule, shared with the results store's CSV export.
escape_cell = neutralise


def safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of df whose text cells are escaped (column names too), whatever the dtypes."""
    out = df.copy()
    for col in out.columns:
        if pd.api.types.is_numeric_dtype(out[col]) or pd.api.types.is_bool_dtype(out[col]):
            continue
        out[col] = out[col].astype(object).map(escape_cell)
    out.columns = [escape_cell(c) for c in out.columns]
    return out


def safe_csv_bytes(df: pd.DataFrame) -> bytes:
    """UTF-8 CSV of df with formula-like text neutralised (for st.download_button).

    Every text cell is quoted: neither pandas nor the csv module quotes a field that holds a
    bare carriage return, and a spreadsheet starts a new row at one, so the text after it
    (`=cmd|...`) would be the first cell of a row, unescaped.
    """
    buf = io.StringIO()
    safe_frame(df).to_csv(buf, index=False, quoting=csv.QUOTE_NONNUMERIC)
    return buf.getvalue().encode()
