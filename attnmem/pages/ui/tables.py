"""Tables that read without scrolling sideways in a 1280 px window with the sidebar open.
Streamlit widgets.

`table` draws a frame of up to HTML_MAX_ROWS rows as an HTML table (st.table) and a longer one
as st.dataframe's data grid, missing cells a dash either way; a grid's columns are as wide as
their longest cell or header in the grid's font (`fit_widths`: the grid draws on a canvas, so
nothing in the DOM shows a cut-off cell); `text_table` and `code_table` are HTML tables whose
cells wrap; `wide_table` shows the columns that answer its question and a URL-bound "show all"
checkbox.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from attnmem.pages.ui import replay
from attnmem.pages.ui.url_state import BoolParam
from attnmem.pages.ui.widgets import toggle

#: What a table shows for a missing value (Streamlit's default is the text "None").
MISSING = "—"


#: Advance width in px of each character in st.dataframe's grid, whose cells and headers are
#: drawn in 400 14px "Source Sans" (the grid's --gdg-base-font-style, --gdg-header-font-style
#: and --gdg-font-family under Streamlit's theme): measured with canvas measureText in Debian's
#: Chromium, rounded up to 0.1 px. tests/browser/test_layout.py measures them again in the
#: running app and fails if a character is wider than listed here.
_WIDTH_GROUPS: tuple[tuple[str, float], ...] = (
    (' ', 2.8),
    ('|', 3.4),
    ("',.:;ij·′", 3.5),
    ('l', 3.6),
    ('I', 3.7),
    ('!f', 4.1),
    ('()[]{}', 4.3),
    ('-', 4.4),
    ('t', 4.8),
    ('/\\r', 4.9),
    ('ᵀ', 5.0),
    ('²³', 5.2),
    ('ℓ', 5.8),
    ('*s', 5.9),
    ('"?z', 6.0),
    ('x', 6.3),
    ('c', 6.4),
    ('vy', 6.6),
    ('Y', 6.7),
    ('J–', 6.8),
    ('L', 6.9),
    ('0123456789#$+<=>F^_ek~×≥≤≈é±', 7.0),
    ('ag', 7.1),
    ('X', 7.2),
    ('V', 7.3),
    ('E', 7.4),
    ('S', 7.5),
    ('TZ`o', 7.6),
    ('Ahnuσ', 7.7),
    ('bdpq', 7.8),
    ('µ', 7.9),
    ('CPR', 8.0),
    ('K', 8.2),
    ('B', 8.3),
    ('&', 8.6),
    ('DG→', 8.7),
    ('NU', 9.1),
    ('H', 9.2),
    ('OQ', 9.3),
    ('w', 10.1),
    ('M', 10.2),
    ('∞', 11.0),
    ('W', 11.1),
    ('—', 11.2),
    ('%', 11.6),
    ('m', 11.7),
    ('@', 11.9),
    ('…', 13.3),
)
CHAR_WIDTHS: dict[str, float] = {ch: px for chars, px in _WIDTH_GROUPS for ch in chars}
#: A character not measured counts as the widest one measured (the ellipsis "…").
WIDEST_CHAR_PX = max(CHAR_WIDTHS.values())
#: A cell's padding (the grid's --gdg-cell-horizontal-padding, 8 px, on each side) plus 4 px
#: to spare; no column wider than MAX_COL_PX.
CELL_PAD_PX, MAX_COL_PX = 20, 640


def text_px(text: str) -> float:
    """Width in px of `text` in the grid's font: the sum of its characters' advance widths
    (CHAR_WIDTHS; canvas measureText of a string equals that sum for this font, no kerning)."""
    return sum(CHAR_WIDTHS.get(ch, WIDEST_CHAR_PX) for ch in text)


def fit_widths(data: pd.DataFrame, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A pixel width per column that holds its longest cell and its header (issue 32: a grid
    sized by its first data cut "1,099,511,627,776" to "1,099,511,627,77" when the numbers
    grew; the grid draws on a canvas, so nothing in the DOM shows the cut). Columns `given`
    a config keep theirs."""
    cfg: dict[str, Any] = dict(given or {})
    for col in data.columns:
        if col in cfg or not isinstance(col, str):
            continue
        cells = data[col].head(2000)
        # Python values (tolist: ints, floats, str, None/NaN as Series.map passes them), without
        # Series.map's trip through pandas' arrow-backed strings (issue 45 item 5: ~2 ms a column)
        values = cells.tolist() if not isinstance(cells.dtype, pd.CategoricalDtype) else \
            list(cells.astype(object))
        widest = max((text_px(MISSING if v is None or v != v else
                              f"{v:,}" if isinstance(v, int) else str(v)) for v in values),
                     default=0.0)
        px = max(widest, text_px(col))
        cfg[col] = st.column_config.Column(width=min(MAX_COL_PX, math.ceil(CELL_PAD_PX + px)))
    return cfg


