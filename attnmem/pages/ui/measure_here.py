"""The "Measure on this GPU" section of the Inference and Training step pages (issue 45,
item 4): the view of attnmem.measure.on_this_gpu, which holds the logic (the request from the
page's inputs, the child process, its progress and cancel, the store, the comparison, the
nearest bundled rows).

With a GPU: the command it runs, the time estimate and where it comes from, a button that
measures and a cancel, a progress bar while the child runs, then the measured peak and its
parts beside the prediction with the error, and downloads of this run and of every run the
page kept. Without one: why not, and the bundled H200 rows nearest to the inputs with their
predictions and errors.

The measurement runs inside the script run that the button started: a click anywhere (Cancel,
another input, another page) interrupts that run, and the ``finally`` here cancels the child
(its process group and worker killed, the GPU lock released); the next run says so.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import streamlit as st

from attnmem.measure import on_this_gpu as gpu_run
from attnmem.pages.ui import replay, tables
from attnmem.pages.ui.units import fmt
from attnmem.pages.ui.url_state import md_escape

TITLE = "Measure on this GPU"
#: Shorter headers of the nearest rows (the table sits in an expander: 784 px at 1280 px).
SHORT = {"measured peak": "measured", "predicted peak": "predicted", "peak error": "error",
         "new tokens": "new", "prefill chunk": "chunk", "seq_len": "s", "checkpointing": "ckpt"}
#: The harnesses' commands as the section names them.
COMMANDS = {"infer": "python -m attnmem.measure --infer", "train": "python -m attnmem.measure --train"}


def _blocked() -> str | None:
    """The exposure setting's reason not to measure on this server (attnmem.measure.exposure)."""
    from attnmem.measure.exposure import measurement_block_reason

    return measurement_block_reason()


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _shown(df: pd.DataFrame, unit: str) -> pd.DataFrame:
    """Bytes in the unit, errors as signed percentages, empty cells as a dash."""
    out = df.copy()
    for col in out.columns:
        if "error" in col:
            out[col] = out[col].map(lambda e: "—" if _missing(e) else f"{e:+.2%}")
        elif "peak" in col or "before" in col:
            out[col] = out[col].map(lambda b: "—" if _missing(b) else fmt(b, unit))
    return out


def nearest_rows(df: pd.DataFrame, *, names: list[str], length_col: str, length: int,
                 batch: int, attention: str | None = None, also: dict[str, Any] | None = None,
                 n: int = 8) -> pd.DataFrame:
    """attnmem.measure.on_this_gpu.nearest_rows, the same rows in the same order, with its sort
    keys read from the columns as Python lists instead of one DataFrame.iloc lookup per row
    and key (~3,000 of them for the ~620 training rows: 16 ms of CPU for each new length or
    batch, issue 45 item 5). Each key is computed as there (math.log of the same float ratio,
    the same comparisons), and Python's sort is stable, so ties keep the frame's order;
    tests/app/test_nearest_rows.py checks both against each other."""
    if df is None or len(df) == 0:
        return df
    wanted = set(names)
    same = [m not in wanted for m in df["model"].tolist()]
    other_attn = ([a != attention for a in df["attention"].tolist()] if attention is not None
                  else [False] * len(df))
    others = [0] * len(df)
    for c, v in (also or {}).items():
        if c in df:
            others = [o + int(x != v) for o, x in zip(others, df[c].tolist(), strict=True)]
    lo_len, lo_b = max(1, length), max(1, batch)
    far_len = [abs(math.log(max(float(x), 1.0) / lo_len)) for x in df[length_col].tolist()]
    far_b = [abs(math.log(max(float(x), 1.0) / lo_b)) for x in df["batch"].tolist()]
    order = sorted(range(len(df)), key=lambda i: (same[i], far_len[i], far_b[i], other_attn[i],
                                                  others[i]))
    return df.iloc[order[:n]]


@st.cache_resource(max_entries=256, show_spinner=False)
def _nearest_table(compared_key: Any, _compared: pd.DataFrame, names: tuple[str, ...],
                   length_col: str, length: int, batch: int, attention: str | None,
                   also: tuple[tuple[str, Any], ...], columns: tuple[str, ...] | None,
                   unit: str) -> tuple[bool, pd.DataFrame]:
    """gpu_run.nearest_rows as the section shows them (whether the page's model is among them;
    the columns shown, in the unit, short headers), kept across runs and sessions (shared
    read-only). Keyed by ``compared_key``, which names the rows' contents (the bundled files'
    stamp and the unit they were predicted for), and the inputs: it sorts every bundled row by
    a Python key (~0.1-0.2 s of CPU for the ~620 training rows), and hashing the rows to key
    them cost ~20 ms a run (issue 45 item 5)."""
    rows = nearest_rows(_compared, names=list(names), length_col=length_col, length=length,
                        batch=batch, attention=attention, also=dict(also))
    same = bool(names) and bool(rows["model"].isin(names).any())
    keep = [c for c in (columns or rows.columns) if c in rows.columns]
    return same, _shown(rows[keep], unit).rename(columns=SHORT)


