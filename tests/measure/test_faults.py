"""Faults during a measurement: the app stays up, says what happened, and loses no finished row.

Issue 6: the child process killed mid-run, a point that exceeds its time limit, CUDA out of
memory, the database locked by another writer, the disk full when writing results.

Layers:
- the store alone (attnmem.measure.store.ResultStore): a real second writer holding the database's
  write lock (another process), a disk that fills (SQLite's max_page_count makes every write
  past the current size fail with SQLITE_FULL, "database or disk is full", exactly what a
  full disk gives), the parent process killed between rows;
- the harness with the store (attnmem.measure.child.run_points writing each row from on_result, as the
  page does), with the fault implementations of tests/measure/_fault_impls.py in the real child;
- the measurement page (AppTest) with the GPU check patched to "present" and run_points
  pointed at those fakes: it must finish, show the statuses and keep the rows.

No GPU, no root, no tmpfs: everything runs on a 2-core CI machine.
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from attnmem.measure.child import run_points as REAL_RUN_POINTS
from attnmem.measure.store import COLUMNS, ResultStore

pytestmark = pytest.mark.robustness

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "attnmem" / "pages" / "measure.py")
IMPLS = "tests.measure._fault_impls"


def _row(seq_len: int, **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {c: None for c in COLUMNS}
    r.update(impl="naive", batch=1, heads=2, kv_heads=2, seq_len=seq_len, head_dim=8,
             dtype="fp32", causal=False, backward=False, status="ok", message="")
    r.update(kw)
    return r


def _integrity(path: Path) -> str:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


# ------------------------------------------------------------------ the store alone ----

_HOLDER = textwrap.dedent("""
    import sqlite3, sys, time
    con = sqlite3.connect(sys.argv[1], isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("BEGIN EXCLUSIVE")
    con.execute("INSERT INTO runs (started, label) VALUES ('x', 'other writer')")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    con.execute("COMMIT")
    print("released", flush=True)
""")


def _hold_lock(path: Path, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), str(seconds)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "locked"
    return p


def test_writer_waits_for_another_writer_and_loses_nothing(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    run = store.new_run(label="mine")
    store.add_row(run, _row(256))
    holder = _hold_lock(store.path, 1.5)
    try:
        t0 = time.monotonic()
        store.add_row(run, _row(512))  # waits for the other writer (busy timeout), then writes
        waited = time.monotonic() - t0
    finally:
        holder.wait(timeout=30)
    assert waited >= 1.0
    assert [r["seq_len"] for r in store.rows(run)] == [256, 512]
    assert {r.label for r in store.runs()} == {"mine", "other writer"}
    assert store.runs()  # reading works while and after
    assert _integrity(store.path) == "ok"


def test_writer_locked_out_gets_a_clear_error_and_finished_rows_stay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    run = store.new_run(label="mine")
    store.add_row(run, _row(256))
    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: real(*a, **{**k, "timeout": 0.3}))
    holder = _hold_lock(store.path, 3.0)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            store.add_row(run, _row(512))
        assert [r["seq_len"] for r in store.rows(run)] == [256]  # readers are not blocked (WAL)
    finally:
        holder.wait(timeout=30)
    store.add_row(run, _row(1024))  # the lock is gone: writing works again
    assert [r["seq_len"] for r in store.rows(run)] == [256, 1024]
    assert _integrity(store.path) == "ok"


@pytest.fixture
def disk_full(monkeypatch: pytest.MonkeyPatch):
    """From now on, no connection may grow the database file: SQLITE_FULL on the next page."""
    real = sqlite3.connect

    def clamped(*a: Any, **k: Any) -> sqlite3.Connection:
        con = real(*a, **k)
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        con.execute(f"PRAGMA max_page_count = {max(pages, 1)}")
        return con

    def on() -> None:
        monkeypatch.setattr(sqlite3, "connect", clamped)

    return on


def test_disk_full_fails_the_write_cleanly_and_keeps_finished_rows(tmp_path: Path,
                                                                   disk_full) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    run = store.new_run(label="mine")
    for s in (256, 512):
        store.add_row(run, _row(s))
    disk_full()
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for s in range(1000, 1400):  # until the last free page is used
            store.add_row(run, _row(s, message="x" * 1500))
    with pytest.raises(sqlite3.OperationalError):  # all or nothing (message: see below)
        store.add_rows(run, [_row(9, message="y" * 1500) for _ in range(50)])
    rows = store.rows(run)
    assert [r["seq_len"] for r in rows[:2]] == [256, 512]
    assert not any(r["seq_len"] == 9 for r in rows)
    assert _integrity(store.path) == "ok"


@pytest.mark.parametrize("method", ["add_rows", "import_rows"])
def test_bulk_write_on_a_full_disk_says_the_disk_is_full(tmp_path: Path, disk_full,
                                                         method: str) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    run = store.new_run(label="mine")
    disk_full()
    rows = [_row(9, message="y" * 1500) for _ in range(50)]
    with pytest.raises(sqlite3.OperationalError, match="full"):
        if method == "add_rows":
            store.add_rows(run, rows)
        else:
            store.import_rows(rows, label="upload")


def test_store_in_an_unwritable_place_says_so(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        ResultStore(blocker / "results.sqlite")


_WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from attnmem.measure.store import ResultStore, COLUMNS
    store = ResultStore(sys.argv[1])
    run = store.new_run(label="killed")
    i = 0
    while True:
        row = {c: None for c in COLUMNS}
        row.update(impl="naive", batch=1, heads=2, kv_heads=2, seq_len=i + 1, head_dim=8,
                   dtype="fp32", causal=False, backward=False, status="ok", message="x" * 500)
        store.add_row(run, row)
        print(i + 1, flush=True)
        i += 1
""")


