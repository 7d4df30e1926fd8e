"""attnmem.measure.speed_runs: the timing choices follow ATTNMEM_BENCH_DIR at each call, a run
that has both passes in one file is offered only when the file is there, and the ratios are
ours over the peer at the longest s both ran."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnmem.measure import speed_runs
from attnmem.measure.speed_results import OURS


def test_sources_follow_the_folder_at_each_call(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ATTNMEM_BENCH_DIR", str(tmp_path))
    sources, gqa = speed_runs.sources()
    assert sources["eager calls"][0]["fwd"] == tmp_path / "kernel_speed_fwd_eager_h200.csv"
    assert "eager, 3 rounds, with FlashAttention-4" not in sources  # no such file here
    (tmp_path / "kernel_speed_peers_eager_h200.csv").write_text("")
    sources, gqa = speed_runs.sources()
    peers = tmp_path / "kernel_speed_peers_eager_h200.csv"
    assert sources["eager, 3 rounds, with FlashAttention-4"][0] == {"fwd": peers, "fwd_bwd": peers}
    assert gqa["eager, 3 rounds, with FlashAttention-4"] == {"fwd": peers, "fwd_bwd": peers}
    monkeypatch.delenv("ATTNMEM_BENCH_DIR")
    assert speed_runs.sources()[0]["eager calls"][0]["fwd"].parent == speed_runs.DATA


def test_ratio_at_top_is_at_the_longest_s_both_ran() -> None:
    wide = pd.DataFrame({OURS: [100.0, 300.0, 400.0], "fa4": [50.0, 200.0, None]},
                        index=[1024, 2048, 4096])
    assert speed_runs.ratio_at_top(wide, "fa4") == (2048, 1.5)
    assert speed_runs.ratio_at_top(wide, "sdpa_cudnn") is None
    assert speed_runs.ratio_at_top(wide.assign(fa4=None), "fa4") is None


def test_fa4_and_gqa_from_the_bundled_runs() -> None:
    sources, gqa = speed_runs.sources(speed_runs.DATA)
    got = speed_runs.fa4_elsewhere(sources, "bf16", 128, False, "fwd", 32)
    if got is not None:  # the bundled peer run is in this checkout
        timing, s, ratio = got
        assert timing in sources and s > 0 and ratio > 0
    where = speed_runs.gqa_where(gqa, 8)
    assert where and all(w.startswith("**") for w in where)


def test_shown_order_puts_ours_first_then_paths_peers_rest() -> None:
    impls, refs = speed_runs.shown_order({"zz", "fa4", "sdpa_cudnn", "triton_bwd_sm90", OURS})
    assert impls == [OURS, "triton_bwd_sm90", "sdpa_cudnn", "fa4", "zz"]
    assert refs == ["sdpa_cudnn", "fa4"]
    rows = pd.DataFrame({"seq_len": [1024, 1024, 2048], "impl": [OURS, "fa4", OURS],
                         "tflops": [100.0, 50.0, 300.0]})
    wide = speed_runs.tflops_by_length(rows, [OURS, "fa4"])
    assert wide.columns.tolist() == [OURS, "fa4"] and wide.loc[1024, "fa4"] == 50.0
