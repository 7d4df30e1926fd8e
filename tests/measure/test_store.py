"""The results store (SQLite, WAL, one transaction per row) and the CSV upload validator."""

from __future__ import annotations

import csv
import io
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmem.measure.store import (
    COLUMNS,
    MAX_UPLOAD_ROWS,
    ResultStore,
    cached_free_bytes,
    csv_text,
    default_db_path,
    neutralise,
    read_csv_rows,
    validate_csv,
)

REPO = Path(__file__).resolve().parents[2]


def row(**kw):
    r = {c: None for c in COLUMNS}
    r.update(impl="sdpa_flash", batch=1, heads=32, kv_heads=32, seq_len=4096, head_dim=128,
             dtype="fp16", causal=False, backward=True, status="ok", median_ms=3.17,
             tflops=296.0, peak_extra_bytes=269_484_032, reserved_bytes=300_000_000,
             reserved_extra_bytes=2_097_152, before_bytes=134_217_728,
             predicted_bytes=269_484_032, rel_error=0.0, message="", wall_s=0.2,
             gpu_name="NVIDIA H200", driver="580.159.04", torch_version="2.11.0+cu130",
             triton_version="3.6.0", timestamp="2026-11-30T06:20:45+00:00")
    r.update(kw)
    return r


@pytest.fixture
def store(tmp_path):
    return ResultStore(tmp_path / "db" / "results.sqlite")


