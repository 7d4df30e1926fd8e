"""GPU measurement: run real attention implementations, lay measured peaks and times over the
analytic model, keep every run.

Thin page: widgets -> attnmem.measure.child.run_points (a child process, one measurement per GPU at a
time) -> attnmem.measure.store (SQLite) -> plotly figures (attnmem.pages.ui.measured_calls) over attnmem.calc.sweep.predicted_curves. Without a GPU it
says so and shows the bundled H200 reference (data/attention_calls_h200.csv) or an uploaded results
CSV (validated by attnmem.measure.store.validate_csv; a bad file changes nothing).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from attnmem.calc import PEAK_MODEL_NOTES, sweep  # noqa: E402
from attnmem.calc.units import short_len  # noqa: E402
from attnmem.measure import reference  # noqa: E402
from attnmem.measure.registry import NAMES, fa4_installed_reason  # noqa: E402
from attnmem.measure.store import (  # noqa: E402
    COLUMNS,
    MAX_UPLOAD_BYTES,
    ResultStore,
    attach_predictions,
    csv_text,
    validate_csv,
)
from attnmem.pages.ui import charts, tables, widgets  # noqa: E402
from attnmem.pages.ui.labels import impl_label  # noqa: E402
from attnmem.pages.ui.measured_calls import error_first, error_table, memory_figure, time_figure  # noqa: E402
from attnmem.pages.ui.messages import warn  # noqa: E402
from attnmem.pages.ui.state import cached, get_unit, kept, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.url_state import BoolParam, ChoiceParam, IntParam, MultiChoiceParam, md_escape  # noqa: E402

REF = "ref"
SEQ_CHOICES = tuple(str(1 << p) for p in range(7, 17))  # 128 .. 65,536
MODES = {"fwd": (False,), "fwd+bwd": (True,), "both": (False, True)}

SPECS = {
    # every implementation the registry can measure (fa4 where FlashAttention-4 is installed)
    "impls": MultiChoiceParam(NAMES, NAMES),
    "lens": MultiChoiceParam(("512", "1024", "2048", "4096", "8192", "16384"), SEQ_CHOICES),
    "b": IntParam(1, 1, 64),
    "h": IntParam(32, 1, 256),
    "hkv": IntParam(0, 0, 256),
    "d": IntParam(128, 8, 256),
    "dtype": ChoiceParam("fp16", ("fp16", "bf16", "fp32")),
    "causal": BoolParam(False),
    "mode": ChoiceParam("both", tuple(MODES)),
    "tmetric": ChoiceParam("TFLOP/s", ("TFLOP/s", "ms")),
    # "Show all columns" of the wide tables (tables.wide_table): the forward and the forward +
    # backward points, past runs, and the comparison of two runs
    "fcols": tables.ALL_COLUMNS,
    "bcols": tables.ALL_COLUMNS,
    "rcols": tables.ALL_COLUMNS,
    "ccols": tables.ALL_COLUMNS,
}


#: Past runs: which run, on what, and how many rows (versions and source under "show all").
RUNS_FIRST = ("run", "started (UTC)", "GPU", "label", "rows")
#: Two runs compared: the point, each run's status, and B over A (the raw columns under "show all").
COMPARE_FIRST = ("impl", "seq_len", "backward", "status_a", "status_b", "peak_ratio_b_over_a",
                 "time_ratio_b_over_a")


label = impl_label


# --- data ----------------------------------------------------------------------------------


@kept(None)
def gpu_reason() -> str | None:
    """None when a CUDA GPU is usable here, else why not: torch's answer where a GPU device
    node exists, without importing torch where none does (attnmem.measure.on_this_gpu, as the
    "Measure on this GPU" sections ask). The import cost the first visit ~2 s and left ~160,000
    objects that every full garbage collection of the server walks again (issue 45 item 5)."""
    from attnmem.measure.on_this_gpu import gpu_reason as reason

    return reason()


def with_predictions(data: pd.DataFrame) -> pd.DataFrame:
    """Results with the current model's prediction and error beside each row (attach_predictions)."""
    return attach_predictions(data) if not data.empty else data.assign(
        model_bytes=[], model_error=[], model_reserved_bytes=[])


@kept(None)
def reference_rows() -> pd.DataFrame:
    """The bundled reference with its predictions: ~1,000 rows, the same on every run (kept
    once per process, shared read-only: a copy per run cost ~5 ms)."""
    return with_predictions(reference.reference_rows())


