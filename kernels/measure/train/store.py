"""Training-step results that last: typed rows from a CSV (``read_rows``, what the pages use),
the CSV writer (``write_header``, ``write_row``), the SQLite store (``TrainStore``, in the
attention points' file) and ``repredict`` (a CSV's predictions from the current calc).

Stdlib only at import (no torch, no transformers, no calc until ``repredict``).
"""

from __future__ import annotations

import contextlib
import csv
import os
import sqlite3
from pathlib import Path
from typing import IO, Any

from kernels.measure import train_models
from kernels.measure.model_common import cell, now_utc
from kernels.measure.train.config import (
    BOOL_COLUMNS,
    COLUMN_DEFAULTS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    TRAIN_COLUMNS,
    TrainConfig,
)
from kernels.measure.train.predict import predict

_INT, _FLOAT, _BOOL = INT_COLUMNS, FLOAT_COLUMNS, BOOL_COLUMNS


def typed_row(raw: dict[str, Any]) -> dict[str, Any]:
    """A CSV or database row with its numbers and booleans parsed (empty cells: None)."""
    out: dict[str, Any] = {}
    for c in TRAIN_COLUMNS:
        v = raw.get(c)
        if v is None or v == "":
            out[c] = None if c in _INT + _FLOAT + _BOOL else COLUMN_DEFAULTS.get(c, "")
        elif c in _INT:
            out[c] = int(float(v))
        elif c in _FLOAT:
            out[c] = float(v)
        elif c in _BOOL:
            out[c] = v if isinstance(v, bool) else str(v).strip().lower() in ("true", "1")
        else:
            out[c] = str(v)
    return out


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a training-step CSV (this module's TRAIN_COLUMNS), typed. A file without the
    columns raises ValueError naming the missing ones; a file written before the adapter
    columns reads as full training (config.COLUMN_DEFAULTS)."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in ("model", "seq_len", "attention", "precision", "checkpointing",
                               "status", "peak_bytes") if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: not a training-step CSV (missing columns "
                             f"{', '.join(missing)})")
        return [typed_row(r) for r in reader]


class TrainStore:
    """Training-step runs in the attention points' SQLite file (kernels.measure.store's
    default_db_path), in tables of their own: ``train_runs`` and ``train_rows``."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        from kernels.measure.store import default_db_path

        self.path = Path(path) if path is not None else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kinds = {c: "INTEGER" if c in _INT + _BOOL else "REAL" if c in _FLOAT else "TEXT"
                 for c in TRAIN_COLUMNS}
        with self._connect() as con:
            con.executescript(
                "CREATE TABLE IF NOT EXISTS train_runs (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                "started TEXT NOT NULL, gpu TEXT NOT NULL DEFAULT '', label TEXT NOT NULL "
                "DEFAULT '');\n"
                "CREATE TABLE IF NOT EXISTS train_rows (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                "run_id INTEGER NOT NULL REFERENCES train_runs(id) ON DELETE CASCADE, "
                + ", ".join(f"{c} {k}" for c, k in kinds.items()) + ");")
            have = {r["name"] for r in con.execute("PRAGMA table_info(train_rows)")}
            for c, k in kinds.items():  # a file made before a column was added (issue 34's)
                if c not in have:
                    con.execute(f"ALTER TABLE train_rows ADD COLUMN {c} {k}")

    @contextlib.contextmanager
    def _connect(self) -> Any:
        con = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA foreign_keys=ON")
            con.row_factory = sqlite3.Row
            yield con
        finally:
            con.close()

    def new_run(self, *, gpu: str = "", label: str = "") -> int:
        with self._connect() as con:
            cur = con.execute("INSERT INTO train_runs (started, gpu, label) VALUES (?, ?, ?)",
                              (now_utc(), gpu, label[:200]))
            return int(cur.lastrowid)

    def add_row(self, run_id: int, row: dict[str, Any]) -> None:
        t = typed_row(row)
        vals = [int(t[c]) if c in _BOOL and t[c] is not None else t[c] for c in TRAIN_COLUMNS]
        with self._connect() as con:
            con.execute(f"INSERT INTO train_rows (run_id, {', '.join(TRAIN_COLUMNS)}) VALUES "
                        f"(?, {', '.join('?' * len(TRAIN_COLUMNS))})", [run_id, *vals])

    def runs(self) -> list[dict[str, Any]]:
        with self._connect() as con:
            cur = con.execute("SELECT train_runs.*, (SELECT COUNT(*) FROM train_rows WHERE "
                              "run_id = train_runs.id) AS n FROM train_runs ORDER BY id DESC")
            return [dict(r) for r in cur]

    def rows(self, run_id: int) -> list[dict[str, Any]]:
        with self._connect() as con:
            cur = con.execute(f"SELECT {', '.join(TRAIN_COLUMNS)} FROM train_rows WHERE "
                              "run_id = ? ORDER BY id", (run_id,))
            return [typed_row(dict(r)) for r in cur]



def csv_writer(fh: IO[str]) -> Any:
    """A CSV writer as the rows are written (CRLF line ends)."""
    return csv.writer(fh, lineterminator="\r\n")


def write_row(writer: Any, row: dict[str, Any]) -> None:
    """One row in TRAIN_COLUMNS order, formula-like text neutralised (model_common.cell)."""
    writer.writerow([cell(row[c]) for c in TRAIN_COLUMNS])


def repredict(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> int:
    """Rewrite a training-step CSV's predictions from the current calc; returns the rows."""
    rows = read_rows(src)
    for r in rows:
        if r["model"] not in train_models.MODELS:
            continue
        cfg = TrainConfig.from_row({**r, "layers": None})
        d = train_models.hf_config(cfg.model, r["layers"])
        peak, before, _ = predict(cfg, d)
        r["predicted_peak_bytes"], r["predicted_before_bytes"] = peak, before
        r["peak_rel_error"] = ((peak - r["peak_bytes"]) / r["peak_bytes"]
                               if peak is not None and r["peak_bytes"] else None)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", newline="") as fh:
        w = csv_writer(fh)
        w.writerow(TRAIN_COLUMNS)
        for r in rows:
            write_row(w, r)
    return len(rows)
