"""Training-step results that last: typed rows from a CSV (``read_rows``, what the pages use),
the CSV writer (``write_header``, ``write_row``), the SQLite store (``TrainStore``, in the
attention points' file) and ``repredict`` (a CSV's predictions from the current calc).

Stdlib only at import (no torch, no transformers, no calc until ``repredict``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from attnmem.measure import run_common, train_models
from attnmem.measure.train.config import (
    BOOL_COLUMNS,
    COLUMN_DEFAULTS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    LEVER_FLAGS,
    TRAIN_COLUMNS,
    TrainConfig,
)
from attnmem.measure.train.predict import predict

_INT, _FLOAT, _BOOL = INT_COLUMNS, FLOAT_COLUMNS, BOOL_COLUMNS


def typed_row(raw: dict[str, Any]) -> dict[str, Any]:
    """A CSV or database row with its numbers and booleans parsed (empty cells: None; a row
    from before the recipe columns: optimizer adamw and every lever False, what it ran)."""
    out = run_common.typed_row(raw, TRAIN_COLUMNS, _INT, _FLOAT, _BOOL, COLUMN_DEFAULTS)
    for f in LEVER_FLAGS:
        if out[f] is None:
            out[f] = False
    return out


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a training-step CSV (this module's TRAIN_COLUMNS), typed. A file without the
    columns raises ValueError naming the missing ones; a file written before the adapter
    columns reads as full training, one before the recipe columns as AdamW with no lever
    (config.COLUMN_DEFAULTS, typed_row)."""
    return run_common.read_typed_csv(
        path, ("model", "seq_len", "attention", "precision", "checkpointing", "status",
               "peak_bytes"), "a training-step CSV", typed_row)


class TrainStore(run_common.RowStore):
    """Training-step runs in the attention points' SQLite file (attnmem.measure.store's
    default_db_path), in tables of their own: ``train_runs`` and ``train_rows`` (a file made
    before a column was added gets it, issue 34's)."""

    prefix, columns, migrate = "train", TRAIN_COLUMNS, True
    ints, floats, bools = _INT, _FLOAT, _BOOL

    def typed(self, raw: dict[str, Any]) -> dict[str, Any]:
        return typed_row(raw)


csv_writer = run_common.csv_writer


def write_row(writer: Any, row: dict[str, Any]) -> None:
    """One row in TRAIN_COLUMNS order, formula-like text neutralised (model_common.cell)."""
    run_common.write_cells(writer, row, TRAIN_COLUMNS)


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
