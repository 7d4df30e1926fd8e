"""The GPU measurement page's view of measured attention calls: the peak chart (measured
points over attnmem.calc's curves, out-of-memory marks), the speed chart, and the table of
every point with the model's error. Plotly figures (plain dicts) and display tables (sizes in the user's
unit, rounded as the grid draws them); no Streamlit call of their own.
"""

from __future__ import annotations

import pandas as pd

from attnmem.pages.ui import charts
from attnmem.pages.ui.labels import impl_color as color
from attnmem.pages.ui.labels import impl_label as label
from attnmem.pages.ui.units import in_unit


def error_first(unit: str) -> tuple[str, ...]:
    """The points' columns shown by default (they fit a 1280 px window beside the sidebar):
    which call, and its measured peak against the model; reserved growth, time and the note
    fall under "show all"."""
    return ("implementation", "mode", "s", "status", f"measured ({unit})", f"model ({unit})",
            "model error %")


def _layout(y_title: str, height: int, title: str, y_log: bool, **y: object) -> dict:
    """charts.figure's layout with a title and the legend under the plot (many implementations:
    it never covers the title), log x; what charts.style plus the updates did on a go.Figure."""
    fig = charts.figure([], "sequence length s (log scale)", y_title, height,
                        xaxis=dict(type="log"), yaxis=dict(type="log", **y) if y_log else None,
                        title=dict(text=title, x=0, xanchor="left"),
                        margin=dict(l=10, r=10, t=50, b=150))
    fig["layout"]["legend"].update(yanchor="top", y=-0.22)
    return fig["layout"]


def memory_figure(rows: pd.DataFrame, curves: pd.DataFrame, impls, unit: str, title: str) -> dict:
    """Measured points over the model's curves, out-of-memory marks: a plotly figure as a plain
    dict (charts.figure: st.plotly_chart validates it once, where building go objects
    validated every property first, ~0.1 s a figure)."""
    traces: list[dict] = []
    drawn: list[list[float]] = []  # model curves already drawn (masked_fill and masked_fill_ coincide)
    # The masks from numpy object arrays: the same rows as `df["impl"] == impl`, without boxing
    # each scalar into pyarrow for pandas' arrow-backed strings (~1 ms a comparison; issue 45).
    curve_impl = curves["impl"].to_numpy(dtype=object)
    row_impl, status = rows["impl"].to_numpy(dtype=object), rows["status"].to_numpy(dtype=object)
    measured = (status == "ok") & rows["peak_extra_bytes"].notna().to_numpy()
    for impl in impls:
        part = curves[curve_impl == impl]
        ys = [float(v) for v in part["peak_bytes"]]
        # Within 3% at every s, a curve drawn later would hide an earlier one on log axes: the
        # later one is dashed and its measured points are open circles, so both show.
        under = any(charts.overlaps(ys, o) for o in drawn)
        drawn.append(ys)
        traces.append(dict(
            type="scatter", x=part["seq_len"].to_numpy(),
            y=[in_unit(v, unit) for v in part["peak_bytes"]], mode="lines",
            name=f"{label(impl)} (model)", legendgroup=impl,
            line=dict(color=color(impl), width=1.5, dash="dash" if under else "dot"),
            hovertemplate=f"<b>{label(impl)}</b> model<br>s = %{{x:,}}<br>%{{y:,.4g}} {unit}<extra></extra>",
        ))
        got = rows[(row_impl == impl) & measured]
        if len(got):
            err = [f"{100 * e:+.2f}%" if e is not None and e == e else "-" for e in got["model_error"]]
            traces.append(dict(
                type="scatter", x=got["seq_len"].to_numpy(),
                y=[in_unit(v, unit) for v in got["peak_extra_bytes"]],
                mode="markers", name=f"{label(impl)} (measured)", legendgroup=impl,
                marker=dict(symbol="circle-open", size=12, color=color(impl), line=dict(width=2))
                if under else dict(color=color(impl), size=9, line=dict(width=1, color="white")),
                customdata=list(zip(err, [f"{int(v):,}" for v in got["peak_extra_bytes"]], strict=True)),
                hovertemplate=(f"<b>{label(impl)}</b> measured<br>s = %{{x:,}}<br>%{{y:,.4g}} {unit}"
                               "<br>%{customdata[1]} bytes<br>model error %{customdata[0]}<extra></extra>"),
            ))
        oom = rows[(row_impl == impl) & (status == "oom")]
        if len(oom):
            traces.append(dict(
                type="scatter", x=oom["seq_len"].to_numpy(),
                y=[in_unit(v, unit) if v == v and v is not None else None for v in oom["model_bytes"]],
                mode="markers", name=f"{label(impl)}: out of memory", legendgroup=impl,
                marker=dict(symbol="x", size=13, color=color(impl), line=dict(width=2)),
                hovertemplate=(f"<b>{label(impl)}</b>: out of memory at s = %{{x:,}}"
                               f"<br>model: %{{y:,.4g}} {unit}<extra></extra>"),
            ))
    return {"data": traces,
            "layout": _layout(f"extra peak memory of one call ({unit}, log)", 480, title, True,
                              exponentformat="power")}