#: A frame of at most this many rows is drawn as an HTML table (st.table), not a data grid
#: (issue 45 item 3): the grid's bundle (glide-data-grid, 0.5 MB) is evaluated and its canvas
#: drawn on every direct load that shows one, 0.5-0.9 s on the 2-core machine
#: (scripts/settle_times.py --floor: floor_3_grid against floor_2_table, 20 rows each), where
#: an HTML table of the same rows costs 0.1-0.3 s. Longer frames (every bundled measured row)
#: keep the grid: it scrolls inside its box and draws only the rows in view, where st.table
#: renders every cell as markdown.
HTML_MAX_ROWS = 40

#: Characters that st.table's cells (rendered as markdown) would read as markup: emphasis,
#: code, math, strikethrough, links, HTML, escapes; and a heading, quote or list marker that
#: starts the cell. Escaped with a backslash, so a cell shows its text as the grid would; "_"
#: inside a word ("masked_fill_") is no emphasis in markdown.
_MD_IN_CELL = re.compile(r"([\\*`$~\[\]<>|])")
_MD_AT_START = re.compile(r"^(\s*)([#>+-]|\d+[.)])(?=\s|$)")


def _cell_text(value: Any) -> Any:
    """A string cell escaped for st.table's markdown (_MD_IN_CELL, _MD_AT_START); anything
    else as it is."""
    if not isinstance(value, str):
        return value
    return _MD_AT_START.sub(lambda m: m[1] + m[2][:-1] + "\\" + m[2][-1],
                            _MD_IN_CELL.sub(r"\\\1", value))


