"""The one-rank ring measurements read back: the CSV that ``python -m
attnmem.measure.ring.one_rank`` writes (data/ring_one_rank_h200.csv is the bundled H200 run),
as the Many GPUs page shows it. pandas only (no torch): the page reads it without a GPU.

Each row is one rank of a ring simulated on one GPU (attnmem/measure/ring/simulate.py): peak =
max_memory_allocated during the call minus memory_allocated before, beside
attnmem.calc.context_parallel's prediction for that rank.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

DATA = Path(__file__).resolve().parents[3] / "data" / "ring_one_rank_h200.csv"
#: The columns a one-rank CSV must have (one_rank.FIELDS holds more).
COLUMNS = {"seq_len", "world_size", "rank", "pass", "status", "peak_bytes", "predicted_bytes",
           "heads", "kv_heads", "head_dim", "dtype", "batch", "causal"}


def read_ring_measurements(path: Path = DATA) -> pd.DataFrame | None:
    """The one-rank measurements (attnmem.measure.ring.one_rank's CSV), rows with status ok
    and numbers where numbers belong; None when the file is absent or not that CSV."""
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError):
        return None
    if not COLUMNS <= set(df.columns):
        return None
    df = df[df["status"].astype(str) == "ok"].copy()
    for col in ("seq_len", "world_size", "rank", "peak_bytes", "predicted_bytes", "heads",
                "kv_heads", "head_dim", "batch"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = df.dropna(subset=["seq_len", "world_size", "rank", "peak_bytes", "predicted_bytes"])
    df = df[df["peak_bytes"] > 0]
    for col in ("seq_len", "world_size", "rank", "peak_bytes", "predicted_bytes"):
        df[col] = df[col].astype("int64")
    df["error_pct"] = 100.0 * (df["predicted_bytes"] - df["peak_bytes"]) / df["peak_bytes"]
    return df.reset_index(drop=True)


def rows_of_shape(measured: pd.DataFrame, heads: int, kv_heads: int, head_dim: int, dtype: str,
                  pas: str, seq_len: int) -> pd.DataFrame:
    """The measured ranks of one shape and pass ("fwd" or "fwd+bwd") at total context seq_len."""
    return measured[(measured["heads"] == heads) & (measured["kv_heads"] == kv_heads)
                    & (measured["head_dim"] == head_dim)
                    & (measured["dtype"].astype(str) == dtype)
                    & (measured["pass"].astype(str) == pas) & (measured["seq_len"] == seq_len)]


def worst_rank_peaks(rows: pd.DataFrame) -> pd.DataFrame:
    """The largest measured extra peak over the ranks of each ring size: columns world_size,
    peak_bytes."""
    return rows.groupby("world_size", as_index=False)["peak_bytes"].max()


def with_link_speed(measured: pd.DataFrame) -> pd.DataFrame:
    """A copy with link_GBps_to_hide_kv where the CSV has the step timings: K/V bytes of one
    step ÷ the step's measured local forward time, the link speed at which sending the next
    K/V block takes as long as the step (in GB/s, to 1 decimal)."""
    table = measured.copy()
    if {"kv_bytes_per_step", "fwd_step_ms"} <= set(table.columns):
        kv = pd.to_numeric(table["kv_bytes_per_step"], errors="coerce")
        ms = pd.to_numeric(table["fwd_step_ms"], errors="coerce")
        table["link_GBps_to_hide_kv"] = (kv / (ms * 1e-3) / 1e9).round(1)
    return table
