"""What every page shares: URL-bound widgets, the GB/GiB switch, colours and labels (the one table
in attnmem.pages.ui.labels, re-exported here), chart and download helpers.

URL binding: each input has a key, which is
also its query-parameter name, and a spec from attnmem.pages.ui.url_state that says its type, default and
bounds. Before a widget is drawn, `init` puts its value into st.session_state: the value this
page's widget already has, else the URL's (parsed; a bad value gives the default and a
st.warning naming the key, the value and what is accepted), else the last value this session
gave an input of the same name and spec on any page, else the default. After the page has drawn
everything, `sync_url` writes the page's inputs back into the URL, so the address bar is always
a link to the current view. Every page calls `page_setup(name)` first and `sync_url(specs)` last.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import streamlit as st

from attnmem.calc.units import format_bytes, short_len, to_unit
from attnmem.pages.ui.export import safe_csv_bytes, safe_frame
from attnmem.pages.ui.labels import (  # noqa: F401
    FALLBACK_COLOR,
    IMPL_COLORS,
    IMPL_LABELS,
    MEMORY_PART_COLORS,
    impl_color,
    impl_label,
)  # pages use them as c.*
from attnmem.pages.ui.url_state import (
    BoolParam,
    ChoiceParam,
    FloatParam,
    IntParam,
    MultiChoiceParam,
    md_escape,
    nearest_power_of_two,
)

#: Colours of the memory parts on the model page (not implementations).
PART_COLORS = MEMORY_PART_COLORS

UNIT_KEY = "unit"
UNIT_SPEC = ChoiceParam("GB", ("GB", "GiB"))
UNIT_HELP = "GB = 10⁹ bytes (what vendors print on the box); GiB = 2³⁰ bytes (what nvidia-smi and PyTorch report)."
_KEEP = "_url_keep"  # session_state: (URL name, spec) -> last value used on any page
_OWNER = "_url_owner"  # session_state: key -> page whose widget holds it now
_PAGE = "_url_page"  # session_state: the page being drawn

COMPUTED = "Computed (analytic model, not measured)"

Spec = IntParam | FloatParam | ChoiceParam | BoolParam | MultiChoiceParam


# --- URL-bound state ---------------------------------------------------------------------------


def _query_raw(key: str) -> str | list[str] | None:
    """The raw URL value(s) of a key: None if absent, a string, or a list if repeated."""
    values = st.query_params.get_all(key)
    if not values:
        return None
    return values[0] if len(values) == 1 else list(values)


def _valid(spec: Spec, value: Any) -> bool:
    if isinstance(spec, MultiChoiceParam):
        return isinstance(value, (list, tuple)) and spec.is_valid(tuple(value))
    return spec.is_valid(value)


def _widget_value(spec: Spec, value: Any) -> Any:
    return list(value) if isinstance(spec, MultiChoiceParam) else value


def warn(message: str) -> None:
    """Show a warning whose text may contain user-controlled parts, escaped (no markdown)."""
    st.warning(md_escape(message), icon=":material/warning:")


def page_setup(name: str) -> None:
    """Call first on every page: names the page whose widgets the following calls draw."""
    st.session_state[_PAGE] = name


def _claim(key: str, page: str | None = None) -> bool:
    """Record that `key` now belongs to this page's widget; True if it already did.

    Widget state survives one run after a page switch, so a key that another page's widget
    used (same URL name, different widget) must be set again explicitly, or the new widget
    would start from its own default instead of the shared value.
    """
    owners: dict[str, str] = st.session_state.setdefault(_OWNER, {})
    page = page if page is not None else st.session_state.get(_PAGE, "")
    mine = owners.get(key) == page
    owners[key] = page
    return mine


def _keep_key(key: str, spec: Spec) -> str:
    """Values are shared across pages by URL name AND spec: the same name with the same type,
    default and bounds means the same input (H on Score matrix, Scaling and the explainer);
    the same name with another spec (the score page's dtype, which has 'custom') is its own."""
    return f"{key}\x1f{spec!r}"


def init(key: str, spec: Spec, page: str | None = None) -> None:
    """Put the value of widget `key` into session_state before the widget is drawn.

    The value is written on every run, even when it is this page's widget's own value: a
    value written through session_state is sent to the browser with the widget, so the box
    on screen always shows the value this run computes with. Left unwritten, the browser
    draws the widget from what it remembers for that widget, which after a page switch in
    the middle of a run can be another visit's value (issue 32: the widgets showed a T4 and
    s = 1 while the numbers were the H100's and 8,192's).
    """
    keep: dict[str, Any] = st.session_state.setdefault(_KEEP, {})
    if _claim(key, page) and key in st.session_state and _valid(spec, st.session_state[key]):
        st.session_state[key] = st.session_state[key]
        return
    kept = keep.get(_keep_key(key, spec))
    raw = _query_raw(key)
    parsed = spec.parse(key, raw) if raw is not None else None
    if parsed is not None and parsed.warning:
        warn(parsed.warning)
        value = spec.default
    elif parsed is not None:
        value = parsed.value
    elif kept is not None and _valid(spec, kept):
        value = kept
    else:
        value = spec.default
    st.session_state[key] = _widget_value(spec, value)


def sync_url(specs: Mapping[str, Spec]) -> None:
    """Write the page's inputs (and the unit) into the URL; remember them for other pages."""
    keep: dict[str, Any] = st.session_state.setdefault(_KEEP, {})
    wanted: dict[str, str] = {UNIT_KEY: get_unit()}
    keep[_keep_key(UNIT_KEY, UNIT_SPEC)] = wanted[UNIT_KEY]
    for key, spec in specs.items():
        if key in st.session_state:
            value = st.session_state[key]
            value = tuple(value) if isinstance(spec, MultiChoiceParam) else value
            keep[_keep_key(key, spec)] = value
            wanted[key] = spec.to_url(value)
    if st.query_params.to_dict() != wanted:
        st.query_params.from_dict(wanted)


def get_unit() -> str:
    """'GB' or 'GiB': the sidebar switch's value, else the URL's, else GB."""
    value = st.session_state.get(UNIT_KEY)
    if value in UNIT_SPEC.choices:
        return value
    parsed = UNIT_SPEC.parse(UNIT_KEY, _query_raw(UNIT_KEY))
    if parsed.warning is None and _query_raw(UNIT_KEY) is not None:
        return parsed.value
    kept = st.session_state.get(_KEEP, {}).get(_keep_key(UNIT_KEY, UNIT_SPEC))
    return kept if kept in UNIT_SPEC.choices else UNIT_SPEC.default


def unit_switch() -> str:
    """The GB/GiB switch (drawn once per run, by app.py in the sidebar)."""
    init(UNIT_KEY, UNIT_SPEC, page="app")
    unit = st.radio("Memory unit", UNIT_SPEC.choices, key=UNIT_KEY, horizontal=True, help=UNIT_HELP)
    if st.query_params.get(UNIT_KEY) != unit:
        st.query_params[UNIT_KEY] = unit
    return unit


# --- widgets -----------------------------------------------------------------------------------


def int_input(label: str, key: str, spec: IntParam, where: Any = st, **kw: Any) -> int:
    init(key, spec)
    return int(where.number_input(label, min_value=spec.lo, max_value=spec.hi, step=1, key=key, **kw))


def float_input(label: str, key: str, spec: FloatParam, where: Any = st, **kw: Any) -> float:
    init(key, spec)
    return float(where.number_input(label, min_value=spec.lo, max_value=spec.hi, key=key, **kw))


def select(label: str, key: str, spec: ChoiceParam, where: Any = st, **kw: Any) -> str:
    init(key, spec)
    return where.selectbox(label, spec.choices, key=key, **kw)


def radio(label: str, key: str, spec: ChoiceParam, where: Any = st, **kw: Any) -> str:
    init(key, spec)
    return where.radio(label, spec.choices, key=key, horizontal=True, **kw)


def multiselect(label: str, key: str, spec: MultiChoiceParam, where: Any = st, **kw: Any) -> list[str]:
    init(key, spec)
    kw.setdefault("wrap", True)  # chips on more rows, not scrolled out of a narrow column's view
    return list(where.multiselect(label, spec.choices, key=key, **kw))


def toggle(label: str, key: str, spec: BoolParam, where: Any = st, **kw: Any) -> bool:
    init(key, spec)
    kw.setdefault("wrap", True)  # a long label wraps; in a column Streamlit would cut it off with …
    return bool(where.checkbox(label, key=key, **kw))


def seq_len_input(
    label: str,
    key: str,
    spec: IntParam,
    lo_pow2: int = 128,
    hi_pow2: int = 1 << 24,
    where: Any = st,
    help: str | None = None,
) -> int:
    """Sequence length: a log-scaled slider over powers of two plus an exact number box.

    The number box (key `key`, in the URL) is the value; the slider (key `key`+'_pow2', not in
    the URL) moves it in powers of two and follows it to the nearest power of two.
    """
    skey = f"_{key}_pow2"
    options = [1 << p for p in range(lo_pow2.bit_length() - 1, hi_pow2.bit_length())]
    init(key, spec)

    def from_slider() -> None:
        st.session_state[key] = int(st.session_state[skey])

    def from_number() -> None:
        st.session_state[skey] = nearest_power_of_two(int(st.session_state[key]), lo_pow2, hi_pow2)

    near = nearest_power_of_two(int(st.session_state[key]), lo_pow2, hi_pow2)
    _claim(skey)
    st.session_state[skey] = near  # written every run, as init does: the slider shows the box
    left, right = where.columns([3, 1])
    left.select_slider(
        f"{label} (log scale: powers of two)", options, key=skey, format_func=short_len,
        on_change=from_slider, help=help,
    )
    value = right.number_input(
        "exact", min_value=spec.lo, max_value=spec.hi, step=1, key=key, on_change=from_number,
        help=f"Any whole number from {spec.lo:,} to {spec.hi:,}.",
    )
    return int(value)


# --- numbers, tables, charts, downloads --------------------------------------------------------


def trained_context_note(model: Any, seq_len: int, where: Any = st) -> None:
    """A note where s is longer than the context the model was trained for (its config's
    max_position_embeddings): the memory still follows, but the model may not work there."""
    if model.max_position_embeddings and seq_len > model.max_position_embeddings:
        where.info(f"s = {seq_len:,} is longer than the {model.max_position_embeddings:,} "
                   "tokens this model was trained for.")


def longest_past_trained_note(model: Any, longest: int, where: Any = st) -> None:
    """A note where a longest context that fits passes the context the model was trained for:
    the memory fits that far, the model may not work there."""
    trained = model.max_position_embeddings
    if trained and longest > trained:
        where.caption(f"A longest context above passes the {trained:,} tokens this model was "
                      "trained for: the memory fits that far, the model may not work there.")


def fmt(n_bytes: int | float, unit: str | None = None) -> str:
    """Bytes in the user's unit (GB or GiB; MB/KB below one)."""
    return format_bytes(n_bytes, unit or get_unit())


def in_unit(n_bytes: int | float, unit: str | None = None) -> float:
    return to_unit(n_bytes, unit or get_unit())


def csv_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Text cells starting with = + - @ (or tab/CR) get a leading apostrophe, whatever the
    column dtype, so a spreadsheet never runs them (attnmem.pages.ui.export, OWASP "CSV injection")."""
    return safe_frame(df)


def csv_bytes(df: pd.DataFrame) -> bytes:
    """The CSV a download button serves: formula-safe, every text cell quoted."""
    return safe_csv_bytes(df)


def download_csv(df: pd.DataFrame, file_name: str, key: str, where: Any = st) -> None:
    """A 'numbers as CSV' button; the file is built only when clicked."""
    where.download_button(
        "⬇ Numbers (CSV)", data=lambda: csv_bytes(df), file_name=file_name, mime="text/csv",
        key=key, on_click="ignore",
    )


def download_html(fig: go.Figure | dict[str, Any], file_name: str, key: str, where: Any = st) -> None:
    """A 'chart as HTML' button (interactive, works offline); built only when clicked."""
    where.download_button(
        "⬇ Chart (HTML)", data=lambda: pio.to_html(fig, include_plotlyjs=True, full_html=True),
        file_name=file_name, mime="text/html", key=key, on_click="ignore",
        help="An interactive copy of the chart. For a PNG, use the camera icon in the chart's toolbar.",
    )


def style(fig: go.Figure, x_title: str, y_title: str, height: int = 430) -> go.Figure:
    """Common layout. No template and no background colours: st.plotly_chart's Streamlit
    theme follows the app's light or dark theme."""
    fig.update_layout(
        height=height,
        margin=dict(l=10, r=10, t=40, b=10),
        xaxis_title=x_title,
        yaxis_title=y_title,
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0),
        hoverlabel=dict(namelength=-1),
    )
    return fig