@kept(None)
def reference_trace() -> pd.DataFrame:
    """The bundled trace fingerprint, kept as reference_rows is."""
    return reference.reference_trace()


@kept(64)
def bundled_trace_tables(impls: tuple[str, ...], causal: bool) -> tuple[pd.DataFrame | None,
                                                                        pd.DataFrame]:
    """trace_tables of the bundled trace, kept across runs and sessions (shared read-only)."""
    return trace_tables(reference_trace(), impls, causal)


def trace_tables(trace: pd.DataFrame, impls: tuple[str, ...],
                 causal: bool) -> tuple[pd.DataFrame | None, pd.DataFrame]:
    """A trace's rows for these implementations and mask: the launches and GPU time of each
    call (None when the trace has no "(all)" row) and every kernel."""
    tsel = reference.trace_rows(trace, impls, causal)
    total = tsel[tsel["kernel"] == "(all)"]
    calls = pd.DataFrame({
        "implementation": total["impl"].map(label), "mode": total["mode"],
        "s": total["seq_len"], "kernel launches": total["count"],
        "GPU µs": total["gpu_us"], "bytes copied/filled": total["bytes"],
    }) if len(total) else None
    # kernel names run to 160 characters, some without a space: an HTML table whose
    # kernel cells wrap anywhere (causal is left out: the rows are those of the toggle)
    kernels = tsel[tsel["kernel"] != "(all)"][
        [x for x in ("impl", "mode", "kernel", "category", "count", "gpu_us", "share", "bytes")
         if x in tsel]].rename(columns={"count": "launches", "gpu_us": "GPU µs"})
    return calls, kernels


def open_store() -> ResultStore | None:
    try:
        return ResultStore()
    except Exception as exc:  # noqa: BLE001 - a page without history still works
        warn(f"The results store could not be opened ({exc}); runs will not be kept.")
        return None


@cached()
def predicted_curves(impls: tuple[str, ...], lo: int, hi: int, b: int, h: int, d: int, dtype: str,
                     causal: bool, bwd: bool, hkv: int | None) -> pd.DataFrame:
    return sweep.predicted_curves(impls, lo, hi, b, h, d, dtype, causal, bwd, hkv)


WORST_HELP = ("The model's worst error: max |attnmem.calc.attention_peak_bytes − measured| / "
              "measured, over the points shown with s ≥ 1,024; the issue's bar is 2%.")


def results_view(data: pd.DataFrame, impls: tuple[str, ...], lens: tuple[int, ...], b: int,
                 h: int, hkv: int, kv: int | None, d: int, dtype: str, causal: bool,
                 backwards: tuple[bool, ...], unit: str) -> dict:
    """What the results section shows of `data` (rows with their predictions) for these inputs:
    the headline metrics (name, value) or None, the "no rows" note or None, and per pass in
    `backwards` the memory figure (a plotly dict), the rows for its CSV, the points table
    and the labels whose error passes 2% at s >= 1,024; `rows` (the pass's points) feed
    time_figures. Pure: the same numbers for the same rows."""
    sel = reference.select_rows(data, impls, b, h, hkv, d, dtype, causal)
    sel = sel[sel["backward"].isin(backwards)] if not sel.empty else sel
    view: dict = {"n_sel": len(sel), "headline": None, "have": None, "parts": []}
    if not sel.empty:
        measured = sel[(sel["status"] == "ok") & sel["peak_extra_bytes"].notna()]
        long = measured[(measured["seq_len"] >= 1024) & measured["model_error"].notna()]
        view["headline"] = (
            ("points shown", f"{len(sel):,}"), ("measured peaks", f"{len(measured):,}"),
            ("out of memory", f"{int((sel['status'] == 'oom').sum()):,}"),
            # a quarter of the column: a longer label is cut off
            ("worst error", f"{100 * long['model_error'].abs().max():.2f}%" if len(long) else "-"))
    if not data.empty and sel.empty:
        have = data[["dtype", "head_dim", "heads", "kv_heads", "batch"]].drop_duplicates()
        view["have"] = ("No rows for this selection in these results. They hold: "
                        + "; ".join(f"{r.dtype}, d={r.head_dim}, H={r.heads}/{r.kv_heads}, B={r.batch}"
                                    for r in have.head(12).itertuples()))
    for bwd in backwards:
        part = sel[sel["backward"] == bwd] if not sel.empty else sel
        what = ("forward + backward" if bwd else "forward") + (", causal" if causal else "")
        s_lo = int(min(list(lens) + ([int(x) for x in part["seq_len"]] if len(part) else [])))
        s_hi = int(max(list(lens) + ([int(x) for x in part["seq_len"]] if len(part) else [])))
        curves = predicted_curves(impls, s_lo, s_hi, b, h, d, dtype, causal, bwd, kv)
        big = part[(part["seq_len"] >= 1024) & part["model_error"].notna()
                   & (part["model_error"].abs() > 0.02)] if len(part) else part
        view["parts"].append({
            "rows": part,
            "figure": memory_figure(part, curves, impls, unit, f"Peak extra memory, {what}"),
            "csv": part[list(COLUMNS)] if len(part) else None,
            "errors": error_table(part, unit) if len(part) else None,
            "big": sorted({label(i) for i in big["impl"]}) if len(big) else [],
        })
    return view