def test_default_path_is_user_data_dir_not_repo(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNMEM_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_db_path() == tmp_path / "xdg" / "attention-memory" / "results.sqlite"
    monkeypatch.delenv("XDG_DATA_HOME")
    p = default_db_path()
    assert ".local/share/attention-memory" in str(p) and REPO not in p.parents
    monkeypatch.setenv("ATTNMEM_DB", str(tmp_path / "x.sqlite"))
    assert default_db_path() == tmp_path / "x.sqlite"
    assert ResultStore().path == tmp_path / "x.sqlite"


def test_wal_mode_and_round_trip(store):
    con = sqlite3.connect(store.path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()
    run = store.new_run(gpu_name="NVIDIA H200", driver="580", torch_version="2.11",
                        triton_version="3.6", label="test")
    store.add_row(run, row())
    store.add_row(run, row(seq_len=8192, causal=True, status="oom", peak_extra_bytes=None,
                           median_ms=None, message="CUDA out of memory"))
    rows = store.rows(run)
    assert len(rows) == 2
    assert rows[0]["causal"] is False and rows[1]["causal"] is True
    assert rows[0]["peak_extra_bytes"] == 269_484_032 and rows[1]["peak_extra_bytes"] is None
    (r,) = store.runs()
    assert (r.id, r.gpu_name, r.label, r.n_rows, r.source) == (run, "NVIDIA H200", "test", 2, "measured")
    df = store.dataframe(run)
    assert list(df.columns) == list(COLUMNS) and len(df) == 2


def test_delete_and_compare(store):
    a = store.new_run(gpu_name="NVIDIA A100", label="a")
    b = store.new_run(gpu_name="NVIDIA H200", label="b")
    store.add_row(a, row(median_ms=6.0))
    store.add_row(b, row(median_ms=3.0))
    store.add_row(b, row(seq_len=8192))
    cmp = store.compare(a, b)
    one = cmp[cmp.seq_len == 4096].iloc[0]
    assert one.time_ratio_b_over_a == pytest.approx(0.5)
    assert len(cmp) == 2  # outer join keeps the point only b has
    assert store.delete_run(a) and not store.delete_run(a)
    assert [r.id for r in store.runs()] == [b] and store.rows(a) == []


_WRITER = """
import os, sys
sys.path.insert(0, {repo!r})
from attnmem.measure.store import ResultStore
st = ResultStore({path!r})
run = st.new_run(label="crash")
r = {row!r}
for i in range(5):
    r["seq_len"] = 256 * (i + 1)
    st.add_row(run, r)
os._exit(9)  # die mid-run, without closing anything
"""


def test_crash_mid_run_loses_no_finished_row(tmp_path):
    path = tmp_path / "c.sqlite"
    code = _WRITER.format(repo=str(REPO), path=str(path), row=row())
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 9, out.stderr
    st = ResultStore(path)
    (run,) = st.runs()
    assert [r["seq_len"] for r in st.rows(run.id)] == [256, 512, 768, 1024, 1280]


def test_concurrent_writers(tmp_path):
    path = tmp_path / "w.sqlite"
    ResultStore(path)
    errors = []

    def write(k):
        try:
            st = ResultStore(path)
            run = st.new_run(label=f"t{k}")
            for i in range(20):
                st.add_row(run, row(seq_len=i + 1))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(r.n_rows for r in ResultStore(path).runs()) == [20, 20, 20, 20]


def test_export_neutralises_formulas_and_round_trips(store):
    run = store.new_run()
    store.add_row(run, row(message="=HYPERLINK(\"http://x\",\"y\")", rel_error=-0.0123,
                           gpu_name="@SUM(A1)", driver="+1", torch_version="-2"))
    text = store.export_csv(run)
    rec = next(csv.DictReader(io.StringIO(text)))
    assert rec["message"].startswith("'=")
    assert rec["gpu_name"] == "'@SUM(A1)" and rec["driver"] == "'+1" and rec["torch_version"] == "'-2"
    assert rec["rel_error"] == "-0.0123"  # numbers are left alone
    v = validate_csv(text.encode())
    assert v.ok, v.errors
    assert v.rows[0]["message"].startswith("=HYPERLINK")  # our own apostrophe is taken off
    assert v.rows[0]["rel_error"] == pytest.approx(-0.0123)
    assert neutralise("\tx") == "'\tx" and neutralise(-5) == -5 and neutralise("ok") == "ok"


def _csv(rows, columns=COLUMNS):
    return csv_text(rows, columns).encode()


def test_validator_accepts_a_good_file_and_import_is_atomic(store):
    data = _csv([row(), row(seq_len=8192, dtype="bfloat16", causal="True", backward="False")])
    v = validate_csv(data)
    assert v.ok, v.errors
    assert v.rows[1]["dtype"] == "bf16" and v.rows[1]["causal"] is True
    run = store.import_rows(v.rows, label="upload.csv")
    assert store.run(run).n_rows == 2 and store.run(run).source == "upload"
    assert store.run(run).gpu_name == "NVIDIA H200"


def test_one_copy_of_the_result_schema():
    """Statuses, columns and dtypes are defined once (attnmem.measure.schema): the harness, the
    store and the registry hand out the same objects; dtype spellings are calc's aliases."""
    from attnmem.calc.units import DTYPE_ALIASES
    from attnmem.measure import harness, registry, schema, store

    assert harness.STATUSES is store.STATUSES is schema.STATUSES
    assert harness.COLUMNS is store.COLUMNS is schema.COLUMNS
    assert harness.PointResult is schema.PointResult and store.DTYPES is schema.DTYPES
    assert registry.canonical_dtype is store.canonical_dtype is schema.canonical_dtype
    for alias, name in DTYPE_ALIASES.items():
        if name in schema.DTYPES:
            assert schema.canonical_dtype(alias) == name
            assert schema.canonical_dtype(alias.upper()) == name
    assert schema.canonical_dtype("torch.half") == "fp16"
    for bad in ("int8", "fp8", "", "float64", None):
        with pytest.raises(ValueError, match="dtype must be one of fp16, bf16, fp32"):
            schema.canonical_dtype(bad)


def test_validator_accepts_fa4_rows_and_calc_spellings():
    """An fa4 row (measured, or unavailable with its reason) is a valid upload; dtypes in any
    spelling calc accepts for fp16/bf16/fp32 are read as the canonical name."""
    v = validate_csv(_csv([row(impl="fa4", dtype="torch.bfloat16"),
                           row(impl="fa4", status="unavailable", peak_extra_bytes="",
                               message="flash_attn.cute is not installed", dtype="half")]))
    assert v.ok, v.errors
    assert [r["dtype"] for r in v.rows] == ["bf16", "fp16"]
    assert v.rows[1]["message"] == "flash_attn.cute is not installed"


def test_validator_minimal_columns():
    cols = ("impl", "batch", "heads", "seq_len", "head_dim", "dtype", "causal", "backward",
            "status", "peak_extra_bytes")
    v = validate_csv(_csv([row()], cols))
    assert v.ok, v.errors
    assert v.rows[0]["kv_heads"] == 32 and v.rows[0]["median_ms"] is None


@pytest.mark.parametrize(
    "data, needle",
    [
        (b"", "empty"),
        (b"\xff\xfe\x00garbage", "UTF-8"),
        (b"impl,batch\nnaive,1\n", "missing required column"),
        (_csv([row(impl="flash3000")]), "impl must be one of"),
        (_csv([row(seq_len="abc")]), "seq_len must be a whole number"),
        (_csv([row(seq_len=-5)]), "seq_len must be from"),
        (_csv([row(seq_len=10**12)]), "seq_len must be from"),
        (_csv([row(batch=1.5)]), "batch must be a whole number"),
        (_csv([row(median_ms="nan-ish")]), "median_ms must be a number"),
        (_csv([row(median_ms=-1)]), "median_ms must be a finite number"),
        (_csv([row(tflops="inf")]), "tflops must be a finite number"),
        (_csv([row(dtype="int8")]), "dtype must be one of"),
        (_csv([row(status="great")]), "status must be one of"),
        (_csv([row(causal="maybe")]), "causal"),
        (_csv([row(heads=32, kv_heads=5)]), "multiple of kv_heads"),
        (_csv([row(peak_extra_bytes="")]), "needs peak_extra_bytes"),
        (_csv([row(message="x" * 3000)]), "longer than"),
        (COLUMNS and ",".join(COLUMNS).encode() + b"\n", "no data rows"),
    ],
)
def test_validator_rejects_bad_files(data, needle, store):
    v = validate_csv(data)
    assert not v.ok and v.rows == ()
    assert any(needle in e for e in v.errors), v.errors
    assert store.runs() == []  # nothing written


def test_validator_limits():
    data = _csv([row(seq_len=i + 1) for i in range(30)])
    v = validate_csv(data, max_rows=10)
    assert not v.ok and "limit is 10" in v.errors[-1]
    v = validate_csv(data, max_bytes=100)
    assert not v.ok and "limit is 100 bytes" in v.errors[0]
    assert MAX_UPLOAD_ROWS == 100_000


def test_validator_error_list_is_bounded():
    v = validate_csv(_csv([row(impl="bad")] * 100))
    assert not v.ok and len(v.errors) <= 21


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_validator_never_raises_on_random_bytes(data):
    v = validate_csv(data)
    assert v.ok in (True, False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=len(COLUMNS), max_size=len(COLUMNS)))
def test_validator_never_raises_on_random_cells(cells):
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(COLUMNS)
    w.writerow(cells)
    v = validate_csv(buf.getvalue())
    assert v.ok in (True, False)


def test_bundled_reference_is_valid():
    path = REPO / "data" / "attention_calls_h200.csv"
    if not path.exists():
        pytest.skip("data/attention_calls_h200.csv not bundled yet")
    rows = read_csv_rows(path)
    assert len(rows) > 100
    assert {r["gpu_name"] for r in rows if r["status"] == "ok"} == {"NVIDIA H200"}


#: The reference measurements the model is held to: the bundled powers-of-two sweep and, when
#: it is there, the awkward-shape sweep of issue 16 (attnmem.measure.awkward_sweep).
REFERENCE_FILES = ("attention_calls_h200.csv", "attention_calls_awkward_h200.csv")
EXPANDABLE_FILE = "attention_calls_awkward_expandable_h200.csv"


cached_free = cached_free_bytes


def _reference_errors(names, expandable=False):
    """(rows with s >= 1,024, rows below) of every present file, with the model's error now."""
    import pandas as pd

    from attnmem.calc import attention_peak_bytes

    frames = []
    for name in names:
        path = REPO / "data" / name
        if path.exists():
            frames.append(pd.DataFrame(read_csv_rows(path), columns=list(COLUMNS)))
    if not frames:
        pytest.skip(f"none of {', '.join(names)} bundled")
    df = pd.concat(frames, ignore_index=True)
    df = df[(df["status"] == "ok") & (df["peak_extra_bytes"].fillna(0) > 0)].copy()
    df["model_bytes"] = [
        attention_peak_bytes(r.impl, int(r.batch), int(r.heads), int(r.seq_len),
                             int(r.head_dim), r.dtype, bool(r.causal), bool(r.backward),
                             kv_heads=int(r.kv_heads), expandable=expandable,
                             cached_free_bytes=cached_free(r))
        for r in df.itertuples()]
    df["model_error"] = (df["model_bytes"] - df["peak_extra_bytes"]) / df["peak_extra_bytes"]
    return df[df["seq_len"] >= 1024], df[df["seq_len"] < 1024]


def test_model_within_half_a_percent_of_every_reference_point_from_1024(record_property):
    """Issue 16: attnmem.calc.attention_peak_bytes (tensors counted as the caching allocator's blocks,
    given what the cache held free before each call, from the row's own columns) within 0.5%
    of every measured peak at s >= 1,024 in the bundled H200 references, every
    implementation, forward and forward+backward (computed now, not the stored prediction);
    the worst error below s = 1,024 is reported (record_property, -rP), not bounded."""
    big, small = _reference_errors(REFERENCE_FILES)
    assert len(big) > 100
    # Rows measured before the Hopper backward padded its flat fp32 dQ buffer to whole query
    # blocks (attnmem/kernels/flash/NOTES.md, "DQ_FLAT"): our kernel's backward at an s_q that is not a
    # multiple of the block, in the Hopper region. calc counts today's kernel; these rows
    # hold the old one's s_q rows and wait for a re-measurement on a GPU.
    from attnmem.calc import dispatch

    stale = big.apply(lambda r: r["impl"] == "triton" and bool(r["backward"]) and
                      r["seq_len"] % dispatch.SM90_QUERY_BLOCK.get(int(r["head_dim"]), 1) != 0
                      and dispatch.sm90_region(int(r["batch"]), int(r["kv_heads"]),
                                               int(r["seq_len"]), int(r["seq_len"]),
                                               int(r["head_dim"]), 2), axis=1)
    assert stale.sum() < len(big) // 20, big[stale]  # a few awkward-sweep rows, no more
    big = big[~stale]
    worst = big.loc[big["model_error"].abs().idxmax()]
    assert big["model_error"].abs().max() <= 0.005, worst.to_dict()
    assert set(big["impl"]) >= {"naive", "naive_inplace", "sdpa_math", "sdpa_efficient",
                                "sdpa_flash", "sdpa_cudnn", "triton"}
    if len(small):
        low = small.loc[small["model_error"].abs().idxmax()]
        record_property("worst_error_below_1024", float(low["model_error"]))
        print(f"worst error below s = 1,024: {100 * low['model_error']:+.2f}% "
              f"({low['impl']} s={low['seq_len']} B={low['batch']} H={low['heads']})")


def test_model_within_half_a_percent_with_expandable_segments():
    """The expandable_segments:True subset (attnmem.measure.awkward_sweep --expandable),
    predicted with attention_peak_bytes(..., expandable=True)."""
    big, _ = _reference_errors((EXPANDABLE_FILE,), expandable=True)
    if big.empty:
        pytest.skip("no rows at s >= 1,024")
    worst = big.loc[big["model_error"].abs().idxmax()]
    assert big["model_error"].abs().max() <= 0.005, worst.to_dict()


def test_attach_predictions_counts_the_cache_left_free_before_the_call() -> None:
    """A row measured with cached free memory is predicted with it (calc's cached_free_bytes),
    and the free amount is reserved before minus allocated before."""
    import pandas as pd

    from attnmem.calc import attention_peak_bytes
    from attnmem.measure.store import attach_predictions

    shape = dict(impl="sdpa_flash", batch=2, heads=16, kv_heads=16, seq_len=3000, head_dim=64,
                 dtype="bf16", causal=False, backward=True, peak_extra_bytes=10**9)
    empty = dict(shape, reserved_bytes=100 * 2**20, reserved_extra_bytes=0, before_bytes=100 * 2**20)
    cached = dict(shape, reserved_bytes=700 * 2**20, reserved_extra_bytes=0, before_bytes=100 * 2**20)
    assert cached_free_bytes(empty) == 0 and cached_free_bytes(cached) == 600 * 2**20
    got = attach_predictions(pd.DataFrame([empty, cached]))["model_bytes"].tolist()
    args = ("sdpa_flash", 2, 16, 3000, 64, "bf16", False, True)
    assert got[0] == attention_peak_bytes(*args, kv_heads=16)
    assert got[1] == attention_peak_bytes(*args, kv_heads=16, cached_free_bytes=600 * 2**20)
    assert got[0] != got[1]  # the rounding of whole segments is what the free cache removes


def test_attach_predictions_gives_reserved_growth_where_calc_predicts_it() -> None:
    """Beside the peak, the store predicts the growth of memory_reserved() (calc's
    attention_reserved_bytes) and leaves it empty where calc does not know every temporary."""
    import pandas as pd

    from attnmem.calc import attention_reserved_bytes
    from attnmem.measure.store import attach_predictions

    base = dict(batch=2, heads=16, kv_heads=16, seq_len=3000, head_dim=64, dtype="bf16",
                causal=False, peak_extra_bytes=10**9, reserved_bytes=0, reserved_extra_bytes=0,
                before_bytes=0)
    rows = [dict(base, impl="sdpa_flash", backward=False), dict(base, impl="sdpa_math", backward=True)]
    got = attach_predictions(pd.DataFrame(rows))["model_reserved_bytes"].tolist()
    want = attention_reserved_bytes("sdpa_flash", 2, 16, 3000, 64, "bf16", False, False, kv_heads=16)
    assert want is not None and got[0] == want
    assert attention_reserved_bytes("sdpa_math", 2, 16, 3000, 64, "bf16", False, True) is None
    assert got[1] is None or got[1] != got[1]  # None (or NaN in a float column)


def test_one_way_to_connect_for_every_table(tmp_path) -> None:
    """ResultStore and the inference/training RowStore share the database file and open it
    the one way (attnmem.measure.store.connect): WAL, synchronous NORMAL, foreign keys on."""
    from attnmem.measure import store as store_mod
    from attnmem.measure.run_common import RowStore

    db = tmp_path / "r.db"
    for con_of in (store_mod.ResultStore(db)._connect, lambda: RowStore._connect(
            type("S", (), {"path": db})())):
        with con_of() as con:
            assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert con.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
            assert con.execute("PRAGMA foreign_keys").fetchone()[0] == 1