def figure(
    traces: list[dict[str, Any]],
    x_title: str,
    y_title: str,
    height: int = 430,
    xaxis: dict[str, Any] | None = None,
    yaxis: dict[str, Any] | None = None,
    **layout: Any,
) -> dict[str, Any]:
    """A plotly figure as a plain dict (same layout as `style`).

    Building go.Figure objects validates every property in Python (~40 ms for a dozen traces);
    st.plotly_chart validates a dict once anyway, so dicts keep slider re-runs fast.
    """
    lay: dict[str, Any] = dict(
        height=height,
        margin=dict(l=10, r=10, t=40, b=10),
        xaxis=dict(title=dict(text=x_title), **(xaxis or {})),
        yaxis=dict(title=dict(text=y_title), **(yaxis or {})),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0),
        hoverlabel=dict(namelength=-1),
    )
    lay.update(layout)
    return {"data": traces, "layout": lay}


def log_len_xaxis(lo: int, hi: int) -> dict[str, Any]:
    """Log x axis of sequence lengths, ticks at powers of four labelled 128, 512, 2K, 8K, ..."""
    ticks = [1 << p for p in range(max(lo, 1).bit_length() - 1, hi.bit_length(), 2)]
    return dict(type="log", tickvals=ticks, ticktext=[short_len(t) for t in ticks])


