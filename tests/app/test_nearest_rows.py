"""The "Measure on this GPU" section's nearest bundled rows (attnmem.pages.ui.measure_here.
nearest_rows, issue 45 item 5) are attnmem.measure.on_this_gpu.nearest_rows's rows in its
order, read from lists instead of one DataFrame lookup per row and key: checked on both
bundled tables (Training step's and Inference's, with their predictions) over lengths,
batches, attentions, models and the other inputs the pages pass."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

pytest.importorskip("streamlit")

from attnmem.measure import on_this_gpu as gpu_run  # noqa: E402
from attnmem.pages.ui import inference as inf  # noqa: E402
from attnmem.pages.ui import training as tr  # noqa: E402
from attnmem.pages.ui.measure_here import nearest_rows  # noqa: E402


@pytest.fixture(scope="module")
def training_rows() -> pd.DataFrame:
    return tr.bundled().compared


@pytest.fixture(scope="module")
def inference_rows() -> pd.DataFrame:
    return inf.compared_rows(inf.read_measured())


def _same(df: pd.DataFrame, **kw) -> None:
    want = gpu_run.nearest_rows(df, **kw)
    got = nearest_rows(df, **kw)
    assert list(got.index) == list(want.index), kw
    pd.testing.assert_frame_equal(got, want)


def test_training_rows_in_the_same_order(training_rows: pd.DataFrame) -> None:
    assert len(training_rows) > 100
    names = [[], ["llama3-8b-2l"], sorted(set(training_rows["model"]))[:2], ["not measured"]]
    for length, batch, attention, name, also in itertools.product(
            (1, 1000, 2048, 4096, 4097, 32768, 10**8), (1, 2, 3, 64), (None, "eager", "sdpa_flash"),
            names, ({}, {"precision": "bf16", "checkpointing": False, "method": "full"},
                    {"precision": "amp_bf16", "checkpointing": True, "method": "lora",
                     "not a column": 1})):
        _same(training_rows, names=name, length_col="seq_len", length=length, batch=batch,
              attention=attention, also=also)


def test_inference_rows_in_the_same_order(inference_rows: pd.DataFrame) -> None:
    assert len(inference_rows) > 10
    for length, batch, attention, cache, new in itertools.product(
            (1, 512, 8192, 8193, 10**6), (1, 4, 7), (None, "sdpa", "eager"),
            ("dynamic", "static"), (1, 128)):
        _same(inference_rows, names=["llama3.1-8b"], length_col="prompt", length=length,
              batch=batch, attention=attention, also={"cache": cache, "new tokens": new})


def test_fewer_rows_than_asked_and_none() -> None:
    df = pd.DataFrame({"model": ["a", "b", "a"], "seq_len": [10, 20, 30], "batch": [1, 1, 2],
                       "attention": ["x", "y", "x"]})
    _same(df, names=["a"], length_col="seq_len", length=20, batch=1, attention="y", n=8)
    _same(df.iloc[0:0], names=["a"], length_col="seq_len", length=20, batch=1)
