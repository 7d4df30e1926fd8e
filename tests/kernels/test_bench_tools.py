"""The speed benchmark's own logic, on the CPU: FLOP convention, the table, the refusal to
time a wrong result, the rows it writes and reads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnmem.measure import speed_results  # noqa: E402
from attnmem.measure.bench import impls  # noqa: E402
from attnmem.measure.bench import speed as bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_flops_convention():
    """FlashAttention-2's convention: forward 4*B*H*s^2*d, half when causal; forward+backward 3.5 x forward, and
    the bench's figure is attnmem.calc.attention_flops's (one copy of the rule)."""
    import attnmem.calc

    assert bench.flops(1, 32, 4096, 128, False, "fwd") == 4 * 32 * 4096**2 * 128
    assert bench.flops(2, 8, 1000, 64, True, "fwd") == 4 * 2 * 8 * 1000**2 * 64 / 2
    assert bench.flops(1, 1, 10, 16, False, "fwd_bwd") == 3.5 * 4 * 100 * 16
    assert bench.flops(1, 32, 8192, 64, True, "fwd_bwd") == attnmem.calc.attention_flops(
        1, 32, 8192, 64, causal=True, backward=True)


def _row(impl, tflops, status="ok", **kw):
    base = dict(impl=impl, dtype="bf16", batch=1, heads=32, seq_len=4096, head_dim=128,
                causal=False, mode="fwd", median_ms=1.0, tflops=tflops, rel_err=math.nan,
                status=status, gpu="g", torch_version="t", triton_version="tr", timestamp="now")
    base.update(kw)
    return speed_results.Row(**base)


def test_table_ratios_and_refused_rows():
    rows = [_row("triton", 500.0), _row("sdpa_cudnn", 625.0), _row("sdpa_flash", 250.0)]
    text = bench.table(rows)
    assert "| bf16 | 128 | no | fwd | 4096 | 500 | 625 | 250 | 0.80 | 2.00 |" in text
    wrong = [_row("triton", math.nan, status="wrong: rel err 3"), _row("sdpa_cudnn", 625.0),
             _row("sdpa_flash", 250.0)]
    line = bench.table(wrong).splitlines()[-1]
    assert "wrong: rel e" in line and line.endswith("| - | - |")  # no ratio from a wrong row


def test_table_has_fa4_as_a_peer_and_gqa_rows_apart():
    """With FlashAttention-4 rows the table gains its column and our ratio to it; a GQA shape
    gets its own line (H_kv column) instead of overwriting the MHA one."""
    rows = [_row("triton", 600.0), _row("sdpa_cudnn", 500.0), _row("sdpa_flash", 300.0),
            _row("fa4", 640.0),
            _row("triton", 380.0, kv_heads=8, causal=True, mode="fwd_bwd"),
            _row("sdpa_cudnn", 500.0, kv_heads=8, causal=True, mode="fwd_bwd"),
            _row("sdpa_flash", 290.0, kv_heads=8, causal=True, mode="fwd_bwd"),
            _row("fa4", 560.0, kv_heads=8, causal=True, mode="fwd_bwd")]
    lines = bench.table(rows).splitlines()
    assert lines[0] == ("| dtype | d | H_kv | causal | pass | s | triton | sdpa_cudnn | "
                        "sdpa_flash | fa4 | triton/cudnn | triton/flash | triton/fa4 |")
    assert "| bf16 | 128 | 32 | no | fwd | 4096 | 600 | 500 | 300 | 640 | 1.20 | 2.00 | 0.94 |" in lines
    assert ("| bf16 | 128 | 8 | yes | fwd+bwd | 4096 | 380 | 500 | 290 | 560 | 0.76 | 1.31 | 0.68 |"
            in lines)
    # fa4 unavailable (not installed): its cells say so, and no ratio is made from them
    gone = [_row("triton", 600.0), _row("sdpa_cudnn", 500.0), _row("sdpa_flash", 300.0),
            _row("fa4", math.nan, status="unavailable")]
    last = bench.table(gone).splitlines()[-1]
    assert "| unavailable |" in last and last.endswith("| 1.20 | 2.00 | - |")


def test_ratios_from_rows():
    """speed_results.ratios: ours over each peer per shape and pass, from ok rows only."""
    rows = [_row("triton", 500.0), _row("sdpa_cudnn", 400.0), _row("fa4", 625.0),
            _row("sdpa_flash", 250.0, status="oom"),
            _row("triton", 300.0, seq_len=8192), _row("fa4", 0.0, seq_len=8192)]
    got = speed_results.ratios(rows)
    key = ("bf16", 128, 32, False, "fwd", 4096)
    assert got[key]["sdpa_cudnn"] == pytest.approx(1.25)
    assert got[key]["fa4"] == pytest.approx(0.8)
    assert math.isnan(got[key]["sdpa_flash"])  # a failed peer gives no ratio
    other = got[("bf16", 128, 32, False, "fwd", 8192)]
    assert all(math.isnan(x) for x in other.values())  # no peer (or a zero) measured there
    assert list(got) == [key, ("bf16", 128, 32, False, "fwd", 8192)]


def test_shapes_presets_and_refusals(capsys):
    """--preset anchors is issue 18's table (bf16 B=1 H=32: d=128 at 4k/16k causal and not,
    d=64 at 8k causal, GQA 8 at d=128 8k causal; fp16 d=128 at 4k), both passes; --shapes
    parses DTYPE/D/S[/causal][/kv=N]; bad values are refused by name."""
    args = bench.parse_args(["--impls", "triton", "sdpa_cudnn", "sdpa_flash", "fa4",
                             "--preset", "anchors", "--rounds", "3"])
    got = [s.spec() for s in bench.shapes_of(args)]
    assert got == ["bf16/128/4096", "bf16/128/4096/causal", "bf16/128/16384",
                   "bf16/128/16384/causal", "bf16/64/8192/causal", "bf16/128/8192/causal/kv=8",
                   "fp16/128/4096", "fp16/128/4096/causal"]
    assert args.modes == ["fwd", "fwd_bwd"] and args.impls[-1] == "fa4"
    # --preset targets: the backward's whole target grid, 2 x 2 x 2 x 2 x 2 shapes, each once
    grid = [s.spec() for s in bench.shapes_of(bench.parse_args(["--preset", "targets"]))]
    assert len(grid) == len(set(grid)) == 32
    assert {"fp16/64/16384/causal/kv=8", "bf16/128/4096", "bf16/64/4096/kv=8"} <= set(grid)
    assert all(bench.parse_shape(g).seq_len >= 4096 for g in grid)
    sh = bench.parse_shape("bf16/128/8192/causal/kv=8")
    assert (sh.dtype, sh.head_dim, sh.seq_len, sh.causal, sh.kv_heads) == ("bf16", 128, 8192, True, 8)
    crossed = bench.shapes_of(bench.parse_args(["--dims", "64", "--seqs", "1024", "2048",
                                                "--causal", "1", "--dtypes", "bf16"]))
    assert [s.spec() for s in crossed] == ["bf16/64/1024/causal", "bf16/64/2048/causal"]
    for bad in (["--shapes", "fp32/128/4096"], ["--shapes", "bf16/128"],
                ["--shapes", "bf16/128/4096/kv=0"], ["--shapes", "bf16/128/4096/window"],
                ["--shapes", "bf16/128/4096/kv=5"], ["--preset", "anchors", "--dims", "64"],
                ["--preset", "anchors", "--shapes", "bf16/64/1024"], ["--preset", "nope"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    err = capsys.readouterr().err
    assert "fp32/128/4096" in err and "DTYPE/D/S" in err and "kv=5 must divide --heads 32" in err
    assert "drop --dims" in err


def test_fa4_absent_is_an_unavailable_row():
    """Without flash_attn.cute the bench's fa4 cell is 'unavailable' (the run goes on) and the
    reason is said once before the grid."""
    from attnmem.measure import registry

    if registry.fa4_installed_reason() is None:
        pytest.skip("flash_attn.cute is installed here")
    q, k, v, do = (torch.randn(1, 2, 8, 64) for _ in range(4))
    assert bench._fa4_note(["triton"]) == ""
    assert "flash_attn.cute is not installed" in bench._fa4_note(["triton", "fa4"])
    if torch.cuda.is_available():  # on a GPU the call itself reaches the import
        ms, rel, status = impls.measure("fa4", q.cuda(), k.cuda(), v.cuda(), do.cuda(), False,
                                        "fwd", None)
        assert status == "unavailable" and math.isnan(ms)


def test_three_warpgroup_impl_is_unsupported_off_d64():
    """The opt-in three-warpgroup forward exists at d = 64 only: elsewhere its row says
    "unsupported" instead of stopping the run."""
    q, k, v, do = (torch.randn(1, 2, 8, 128) for _ in range(4))
    ms, rel, status = impls.measure("triton_sm90_3wg", q, k, v, do, False, "fwd", None)
    assert status == "unsupported" and math.isnan(ms) and math.isnan(rel)
    assert "triton_sm90_3wg" in bench.IMPLS
    # the deleted persistent forward is no longer offered
    assert "triton_sm90_persistent" not in bench.IMPLS


@pytest.mark.parametrize("factor,expect_ok", [(1.0, True), (1.001, True), (3.0, False)])
def test_measure_refuses_a_wrong_result(monkeypatch, factor, expect_ok):
    """A kernel whose output is off gets no time, only its error; a right one is timed."""
    import triton.testing

    q, k, v, do = (torch.randn(1, 2, 8, 16) for _ in range(4))
    ref = torch.softmax(q @ k.transpose(-1, -2) / 4, -1) @ v
    monkeypatch.setattr(impls, "impl_fn", lambda name: lambda a, b, c, causal: ref * factor)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: (fn(), 0.25)[1])
    ms, rel, status = impls.measure("triton", q, k, v, do, False, "fwd", ref)
    if expect_ok:
        assert status == "ok" and ms == 0.25 and rel == pytest.approx(factor - 1, abs=1e-6)
    else:
        assert status.startswith("wrong: rel err") and math.isnan(ms) and rel == pytest.approx(2)


def test_read_rows_round_trips_and_refuses_other_files(tmp_path):
    """The measurement system reads the bench's CSVs (the page's path); the bench writes the
    same Row type."""
    read_rows = speed_results.read_rows
    assert bench.Row is speed_results.Row
    rows = read_rows(ROOT / "data" / "kernel_speed_fwd_eager_h200.csv")
    assert len(rows) == 400 and all(isinstance(r, speed_results.Row) for r in rows)
    assert {r.impl for r in rows} == {"triton", "triton_generic", "triton_sm90_3wg", "sdpa_cudnn",
                                      "sdpa_flash"}
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing columns"):
        read_rows(bad)
    text = (ROOT / "data" / "kernel_speed_fwd_eager_h200.csv").read_text().splitlines()
    bad.write_text("\n".join([text[0], text[1].replace(",False,", ",maybe,", 1)]) + "\n")
    with pytest.raises(ValueError, match="line 2"):
        read_rows(bad)


def test_rounds_median_worst_error_and_failures():
    """--rounds: the median of the rounds' times, the worst error, and a failed round wins."""
    nan = math.nan
    assert impls.combine([(3.0, 1e-3, "ok"), (1.0, 2e-3, "ok"), (2.0, nan, "ok")]) == (
        2.0, 2e-3, "ok")
    assert impls.combine([(1.0, nan, "ok"), (3.0, nan, "ok")])[0] == 2.0
    ms, _, status = impls.combine([(1.0, 1e-3, "ok"), (nan, nan, "oom")])
    assert math.isnan(ms) and status == "oom"
    assert bench.parse_args(["--rounds", "3"]).rounds == 3
    for bad in ("0", "x", "-2"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--rounds", bad])


def test_run_grid_on_the_cpu(tmp_path, monkeypatch, capsys):
    """The whole grid procedure on tiny CPU tensors (GPU kernels replaced by the eager
    reference, do_bench by a fixed time): every shape x pass x implementation gives one row,
    in the CSV as it comes and read back the same; per-shape GQA; fa4 refused by its rule on
    CPU tensors without stopping the run; the header names the run."""
    import triton.testing

    from attnmem.measure import registry

    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: (fn(), 0.5)[1])
    real = impls.impl_fn
    eager = lambda q, k, v, causal: registry.naive(q, k, v, causal)  # noqa: E731
    monkeypatch.setattr(impls, "impl_fn", lambda name: eager if name in (
        "triton", "sdpa_cudnn", "sdpa_flash") else real(name))
    out = tmp_path / "x.csv"
    args = bench.parse_args(["--impls", "triton", "sdpa_cudnn", "sdpa_flash", "fa4",
                             "--shapes", "bf16/16/64", "fp16/16/48/causal/kv=2", "--heads", "4",
                             "--rounds", "2", "--csv", str(out)])
    rows = bench.run_grid(args, device="cpu")
    assert len(rows) == 2 * 2 * 4
    assert [repr(r) for r in speed_results.read_rows(out)] == [repr(r) for r in rows]  # nan too
    by = {(r.impl, r.dtype, r.mode): r for r in rows}
    for mode in ("fwd", "fwd_bwd"):
        r = by[("triton", "fp16", mode)]
        assert r.status == "ok" and r.median_ms == 0.5 and r.kv_heads == 2 and r.causal
        assert r.tflops == pytest.approx(bench.flops(1, 4, 48, 16, True, mode) / 0.5e-3 / 1e12)
        assert r.rel_err < 1e-2  # checked against the reference
        assert by[("fa4", "bf16", mode)].status == "unsupported"
        assert by[("sdpa_cudnn", "bf16", mode)].kv_heads == 4
    text = bench.table(rows)
    assert "| fp16 | 16 | 2 | yes | fwd+bwd | 48 |" in text and "triton/fa4" in text
    head = bench.header(rows, args)
    assert head.startswith("cpu, torch ") and "H_kv=4, 2" in head and "2 round(s)" in head
    assert "fa4" in capsys.readouterr().out