def capacity_dict(name: str, n_bytes: int, x0: float, x1: float, unit: str) -> dict[str, Any]:
    """capacity_trace as a plain dict (see `figure`)."""
    y = in_unit(n_bytes, unit)
    return dict(
        type="scatter", x=[x0, x1], y=[y, y], mode="lines", name=f"{name} ({fmt(n_bytes, unit)})",
        line=dict(color="rgba(128,128,128,0.9)", dash="dash", width=1.5),
        hovertemplate=f"{name}: {fmt(n_bytes, unit)} ({n_bytes:,} bytes)<extra></extra>",
    )


def chart(fig: go.Figure | dict[str, Any], key: str, file_stem: str, df: pd.DataFrame | None = None) -> None:
    """Draw a figure (theme follows the app) with its download buttons underneath."""
    st.plotly_chart(
        fig, key=key, theme="streamlit",
        config={"displaylogo": False, "toImageButtonOptions": {"filename": file_stem, "scale": 2}},
    )
    row = st.container(horizontal=True, horizontal_alignment="left")
    download_html(fig, f"{file_stem}.html", key=f"{key}_html", where=row)
    if df is not None:
        download_csv(df, f"{file_stem}.csv", key=f"{key}_csv", where=row)


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
        widest = float(cells.map(lambda v: text_px(MISSING if v is None or v != v else
                                                   f"{v:,}" if isinstance(v, int) else str(v))).max()
                       if len(cells) else 0)
        px = max(widest, text_px(col))
        cfg[col] = st.column_config.Column(width=min(MAX_COL_PX, math.ceil(CELL_PAD_PX + px)))
    return cfg


