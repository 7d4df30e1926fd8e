"""The decode and random presets of the bench (attnmem.measure.bench.decode, random_grid,
preset_cli): their shape lists, the draw's coverage and determinism, the tables and summaries
on given rows, the command line. The timing itself needs a GPU (the lead runs it)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")


def test_random_draw_is_seeded_and_covers_the_issue_ranges():
    from attnmem.measure.bench.random_grid import COUNT, MAX_FWD_FLOP, draw

    a, b, c = draw(1), draw(1), draw(2)
    assert a == b and a != c and len(a) == COUNT >= 60
    every = [s for seed in range(1, 4) for s in draw(seed)]
    assert {24, 28, 40, 48, 96} <= {s.heads for s in every}
    assert min(s.heads for s in every) >= 8 and max(s.heads for s in every) == 128
    assert {s.heads // s.kv_heads for s in every} >= {1, 4, 8, 16}
    assert {s.head_dim for s in every} == {64, 80, 96, 128, 192, 256}
    assert {s.dtype for s in every} == {"bf16", "fp16"} and {s.causal for s in every} == {
        True, False}
    for s in every:
        assert s.heads % s.kv_heads == 0 and s.seq_len % 8 == 0 and s.seq_len >= 256
        assert s.fwd_flop() <= MAX_FWD_FLOP or s.batch == 1


def test_random_tokens_per_call_span_8k_to_128k_before_the_cap():
    """Tokens B·s fall in 8k-128k wherever the FLOP cap did not cut the batch."""
    from attnmem.measure.bench.random_grid import draw

    tokens = [s.batch * s.seq_len for s in draw(7)]
    assert max(tokens) > 32768 and min(tokens) >= 4096


def test_decode_shapes_cover_batch_cache_and_queries():
    from attnmem.measure.bench.decode import DECODE_SHAPES

    assert {s.batch for s in DECODE_SHAPES} == {1, 4, 16, 64}
    assert {s.cache for s in DECODE_SHAPES} == {1024, 8192, 32768, 131072}
    assert {s.new for s in DECODE_SHAPES} == {1, 8}
    assert all(s.batch * s.cache <= 2 * 1024 * 1024 for s in DECODE_SHAPES)


def test_decode_bytes_moved_counts_cache_and_partials():
    from attnmem.calc.decode_split import decode_plan
    from attnmem.measure.bench.decode import DecodeShape, bytes_moved

    sh = DecodeShape(1, 131072, 1)
    plan = decode_plan(1, 32, 8, 1, 131072, 128)
    kv = 2 * 8 * 131072 * 128 * 2
    assert bytes_moved(sh) == kv + 2 * 32 * 128 * 2 + 2 * 32 * plan.splits * 129 * 4
    unsplit = DecodeShape(64, 8192, 1)
    assert decode_plan(64, 32, 8, 1, 8192, 128).splits == 1
    assert bytes_moved(unsplit) == 2 * 64 * 8 * 8192 * 128 * 2 + 2 * 64 * 32 * 128 * 2


def test_decode_reference_is_bottom_right_causal():
    from attnmem.kernels.flash.reference import attention_reference
    from attnmem.measure.bench.decode import _reference

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 3, 16, generator=g), *(torch.randn(2, 2, 9, 16, generator=g)
                                                       for _ in range(2))
    got = _reference(q, k, v, True)
    for i in range(3):  # query i sees keys 0 .. 9 - 3 + i
        want = attention_reference(q[:, :, i:i + 1], k[:, :, :7 + i], v[:, :, :7 + i])
        assert torch.allclose(got[:, :, i:i + 1], want, atol=1e-5)


def _decode_rows():
    from attnmem.measure.bench.decode import DecodeRow

    stamp = dict(gpu="g", torch_version="t", triton_version="tr", fa4_version="",
                 timestamp="now")
    rows = []
    for (b, c, n), times in {(1, 1024, 1): {"triton": 10.0, "sdpa_flash": 12.0,
                                            "sdpa_cudnn": 15.0, "fa4": math.nan},
                             (4, 8192, 8): {"triton": 20.0, "sdpa_flash": 18.0,
                                            "sdpa_cudnn": 30.0, "fa4": math.nan}}.items():
        for impl, us in times.items():
            rows.append(DecodeRow(impl, b, c, n, 32, 8, 128, "bf16", us, 0.001,
                                  "ok" if not math.isnan(us) else "unavailable: x", 10 ** 6,
                                  "", **stamp))
    return rows


def test_decode_table_and_summary():
    from attnmem.measure.bench.decode import summary, table

    rows = _decode_rows()
    t = table(rows)
    assert "| 1 | 1024 | 1 | 10.0 |" in t and "sdpa_flash | 1.20 |" in t
    assert "sdpa_flash | 0.90 |" in t and "unavailable" in t
    s = summary(rows)
    assert "median 1.05" in s and "worst 0.90 (B=4 cache=8192 new=8, against sdpa_flash)" in s


def test_random_table_and_summary():
    from attnmem.measure.bench.random_grid import RandomRow, summary, table

    stamp = dict(gpu="g", torch_version="t", triton_version="tr", fa4_version="",
                 timestamp="now")
    rows = []
    for i, (ours, cudnn, fa4) in enumerate(((1.0, 1.1, 0.9), (2.0, 1.8, 2.2), (1.0, 1.0, 1.0))):
        for impl, ms in (("triton", ours), ("sdpa_cudnn", cudnn), ("fa4", fa4)):
            rows.append(RandomRow(5, i, "m", impl, "fwd", 1, 32, 8, 4096, 128, True, "bf16",
                                  ms, 100.0, 0.001, "ok", **stamp))
    t = table(rows)
    assert t.count("\n") == 4 and "| 0.90 |" in t
    s = summary(rows, 64)
    assert "3 of 64 shapes measured (seed 5)" in s
    assert "fwd: sdpa_cudnn/ours median 1.00, worst 0.90 (#1), 2 of 3 >= 1.00" in s
    assert "fwd: fa4/ours median 1.00, worst 0.90 (#0)" in s
    assert "fwd_bwd: fa4/ours: no shape with both times" in s


@pytest.mark.parametrize("argv, words", [
    (["--preset", "random", "--out", "x"], "needs --seed"),
    (["--preset", "decode", "--out", "x", "--seed", "1"], "random only"),
    (["--preset", "decode"], "--out"),
    (["--preset", "random", "--seed", "1", "--out", "x", "--budget-s", "0"], "budget-s"),
])
def test_preset_cli_refuses(argv, words, capsys):
    from attnmem.measure.bench.preset_cli import parse

    with pytest.raises(SystemExit):
        parse(argv)
    assert words in capsys.readouterr().err


def test_other_presets_are_not_routed():
    from attnmem.measure.bench.preset_cli import route

    assert route(["--preset", "training"]) is None and route(["--quick"]) is None


def test_random_route_label_names_the_portable_path_off_hopper():
    """On a CPU the route has no Hopper kernel: the label names the portable forward, and for
    fwd_bwd the backward the pure rules pick (a 4:1 GQA group on a 2-block grid is split)."""
    import torch

    from attnmem.calc import dispatch
    from attnmem.measure.bench.random_grid import route_label

    q = torch.randn(1, 8, 256, 64)
    k = v = torch.randn(1, 2, 256, 64)
    assert route_label(q, k, v, q, True, "fwd") == "fwd triton"
    split = dispatch.kv_split(1, 8, 2, 256, 256, 64, 4)
    label = route_label(q, k, v, q, True, "fwd_bwd")
    assert label.startswith("fwd triton, bwd triton 2-kernel"), label
    assert (f" S={split}" in label) == (split > 1)
