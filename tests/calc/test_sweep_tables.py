"""attnmem.calc.sweep's tables for the Scaling and GPU measurement pages, and attnmem.calc.scores'
for the Score matrix page: each cell is the model's own number (max_seq_len,
attention_peak_bytes, attention_peak_breakdown, attention_reserved_bytes, sweep_seq_len,
score_matrix_bytes)."""

from __future__ import annotations

from attnmem.calc import GPUS, attention_peak_breakdown, attention_peak_bytes, max_seq_len
from attnmem.calc.sweep import (
    call_detail,
    curve_seq_lens,
    oom_table,
    param_values,
    predicted_curves,
    sweep_seq_len,
)

GPU = "NVIDIA H100 80GB"


def test_oom_table_is_max_seq_len_and_the_peak_there() -> None:
    df = oom_table(("naive", "triton"), (GPU,), 1, 32, 128, "fp16", False, False)
    assert df.columns.tolist() == ["gpu", "impl", "max_seq_len", "peak_bytes_at_max"]
    for r in df.itertuples():
        s = max_seq_len(r.impl, GPUS[GPU], 1, 32, 128, "fp16", False, False)
        assert r.max_seq_len == s
        assert r.peak_bytes_at_max == attention_peak_bytes(r.impl, 1, 32, s, 128, "fp16", False, False)
    # nothing fits: s = 0 and no peak
    tiny = oom_table(("naive",), ("tiny",), 1, 32, 128, "fp16", False, False, gpu_bytes={"tiny": 1})
    assert tiny[["max_seq_len", "peak_bytes_at_max"]].values.tolist() == [[0, 0]]


def test_call_detail_sums_the_breakdown() -> None:
    summary, terms = call_detail(("naive", "sdpa_math"), 4096, 1, 32, 128, "fp16", False, True)
    parts = attention_peak_breakdown("naive", 1, 32, 4096, 128, "fp16", False, True)
    row = summary[summary["impl"] == "naive"].iloc[0]
    assert row["allocated_peak_bytes"] == sum(t.counted_bytes for t in parts)
    assert row["rounding_bytes"] == sum(t.rounding_bytes for t in parts)
    assert len(terms[terms["impl"] == "naive"]) == len(parts)


def test_param_values_and_curve_lengths() -> None:
    assert param_values("batch")[-1] == 64 and param_values("heads")[-1] == 128
    assert curve_seq_lens(512, 4096) == [512, 768, 1024, 1536, 2048, 3072, 4096]


def test_predicted_curves_skip_unmodelled_names_and_refusals() -> None:
    df = predicted_curves(("triton", "not_a_model"), 512, 2048, 1, 32, 128, "fp16", False, False, None)
    assert set(df["impl"]) == {"triton"}
    assert df.equals(sweep_seq_len(("triton",), curve_seq_lens(512, 2048), 1, 32, 128, "fp16",
                                   False, False))
    # FlashAttention-2 refuses fp32: the eager curve is still drawn
    df = predicted_curves(("naive", "sdpa_flash"), 512, 2048, 1, 32, 128, "fp32", False, False, None)
    assert set(df["impl"]) == {"naive"}


def test_score_curve_and_doublings() -> None:
    from attnmem.calc.scores import CURVE_LENS, score_curve, score_doublings, score_matrix_bytes

    df = score_curve(1, 32, "fp16")
    assert df["seq_len"].tolist() == list(CURVE_LENS)
    assert df["bytes"].iloc[5] == score_matrix_bytes(1, 32, CURVE_LENS[5], 2)
    t = score_doublings(1, 32, 4096, "fp16")
    assert t["seq_len"].tolist() == [2048, 4096, 8192, 16384]
    assert t["× memory"].tolist() == [0.25, 1.0, 4.0, 16.0]
    assert t["bytes"].iloc[1] == 1_073_741_824 and t["GiB"].iloc[1] == 1.0
    assert score_doublings(1, 1, 1, 2)["seq_len"].tolist() == [1, 2, 4]  # s/2 is not whole