def test_process_killed_while_writing_loses_no_committed_row(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    p = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(ROOT)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    committed = 0
    for line in p.stdout:
        committed = int(line)
        if committed >= 40:
            break
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    store = ResultStore(path)
    (run,) = store.runs()
    assert run.n_rows >= committed  # every row reported as written is there
    seq = [r["seq_len"] for r in store.rows(run.id)]
    assert seq == list(range(1, len(seq) + 1))  # no gap, no half row
    assert _integrity(path) == "ok"


# ------------------------------------------------------------------ harness + store ----

def _scenario_points() -> list[Any]:
    from attnmem.measure.harness import PointConfig

    return [PointConfig("naive", 1, 2, s, 8, "fp32") for s in (256, 512, 256, 1024, 2048, 4096)]


_PARENT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    from attnmem.measure.child import run_points
    from attnmem.measure.harness import BenchOptions, PointConfig
    from attnmem.measure.store import ResultStore
    store = ResultStore(sys.argv[1])
    run = store.new_run(label="parent killed")
    def on_result(res, i, n):
        store.add_row(run, res.to_row())
        print(res.status, flush=True)
    pts = [PointConfig("naive", 1, 2, s, 8, "fp32") for s in (256, 256, 1024)]
    run_points(pts, options=BenchOptions(warmup_ms=1, rep_ms=2), on_result=on_result,
               impl_module="tests.measure._fault_impls", lock_dir=sys.argv[3], timeout_s=300,
               env={"ATTNMEM_FAULT_TOKEN": sys.argv[4]})
""")


def _children_with(token: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"ATTNMEM_FAULT_TOKEN={token}".encode() in (d / "environ").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


@pytest.mark.slow
def test_app_killed_mid_run_keeps_rows_and_releases_the_gpu_lock(tmp_path: Path) -> None:
    """The app (parent) dies while a point runs: finished rows stay, the lock is free again."""
    from attnmem.measure.child import gpu_lock

    token = f"t{os.getpid()}-{time.monotonic_ns()}"
    path = tmp_path / "r.sqlite"
    p = subprocess.Popen([sys.executable, "-c", _PARENT, str(path), str(ROOT), str(tmp_path),
                          token], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout is not None
    try:
        assert [p.stdout.readline().strip() for _ in range(2)] == ["ok", "ok"]
        time.sleep(0.5)  # the third point (it hangs) is running in the child now
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        store = ResultStore(path)
        (run,) = store.runs()
        assert run.n_rows == 2 and _integrity(path) == "ok"
        with gpu_lock(0, lock_dir=tmp_path, wait_s=5):  # the dead app's lock is released
            pass
    finally:
        orphans = _children_with(token)
        for pid in orphans:  # never leave the hung child behind, whatever the outcome
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_child_does_not_outlive_a_killed_app(tmp_path: Path) -> None:
    token = f"t{os.getpid()}-{time.monotonic_ns()}"
    p = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path / "r.sqlite"), str(ROOT),
                          str(tmp_path), token], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout is not None
    orphans: list[int] = []
    try:
        assert [p.stdout.readline().strip() for _ in range(2)] == ["ok", "ok"]
        time.sleep(0.5)
        assert _children_with(token), "no child found"
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _children_with(token):
            time.sleep(0.2)
        orphans = _children_with(token)
        assert not orphans, f"child process(es) {orphans} still running 5 s after the app died"
    finally:
        for pid in orphans or _children_with(token):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------ the page ----

PAGE_POINTS: list[Any] = []  # what the page's next run measures (set by a test to shorten it)


@pytest.fixture
def page_with_fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The measurement page believing a GPU is present, its runs served by the fault fakes."""
    import streamlit as st

    import attnmem.measure.child
    import attnmem.measure.on_this_gpu
    import attnmem.measure.registry
    from attnmem.measure.harness import BenchOptions

    monkeypatch.setenv("ATTNMEM_DB", str(tmp_path / "r.sqlite"))
    monkeypatch.setattr(attnmem.measure.registry, "gpu_reason", lambda: None)
    # the page asks on_this_gpu, which looks for a device node before torch
    monkeypatch.setattr(attnmem.measure.on_this_gpu, "gpu_reason", lambda: None)
    real_run = attnmem.measure.child.run_points
    points = _scenario_points()
    PAGE_POINTS[:] = points

    def fake_run(_points: Any, **kw: Any) -> Any:
        return real_run(list(PAGE_POINTS), options=BenchOptions(warmup_ms=1, rep_ms=2),
                        on_result=kw.get("on_result"), cancel=kw.get("cancel"),
                        impl_module=IMPLS, lock_dir=tmp_path, timeout_s=3.0, startup_s=60.0,
                        skip_longer_after_oom=False)

    monkeypatch.setattr(attnmem.measure.child, "run_points", fake_run)
    st.cache_resource.clear()
    st.cache_data.clear()
    yield tmp_path / "r.sqlite"
    st.cache_resource.clear()


def _run_measure_page() -> Any:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(PAGE, default_timeout=240)
    at.query_params.update({"impls": "naive", "lens": "512", "mode": "fwd"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    run_button = [b for b in at.button if b.label == "Run measurement"]
    assert run_button, "the page shows no Run button with a GPU present"
    run_button[0].click().run()
    return at


def _page_text(at: Any) -> str:
    parts = [e.value for kind in ("error", "warning", "info", "success", "markdown", "caption")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


@pytest.mark.slow
def test_page_survives_kill_timeout_and_oom(page_with_fake_gpu: Path) -> None:
    """Through the page (rows written by its on_result, as in real use): the child SIGKILLed
    mid-point, a point past its time limit, a simulated CUDA OOM; every row is kept and says
    what happened, and the points after each fault still run (in a fresh child)."""
    t0 = time.monotonic()
    at = _run_measure_page()
    assert not at.exception, [e.value for e in at.exception]
    (run,) = ResultStore(page_with_fake_gpu).runs()
    rows = ResultStore(page_with_fake_gpu).rows(run.id)
    assert [r["status"] for r in rows] == ["ok", "crashed", "ok", "timeout", "oom", "ok"]
    assert "exit code -9" in rows[1]["message"], rows[1]["message"]
    assert "no result within" in rows[3]["message"], rows[3]["message"]
    assert "out of memory" in rows[4]["message"].lower(), rows[4]["message"]
    assert time.monotonic() - t0 < 120
    assert _integrity(page_with_fake_gpu) == "ok"


def _fail_after(monkeypatch: pytest.MonkeyPatch, ok_rows: int, fault) -> dict[str, Any]:
    """Let the page write ok_rows rows, then call fault() before each later write."""
    real_add = ResultStore.add_row
    state: dict[str, Any] = {"n": 0}

    def add_row(self: ResultStore, run_id: int, row: Any) -> None:
        state["n"] += 1
        if state["n"] > ok_rows:
            fault(self)
        real_add(self, run_id, row)

    monkeypatch.setattr(ResultStore, "add_row", add_row)
    return state


@pytest.mark.slow
def test_page_reports_a_locked_database_and_keeps_finished_rows(
        page_with_fake_gpu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: real(*a, **{**k, "timeout": 0.3}))
    holders: list[subprocess.Popen] = []

    def lock(store: ResultStore) -> None:  # another writer takes the database mid-run
        if not holders:
            holders.append(_hold_lock(store.path, 60.0))

    _fail_after(monkeypatch, 2, lock)
    PAGE_POINTS[:] = [p for p in _scenario_points() if p.seq_len in (256, 4096)]  # all ok
    try:
        at = _run_measure_page()
        text = _page_text(at)
        exceptions = [e.value for e in at.exception]
    finally:
        for h in holders:
            h.kill()
            h.wait()
    (run,) = ResultStore(page_with_fake_gpu).runs()
    assert run.n_rows == 2  # the rows finished before the lock are kept
    assert not exceptions, exceptions
    assert "locked" in text


@pytest.mark.slow
def test_page_reports_a_full_disk_and_keeps_finished_rows(
        page_with_fake_gpu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(store: ResultStore) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    _fail_after(monkeypatch, 2, full)
    PAGE_POINTS[:] = [p for p in _scenario_points() if p.seq_len in (256, 4096)]  # all ok
    at = _run_measure_page()
    (run,) = ResultStore(page_with_fake_gpu).runs()
    assert run.n_rows == 2
    assert not at.exception, [e.value for e in at.exception]
    assert "full" in _page_text(at)


@pytest.mark.slow
def test_second_session_is_told_the_gpu_is_busy(page_with_fake_gpu: Path) -> None:
    """Another session (here: another process) measures on this GPU: the page refuses with a
    message naming the holder, records nothing and stays up."""
    code = ("import fcntl, sys, time\n"
            f"fh = open({str(page_with_fake_gpu.parent / 'gpu0.lock')!r}, 'a+')\n"
            "fcntl.flock(fh.fileno(), fcntl.LOCK_EX)\n"
            "fh.write('pid 4242 since now (another session)'); fh.flush()\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        at = _run_measure_page()
        assert not at.exception, [e.value for e in at.exception]
        errors = " ".join(str(e.value) for e in at.error)
        assert "busy" in errors and "another session" in errors, errors
        assert all(r.n_rows == 0 for r in ResultStore(page_with_fake_gpu).runs())
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------ the command line ----

class _FillingFile:
    """A text file that raises OSError(ENOSPC) once more than `room` characters were written:
    what a full disk does to the command line's --out CSV."""

    def __init__(self, path: Path, room: int) -> None:
        self._fh = open(path, "w", newline="")  # noqa: SIM115 - closed by close()
        self._room = room

    def write(self, text: str) -> int:
        if len(text) > self._room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= len(text)
        return self._fh.write(text)

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _cli_with_fault_impls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    import attnmem.measure.cli
    from attnmem.measure.harness import BenchOptions

    real_run = attnmem.measure.cli.run_points

    def fake_run(points: Any, **kw: Any) -> Any:  # the CLI's sweep, served by the fakes
        return real_run([p for p in _scenario_points() if p.seq_len in (256, 4096)] * 2,
                        options=BenchOptions(warmup_ms=1, rep_ms=2),
                        on_result=kw.get("on_result"), impl_module=IMPLS, lock_dir=tmp_path,
                        timeout_s=10.0, startup_s=60.0)

    monkeypatch.setattr(attnmem.measure.cli, "run_points", fake_run)
    return attnmem.measure.cli


@pytest.mark.slow
def test_cli_keeps_finished_rows_when_the_database_is_locked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    measure = _cli_with_fault_impls(monkeypatch, tmp_path)
    db = tmp_path / "r.sqlite"
    ResultStore(db)
    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: real(*a, **{**k, "timeout": 0.3}))
    holders: list[subprocess.Popen] = []
    _fail_after(monkeypatch, 2, lambda store: holders.append(_hold_lock(store.path, 60.0))
                if not holders else None)
    out = tmp_path / "results.csv"
    try:
        code = measure.main(["--impl", "naive", "--seq-len", "256", "--out", str(out),
                             "--db", str(db), "--quiet"])
    finally:
        for h in holders:
            h.kill()
            h.wait()
    err = capsys.readouterr().err
    assert code != 0 and "locked" in err, (code, err)
    assert len(out.read_text().splitlines()) >= 1 + 2  # header + the rows before the fault


@pytest.mark.slow
def test_cli_says_the_disk_is_full_and_keeps_finished_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    measure = _cli_with_fault_impls(monkeypatch, tmp_path)
    out = tmp_path / "results.csv"
    header_and_two_rows = 700  # header ~300 characters, a row ~190
    monkeypatch.setattr(measure, "open", lambda p, *a, **k: _FillingFile(Path(p), header_and_two_rows)
                        if Path(p) == out else open(p, *a, **k), raising=False)
    code = measure.main(["--impl", "naive", "--seq-len", "256", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code != 0 and "space" in err.lower(), (code, err)
    lines = out.read_text().splitlines()
    assert lines[0].startswith("impl,") and len(lines) >= 2, lines


@pytest.mark.slow
def test_page_with_an_unwritable_data_directory_says_so(
        page_with_fake_gpu: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only home (the default data directory holds the GPU lock file): the run is
    refused with a message, the page stays up."""
    import attnmem.measure.child
    from attnmem.measure.harness import BenchOptions

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the data directory should be")
    monkeypatch.setenv("XDG_DATA_HOME", str(blocker))

    def run_with_default_lock_dir(_points: Any, **kw: Any) -> Any:
        return REAL_RUN_POINTS([p for p in _scenario_points() if p.seq_len == 256],
                               options=BenchOptions(warmup_ms=1, rep_ms=2),
                               on_result=kw.get("on_result"), impl_module=IMPLS, timeout_s=5.0)

    monkeypatch.setattr(attnmem.measure.child, "run_points", run_with_default_lock_dir)
    at = _run_measure_page()
    assert not at.exception, [e.value for e in at.exception]
    shown = " ".join(str(e.value) for kind in ("error", "warning") for e in getattr(at, kind))
    assert "not-a-directory" in shown, shown