def nearest(kind: str, compared: pd.DataFrame, names: list[str], length_col: str, length: int,
            batch: int, attention: str | None, unit: str, also: dict[str, Any] | None = None,
            columns: tuple[str, ...] | None = None, compared_key: Any = None) -> None:
    """The bundled rows nearest to the inputs (attnmem.measure.on_this_gpu.nearest_rows), with
    their predictions and errors (``columns``: those shown, so that the table fits the page's
    width; all when None). ``compared_key``: a value that changes whenever ``compared`` does
    (the bundled files' stamp); None keys the cache by the rows' contents."""
    if compared is None or compared.empty:
        st.caption("No bundled measurements to show (data/"
                   f"{gpu_run.DATA[kind].name} is not in this checkout).")
        return
    if compared_key is None:  # keyed by the rows' contents (their pickle's digest)
        compared_key = ("rows", replay.digest(compared))
    key = (compared_key, tuple(names), length_col, length, batch, attention,
           tuple((also or {}).items()), tuple(columns) if columns else None, unit)
    same, shown = _nearest_table(*key[:1], compared, *key[1:])
    st.markdown(md_escape(
        "The bundled H200 rows nearest to these inputs"
        + (f" (this model: {', '.join(names)}; then the nearest length and batch)" if same else
           " (this model was not measured: the nearest length and batch of any model)")
        + ", each with its prediction now and the error:"))
    tables.table(shown, hide_index=True, content_key=("nearest", key))


def section(kind: str, requests: dict[str, Any], *, key: str, unit: str,
            compared: pd.DataFrame, names: list[str], length_col: str, length: int, batch: int,
            label: Any = str, predicted: dict[str, dict[str, int]] | None = None,
            also: dict[str, Any] | None = None, columns: tuple[str, ...] | None = None,
            compared_key: Any = None) -> None:
    """Draw the section (in an expander) for one page's inputs. ``requests``: per attention
    the page computed, the runner's request or why the harness cannot measure it, or a
    function of no arguments that returns one (called only where a GPU can measure: building
    a request runs the harness's argument parser, ~2 ms an attention every run otherwise);
    several: a choice of which to measure, labelled by ``label``. ``compared``: the page's
    bundled rows beside their predictions, for the no-GPU view (``compared_key``: what
    changes with them, see `nearest`); ``predicted``: per attention, parts of the page's own
    prediction to lay beside the row's (the weights); ``also``: the other inputs the nearest
    rows should share (column: value); ``columns``: the nearest rows' columns shown."""
    with st.expander(TITLE, icon=":material/memory:"):
        attention = next(iter(requests))
        if len(requests) > 1:
            attention = st.selectbox("Attention to measure", list(requests), key=f"{key}_attn",
                                     format_func=label)
        predicted = (predicted or {}).get(attention)
        reason = gpu_run.gpu_reason()
        if reason:
            st.info(md_escape(f"No GPU here: {reason}. Measuring these inputs needs a CUDA GPU "
                              f"in the machine that serves this app ({COMMANDS[kind]} runs "
                              "the same measurement from a shell)."), icon=":material/info:")
            nearest(kind, compared, names, length_col, length, batch, attention, unit, also,
                    columns, compared_key)
            return
        blocked = _blocked()
        if blocked:
            st.info(blocked, icon=":material/lock:")
            nearest(kind, compared, names, length_col, length, batch, attention, unit, also,
                    columns, compared_key)
            return
        request = requests[attention]
        if callable(request):
            request = request()
        if isinstance(request, str):
            st.warning(md_escape(f"These inputs cannot be measured here: {request}."),
                       icon=":material/block:")
            nearest(kind, compared, names, length_col, length, batch, attention, unit, also,
                    columns, compared_key)
            return
        est = gpu_run.estimate(request)
        st.markdown(md_escape(f"Runs `{COMMANDS[kind]} {' '.join(request.args)}` in a child "
                              f"process: about {est.seconds:,.0f} s ({est.source})."))
        cols = st.columns([1.2, 1, 3])
        go = cols[0].button(TITLE, key=f"{key}_go", type="primary")
        cols[1].button("Cancel", key=f"{key}_cancel",
                       help="Stops the measurement: the child process and its worker are "
                            "killed and the GPU lock released.",
                       on_click=lambda: st.session_state.update({f"_{key}_cancelled": True}))
        if st.session_state.pop(f"_{key}_cancelled", False):
            st.warning("Cancelled: the child process and its worker were stopped; the GPU is "
                       "free.", icon=":material/cancel:")
        if go:
            _run(kind, request, key, est)
        last = st.session_state.get(f"_{key}_last")
        if last is not None and last[0] == request:
            _outcome(kind, last[1], unit, predicted)
        _kept_runs(kind, key)


