"""The bundled recipe rows (issue 43; data/training_recipes_h100.csv, an H100 80GB, 2026-12-07:
each optimizer, Liger, activation offloading, peft's prepare step, alone and combined), each
re-predicted by today's calc with the row's own levers: peak within 2% and the memory before
the step within 1%, the issue's targets."""

from __future__ import annotations

import csv
from pathlib import Path

from attnmem.measure.train.store import repredict

ROWS = Path(__file__).resolve().parents[2] / "data" / "training_recipes_h100.csv"


def test_every_measured_recipe_row_holds_its_targets(tmp_path):
    out = tmp_path / "re.csv"
    repredict(ROWS, out)
    with open(out, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["status"] == "ok"]
    levers = set()
    for r in rows:
        peak = float(r["predicted_peak_bytes"]) / float(r["peak_bytes"]) - 1
        before = float(r["predicted_before_bytes"]) / float(r["before_step_bytes"]) - 1
        what = (r["model"], r["adapter"], r["optimizer"], r["kbit_prepare"], r["liger"],
                r["offload_activations"], r["seq_len"])
        assert abs(peak) <= 0.02, (what, peak)
        assert abs(before) <= 0.01, (what, before)
        levers.add(r["optimizer"])
        levers.update(k for k in ("kbit_prepare", "liger", "offload_activations")
                      if r[k] == "True")
    assert levers >= {"adamw", "adamw_fused", "adamw_8bit", "paged_adamw_8bit", "adafactor",
                      "sgd", "kbit_prepare", "liger", "offload_activations"}
