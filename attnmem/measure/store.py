"""Results that last: an embedded SQLite store of measurement runs, and the CSV validator.

No torch here (the page and the tests import it on any machine). Stdlib ``sqlite3`` in WAL
mode, one transaction per row: a crash mid-run loses no finished row, and several browser
sessions (or the command line) may read while one writes.

Where: ``ATTNMEM_DB`` if set, else ``$XDG_DATA_HOME/attention-memory/results.sqlite``
(``~/.local/share/...`` when XDG_DATA_HOME is unset) -- never inside the repository.

Tables:
- ``runs``: id, started (ISO UTC), gpu_name, driver, torch_version, triton_version, label, source
  ('measured' | 'upload' | 'reference').
- ``rows``: run_id plus every column of ``attnmem.measure.schema.COLUMNS``.

CSV upload (``validate_csv``): required columns, types, value ranges, a row limit and a byte
limit, implementation names from ``attnmem.measure.registry.NAMES``; on any problem it returns clear
messages and nothing is written. Cells that a spreadsheet would run as a formula (starting with
``= + - @``, or a tab/CR) are neutralised on export (``csv_text``) with a leading apostrophe
(OWASP "CSV injection"); ``neutralise`` is the project's one copy of that rule (the command
line, the pages' downloads and the benchmark's CSV use it too).
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from attnmem.measure import registry
from attnmem.measure.schema import COLUMNS, DTYPES, STATUSES, canonical_dtype

__all__ = ["COLUMNS", "DTYPES", "FORMULA_START", "MAX_UPLOAD_BYTES", "MAX_UPLOAD_ROWS",
           "REQUIRED_COLS", "STATUSES", "ResultStore", "Run", "Validation",
           "attach_predictions", "connect", "csv_text", "data_dir", "default_db_path", "neutralise",
           "read_csv_rows", "validate_csv"]

INT_COLS = ("batch", "heads", "kv_heads", "seq_len", "head_dim", "peak_extra_bytes",
            "reserved_bytes", "reserved_extra_bytes", "before_bytes", "predicted_bytes")
FLOAT_COLS = ("median_ms", "tflops", "rel_error", "wall_s")
BOOL_COLS = ("causal", "backward")
TEXT_COLS = ("impl", "dtype", "status", "message", "gpu_name", "driver", "torch_version",
             "triton_version", "timestamp")
#: Columns an uploaded CSV must have; the rest may be absent (filled with empty values).
REQUIRED_COLS = ("impl", "batch", "heads", "seq_len", "head_dim", "dtype", "causal",
                 "backward", "status", "peak_extra_bytes")
MAX_UPLOAD_ROWS = 100_000
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
MAX_TEXT_CHARS = 2_000
#: Bounds per integer column (inclusive), a sanity check on uploads.
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "batch": (1, 1_000_000), "heads": (1, 100_000), "kv_heads": (1, 100_000),
    "seq_len": (1, 100_000_000), "head_dim": (1, 65_536),
    "peak_extra_bytes": (0, 10**15), "reserved_bytes": (0, 10**15),
    "reserved_extra_bytes": (-(10**15), 10**15), "before_bytes": (0, 10**15),
    "predicted_bytes": (0, 10**18),
}

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started TEXT NOT NULL,
    gpu_name TEXT NOT NULL DEFAULT '',
    driver TEXT NOT NULL DEFAULT '',
    torch_version TEXT NOT NULL DEFAULT '',
    triton_version TEXT NOT NULL DEFAULT '',
    label TEXT NOT NULL DEFAULT '',
    source TEXT NOT NULL DEFAULT 'measured'
);
CREATE TABLE IF NOT EXISTS rows (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    {", ".join(f"{c} {'INTEGER' if c in INT_COLS + BOOL_COLS else 'REAL' if c in FLOAT_COLS else 'TEXT'}" for c in COLUMNS)}
);
CREATE INDEX IF NOT EXISTS rows_run ON rows(run_id);
"""


