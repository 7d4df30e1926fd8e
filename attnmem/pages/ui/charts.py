"""Charts and their downloads: the common plotly layout, log axes of sequence lengths, a GPU's
memory as a dashed line, and `chart`, which draws a figure with its "chart as HTML" and
"numbers as CSV" buttons. Streamlit widgets.

The CSV a button serves is formula-safe (attnmem.pages.ui.export): a spreadsheet never runs a
cell of it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import streamlit as st

from attnmem.calc.units import short_len
from attnmem.pages.ui import replay
from attnmem.pages.ui.export import safe_csv_bytes
from attnmem.pages.ui.units import fmt, in_unit


def overlaps(a: list[int] | list[float], b: list[int] | list[float]) -> bool:
    """Within 3% at every point: one curve would hide the other (masked_fill and masked_fill_
    often coincide); the later one is then drawn dashed with open markers, so both show."""
    return len(a) == len(b) and all(abs(x - y) <= 0.03 * max(x, y) for x, y in zip(a, b, strict=True))


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
    """A GPU's memory as a dashed horizontal line with a legend entry and hover value, as a
    plain dict (see `figure`). A trace, not an add_hline shape: hline annotations land in the
    wrong place on log axes."""
    y = in_unit(n_bytes, unit)
    return dict(
        type="scatter", x=[x0, x1], y=[y, y], mode="lines", name=f"{name} ({fmt(n_bytes, unit)})",
        line=dict(color="rgba(128,128,128,0.9)", dash="dash", width=1.5),
        hovertemplate=f"{name}: {fmt(n_bytes, unit)} ({n_bytes:,} bytes)<extra></extra>",
    )


def chart(fig: go.Figure | dict[str, Any], key: str, file_stem: str, df: pd.DataFrame | None = None,
          content_key: Any = None) -> None:
    """Draw a figure (theme follows the app) with its download buttons underneath. A figure
    drawn before with the same content (by any session) is replayed, not validated and
    serialised again (attnmem.pages.ui.replay: 3-10 ms of CPU a chart). ``content_key``,
    where given, stands for the figure in that comparison (a value that changes whenever the
    figure does): a go.Figure is then not turned into a dict to be compared."""
    config = {"displaylogo": False, "toImageButtonOptions": {"filename": file_stem, "scale": 2}}
    replay.drawn("plotly_chart",
                 (("key", content_key) if content_key is not None else fig, key, config),
                 lambda: st.plotly_chart(fig, key=key, theme="streamlit", config=config))
    row = st.container(horizontal=True, horizontal_alignment="left")
    download_html(fig, f"{file_stem}.html", key=f"{key}_html", where=row)
    if df is not None:
        download_csv(df, f"{file_stem}.csv", key=f"{key}_csv", where=row)



def chart_on_open(title: str, fig: go.Figure | dict[str, Any], key: str, file_stem: str,
                  df: pd.DataFrame | None = None, content_key: Any = None) -> bool:
    """`chart` in an expander that draws it only once opened (Streamlit's lazy expander:
    opening it reruns the page; it stays open for the session), for a page's second or later
    chart whose numbers the page shows in a table beside it. Each plotly chart drawn on a
    direct load costs 0.5-0.8 s of the browser's main thread on the 2-core machine, the same
    whether separate or as subplots of one figure (issue 45 item 3; docs/APP.md, "Speed:
    opening a page"); the page's first chart stays drawn. Whether it was drawn."""
    box = st.expander(title, key=f"_open_{key}", on_change="rerun")
    if box.open:
        with box:
            chart(fig, key, file_stem, df, content_key)
    return bool(box.open)


#: Where Streamlit's frontend bundles are served from, in the installed package: each element
#: kind is a module loaded the first time the page draws one (PlotlyChart.<hash>.js: plotly.js,
#: 4.7 MB; DataFrame.<hash>.js: the data grid).
_BUNDLES = Path(st.__file__).parent / "static" / "static" / "js"

#: Imports the named modules from the folder Streamlit's own index module was loaded from.
_PRELOAD_JS = """<script>(() => {
  const index = document.querySelector('script[type="module"][src*="/static/js/index"]');
  const base = index ? index.src.replace(/[^/]*$/, '') : new URL('static/js/', document.baseURI).href;
  for (const name of NAMES) import(base + name).catch(() => {});
})();</script>"""


@functools.cache
def _preload_html(kinds: tuple[str, ...]) -> str:
    """The script that starts `kinds`' bundles, or "" where the installed Streamlit has none of
    that name."""
    names = [found[0].name for kind in kinds if (found := sorted(_BUNDLES.glob(f"{kind}.*.js")))]
    return _PRELOAD_JS.replace("NAMES", json.dumps(names)) if names else ""


def preload(*kinds: str) -> None:
    """Start loading and evaluating the frontend bundles of the element kinds this page draws
    (default: plotly's), from the sidebar, before the page's script has computed anything.
    Streamlit loads a kind's bundle only once React mounts the first element of it, after
    every element above; plotly.js then takes ~0.9 s of the main thread on the 2-core
    machine, and on a direct load it began 1-1.5 s after the page's first number, while the
    browser sat waiting for the script (issue 45 item 3). Imported early, that evaluation
    overlaps the wait; the module is the one Streamlit imports later (same URL: evaluated
    once per document), so a page switch inside the app, where it is loaded already, costs
    nothing."""
    html = _preload_html(kinds or ("PlotlyChart",))
    if html:
        with st.sidebar:
            st.html(html, unsafe_allow_javascript=True)
