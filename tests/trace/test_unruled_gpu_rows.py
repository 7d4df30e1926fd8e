"""The bundled GPU rows of architectures outside calc's rules, re-predicted by today's trace.

data/inference_steps_unruled_h100.csv (38 generate() runs) and
data/training_steps_unruled_h100.csv (56 training steps) were measured on an H100 80GB with
transformers 5.17 (`python -m attnmem.measure --infer|--train --plan h200-unruled`); their
predictions came from the meta-device trace in the worker. Here the trace runs again, under the
transformers CI installs, for one row per architecture at the shortest length (the 8k prompts
and 4k steps of the hybrid take tens of seconds on two cores), and each must stay within the
issue's 2% of the measured peak. The rows' own measured columns are never recomputed.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnmem.measure.infer import store as infer_store  # noqa: E402
from attnmem.measure.train import store as train_store  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data"
TARGET = 0.02
#: The architectures issue 42 asks for (every one must have rows in both files but gpt-oss's
#: training, which calc's rules already answer).
FAMILIES = ("olmo2", "granite", "smollm3", "glm4.5-air", "minimax-m2", "llama4-scout",
            "qwen3-next", "gpt-oss")


def _rows(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="") as fh:
        return list(csv.DictReader(fh))


def _subset(rows: list[dict[str, str]], length_key: str, length: str) -> list[dict[str, str]]:
    return [r for r in rows if r["status"] == "ok" and r[length_key] == length]


def _first_per_model(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    seen: dict[str, dict[str, str]] = {}
    for r in rows:
        seen.setdefault(r["model"], r)
    return list(seen.values())


def _write(rows: list[dict[str, str]], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_bundled_rows_cover_the_families_and_hold_the_target():
    inf = _rows("inference_steps_unruled_h100.csv")
    train = _rows("training_steps_unruled_h100.csv")
    for fam in FAMILIES:
        assert any(r["model"].startswith(fam) for r in inf), fam
        if fam != "gpt-oss":
            assert any(r["model"].startswith(fam) for r in train), fam
    for r in inf + train:
        assert "meta-device trace" in r["message"], r["model"]
        if r["status"] == "ok":
            assert abs(float(r["peak_rel_error"])) <= TARGET, (r["model"], r["peak_rel_error"])
    # The one row that did not run: GLM-4.5-Air's eager 8k prompt ran out of the 80 GB card.
    # At the failure 52.83 GiB were allocated and 24.00 GiB asked for (the fp32 softmax of
    # 96 heads x 8,192^2), 76.83 GiB in all, against the trace's 76.88 GiB.
    oom = [r for r in inf if r["status"] == "oom"]
    assert [(r["model"], r["attention"], r["prompt_len"]) for r in oom] == [
        ("glm4.5-air-4l", "eager", "8192")]
    asked = (52.83 + 24.00) * 2**30
    assert abs(float(oom[0]["predicted_peak_bytes"]) / asked - 1) < 0.002


def test_inference_rows_re_predicted_by_todays_trace(tmp_path):
    rows = _first_per_model(_subset(_rows("inference_steps_unruled_h100.csv"),
                                    "prompt_len", "1000"))
    assert len(rows) == 8
    _write(rows, tmp_path / "in.csv")
    infer_store.repredict(tmp_path / "in.csv", tmp_path / "out.csv")
    for r in _rows_at(tmp_path / "out.csv"):
        err = float(r["peak_rel_error"])
        assert abs(err) <= TARGET, (r["model"], r["attention"], err)


def test_training_rows_re_predicted_by_todays_trace(tmp_path):
    rows = [r for r in _subset(_rows("training_steps_unruled_h100.csv"), "seq_len", "1000")
            if r["checkpointing"] == "True" and r["attention"] == "sdpa_flash"]
    assert len(rows) == 7
    _write(rows, tmp_path / "in.csv")
    train_store.repredict(tmp_path / "in.csv", tmp_path / "out.csv")
    for r in _rows_at(tmp_path / "out.csv"):
        err = float(r["peak_rel_error"])
        assert abs(err) <= TARGET, (r["model"], r["attention"], err)


def _rows_at(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        out = list(csv.DictReader(fh))
    assert out and all(r["predicted_peak_bytes"] not in ("", "nan") for r in out)
    return out
