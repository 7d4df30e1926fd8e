"""attnmem.measure.ring.results: the reader takes attnmem.measure.ring.one_rank's CSV (ok rows,
numbers typed, the error in %) and ignores anything else; the Many GPUs page's filters of it."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

from attnmem.measure.ring.one_rank import FIELDS
from attnmem.measure.ring.results import (
    read_ring_measurements,
    rows_of_shape,
    with_link_speed,
    worst_rank_peaks,
)


def test_reader_takes_the_script_csv_and_ignores_others(tmp_path: Path) -> None:

    path = tmp_path / "ring.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        base = dict(impl="triton", dtype="bf16", batch=1, heads=32, kv_heads=32, head_dim=128,
                    seq_len=16384, world_size=2, local_seq_len=8192, causal=True,
                    **{"pass": "fwd"})
        w.writerow({**base, "rank": 0, "status": "ok", "peak_bytes": 1000,
                    "predicted_bytes": 1010})
        w.writerow({**base, "rank": 1, "status": "oom", "peak_bytes": "",
                    "predicted_bytes": 2000})
    df = read_ring_measurements(path)
    assert len(df) == 1 and df["error_pct"].iloc[0] == pytest.approx(1.0)
    assert read_ring_measurements(tmp_path / "absent.csv") is None
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    assert read_ring_measurements(tmp_path / "other.csv") is None


def test_shape_filter_worst_rank_and_link_speed() -> None:
    df = pd.DataFrame([
        dict(heads=32, kv_heads=32, head_dim=128, dtype="bf16", seq_len=16384, world_size=2,
             rank=r, peak_bytes=p, kv_bytes_per_step=2_000_000, fwd_step_ms=2.0,
             **{"pass": "fwd"}) for r, p in ((0, 10), (1, 30))]
        + [dict(heads=32, kv_heads=8, head_dim=128, dtype="bf16", seq_len=16384, world_size=2,
                rank=0, peak_bytes=99, **{"pass": "fwd"})])
    rows = rows_of_shape(df, 32, 32, 128, "bf16", "fwd", 16384)
    assert len(rows) == 2
    assert worst_rank_peaks(rows).to_dict("records") == [{"world_size": 2, "peak_bytes": 30}]
    # 2 MB per step over 2 ms: 1 GB/s hides the send
    assert with_link_speed(rows)["link_GBps_to_hide_kv"].tolist() == [1.0, 1.0]
    assert "link_GBps_to_hide_kv" not in with_link_speed(df[["rank"]]).columns