def time_figure(rows: pd.DataFrame, impls, metric: str, title: str) -> dict:
    """Measured speed by s, one line per implementation: a plain dict as memory_figure."""
    traces: list[dict] = []
    col = "tflops" if metric == "TFLOP/s" else "median_ms"
    row_impl = rows["impl"].to_numpy(dtype=object)  # numpy masks, as in memory_figure
    timed = (rows["status"].to_numpy(dtype=object) == "ok") & rows[col].notna().to_numpy()
    for impl in impls:
        got = rows[(row_impl == impl) & timed].sort_values("seq_len")
        if len(got):
            traces.append(dict(
                type="scatter", x=got["seq_len"].to_numpy(), y=got[col].to_numpy(),
                mode="lines+markers", name=label(impl), line=dict(color=color(impl)),
                hovertemplate=f"<b>{label(impl)}</b><br>s = %{{x:,}}<br>%{{y:,.4g}} {metric}<extra></extra>",
            ))
    return {"data": traces,
            "layout": _layout(metric + (" (log)" if col == "median_ms" else ""), 400, title,
                              col == "median_ms")}


def _shown(v: float | None, digits: int) -> float | None:
    """A number rounded as the grid shows it (so its column is sized to what is drawn); a
    missing value stays missing."""
    return None if v is None or v != v else round(float(v), digits)


def error_table(rows: pd.DataFrame, unit: str) -> pd.DataFrame:
    """Every point: sizes in `unit` to 4 decimals (what the grid draws of a float), the model's
    error in % to 2, the median time in ms to 3, TFLOP/s whole (the CSV under the chart has
    the bytes and the raw values)."""
    t = rows.sort_values(["backward", "impl", "seq_len"])
    return pd.DataFrame({
        "implementation": t["impl"].map(label),
        "mode": ["fwd+bwd" if x else "fwd" for x in t["backward"]],
        "s": t["seq_len"],
        "status": t["status"],
        f"measured ({unit})": [_shown(in_unit(v, unit), 4) if v == v and v is not None else None
                               for v in t["peak_extra_bytes"]],
        f"model ({unit})": [_shown(in_unit(v, unit), 4) if v == v and v is not None else None
                            for v in t["model_bytes"]],
        "model error %": [_shown(100 * e, 2) if e is not None else None for e in t["model_error"]],
        f"reserved growth, measured ({unit})": [
            _shown(in_unit(v, unit), 4) if v == v and v is not None else None for v in t["reserved_extra_bytes"]],
        f"reserved growth, model ({unit})": [
            _shown(in_unit(v, unit), 4) if v == v and v is not None else None for v in t["model_reserved_bytes"]],
        "median ms": [_shown(v, 3) for v in t["median_ms"]],
        "TFLOP/s": [_shown(v, 0) for v in t["tflops"]],
        "note": t["message"].fillna("").map(lambda m: str(m)[:200]),
    })
