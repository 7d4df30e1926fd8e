"""The run machinery the whole-model harnesses share (training steps, ``attnmem.measure.train``;
inference, ``attnmem.measure.infer``); each harness keeps its configuration, row and
procedure and hands them to these:

- ``serve_configs``: the worker's loop (``{"cfg": ...}`` lines in, ``{"result": row,
  "restart": bool}`` lines out; a worker holding more than ``LEFTOVER_RESTART_BYTES`` after
  cleaning up exits);
- ``ConfigChild`` and ``run_configs``: the parent's loop under the GPU lock (timeouts,
  crashes, an OOM skipping the longer lengths of its series, the time budget), giving a
  ``RunSummary``;
- ``typed_row``, ``read_typed_csv``, ``csv_writer`` / ``write_cells`` and ``RowStore``: rows
  that last (a CSV, and tables ``<prefix>_runs`` / ``<prefix>_rows`` in the attention points'
  SQLite file);
- ``add_run_options`` and ``measure_to_csv``: the command line's run options and its main
  (CSV written row by row, optional store, progress on stderr, the closing summary).

No torch or transformers at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from attnmem.measure.child import WorkerProcess
from attnmem.measure.model_common import (
    LEFTOVER_RESTART_BYTES,
    allocated_now,
    cell,
    next_message,
    now_utc,
)

# --------------------------------------------------------------------------------------------
# The worker (child side).
# --------------------------------------------------------------------------------------------


def serve_configs(stdin: IO[str], proto: IO[str], *, parse: Callable[[dict], Any],
                  measure: Callable[[Any], Any], error_row: Callable[[Any, str], Any],
                  name: str, held: str = "still allocated",
                  baseline: Callable[[], int] = lambda: 0,
                  on_error: Callable[[], None] | None = None,
                  outside: Callable[[], int] = lambda: 0) -> None:
    """Serve {"cfg": {...}} lines until EOF or {"cmd": "exit"}; answer {"result": row,
    "restart": bool}. ``parse`` makes a configuration of the dict, ``measure`` its result,
    ``error_row(cfg, message)`` the row of an exception (after ``on_error``); memory allocated
    beyond ``baseline()``, plus ``outside()`` (GPU memory the process holds outside torch's
    allocator, e.g. a paged optimizer's unified memory that its library never frees), over
    LEFTOVER_RESTART_BYTES ends the worker ("<name> worker: N bytes <held> after <label>;
    exiting" on stderr)."""
    from attnmem.measure.model_common import short_error

    for line in stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        if msg.get("cmd") == "exit":
            break
        cfg = parse(msg["cfg"])
        try:
            res = measure(cfg)
        except Exception as exc:  # noqa: BLE001 - keep serving; the row says what broke
            if on_error is not None:
                on_error()
            res = error_row(cfg, short_error(exc))
        left = allocated_now() - baseline() + outside()
        restart = left > LEFTOVER_RESTART_BYTES
        proto.write(json.dumps({"result": res.to_row(), "restart": restart}) + "\n")
        proto.flush()
        if restart:  # something kept GPU memory alive: the next configuration gets a fresh child
            print(f"{name} worker: {left} bytes {held} after {cfg.label()}; exiting",
                  file=sys.stderr, flush=True)
            break


# --------------------------------------------------------------------------------------------
# The runner (parent side).
# --------------------------------------------------------------------------------------------


class ConfigChild(WorkerProcess):
    """One worker process (``python -m <args>``), counting the results it gave."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None) -> None:
        super().__init__(list(args), env)
        self.done = 0


@dataclass
class RunSummary:
    results: list[Any] = field(default_factory=list)
    wall_s: float = 0.0
    children_started: int = 0


def run_configs(configs: Sequence[Any], *, new_child: Callable[[dict[str, str] | None], Any],
                result: Callable[..., Any], row_for: Callable[[Any, str, str], Any],
                length: str, length_label: str,
                on_result: Callable[[Any, int, int], None] | None, timeout_s: float,
                startup_s: float, budget_s: float | None, skip_longer_after_oom: bool,
                gpu_index: int, lock_wait_s: float,
                lock_dir: str | os.PathLike[str] | None,
                env: dict[str, str] | None) -> RunSummary:
    """Measure ``configs`` one by one in a child process (``new_child(env)``), holding the GPU
    lock. ``result(**row)`` is a row from the child; ``row_for(cfg, status, message)`` a row
    the runner writes itself. ``length`` names the configuration's length field (an OOM skips
    the longer ones of its ``series()``; the message says ``<length_label><n>``).

    ``budget_s``: configurations not started within that many seconds of the start are
    recorded as ``skipped`` (the run finishes at most one configuration's time later).
    ``timeout_s`` limits each configuration (plus ``startup_s`` for a fresh child's first).
    """
    from attnmem.measure.child import gpu_lock

    summary = RunSummary()
    t0 = time.monotonic()
    oom_at: dict[tuple, int] = {}
    with gpu_lock(gpu_index, wait_s=lock_wait_s, lock_dir=lock_dir):
        child: Any = None
        try:
            for i, cfg in enumerate(configs):
                series = cfg.series()
                n = getattr(cfg, length)
                if budget_s is not None and time.monotonic() - t0 > budget_s:
                    res = row_for(cfg, "skipped",
                                  f"not run: the run's time budget of {budget_s:g} s was spent")
                elif skip_longer_after_oom and series in oom_at and n >= oom_at[series]:
                    res = row_for(cfg, "skipped", f"not run: {length_label}{oom_at[series]} of "
                                  "the same series already ran out of memory")
                else:
                    if child is None or child.proc.poll() is not None:
                        if child is not None:
                            child.kill()
                        child = new_child(env)
                        summary.children_started += 1
                    limit = timeout_s + (startup_s if child.done == 0 else 0.0)
                    child.send({"cfg": cfg.to_dict()})
                    msg = next_message(child, limit)
                    if msg == "timeout":
                        child.kill()
                        child = None
                        res = row_for(cfg, "timeout", f"no result within {limit:.0f} s: the "
                                      "child was killed and a fresh one takes the next")
                    elif not isinstance(msg, dict) or "result" not in msg:
                        code = (child.proc.wait(timeout=10) if child.proc.poll() is None
                                else child.proc.returncode)
                        tail = child.stderr_tail()
                        child.kill()
                        child = None
                        res = row_for(cfg, "crashed", f"the child process died (exit code "
                                      f"{code}); stderr ends: {tail[-300:]}")
                    else:
                        res = result(**msg["result"])
                        child.done += 1
                        if msg.get("restart"):
                            child.close()
                            child = None
                if res.status == "oom":
                    oom_at[series] = min(n, oom_at.get(series, n))
                summary.results.append(res)
                if on_result is not None:
                    on_result(res, i, len(configs))
        finally:
            if child is not None:
                if sys.exc_info()[0] is not None:
                    child.kill()
                else:
                    child.close()
    summary.wall_s = time.monotonic() - t0
    return summary


# --------------------------------------------------------------------------------------------
# Rows that last: typed CSV rows and the SQLite store.
# --------------------------------------------------------------------------------------------


def typed_row(raw: dict[str, Any], columns: Sequence[str], ints: Sequence[str],
              floats: Sequence[str], bools: Sequence[str],
              defaults: dict[str, str] | None = None) -> dict[str, Any]:
    """A CSV or database row with its numbers and booleans parsed (empty cells: None; empty
    text: ``defaults``' value or '')."""
    defaults = defaults or {}
    out: dict[str, Any] = {}
    for c in columns:
        v = raw.get(c)
        if v is None or v == "":
            out[c] = None if c in ints or c in floats or c in bools else defaults.get(c, "")
        elif c in ints:
            out[c] = int(float(v))
        elif c in floats:
            out[c] = float(v)
        elif c in bools:
            out[c] = v if isinstance(v, bool) else str(v).strip().lower() in ("true", "1")
        else:
            out[c] = str(v)
    return out


def read_typed_csv(path: str | os.PathLike[str], key_columns: Sequence[str], what: str,
                   typed: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a CSV through ``typed``; a file without ``key_columns`` raises ValueError
    ("<path>: not <what> (missing columns ...)")."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in key_columns if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: not {what} (missing columns {', '.join(missing)})")
        return [typed(r) for r in reader]


def csv_writer(fh: IO[str]) -> Any:
    """A CSV writer as the rows are written (CRLF line ends)."""
    return csv.writer(fh, lineterminator="\r\n")


def write_cells(writer: Any, row: dict[str, Any], columns: Sequence[str]) -> None:
    """One row in ``columns`` order, formula-like text neutralised (model_common.cell)."""
    writer.writerow([cell(row.get(c)) for c in columns])


class RowStore:
    """Runs in the attention points' SQLite file (attnmem.measure.store's default_db_path), in
    tables of their own: ``<prefix>_runs`` and ``<prefix>_rows``. Subclasses set ``prefix``,
    ``columns``, ``ints``, ``floats``, ``bools``, ``typed`` (a row typed) and ``migrate``
    (add the columns an older file lacks)."""

    prefix: str = ""
    columns: tuple[str, ...] = ()
    ints: tuple[str, ...] = ()
    floats: tuple[str, ...] = ()
    bools: tuple[str, ...] = ()
    migrate: bool = False

    def typed(self, raw: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        from attnmem.measure.store import default_db_path

        self.path = Path(path) if path is not None else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        p = self.prefix
        kinds = {c: "INTEGER" if c in self.ints + self.bools else
                 "REAL" if c in self.floats else "TEXT" for c in self.columns}
        with self._connect() as con:
            con.executescript(
                f"CREATE TABLE IF NOT EXISTS {p}_runs (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                "started TEXT NOT NULL, gpu TEXT NOT NULL DEFAULT '', label TEXT NOT NULL "
                "DEFAULT '');\n"
                f"CREATE TABLE IF NOT EXISTS {p}_rows (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                f"run_id INTEGER NOT NULL REFERENCES {p}_runs(id) ON DELETE CASCADE, "
                + ", ".join(f"{c} {k}" for c, k in kinds.items()) + ");")
            if self.migrate:
                have = {r["name"] for r in con.execute(f"PRAGMA table_info({p}_rows)")}
                for c, k in kinds.items():  # a file made before a column was added
                    if c not in have:
                        con.execute(f"ALTER TABLE {p}_rows ADD COLUMN {c} {k}")

    def _connect(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """The results database's one way of connecting (attnmem.measure.store.connect)."""
        from attnmem.measure.store import connect

        return connect(self.path)

    def new_run(self, *, gpu: str = "", label: str = "") -> int:
        with self._connect() as con:
            cur = con.execute(f"INSERT INTO {self.prefix}_runs (started, gpu, label) "
                              "VALUES (?, ?, ?)", (now_utc(), gpu, label[:200]))
            return int(cur.lastrowid)

    def add_row(self, run_id: int, row: dict[str, Any]) -> None:
        t = self.typed(row)
        vals = [int(t[c]) if c in self.bools and t[c] is not None else t[c]
                for c in self.columns]
        with self._connect() as con:
            con.execute(f"INSERT INTO {self.prefix}_rows (run_id, {', '.join(self.columns)}) "
                        f"VALUES (?, {', '.join('?' * len(self.columns))})", [run_id, *vals])

    def runs(self) -> list[dict[str, Any]]:
        p = self.prefix
        with self._connect() as con:
            cur = con.execute(f"SELECT {p}_runs.*, (SELECT COUNT(*) FROM {p}_rows WHERE "
                              f"run_id = {p}_runs.id) AS n FROM {p}_runs ORDER BY id DESC")
            return [dict(r) for r in cur]

    def rows(self, run_id: int) -> list[dict[str, Any]]:
        with self._connect() as con:
            cur = con.execute(f"SELECT {', '.join(self.columns)} FROM {self.prefix}_rows "
                              "WHERE run_id = ? ORDER BY id", (run_id,))
            return [self.typed(dict(r)) for r in cur]


# --------------------------------------------------------------------------------------------
# The command line.
# --------------------------------------------------------------------------------------------


def add_run_options(ap: argparse.ArgumentParser, *, timeout: float, out: str, prefix: str,
                    repredict_help: str) -> None:
    """--budget, --timeout, --lock-wait, --out, --db, --label, --list, --repredict, --quiet."""
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds: configurations not started by then are recorded as skipped")
    ap.add_argument("--timeout", type=float, default=timeout, help="seconds per configuration")
    ap.add_argument("--lock-wait", type=float, default=0.0,
                    help="seconds to wait for a busy GPU")
    ap.add_argument("--out", type=Path, default=Path(out), help="CSV to write")
    ap.add_argument("--db", type=Path, default=None,
                    help=f"also store the run in this SQLite file (tables {prefix}_runs, "
                         f"{prefix}_rows)")
    ap.add_argument("--label", default="", help="label of the stored run")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--repredict", type=Path, default=None, metavar="CSV", help=repredict_help)
    ap.add_argument("--quiet", action="store_true")


def measure_to_csv(args: argparse.Namespace, configs: Sequence[Any], *,
                   run: Callable[..., RunSummary], columns: Sequence[str],
                   store: Callable[[Path], RowStore], describe: Callable[[Any], str]) -> int:
    """The command line's main after the configurations: ``--list`` prints them; otherwise
    ``run(configs, on_result=..., timeout_s=, budget_s=, lock_wait_s=)`` with every row
    written to ``args.out`` as it comes (and to ``store(args.db)``), a progress line on stderr
    (``describe(res)``) unless ``--quiet``, and a closing summary. Exit codes: 0, 2 (GPU
    busy), 3 (a row could not be saved), 130 (interrupted)."""
    if args.list:
        for c in configs:
            print(c.label())
        print(f"{len(configs)} configurations")
        return 0
    from attnmem.measure.child import GpuBusy

    args.out.parent.mkdir(parents=True, exist_ok=True)
    fh = open(args.out, "w", newline="")  # noqa: SIM115 - closed in finally
    writer = csv_writer(fh)
    writer.writerow(columns)
    fh.flush()
    t0 = time.monotonic()
    db = store(args.db) if args.db else None
    run_id: int | None = None

    def on_result(res: Any, i: int, n: int) -> None:
        nonlocal run_id
        row = res.to_row()
        write_cells(writer, row, columns)
        fh.flush()
        if db is not None:
            if run_id is None:
                run_id = db.new_run(gpu=res.gpu, label=args.label or "command line")
            db.add_row(run_id, row)
        if not args.quiet:
            print(f"[{i + 1}/{n} {time.monotonic() - t0:6.1f}s] {describe(res)}",
                  file=sys.stderr, flush=True)

    try:
        summary = run(configs, on_result=on_result, timeout_s=args.timeout,
                      budget_s=args.budget, lock_wait_s=args.lock_wait)
    except GpuBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the rows measured so far are in {args.out}", file=sys.stderr)
        return 130
    except (sqlite3.Error, OSError) as exc:  # database locked or full, disk full, ...
        where = f"{args.db} (database)" if isinstance(exc, sqlite3.Error) else str(args.out)
        print(f"error: could not save a result to {where}: {exc}. The run stopped; the rows "
              f"saved before it are in {args.out}", file=sys.stderr)
        return 3
    finally:
        with contextlib.suppress(OSError):
            fh.close()
    counts: dict[str, int] = {}
    for r in summary.results:
        counts[r.status] = counts.get(r.status, 0) + 1
    print(f"{len(summary.results)} configurations in {summary.wall_s:.1f} s "
          f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}; "
          f"{summary.children_started} child process(es)); rows in {args.out}"
          + (f"; run {run_id} in {args.db}" if run_id is not None else ""))
    return 0


def status_note(res: Any) -> str:
    """A progress line's tail: the message (120 characters) unless the row is ok."""
    return res.message[:120] if res.status != "ok" else ""