def time_figures(view: dict, impls: tuple[str, ...], backwards: tuple[bool, ...],
                 metric: str) -> list[dict | None]:
    """The speed figure (a plotly dict) of each pass of a results_view, None for a pass
    without points."""
    what = {False: "forward", True: "forward + backward"}
    return [time_figure(p["rows"], impls, metric, f"{metric}, {what[bwd]}")
            if len(p["rows"]) else None for bwd, p in zip(backwards, view["parts"], strict=True)]


@kept(128)
def bundled_view(*key) -> dict:
    """results_view of the bundled reference, kept across runs and sessions by its inputs
    (the reference does not change while the app runs): selecting, predicting and drawing
    its rows took 50-100 ms of CPU a run (issue 45 item 5). Shared read-only."""
    return results_view(reference_rows(), *key)


@kept(128)
def bundled_time_figures(*key_and_metric) -> list[dict | None]:
    """time_figures of bundled_view, kept as it is."""
    *key, metric = key_and_metric
    impls, backwards = key[0], key[9]
    return time_figures(bundled_view(*key), impls, backwards, metric)


@cached(64)
def formula_notes(impls: tuple[str, ...]) -> str:
    """What each picked implementation's formula assumes, one paragraph each."""
    return "\n\n".join(f"**{label(impl)}** (`{impl}`): {PEAK_MODEL_NOTES.get(impl, '')}"
                        for impl in impls)


# --- the page ------------------------------------------------------------------------------

page_setup("measure")
charts.preload("PlotlyChart", "DataFrame")  # plotly.js and the data grid start loading now
st.title("GPU measurement")
st.markdown(
    "Measured peaks laid over the analytic model. Each point is one attention call: "
    "`max_memory_allocated()` during the call minus `memory_allocated()` just before it "
    "(inputs already allocated, caches emptied, warm-up done), timed with CUDA events "
    "(`triton.testing.do_bench` median). The model's error is shown for every point, never hidden."
)
# The answer (how many points, the model's worst error on them) comes first, on screen at
# 1280x800 without scrolling (issue 45, item 2); the inputs and the run follow it.
headline = st.container()

reason = gpu_reason()
try:
    from attnmem.measure.exposure import measurement_block_reason

    blocked = None if reason else measurement_block_reason()
except ImportError:  # older checkout without the exposure setting
    blocked = None
store = open_store()
unit = get_unit()

# The inputs sit above the results, which take the page's whole width: the tables beside a
# column of inputs were 525 px wide at 1280 px and scrolled sideways.
picks = st.columns([3, 2])
impls = widgets.multiselect("Implementations", "impls", SPECS["impls"], format_func=label, where=picks[0])
lens = [int(x) for x in widgets.multiselect("Sequence lengths", "lens", SPECS["lens"], where=picks[1],
                                            format_func=lambda v: short_len(int(v)))]
shape = st.columns(4)
b = widgets.int_input("Batch B", "b", SPECS["b"], where=shape[0])
h = widgets.int_input("Heads H", "h", SPECS["h"], where=shape[1])
hkv = widgets.int_input("KV heads (0 = H)", "hkv", SPECS["hkv"], where=shape[2],
                        help="Fewer key/value heads than H is GQA; 0 means the same as H.")
