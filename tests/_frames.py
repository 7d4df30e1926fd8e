"""Every table a page drew, for AppTest checks: attnmem.pages.ui.tables.table draws a frame of
up to HTML_MAX_ROWS rows as an HTML table (st.table) and a longer one as a data grid
(st.dataframe), so a test that reads a table finds it among both kinds."""

from __future__ import annotations

import pandas as pd

#: AppTest's node types of st.table and st.dataframe.
KINDS = ("table", "dataframe")


def frames(at) -> list[pd.DataFrame]:
    """The values of every HTML table and data grid in the main area of `at` (an AppTest run,
    or an element of it such as an expander), in page order."""
    root = getattr(at, "main", at)
    return [e.value for e in root if e.type in KINDS]


def frame_with(at, column: str) -> pd.DataFrame:
    """The first table of `at` (frames) that has `column`."""
    for df in frames(at):
        if column in df.columns:
            return df
    raise AssertionError(f"no table with a column {column!r}; columns: "
                         f"{[list(df.columns) for df in frames(at)]}")


def grids(at) -> list:
    """The elements (each with .value) of every HTML table and data grid of `at`, in page
    order: what `at.dataframe` listed while every table was a grid."""
    root = getattr(at, "main", at)
    return [e for e in root if e.type in KINDS]