def table(data: Any, where: Any = st, **kw: Any) -> Any:
    """st.dataframe with missing cells shown as a dash instead of "None" (measured tables
    have columns a row does not fill: a failed run has no time, an old row no version), and
    every column as wide as its content (fit_widths)."""
    kw.setdefault("placeholder", MISSING)
    if isinstance(data, pd.DataFrame):
        kw["column_config"] = fit_widths(data, kw.get("column_config"))
    return where.dataframe(data, **kw)


def text_table(data: pd.DataFrame, where: Any = st) -> Any:
    """A table whose cells are sentences (what each tensor is, why it is kept) as st.table:
    HTML, whose cells wrap at the container's width, where st.dataframe's grid draws each cell
    on one line and scrolls sideways once the longest does not fit. No index; missing cells
    a dash, as in `table`."""
    return where.table(data.astype(object).where(data.notna(), MISSING), hide_index=True)


def code_table(data: pd.DataFrame, long: Iterable[str], where: Any = st,
               formats: Mapping[str, str] | None = None) -> Any:
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
    unknown = [col for col in [*long, *(formats or {})] if col not in cols]
    if unknown:
        raise ValueError(f"code_table: columns {unknown} are not in the table ({cols})")
    styled = data.style.set_table_styles(
        [{"selector": f"td.col{cols.index(col)} {tag}", "props": [("overflow-wrap", "anywhere")]}
         for col in long for tag in ("div", "p")])
    styled = styled.format(na_rep=MISSING)
    for col, spec in (formats or {}).items():
        styled = styled.format(spec, subset=[col], na_rep=MISSING)
    return where.table(styled, hide_index=True)