d = widgets.int_input("Head dim d", "d", SPECS["d"], where=shape[3])
kind = st.columns(4, vertical_alignment="bottom")
dtype = widgets.select("dtype", "dtype", SPECS["dtype"], where=kind[0])
mode = widgets.select("Pass", "mode", SPECS["mode"], where=kind[1],
                      help="fwd: forward under no_grad; fwd+bwd: forward and backward(dO), gradients count.")
causal = widgets.toggle("Causal mask", "causal", SPECS["causal"], where=kind[2])
kv = hkv if hkv and hkv != h else None
if kv is not None and h % kv:
    warn(f"Heads H ({h}) must be a multiple of KV heads ({hkv}); using KV heads = H.")
    kv = None
backwards = MODES[mode]

# -- run (GPU) or say plainly why not ------------------------------------------------
fa4_missing = fa4_installed_reason() if "fa4" in impls else None
if fa4_missing:
    # the reason is the registry's own text (no user input): shown as written
    st.caption(f"{label('fa4')} (`fa4`) is not available here: {fa4_missing}. Its points "
               "are recorded as unavailable, with that reason.")
if reason:
    st.info(f"**No GPU here**: {reason}. Nothing can be measured on this machine. Shown "
            "instead: the bundled reference measured on an NVIDIA H200 with this page's "
            "harness, or any results CSV you upload below (from `python -m attnmem.measure` "
            "run on a GPU machine).", icon=":material/info:")
elif blocked:
    st.info(blocked, icon=":material/lock:")
else:
    run_cols = st.columns([1, 1, 2])
    go_run = run_cols[0].button("Run measurement", type="primary", disabled=not (impls and lens))
    run_cols[1].button("Cancel", key="cancel_run",
                       help="Stops the sweep: the child process is killed, finished rows are kept.",
                       on_click=lambda: st.session_state.update(cancelled=True))
    with run_cols[2].expander("Run options"):
        limit_s = st.number_input("Time limit per point (s)", 5, 1800, 120)
        label_text = st.text_input("Label of this run", "", max_chars=100)
    if st.session_state.pop("cancelled", False):
        st.warning("Cancelled: the rows finished before the cancel are kept in the run.")
    if go_run:
        from attnmem.measure.child import GpuBusy, run_points
        from attnmem.measure.harness import expand_points

        points = expand_points(impls, sorted(lens), batch=b, heads=h, head_dims=[d],
                               dtypes=[dtype], causals=[causal], backwards=backwards,
                               kv_heads=kv)
        progress = st.progress(0.0, text=f"0 of {len(points)} points")
        live = st.empty()
        state = {"run": None, "rows": [], "store_error": None}

        def on_result(res, i, n):
            row = res.to_row()
            if store is not None and state["store_error"] is None:
                try:
                    if state["run"] is None:
                        state["run"] = store.new_run(
                            gpu_name=res.gpu_name, driver=res.driver,
                            torch_version=res.torch_version,
                            triton_version=res.triton_version,
                            label=label_text or "page", source="measured")
                    store.add_row(state["run"], row)
                except sqlite3.Error as exc:  # locked, disk full, ...: measure on, say so
                    state["store_error"] = f"{type(exc).__name__}: {exc}"
            state["rows"].append(row)
            progress.progress((i + 1) / n, text=f"{i + 1} of {n}: {res.impl} {res.mode} "
                                                f"s={res.seq_len:,} {res.status}")
            df_live = attach_predictions(pd.DataFrame(state["rows"], columns=list(COLUMNS)))
            curves = predicted_curves(tuple(impls), min(lens), max(lens), b, h, d, dtype,
                                      causal, bool(res.backward), kv)
            live.plotly_chart(memory_figure(df_live[df_live["backward"] == res.backward],
                                            curves, impls, unit, "live"),
                              key=f"live_{i}", theme="streamlit")

        try:
            summary = run_points(points, on_result=on_result, timeout_s=float(limit_s))
            live.empty()
            progress.progress(1.0, text=f"{len(summary.results)} points in {summary.wall_s:.1f} s")
            if state["run"] is not None:
                st.session_state["src"] = str(state["run"])
        except GpuBusy as exc:
            st.error(str(exc))
        except OSError as exc:  # e.g. the data directory (GPU lock file) is not writable
            shown = str(exc).replace("`", "'")  # in a code span: shown as is, no markdown
            st.error(f"The measurement could not start or go on: `{shown}`. "
                     "Set XDG_DATA_HOME (or ATTNMEM_DB) to a writable folder.")
        if state["store_error"]:
            kept = store.run(state["run"]).n_rows if store is not None and state["run"] else 0
            st.error(
                f"The results store ({md_escape(str(store.path) if store else '')}) stopped "
                f"accepting rows: {md_escape(state['store_error'])}. {kept} row(s) were saved "
                f"before that; all {len(state['rows'])} measured rows are in the file below.")
            st.download_button("⬇ This run's rows (CSV)", data=csv_text(state["rows"]).encode(),
                               file_name="attention-measure-unsaved.csv", mime="text/csv",
                               key="unsaved_csv")

