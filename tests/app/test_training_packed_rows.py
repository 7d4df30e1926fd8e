"""The packed (padding-free) training steps bundled in data/training_steps_h200.csv: the page
re-predicts them with their packed lengths, and calc gets the packed row's extra bytes over
its dense twin (the same model and tokens in one dense row) to within a few KiB."""

from __future__ import annotations

import pandas as pd
import pytest

import attnmem.pages.ui.training as tr

KEYS = ["model", "method", "batch", "seq_len", "attention", "precision", "checkpointing"]


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    measured = tr.read_measured()
    if measured.empty or "packed_lengths" not in measured.columns:
        pytest.skip("no packed rows bundled")
    # the packed rows and the dense twins measured between them (one run, one process):
    # dense rows of other runs differ by their allocator state
    stamps = pd.to_datetime(measured["timestamp"], errors="coerce", utc=True)
    packed = measured["packed_lengths"].notna() & (measured["packed_lengths"] != "")
    run = (stamps >= stamps[packed].min()) & (stamps <= stamps[packed].max())
    return tr.predicted_rows(measured[run])


def test_packed_rows_are_predicted_with_their_lengths(rows: pd.DataFrame) -> None:
    packed = rows[rows["packed"].notna()]
    assert len(packed) >= 20
    assert packed["predicted peak"].notna().all()
    assert packed["peak error"].abs().max() <= 0.001
    assert packed["before error"].abs().max() <= 0.005  # measured: 0.27% at worst
    # the lengths reach calc: a pack's sum is its seq_len, and its prediction is not the
    # dense row's
    for _, r in packed.iterrows():
        assert sum(int(x) for x in r["packed"].split("+")) == r["seq_len"]
    twins = packed.merge(rows[rows["packed"].isna()], on=KEYS, suffixes=("", " dense"))
    assert len(twins) >= 20
    assert (twins["predicted peak"] != twins["predicted peak dense"]).all()


def test_packed_minus_dense_is_predicted(rows: pd.DataFrame) -> None:
    """What the step adds to its before-step bytes (peak - before) in a packed row minus its
    dense twin's (the packed mask's index tensors)
    against calc's difference: within 4 KiB at every pair. The before-step bytes themselves
    carry the process's state from the row measured before (one dense twin on the H200,
    2026-12-02, held exactly 1 MiB more than the other 23), so the peaks' plain difference is
    checked only where that state agrees."""
    packed = rows[rows["packed"].notna()]
    twins = packed.merge(rows[rows["packed"].isna()], on=KEYS, suffixes=("", " dense"))

    def step(kind: str, suffix: str) -> pd.Series:
        return twins[f"{kind} peak{suffix}"] - twins[f"{kind} before{suffix}"]

    measured = step("measured", "") - step("measured", " dense")
    predicted = step("predicted", "") - step("predicted", " dense")
    assert (predicted - measured).abs().max() <= 4096, pd.DataFrame(
        {"measured": measured, "predicted": predicted})
    before_m = twins["measured before"] - twins["measured before dense"]
    before_p = twins["predicted before"] - twins["predicted before dense"]
    same_state = (before_m - before_p).abs() <= 4096
    assert same_state.mean() >= 0.9  # the leftover state is the exception
    assert (before_p > 0).all()  # a packed row's extra inputs, counted before the step
    plain_m = twins["measured peak"] - twins["measured peak dense"]
    plain_p = twins["predicted peak"] - twins["predicted peak dense"]
    assert (plain_p - plain_m)[same_state].abs().max() <= 4096


def test_dense_lookups_skip_packed_rows(rows: pd.DataFrame) -> None:
    """shown_table writes a dash, never None, where a row is dense."""
    shown = tr.shown_table(rows.head(3).assign(packed=None), "GB")
    assert (shown["packed"] == "—").all()