#: The URL value of a "show all columns" checkbox (wide_table): off unless the link says so.
ALL_COLUMNS = BoolParam(False)


def wide_table(data: pd.DataFrame, first: Iterable[str], key: str, where: Any = st,
               spec: BoolParam = ALL_COLUMNS, **kw: Any) -> Any:
    """A table of more columns than a 1280 px window shows beside the sidebar: the columns
    `first` (in that order) by default, every column once the checkbox above it is ticked.
    The checkbox is an input like the others (URL key `key`: put `key: spec` in the page's
    specs for sync_url), so a link keeps the choice; its help names the columns it adds."""
    kw.setdefault("hide_index", True)
    first = list(first)
    missing = [col for col in first if col not in data.columns]
    if missing:
        raise ValueError(f"wide_table: columns {missing} are not in the table ({list(data.columns)})")
    rest = [col for col in data.columns if col not in first]
    if not rest:
        return table(data, where, **kw)
    more = f"adds {', '.join(map(str, rest))}" if len(rest) <= 2 else f"{len(rest)} more"
    every = toggle(f"Show all {len(data.columns)} columns ({more})", key, spec, where=where,
                   help="Adds: " + ", ".join(map(str, rest)))
    return table(data if every else data[first], where, **kw)


def log_len_axis(fig: go.Figure, lo: int, hi: int) -> None:
    """Log x axis of sequence lengths, ticks at powers of four labelled 128, 512, 2K, 8K, ..."""
    ticks = [1 << p for p in range(max(lo, 1).bit_length() - 1, hi.bit_length(), 2)]
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[short_len(t) for t in ticks])


def capacity_line(fig: go.Figure, name: str, n_bytes: int, x0: float, x1: float, unit: str) -> None:
    """Add capacity_trace to a figure."""
    fig.add_trace(capacity_trace(name, n_bytes, x0, x1, unit))


def capacity_trace(name: str, n_bytes: int, x0: float, x1: float, unit: str) -> go.Scatter:
    """A GPU's memory as a dashed horizontal line with a legend entry and hover value.

    (A trace, not fig.add_hline: hline annotations land in the wrong place on log axes.)
    """
    y = in_unit(n_bytes, unit)
    return go.Scatter(
        x=[x0, x1], y=[y, y], mode="lines", name=f"{name} ({fmt(n_bytes, unit)})",
        line=dict(color="rgba(128,128,128,0.9)", dash="dash", width=1.5),
        hovertemplate=f"{name}: {fmt(n_bytes, unit)} ({n_bytes:,} bytes)<extra></extra>",
    )


def gpu_options(gpus: Mapping[str, int]) -> tuple[str, ...]:
    """GPU names ordered by memory size."""
    return tuple(sorted(gpus, key=lambda name: (gpus[name], name)))


def cached(max_entries: int = 64) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """st.cache_data for sweeps, bounded so a long session cannot grow memory without limit."""
    return st.cache_data(max_entries=max_entries, show_spinner=False)


def labels(names: Iterable[str], table: Mapping[str, str]) -> dict[str, str]:
    return {n: table.get(n, n) for n in names}