def test_run_grid_times_fa4_on_its_own_layout(tmp_path, monkeypatch):
    """FA4 (a fake standing in for flash_attn_func) gets contiguous (B, s, H, d) leaves with
    the same values as everyone's (B, H, s, d) inputs, k/v with H_kv heads; its output is
    checked against the reference and its row carries flash-attn-4's version."""
    import triton.testing

    from attnmem.measure import registry

    seen = []

    def fake(q, k, v, softmax_scale=None, causal=False):
        seen.append((q.shape, k.shape, q.is_contiguous(), q.is_leaf))
        out = registry.naive(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal)
        return out.transpose(1, 2).contiguous(), None

    monkeypatch.setattr(registry, "_FA4_IMPORT", {"fn": fake})
    monkeypatch.setattr(registry, "_fa4_tensor_reason", lambda q: None)
    monkeypatch.setattr(registry, "fa4_version", lambda: "4.0.0b36")
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: (fn(), 0.25)[1])
    real = impls.impl_fn
    eager = lambda q, k, v, causal: registry.naive(q, k, v, causal)  # noqa: E731
    monkeypatch.setattr(impls, "impl_fn", lambda name: eager if name in (
        "triton", "sdpa_cudnn") else real(name))
    args = bench.parse_args(["--impls", "triton", "sdpa_cudnn", "fa4", "--shapes",
                             "fp16/16/40/causal/kv=2", "--heads", "4", "--csv",
                             str(tmp_path / "x.csv")])
    rows = {(r.impl, r.mode): r for r in bench.run_grid(args, device="cpu")}
    assert seen and all(s == ((1, 40, 4, 16), (1, 40, 2, 16), True, True) for s in seen)
    for mode in ("fwd", "fwd_bwd"):
        r = rows[("fa4", mode)]
        assert r.status == "ok" and r.rel_err < 1e-2 and r.impl_version == "4.0.0b36"
        assert rows[("triton", mode)].impl_version == ""
    text = bench.table(list(rows.values()))
    assert text.splitlines()[-1].endswith("| 1.00 | - | 1.00 |")  # ours/cudnn, /flash, /fa4
    assert "flash-attn-4 4.0.0b36" in bench.header(list(rows.values()), args)

