"""The benchmark and tuning scripts' own logic, on the CPU: FLOP convention, the table, the
refusal to time a wrong result, and which variants a tuning sweep builds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels.bench import speed as bench  # noqa: E402
from kernels.bench import tune_bwd, tune_fwd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_flops_convention():
    """DESIGN.md: forward 4*B*H*s^2*d, half when causal; forward+backward 3.5 x forward."""
    assert bench.flops(1, 32, 4096, 128, False, "fwd") == 4 * 32 * 4096**2 * 128
    assert bench.flops(2, 8, 1000, 64, True, "fwd") == 4 * 2 * 8 * 1000**2 * 64 / 2
    assert bench.flops(1, 1, 10, 16, False, "fwd_bwd") == 3.5 * 4 * 100 * 16


def _row(impl, tflops, status="ok", **kw):
    base = dict(impl=impl, dtype="bf16", batch=1, heads=32, seq_len=4096, head_dim=128,
                causal=False, mode="fwd", median_ms=1.0, tflops=tflops, rel_err=math.nan,
                status=status, gpu="g", torch_version="t", triton_version="tr", timestamp="now")
    base.update(kw)
    return bench.Row(**base)


def test_table_ratios_and_refused_rows():
    rows = [_row("triton", 500.0), _row("sdpa_cudnn", 625.0), _row("sdpa_flash", 250.0)]
    text = bench.table(rows)
    assert "| bf16 | 128 | no | fwd | 4096 | 500 | 625 | 250 | 0.80 | 2.00 |" in text
    wrong = [_row("triton", math.nan, status="wrong: rel err 3"), _row("sdpa_cudnn", 625.0),
             _row("sdpa_flash", 250.0)]
    line = bench.table(wrong).splitlines()[-1]
    assert "wrong: rel e" in line and line.endswith("| - | - |")  # no ratio from a wrong row


def test_three_warpgroup_impl_is_unsupported_off_d64():
    """The opt-in three-warpgroup forward exists at d = 64 only: elsewhere its row says
    "unsupported" instead of stopping the run."""
    q, k, v, do = (torch.randn(1, 2, 8, 128) for _ in range(4))
    ms, rel, status = bench.measure("triton_sm90_3wg", q, k, v, do, False, "fwd", None)
    assert status == "unsupported" and math.isnan(ms) and math.isnan(rel)
    assert "triton_sm90_3wg" in bench.IMPLS
    # the persistent form can be asked for, but is not run by default (slower than the default)
    assert "triton_sm90_persistent" in bench.IMPLS
    assert "triton_sm90_persistent" not in bench.DEFAULT_IMPLS
    assert set(bench.DEFAULT_IMPLS) | {"triton_sm90_persistent"} == set(bench.IMPLS)


@pytest.mark.parametrize("factor,expect_ok", [(1.0, True), (1.001, True), (3.0, False)])
def test_measure_refuses_a_wrong_result(monkeypatch, factor, expect_ok):
    """A kernel whose output is off gets no time, only its error; a right one is timed."""
    import triton.testing

    q, k, v, do = (torch.randn(1, 2, 8, 16) for _ in range(4))
    ref = torch.softmax(q @ k.transpose(-1, -2) / 4, -1) @ v
    monkeypatch.setattr(bench, "_impl_fn", lambda name: lambda a, b, c, causal: ref * factor)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: (fn(), 0.25)[1])
    ms, rel, status = bench.measure("triton", q, k, v, do, False, "fwd", ref)
    if expect_ok:
        assert status == "ok" and ms == 0.25 and rel == pytest.approx(factor - 1, abs=1e-6)
    else:
        assert status.startswith("wrong: rel err") and math.isnan(ms) and rel == pytest.approx(2)


def test_tune_variants():
    """Experimental loops only with descriptors; configs that overflow shared memory dropped."""
    configs = [(128, 128, 8, 3), (128, 128, 8, 5)]  # the second needs 4 * 64 KiB of K/V
    got = tune_fwd._variants([128], [False], configs, [False, True], ["plain", "ahead", "ws"])
    assert {(c, desc, x) for _, _, c, desc, x in got} == {
        ((128, 128, 8, 3), False, "plain"), ((128, 128, 8, 3), True, "plain"),
        ((128, 128, 8, 3), True, "ahead"), ((128, 128, 8, 3), True, "ws")}
    cfg = tune_fwd._cfg((64, 32, 4, 2), True, "ws")
    assert cfg == {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2,
                   "USE_DESC": True, "WS": True}


def test_tune_bwd_variants_fit_and_cover_the_stored_choices():
    """Every backward candidate kept fits in shared memory, the big ones are dropped at
    d = 256, and every stored H200 backward choice up to 8192 is among the candidates (so a
    re-run of tune_bwd times what is in use)."""
    from kernels.flash.fwd import SMEM_BYTES, TUNED_H200

    for d in (64, 128, 256):
        for _, _, kern, (bm, bn, _, st) in tune_bwd._variants([d], [False]):
            streamed, resident = (bm, bn) if kern == "dkdv" else (bn, bm)
            assert (st - 1) * 2 * streamed * d * 2 + 2 * resident * d * 2 <= SMEM_BYTES
    assert len(tune_bwd._variants([256], [False])) < len(tune_bwd._variants([64], [False]))
    for (kern, _, d, _, bucket), c in TUNED_H200.items():
        if kern != "fwd" and bucket <= 8192:
            assert c in (tune_bwd.DQ if kern == "dq" else tune_bwd.DKDV), (kern, d, bucket, c)
    # --atomic adds the atomic-dQ backward with every dK/dV candidate, its defaults among them
    from kernels.flash.bwd import ATOMIC_TILES

    plain = tune_bwd._variants([128], [True])
    both = tune_bwd._variants([128], [True], atomic=True)
    extra = [v for v in both if v[2] == "dkdv_atomic"]
    assert both[:len(plain)] == plain
    assert [v[3] for v in extra] == [v[3] for v in plain if v[2] == "dkdv"]
    for tiles in ATOMIC_TILES.values():
        assert tuple(tiles.values()) in tune_bwd.DKDV
    # --atomic-elementwise: the same candidates under their own name
    ew = tune_bwd._variants([128], [True], atomic=True, elementwise=True)
    assert [v[3] for v in ew if v[2] == "dkdv_atomic_ew"] == [v[3] for v in extra]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
@pytest.mark.parametrize("tool", [tune_fwd, tune_bwd], ids=["fwd", "bwd"])
def test_tune_refuses_without_gpu(capsys, tool):
    assert tool.main(["--dims", "64", "--seqs", "1024"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_read_rows_round_trips_and_refuses_other_files(tmp_path):
    rows = bench.read_rows(ROOT / "data" / "kernel_speed_fwd_eager_h200.csv")
    assert len(rows) == 400 and all(isinstance(r, bench.Row) for r in rows)
    assert {r.impl for r in rows} == {"triton", "triton_generic", "triton_sm90_3wg", "sdpa_cudnn",
                                      "sdpa_flash"}
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing columns"):
        bench.read_rows(bad)
    text = (ROOT / "data" / "kernel_speed_fwd_eager_h200.csv").read_text().splitlines()
    bad.write_text("\n".join([text[0], text[1].replace(",False,", ",maybe,", 1)]) + "\n")
    with pytest.raises(ValueError, match="line 2"):
        bench.read_rows(bad)


def test_rounds_median_worst_error_and_failures():
    """--rounds: the median of the rounds' times, the worst error, and a failed round wins."""
    nan = math.nan
    assert bench._combine([(3.0, 1e-3, "ok"), (1.0, 2e-3, "ok"), (2.0, nan, "ok")]) == (
        2.0, 2e-3, "ok")
    assert bench._combine([(1.0, nan, "ok"), (3.0, nan, "ok")])[0] == 2.0
    ms, _, status = bench._combine([(1.0, 1e-3, "ok"), (nan, nan, "oom")])
    assert math.isnan(ms) and status == "oom"
    assert bench.parse_args(["--rounds", "3"]).rounds == 3
    for bad in ("0", "x", "-2"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--rounds", bad])


@pytest.mark.parametrize("argv", [["--kv-heads", "5"], ["--batch", "0"], ["--heads", "0"]])
def test_tune_bwd_refuses_bad_head_counts(capsys, argv):
    """--kv-heads must divide --heads, and both and --batch be positive: refused by name before
    anything runs (GPU or not)."""
    with pytest.raises(SystemExit) as info:
        tune_bwd.main(argv)
    assert info.value.code == 2
    assert "--kv-heads must divide --heads" in capsys.readouterr().err