# -- which results to show ----------------------------------------------------------
runs = store.runs() if store is not None else []
options = [REF] + [str(r.id) for r in runs]
names = {REF: "Bundled reference: NVIDIA H200 (data/attention_calls_h200.csv)"}
names.update({str(r.id): f"#{r.id} · {r.gpu_name or '?'} · {r.label or r.source} · "
                         f"{r.n_rows} rows · {r.started[:16]}" for r in runs})
src_spec = ChoiceParam(REF, tuple(options))
src = widgets.select("Results to show", "src", src_spec, format_func=lambda k: names.get(k, k))
if src == REF:
    data = reference_rows()
    if data.empty:
        st.info("The bundled reference dataset is not in this checkout (data/attention_calls_h200.csv).")
else:  # a stored run can change (an import, a delete): read and predicted on every run
    data = with_predictions(store.dataframe(int(src)) if store is not None
                            else pd.DataFrame(columns=list(COLUMNS)))

if not impls or not lens:
    headline.info("Pick at least one implementation and one sequence length.")
else:
    key = (tuple(impls), tuple(lens), b, h, hkv if kv else h, kv, d, dtype, causal, backwards,
           unit)
    view = bundled_view(*key) if src == REF else results_view(data, *key)
    if view["headline"] is not None:
        m = headline.columns(4)
        for col, (name, value) in zip(m, view["headline"], strict=True):
            col.metric(name, value, help=WORST_HELP if name == "worst error" else None)
        headline.caption(md_escape(f"Results shown: {names.get(src, src)}; the "
                                   "implementations, lengths and shape are picked below."))
    if view["have"] is not None:
        headline.info(view["have"])
    for bwd, part in zip(backwards, view["parts"], strict=True):
        charts.chart(part["figure"], f"mem_{int(bwd)}",
                     f"measured-memory-{'fwdbwd' if bwd else 'fwd'}", part["csv"])
        if part["errors"] is not None:
            tables.wide_table(part["errors"], error_first(unit), "bcols" if bwd else "fcols")
            st.caption("*measured* and *model*: the extra `max_memory_allocated()` of the call "
                       "(the caching allocator's blocks, what PyTorch counts); *reserved "
                       "growth*: how much `memory_reserved()` grew, what nvidia-smi-like tools "
                       "show (model from attnmem.calc.attention_reserved_bytes; empty where a "
                       "temporary's size is not known: math backend, eager and cuDNN "
                       "backward, memory-efficient backward with GQA).")
            if part["big"]:
                st.warning("Model error above 2% at s ≥ 1,024 for: " + ", ".join(part["big"])
                           + ". What each formula cannot know is listed below.")
    if view["n_sel"]:
        metric = widgets.radio("Speed as", "tmetric", SPECS["tmetric"])
        # The speed charts drawn once their expander is opened (Streamlit's lazy expander):
        # each plotly chart costs a direct load 0.5-0.8 s of the browser's main thread
        # (issue 45 item 3); the memory charts above stay drawn, the points' tables list the
        # times ("Show all" columns: median ms, TFLOP/s).
        speed_box = st.expander("Charts: speed of each call", key="_open_speed",
                                on_change="rerun")
        if speed_box.open:
            times = (bundled_time_figures(*key, metric) if src == REF
                     else time_figures(view, tuple(impls), backwards, metric))
            with speed_box:
                for bwd, fig in zip(backwards, times, strict=True):
                    if fig is not None:
                        charts.chart(fig, f"time_{int(bwd)}",
                                     f"measured-time-{'fwdbwd' if bwd else 'fwd'}")
        st.caption("TFLOP/s: forward 4·B·H·s²·d (half when causal), forward + backward 3.5× "
                   "that (attnmem.calc.attention_flops), over the median time.")
    with st.expander("What each formula assumes (and cannot know)"):
        st.markdown(formula_notes(tuple(impls)))