def cell_display(value: Any) -> str:
    """What an HTML table shows for a cell: text escaped for st.table's markdown (_cell_text),
    an integer with thousands separators (as the app writes lengths and byte counts), a float
    with at most four decimals (no "1.500000"), anything else as str()."""
    if isinstance(value, str):
        return _cell_text(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return _cell_text(str(value))
    if isinstance(value, numbers.Integral) or (math.isfinite(value) and value == int(value)):
        return f"{int(value):,}"
    return f"{value:,.4f}".rstrip("0").rstrip(".") if math.isfinite(value) else str(value)


def html_styled(data: pd.DataFrame) -> Any:
    """`data` as `table` hands it to st.table: a pandas Styler whose display text is
    cell_display's, a missing cell MISSING, column names escaped alike. The data under it stay
    as they are (numbers as numbers, a missing cell missing: what AppTest's Table.value reads),
    only what is shown is formatted. A frame whose index or columns repeat a label (which a
    Styler refuses) gets its cells turned into that text instead."""
    shown = data.rename(columns=lambda c: _cell_text(c) if isinstance(c, str) else c)
    if not (shown.index.is_unique and shown.columns.is_unique):
        return shown.astype(object).where(shown.notna(), MISSING).map(cell_display)
    return shown.style.format(cell_display, na_rep=MISSING)


def table(data: Any, where: Any = st, content_key: Any = None, **kw: Any) -> Any:
    """A table: an HTML table (st.table) for a frame of at most HTML_MAX_ROWS rows, else
    st.dataframe's grid. Missing cells are shown as a dash instead of "None" (measured tables
    have columns a row does not fill: a failed run has no time, an old row no version); a
    grid's columns are as wide as their content (fit_widths). A frame drawn before with the
    same content and options is replayed (attnmem.pages.ui.replay): its widths and Arrow bytes
    are not computed again. ``content_key``, where given, stands for the frame's content in
    that comparison (a value that changes whenever the frame does, e.g. the inputs of the
    cached function that made it), so a large frame is not pickled to find it. Of `kw`, an
    HTML table takes hide_index and width (default "content": as wide as its cells, as the
    grid is)."""
    if isinstance(data, pd.DataFrame) and len(data) <= HTML_MAX_ROWS:
        opts = {"hide_index": kw.get("hide_index"), "width": kw.get("width", "content")}

        def draw_html() -> None:  # styled and turned into Arrow only on a miss
            st.table(html_styled(data), **opts)

        if not replay.can_replay(where):  # a stand-in object (tests): drawn on directly
            return where.table(html_styled(data), **opts)
        replay.drawn("html_table", (("key", content_key) if content_key is not None else data,
                                    opts), draw_html, where)
        return None
    kw.setdefault("placeholder", MISSING)
    if not isinstance(data, pd.DataFrame):
        return where.dataframe(data, **kw)
    if not replay.can_replay(where):  # a stand-in object (tests): drawn on directly
        kw["column_config"] = fit_widths(data, kw.get("column_config"))
        return where.dataframe(data, **kw)

    def draw() -> None:  # widths measured and the frame turned into Arrow only on a miss
        st.dataframe(data, **{**kw, "column_config": fit_widths(data, kw.get("column_config"))})

    replay.drawn("dataframe", (("key", content_key) if content_key is not None else data, kw),
                 draw, where)
    return None


def text_table(data: pd.DataFrame, where: Any = st, content_key: Any = None) -> None:
    """A table whose cells are sentences (what each tensor is, why it is kept) as st.table:
    HTML, whose cells wrap at the container's width, where st.dataframe's grid draws each cell
    on one line and scrolls sideways once the longest does not fit. No index; missing cells
    a dash, as in `table`; replayed, and ``content_key`` taken, as there."""
    replay.drawn("text_table", (("key", content_key) if content_key is not None else data,),
                 lambda: st.table(data.astype(object).where(data.notna(), MISSING), hide_index=True),
                 where)


def code_table(data: pd.DataFrame, long: Iterable[str], where: Any = st,
               formats: Mapping[str, str] | None = None) -> None:
    """`text_table` for cells that hold long names without spaces (CUDA kernel names, C++
    templates such as "sm80_xmma_gemm_f32f32_..._tilesize64x256x8_stage3"): in the columns
    `long`, a line may break anywhere (CSS overflow-wrap: anywhere), where st.table breaks
    only at a space and a 100-character name pushes the table wider than its container. The
    rule goes through a pandas Styler, which st.table renders: st.table draws each cell's text
    as markdown, a paragraph in a div, both with overflow-wrap: normal, so the rule names
    them (and its id selector outranks their class rules). Numbers in the columns of
    `formats` are shown with that format string (e.g. "{:.2f}"); the other columns keep
    their words whole."""
    cols = list(data.columns)
    long = list(long)
    unknown = [col for col in [*long, *(formats or {})] if col not in cols]
    if unknown:
        raise ValueError(f"code_table: columns {unknown} are not in the table ({cols})")

    def draw() -> None:  # styled (pandas' Styler renders every cell) only on a miss
        styled = data.style.set_table_styles(
            [{"selector": f"td.col{cols.index(col)} {tag}", "props": [("overflow-wrap", "anywhere")]}
             for col in long for tag in ("div", "p")])
        styled = styled.format(na_rep=MISSING)
        for col, spec in (formats or {}).items():
            styled = styled.format(spec, subset=[col], na_rep=MISSING)
        st.table(styled, hide_index=True)

    replay.drawn("code_table", (data, long, dict(formats or {})), draw, where)


#: The URL value of a "show all columns" checkbox (wide_table): off unless the link says so.
ALL_COLUMNS = BoolParam(False)


def wide_table(data: pd.DataFrame, first: Iterable[str], key: str, where: Any = st,
               spec: BoolParam = ALL_COLUMNS, content_key: Any = None, **kw: Any) -> Any:
    """A table of more columns than a 1280 px window shows beside the sidebar: the columns
    `first` (in that order) by default, every column once the checkbox above it is ticked.
    The checkbox is an input like the others (URL key `key`: put `key: spec` in the page's
    specs for sync_url), so a link keeps the choice; its help names the columns it adds.
    ``content_key``: as in `table`, for `data`."""
    kw.setdefault("hide_index", True)
    first = list(first)
    missing = [col for col in first if col not in data.columns]
    if missing:
        raise ValueError(f"wide_table: columns {missing} are not in the table ({list(data.columns)})")
    rest = [col for col in data.columns if col not in first]
    if not rest:
        return table(data, where, content_key, **kw)
    more = f"adds {', '.join(map(str, rest))}" if len(rest) <= 2 else f"{len(rest)} more"
    every = toggle(f"Show all {len(data.columns)} columns ({more})", key, spec, where=where,
                   help="Adds: " + ", ".join(map(str, rest)))
    if content_key is None or every or not replay.can_replay(where) or len(data) <= HTML_MAX_ROWS:
        return table(data if every else data[first], where,
                     None if content_key is None else (content_key, every, tuple(first)), **kw)
    # the first columns taken from the frame only when they are drawn, not replayed (a copy of
    # ~620 rows of arrow strings, ~2 ms)
    kw.setdefault("placeholder", MISSING)
    replay.drawn("dataframe", (("key", (content_key, every, tuple(first))), kw),
                 lambda: st.dataframe(data[first], **{**kw, "column_config": fit_widths(
                     data[first], kw.get("column_config"))}), where)
    return None