def _run(kind: str, request: gpu_run.Request, key: str, est: gpu_run.Estimate) -> None:
    """Start the child, draw its progress until it ends; cancel it if this script run is
    interrupted (Cancel or any other click reruns the page)."""
    bar = st.progress(0.0, text="starting")
    job = gpu_run.start(request)
    try:
        out = job.wait(on_progress=lambda p: bar.progress(
            p.fraction, text=f"{p.phase} · {p.elapsed_s:,.0f} s of about {est.seconds:,.0f} s"))
    finally:
        if not job.done():
            job.cancel()
    bar.progress(1.0, text=f"{out.status} in {out.wall_s:,.0f} s")
    st.session_state[f"_{key}_last"] = (request, out)


def _outcome(kind: str, out: gpu_run.Outcome, unit: str, predicted: dict[str, int] | None) -> None:
    """The measured peak and its parts beside the prediction, with the error."""
    if out.row is None:
        (st.warning if out.status in ("cancelled", "busy") else st.error)(md_escape(out.message))
        return
    row = out.row
    parts = gpu_run.comparison(kind, row, predicted) if predicted else out.parts
    peak = parts[0]
    m = st.columns(3)
    m[0].metric("measured peak", "—" if _missing(peak["measured"]) else fmt(peak["measured"], unit),
                help="max_memory_allocated() over the run, as the harness measures it.")
    m[1].metric("predicted peak", "—" if _missing(peak["predicted"]) else fmt(peak["predicted"], unit))
    m[2].metric("error", "—" if _missing(peak["error"]) else f"{peak['error']:+.2%}",
                help="(predicted − measured) / measured")
    if out.status != "ok":
        st.warning(md_escape(f"Status {out.status}: {out.message}"), icon=":material/warning:")
    elif out.message:
        st.caption(md_escape(out.message))
    tables.table(_shown(pd.DataFrame(parts), unit).rename(columns={
        "measured": "measured (this GPU)", "predicted": "predicted (computed)"}), hide_index=True)
    timing = (f"prefill {row.get('prefill_ms')} ms, decode {row.get('decode_ms_per_token')} ms/token"
              if kind == "infer" else f"step {row.get('step_ms')} ms (median)")
    st.caption(md_escape(f"{row.get('gpu')}, driver {row.get('driver')}, torch {row.get('torch')}, "
                         f"transformers {row.get('transformers')}; {timing}; the run took "
                         f"{out.wall_s:,.0f} s. The prediction is the harness's for exactly this "
                         "configuration (attnmem.calc, or the meta-device trace where calc has "
                         "no rules)."))
    if out.store_error:
        st.error(md_escape(f"The results store did not keep this run ({out.store_error}); "
                           "the row is in the file below."))
        data = gpu_run.rows_csv(kind, [row])
    else:
        data = gpu_run.run_csv(kind, [out.run_id])
    st.download_button("⬇ This run (CSV)", data=data.encode(), file_name=f"{kind}-run.csv",
                       mime="text/csv", key=f"{kind}_run_csv")


def _kept_runs(kind: str, key: str) -> None:
    """How many runs this page kept, and all of them as one CSV."""
    try:
        runs = gpu_run.page_runs(kind)
    except Exception as exc:  # noqa: BLE001 - a page without history still measures
        st.caption(md_escape(f"The results store could not be read ({exc})."))
        return
    if not runs:
        return
    st.caption(md_escape(f"{len(runs)} run(s) measured from this page are kept in the results "
                         f"store (latest: {runs[0]['label']}, {runs[0]['started']})."))
    st.download_button("⬇ Every run kept from this page (CSV)",
                       data=lambda: gpu_run.run_csv(kind, [r["id"] for r in runs]).encode(),
                       file_name=f"{kind}-runs.csv", mime="text/csv", on_click="ignore",
                       key=f"{key}_all_csv")