# -- trace fingerprint ---------------------------------------------------------------
st.subheader("Trace fingerprint: the kernels one call launches")
trace = reference_trace()
if not reason and not blocked:
    if st.button("Trace the selected implementations (s = 2,048)"):
        from attnmem.measure.child import GpuBusy, run_trace
        from attnmem.measure.harness import PointConfig

        cfgs = [PointConfig(i, b, h, 2048, d, dtype, causal, bwd, kv) for i in impls for bwd in backwards]
        try:
            with st.spinner("Profiling..."):
                st.session_state["trace"] = run_trace(cfgs)
        except GpuBusy as exc:
            st.error(str(exc))
    if "trace" in st.session_state:
        trace = pd.DataFrame(st.session_state["trace"])
if trace.empty:
    st.info("No trace fingerprint available (bundled: data/attention_calls_trace_h200.csv).")
else:
    calls, kernels = (trace_tables(trace, tuple(impls), causal) if "trace" in st.session_state
                      and not reason and not blocked else bundled_trace_tables(tuple(impls), causal))
    if calls is not None:
        tables.table(calls, hide_index=True)
    with st.expander("Every kernel (name, launches, share of the call's GPU time)"):
        tables.code_table(kernels, ["kernel"], formats={"GPU µs": "{:.2f}", "share": "{:.1%}"})
    st.caption("Eager attention launches one kernel per step (matmul, scale, fill, softmax, "
               "matmul): masked_fill adds an out-of-place copy that masked_fill_ avoids; the "
               "math backend adds fp32 casts; the fused backends launch one kernel.")

# -- upload, history, compare, export, delete ----------------------------------------
st.subheader("Results from elsewhere, and past runs")
up = st.file_uploader("Upload a results CSV (from `python -m attnmem.measure --out ...`)",
                      type=["csv"], key="upload",
                      max_upload_size=max(1, MAX_UPLOAD_BYTES // 2**20))
if up is not None:
    # Read at most one byte past the limit (never the whole of an oversized upload): the
    # validator then refuses it by size with a clear message.
    v = validate_csv(up.read(MAX_UPLOAD_BYTES + 1))
    if not v.ok:
        st.error("This file was not imported (nothing changed):\n\n"
                 + "\n".join(f"- {md_escape(e)}" for e in v.errors))
    else:
        st.success(f"{len(v.rows):,} valid rows.")
        if store is not None and st.button(f"Import {len(v.rows):,} rows as a run"):
            run_id = store.import_rows(list(v.rows), label=up.name[:100], source="upload")
            st.session_state["src"] = str(run_id)
            st.rerun()

if runs:
    tables.wide_table(pd.DataFrame([{
        "run": r.id, "started (UTC)": r.started, "GPU": r.gpu_name, "driver": r.driver,
        "torch": r.torch_version, "triton": r.triton_version, "label": r.label,
        "source": r.source, "rows": r.n_rows} for r in runs]), RUNS_FIRST, "rcols")
    cmp_cols = st.columns(2)
    a = cmp_cols[0].selectbox("Compare run A", options[1:], key="cmp_a",
                              format_func=lambda k: names.get(k, k))
    bb = cmp_cols[1].selectbox("with run B", options[1:], key="cmp_b",
                               index=min(1, len(options) - 2),
                               format_func=lambda k: names.get(k, k))
    if a and bb and a != bb and store is not None:
        tables.wide_table(store.compare(int(a), int(bb)), COMPARE_FIRST, "ccols")
    del_cols = st.columns([2, 1, 1])
    victim = del_cols[0].selectbox("Delete run", options[1:], key="del_run",
                                   format_func=lambda k: names.get(k, k))
    sure = del_cols[1].checkbox("I am sure", key="del_sure")
    if del_cols[2].button("Delete", disabled=not sure) and store is not None and victim:
        store.delete_run(int(victim))
        if st.session_state.get("src") == victim:
            st.session_state["src"] = REF
        st.rerun()
st.download_button("⬇ Export the shown results (CSV)",  # the file is written when clicked
                   data=lambda: csv_text(data[list(COLUMNS)].to_dict("records")).encode(),
                   file_name=f"attention-measure-{src}.csv", mime="text/csv", on_click="ignore",
                   disabled=data.empty, key="export_csv")

sync_url(SPECS | {"src": ChoiceParam(REF, tuple(options))})