def data_dir() -> Path:
    """The user's data directory for this app ($XDG_DATA_HOME or ~/.local/share)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "attention-memory"


def default_db_path() -> Path:
    env = os.environ.get("ATTNMEM_DB")
    return Path(env) if env else data_dir() / "results.sqlite"


@dataclass(frozen=True)
class Run:
    """One stored run (a sweep, an upload or the bundled reference)."""

    id: int
    started: str
    gpu_name: str
    driver: str
    torch_version: str
    triton_version: str
    label: str
    source: str
    n_rows: int = 0


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextmanager
def connect(path: str | os.PathLike[str]) -> Iterator[sqlite3.Connection]:
    """A connection to the results database, opened the one way every table's writer and
    reader opens it (ResultStore here, attnmem.measure.run_common.RowStore for the inference
    and training rows in the same file): autocommit (one transaction per statement, so each
    row is kept as it is measured), a 30 s wait for a lock, WAL (readers never block the
    writer), synchronous=NORMAL (in WAL mode a commit survives a crash of the process; a power
    loss may undo the last commits, never corrupt the file: sqlite.org/pragma.html#pragma_synchronous),
    foreign keys on (a run's rows go with it), rows by column name."""
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("PRAGMA foreign_keys=ON")
        con.row_factory = sqlite3.Row
        yield con
    finally:
        con.close()


class ResultStore:
    """SQLite results store. Cheap to create; every method opens its own connection."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as con:
            con.executescript(_SCHEMA)

    def _connect(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return connect(self.path)

    # -- writing ---------------------------------------------------------------------------

    def new_run(self, *, gpu_name: str = "", driver: str = "", torch_version: str = "",
                triton_version: str = "", label: str = "", source: str = "measured",
                started: str | None = None) -> int:
        with self._connect() as con:
            cur = con.execute(
                "INSERT INTO runs (started, gpu_name, driver, torch_version, triton_version, "
                "label, source) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (started or _now(), gpu_name, driver, torch_version, triton_version,
                 label[:200], source))
            return int(cur.lastrowid)

    def add_row(self, run_id: int, row: Mapping[str, Any]) -> None:
        """Insert one result row in its own transaction (committed when this returns)."""
        values = [_db_value(c, row.get(c)) for c in COLUMNS]
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            con.execute(f"INSERT INTO rows (run_id, {', '.join(COLUMNS)}) VALUES "
                        f"(?, {', '.join('?' * len(COLUMNS))})", [run_id, *values])
            con.execute("COMMIT")

    def add_rows(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> int:
        """Insert many rows in one transaction (uploads: all or nothing)."""
        data = [[run_id, *(_db_value(c, r.get(c)) for c in COLUMNS)] for r in rows]
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                con.executemany(f"INSERT INTO rows (run_id, {', '.join(COLUMNS)}) VALUES "
                                f"(?, {', '.join('?' * len(COLUMNS))})", data)
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL)
                    con.execute("ROLLBACK")
                raise
        return len(data)

    def import_rows(self, rows: Sequence[Mapping[str, Any]], *, label: str,
                    source: str = "upload") -> int:
        """A new run holding ``rows`` (validated already), written in one transaction."""
        first = rows[0] if rows else {}
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                cur = con.execute(
                    "INSERT INTO runs (started, gpu_name, driver, torch_version, triton_version, "
                    "label, source) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (str(first.get("timestamp") or _now()), str(first.get("gpu_name") or ""),
                     str(first.get("driver") or ""), str(first.get("torch_version") or ""),
                     str(first.get("triton_version") or ""), label[:200], source))
                run_id = int(cur.lastrowid)
                con.executemany(
                    f"INSERT INTO rows (run_id, {', '.join(COLUMNS)}) VALUES "
                    f"(?, {', '.join('?' * len(COLUMNS))})",
                    [[run_id, *(_db_value(c, r.get(c)) for c in COLUMNS)] for r in rows])
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL)
                    con.execute("ROLLBACK")
                raise
        return run_id

    def delete_run(self, run_id: int) -> bool:
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            con.execute("DELETE FROM rows WHERE run_id = ?", (run_id,))
            n = con.execute("DELETE FROM runs WHERE id = ?", (run_id,)).rowcount
            con.execute("COMMIT")
        return n > 0

    # -- reading ---------------------------------------------------------------------------

    def runs(self) -> list[Run]:
        with self._connect() as con:
            cur = con.execute(
                "SELECT runs.*, (SELECT COUNT(*) FROM rows WHERE rows.run_id = runs.id) AS n "
                "FROM runs ORDER BY runs.id DESC")
            return [Run(r["id"], r["started"], r["gpu_name"], r["driver"], r["torch_version"],
                        r["triton_version"], r["label"], r["source"], r["n"]) for r in cur]

    def run(self, run_id: int) -> Run | None:
        return next((r for r in self.runs() if r.id == run_id), None)

    def rows(self, run_id: int) -> list[dict[str, Any]]:
        with self._connect() as con:
            cur = con.execute(f"SELECT {', '.join(COLUMNS)} FROM rows WHERE run_id = ? "
                              "ORDER BY id", (run_id,))
            return [_py_row(r) for r in cur]

    def dataframe(self, run_id: int) -> Any:
        import pandas as pd

        return pd.DataFrame(self.rows(run_id), columns=list(COLUMNS))

    def compare(self, run_a: int, run_b: int) -> Any:
        """Rows of two runs side by side on the point (impl, shape, dtype, causal, mode)."""
        import pandas as pd

        key = ["impl", "batch", "heads", "kv_heads", "seq_len", "head_dim", "dtype", "causal",
               "backward"]
        vals = ["status", "median_ms", "tflops", "peak_extra_bytes", "predicted_bytes"]
        a = self.dataframe(run_a)[key + vals]
        b = self.dataframe(run_b)[key + vals]
        m = pd.merge(a, b, on=key, how="outer", suffixes=("_a", "_b"))
        m["peak_ratio_b_over_a"] = m["peak_extra_bytes_b"] / m["peak_extra_bytes_a"]
        m["time_ratio_b_over_a"] = m["median_ms_b"] / m["median_ms_a"]
        return m

    def export_csv(self, run_id: int) -> str:
        return csv_text(self.rows(run_id))


# --------------------------------------------------------------------------------------------
# Value conversion.
# --------------------------------------------------------------------------------------------


def _db_value(col: str, v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v == "":
        return None if col not in TEXT_COLS else ""
    if col in BOOL_COLS:
        return int(_parse_bool(v))
    if col in INT_COLS:
        return int(v)
    if col in FLOAT_COLS:
        return float(v)
    return str(v)[:MAX_TEXT_CHARS]


def _py_row(r: sqlite3.Row) -> dict[str, Any]:
    d = dict(r)
    for c in BOOL_COLS:
        d[c] = bool(d[c]) if d[c] is not None else None
    return d


def _parse_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    text = str(v).strip().lower()
    if text in ("true", "1", "yes", "fwd+bwd", "causal"):
        return True
    if text in ("false", "0", "no", "fwd", ""):
        return False
    raise ValueError(f"expected True or False, got {str(v)[:40]!r}")


# --------------------------------------------------------------------------------------------
# CSV export (formula-safe) and upload validation.
# --------------------------------------------------------------------------------------------

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutralise(cell: Any) -> Any:
    """Prefix a text cell that a spreadsheet would treat as a formula with an apostrophe.

    Numbers are left alone (a negative rel_error stays a number); only strings are touched.
    """
    if isinstance(cell, str) and cell.startswith(FORMULA_START):
        return "'" + cell
    return cell


def csv_text(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    """CSV of result rows with formula-like text cells neutralised and line breaks quoted."""
    buf = io.StringIO()
    # CRLF row ends (RFC 4180) make the csv module quote every cell that holds a CR or LF:
    # unquoted, a spreadsheet would start a new row there (and the text after it could be a
    # formula in a cell of its own).
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(["" if r.get(c) is None else neutralise(r.get(c)) for c in columns])
    return buf.getvalue()


@dataclass(frozen=True)
class Validation:
    """Outcome of validate_csv: rows only when ok; errors say what and where."""

    ok: bool
    rows: tuple[dict[str, Any], ...]
    errors: tuple[str, ...]


def _impl_names() -> tuple[str, ...]:
    """Names a result row may carry: the registry's (what can be measured), then any other name
    calc models."""
    from attnmem.calc import IMPLEMENTATIONS

    return tuple(dict.fromkeys((*registry.NAMES, *IMPLEMENTATIONS)))


def validate_csv(data: bytes | str, *, max_rows: int = MAX_UPLOAD_ROWS,
                 max_bytes: int = MAX_UPLOAD_BYTES, max_errors: int = 20) -> Validation:
    """Check an uploaded results CSV; return its rows (typed) only if every check passes.

    Checks: size ≤ max_bytes, UTF-8 text, a header with every REQUIRED_COLS column, at most
    max_rows rows, each value of the right type and range, impl a registry (or calc) name,
    dtype fp16/bf16/fp32, status one of STATUSES, and ok rows from a GPU carry a peak.
    """
    size = len(data)
    if size > max_bytes:
        return Validation(False, (), (f"file is {size:,} bytes; the limit is {max_bytes:,} bytes",))
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            return Validation(False, (), (f"file is not UTF-8 text ({exc.reason} at byte {exc.start})",))
    else:
        text = data.removeprefix("\ufeff")
    if "\x00" in text:
        return Validation(False, (), ("file contains NUL bytes: not a CSV text file",))
    try:
        reader = csv.DictReader(io.StringIO(text))
        header = [h.strip() for h in (reader.fieldnames or [])]
    except csv.Error as exc:
        return Validation(False, (), (f"not a readable CSV: {exc}",))
    if not header:
        return Validation(False, (), ("file is empty: expected a header row with columns "
                                      + ", ".join(REQUIRED_COLS),))
    missing = [c for c in REQUIRED_COLS if c not in header]
    if missing:
        return Validation(False, (), (f"missing required column(s): {', '.join(missing)} "
                                      f"(found: {', '.join(h[:30] for h in header[:30])})",))
    impls = _impl_names()
    errors: list[str] = []
    rows: list[dict[str, Any]] = []
    try:
        for i, raw in enumerate(reader, start=2):  # line 1 is the header
            if len(rows) >= max_rows:
                errors.append(f"more than {max_rows:,} data rows: the limit is {max_rows:,}")
                break
            raw = {(k or "").strip(): v for k, v in raw.items()}
            if None in raw.values() and any(v is None for k, v in raw.items() if k in REQUIRED_COLS):
                errors.append(f"line {i}: too few fields")
                continue
            row, errs = _check_row(raw, impls)
            errors.extend(f"line {i}: {e}" for e in errs)
            if len(errors) >= max_errors:
                errors.append("(stopped after the first errors)")
                break
            rows.append(row)
    except csv.Error as exc:
        errors.append(f"not a readable CSV: {exc}")
    if not errors and not rows:
        errors.append("no data rows under the header")
    if errors:
        return Validation(False, (), tuple(errors))
    return Validation(True, tuple(rows), ())


def _check_row(raw: Mapping[str, Any], impls: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    errs: list[str] = []
    row: dict[str, Any] = {}
    for c in COLUMNS:
        v = raw.get(c)
        v = "" if v is None else str(v).strip()
        v = v[1:] if v.startswith("'") and v[1:2] in FORMULA_START else v  # our own export
        if c in INT_COLS:
            if v == "":
                if c in REQUIRED_COLS and c != "peak_extra_bytes":
                    errs.append(f"{c} is empty")
                row[c] = None
                continue
            try:
                f = float(v)
                if not math.isfinite(f) or f != int(f):
                    raise ValueError
                n = int(f) if abs(f) < 2**53 else int(v)
            except (ValueError, OverflowError):
                errs.append(f"{c} must be a whole number, got {v[:30]!r}")
                continue
            lo, hi = INT_BOUNDS[c]
            if not lo <= n <= hi:
                errs.append(f"{c} must be from {lo:,} to {hi:,}, got {n:,}")
            row[c] = n
        elif c in FLOAT_COLS:
            if v == "":
                row[c] = None
                continue
            try:
                f = float(v)
            except ValueError:
                errs.append(f"{c} must be a number, got {v[:30]!r}")
                continue
            if math.isnan(f):
                row[c] = None
            elif not math.isfinite(f) or (c != "rel_error" and f < 0) or abs(f) > 1e12:
                errs.append(f"{c} must be a finite number{'' if c == 'rel_error' else ' ≥ 0'}, got {v[:30]!r}")
            else:
                row[c] = f
        elif c in BOOL_COLS:
            try:
                row[c] = _parse_bool(v)
            except ValueError as exc:
                errs.append(f"{c}: {exc}")
        else:
            if len(v) > MAX_TEXT_CHARS:
                errs.append(f"{c} is longer than {MAX_TEXT_CHARS:,} characters")
                continue
            row[c] = v
    if row.get("impl") is not None and row["impl"] not in impls:
        errs.append(f"impl must be one of {', '.join(impls)}, got {str(row['impl'])[:30]!r}")
    if "dtype" in row:
        try:
            row["dtype"] = canonical_dtype(row["dtype"])
        except ValueError:
            errs.append(f"dtype must be one of {', '.join(DTYPES)}, got {row['dtype'][:30]!r}")
    if row.get("status") not in STATUSES:
        errs.append(f"status must be one of {', '.join(STATUSES)}, got {str(row.get('status'))[:30]!r}")
    if row.get("kv_heads") is None and row.get("heads") is not None:
        row["kv_heads"] = row["heads"]
    h, hkv = row.get("heads"), row.get("kv_heads")
    if isinstance(h, int) and isinstance(hkv, int) and hkv > 0 and h % hkv:
        errs.append(f"heads ({h}) must be a multiple of kv_heads ({hkv})")
    if (row.get("status") == "ok" and row.get("peak_extra_bytes") is None
            and row.get("gpu_name") not in ("cpu", "")):
        errs.append("an 'ok' row measured on a GPU needs peak_extra_bytes")
    return row, errs


def read_csv_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a results CSV on disk (the bundled reference), validated; ValueError if bad."""
    v = validate_csv(Path(path).read_bytes(), max_bytes=10**9, max_rows=10**7)
    if not v.ok:
        raise ValueError(f"{path}: " + "; ".join(v.errors[:5]))
    return list(v.rows)


def cached_free_bytes(row: Any) -> int:
    """What the caching allocator held free just before a row's call: memory_reserved() before
    (``reserved_bytes - reserved_extra_bytes``) minus memory_allocated() before
    (``before_bytes``). Zero when the cache was really emptied (the harness's procedure); in a
    child serving many points a cuBLAS workspace can pin a freed segment (attnmem/measure/
    prewarm.py), and calc's peak model takes that state as ``cached_free_bytes``. Takes a row
    as a mapping or an object with those attributes; a missing value counts as 0."""
    def get(name: str) -> Any:
        return row.get(name) if isinstance(row, Mapping) else getattr(row, name, None)

    vals = [get(n) for n in ("reserved_bytes", "reserved_extra_bytes", "before_bytes")]
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in vals):
        return 0
    return max(0, int(vals[0] - vals[1] - vals[2]))


def attach_predictions(df: Any) -> Any:
    """A copy of a results DataFrame with the current model's predictions and error beside each
    measured row: ``model_bytes`` (attnmem.calc.attention_peak_bytes now, which may differ from the
    ``predicted_bytes`` stored when the row was measured), given the allocator's free cache
    before the call (`cached_free_bytes`), ``model_error`` = (model - measured) / measured, and
    ``model_reserved_bytes`` (attnmem.calc.attention_reserved_bytes: the growth of memory_reserved(),
    None where calc does not predict it). Pure (pandas and calc only)."""
    from attnmem.calc import attention_peak_bytes, attention_reserved_bytes

    out = df.copy()
    preds: list[Any] = []
    errs: list[Any] = []
    reserved: list[Any] = []
    for r in out.itertuples(index=False):
        try:
            kv = None if r.kv_heads is None or (isinstance(r.kv_heads, float) and math.isnan(r.kv_heads)) else int(r.kv_heads)
            args = (r.impl, int(r.batch), int(r.heads), int(r.seq_len), int(r.head_dim), r.dtype,
                    bool(r.causal), bool(r.backward))
            free = cached_free_bytes(r)
            p = attention_peak_bytes(*args, kv_heads=kv, cached_free_bytes=free)
            q = attention_reserved_bytes(*args, kv_heads=kv, cached_free_bytes=free)
        except (ValueError, TypeError, KeyError):
            p = q = None
        preds.append(p)
        reserved.append(q)
        m = r.peak_extra_bytes
        ok = p is not None and m is not None and not (isinstance(m, float) and math.isnan(m)) and m > 0
        errs.append((p - m) / m if ok else None)
    out["model_bytes"] = preds
    out["model_error"] = errs
    out["model_reserved_bytes"] = reserved
    return out
