"""Inference results that last: typed rows from a CSV (``read_rows``, what the pages use), the
CSV writer (``write_rows``), the SQLite store (``InferStore``, in the attention points' file)
and ``repredict`` (a CSV's predictions from the current calc).

Stdlib only at import (no torch, no transformers, no calc until ``repredict``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from attnmem.measure import infer_models, run_common
from attnmem.measure.infer.config import (
    BOOL_COLUMNS,
    FLOAT_COLUMNS,
    INFER_COLUMNS,
    INT_COLUMNS,
    InferConfig,
)
from attnmem.measure.infer.predict import predict, rel_error

_INT, _FLOAT, _BOOL = INT_COLUMNS, FLOAT_COLUMNS, BOOL_COLUMNS


def typed_row(raw: dict[str, Any]) -> dict[str, Any]:
    """A CSV or database row with its numbers and booleans parsed (empty cells: None)."""
    return run_common.typed_row(raw, INFER_COLUMNS, _INT, _FLOAT, _BOOL)


def write_rows(fh: IO[str], rows: Iterable[dict[str, Any]], *, header: bool = True) -> None:
    """CSV rows in INFER_COLUMNS order, formula-like text neutralised (store.neutralise)."""
    w = run_common.csv_writer(fh)
    if header:
        w.writerow(INFER_COLUMNS)
    for r in rows:
        run_common.write_cells(w, r, INFER_COLUMNS)


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of an inference CSV (INFER_COLUMNS), typed. A file without the key columns raises
    ValueError naming the missing ones."""
    return run_common.read_typed_csv(
        path, ("model", "prompt_len", "new_tokens", "attention", "cache", "status",
               "peak_bytes"), "an inference CSV", typed_row)


class InferStore(run_common.RowStore):
    """Inference runs in the attention points' SQLite file (attnmem.measure.store's
    default_db_path), in tables of their own: ``infer_runs`` and ``infer_rows``."""

    prefix, columns = "infer", INFER_COLUMNS
    ints, floats, bools = _INT, _FLOAT, _BOOL

    def typed(self, raw: dict[str, Any]) -> dict[str, Any]:
        return typed_row(raw)


def repredict(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> int:
    """Rewrite an inference CSV's predictions from the current calc; returns the rows."""
    rows = read_rows(src)
    for r in rows:
        if r["model"] not in infer_models.MODELS:
            continue
        cfg = InferConfig.from_row(r)
        predicted, _ = predict(cfg, infer_models.hf_config(cfg.model, r["layers"]))
        r.update(predicted)
        r["peak_rel_error"] = rel_error(r["predicted_peak_bytes"], r["peak_bytes"])
        r["prefill_rel_error"] = rel_error(r["predicted_prefill_peak_bytes"],
                                           r["prefill_peak_bytes"])
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", newline="") as fh:
        write_rows(fh, rows)
    return len(rows)
