"""``python -m attnmem.measure.bench --preset training`` (issue 31, item 4) on the CPU: the grid covers
the axes the issue names, its packed batches' starts are what the kernel accepts, the summary
is computed right from made-up timings, bad options are refused in one line, and the packed
path of the bench runs end to end (GPU kernels replaced by the eager reference; under Triton's
interpreter with our real kernel in a child process)."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnmem.measure import speed_results  # noqa: E402
from attnmem.measure.bench import impls, training  # noqa: E402
from attnmem.measure.bench import speed as bench  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERS4 = ["--impls", "triton", "sdpa_cudnn", "sdpa_flash", "fa4"]


def _training_args(*extra):
    return bench.parse_args(["--preset", "training", *PEERS4, "--rounds", "3", *extra])


def test_training_grid_covers_the_issue_axes():
    """40 shapes: 36 dense with their own batch and 4 packed; both head dims, MHA and GQA 4:1,
    causal and not, both dtypes (every cell of that cube), s from 512 to 32,768 with lengths
    that are not powers of two, B*s from 8k to 128k tokens outside the six B = 1 anchors, the
    anchors in; packed batches causal bf16, d 64 and 128, MHA and GQA, 16k-64k tokens of mixed
    lengths; and every row's speed_results key names one shape (no batch in the key)."""
    args = _training_args()
    dense, packed = args.shapes, args.packed
    assert len(dense) + len(packed) == 40 and len(packed) == 4
    H = args.heads
    assert all(sh.batch for sh in dense)
    cells = {(sh.dtype, sh.head_dim, (sh.kv_heads or H) != H, sh.causal) for sh in dense}
    assert cells == {(dt, d, g, c) for dt in ("bf16", "fp16") for d in (64, 128)
                     for g in (False, True) for c in (False, True)}
    assert {sh.kv_heads or H for sh in dense} == {32, 8} and H == 32
    seqs = {sh.seq_len for sh in dense}
    assert min(seqs) == 512 and max(seqs) == 32768
    assert len({s for s in seqs if s & (s - 1)}) >= 3  # 1,536, 3,000, 6,000
    anchors = {bench.parse_shape(a) for a in training.ANCHORS}
    assert anchors <= set(dense) and all(a.batch == 1 and a.seq_len >= 4096 for a in anchors)
    tokens = [sh.batch * sh.seq_len for sh in dense if sh not in anchors]
    assert min(tokens) == 8192 and max(tokens) == 131072
    assert len({sh.batch for sh in dense}) >= 8  # batch sizes spread, not one B
    # packed batches
    assert {b.head_dim for b in packed} == {64, 128}
    assert {b.kv_heads or H for b in packed} == {32, 8}
    assert all(b.causal and b.dtype == "bf16" for b in packed)
    assert all(16_000 <= b.total <= 65_536 for b in packed)
    assert all(set(b.lengths) <= set(training.LENGTH_POOL) and len(set(b.lengths)) > 3
               for b in packed)
    # one key per shape, dense and packed together, so tables and ratios never merge two
    ids = [(sh.dtype, sh.head_dim, sh.kv_heads or H, sh.causal, sh.seq_len) for sh in dense]
    ids += [(b.dtype, b.head_dim, b.kv_heads or H, b.causal, b.total) for b in packed]
    assert len(ids) == len(set(ids)) == 40


def test_packed_starts_are_what_the_kernel_accepts():
    """cu_seqlens of every packed batch: 0, strictly increasing, ending at the total, and
    accepted by flash_attention's own check (attnmem.kernels.flash.api._check_starts)."""
    from attnmem.kernels.flash.api import _check_starts

    for b in training.PACKED:
        starts = b.starts()
        assert starts[0] == 0 and starts[-1] == b.total and len(starts) == len(b.lengths) + 1
        assert all(y - x == n for x, y, n in zip(starts[:-1], starts[1:], b.lengths, strict=True))
        cu = torch.tensor(starts, dtype=torch.int32)
        assert _check_starts("cu_seqlens", cu, b.total, cu.device) == tuple(starts)
    # the draw is fixed: the same seed gives the same lengths, another seed other lengths
    assert training.draw_lengths(1, 16_000, 4096) == training.PACKED[0].lengths
    assert training.draw_lengths(9, 16_000, 4096) != training.PACKED[0].lengths
    with pytest.raises(ValueError, match="longest=50"):
        training.draw_lengths(1, 100, 50)


def _row(impl, tflops, *, s=4096, mode="fwd_bwd", batch=1, kv=32, d=128, causal=False,
         status="ok", dtype="bf16"):
    return speed_results.Row(impl, dtype, batch, 32, s, d, causal, mode, 1.0, tflops, math.nan,
                             status, "g", "t", "tr", "now", kv_heads=kv)


def test_summary_from_made_up_timings():
    """Geometric mean and median of ours / peer per (dense | packed | anchors, pass, peer),
    from shapes where both rows are ok; a failed or missing peer row leaves its shape out of
    n but in 'of'; the anchors' lines and the table come last."""
    ours = {1024: 300.0, 2048: 400.0, 4096: 500.0}  # dense fwd+bwd, B = 8, 4, 1 (4096 anchor)
    cudnn = {1024: 600.0, 2048: 400.0, 4096: 250.0}  # ratios 0.5, 1.0, 2.0
    fa4 = {1024: 375.0, 2048: 500.0}  # 0.8, 0.8; anchor: fa4 failed
    batch = {1024: 8, 2048: 4, 4096: 1}
    rows = []
    for s in ours:
        rows.append(_row("triton", ours[s], s=s, batch=batch[s]))
        rows.append(_row("sdpa_cudnn", cudnn[s], s=s, batch=batch[s]))
        rows.append(_row("fa4", fa4.get(s, math.nan), s=s, batch=batch[s],
                         status="ok" if s in fa4 else "wrong: rel err 1"))
    # a packed batch (B = 12 sequences, 20,000 tokens): ours 100, cuDNN 400, fa4 50
    rows += [_row("triton", 100.0, s=20000, batch=12, causal=True),
             _row("sdpa_cudnn", 400.0, s=20000, batch=12, causal=True),
             _row("fa4", 50.0, s=20000, batch=12, causal=True)]
    packed = {(12, "bf16", 128, 32, True, 20000)}
    got = {(x["group"], x["mode"], x["peer"]): x
           for x in training.summarize(rows, packed, ["sdpa_cudnn", "fa4"])}
    c = got[("dense", "fwd_bwd", "sdpa_cudnn")]
    assert (c["n"], c["of"]) == (3, 3)
    assert c["geomean"] == pytest.approx(1.0) and c["median"] == pytest.approx(1.0)
    assert (c["min"], c["max"]) == (pytest.approx(0.5), pytest.approx(2.0))
    f = got[("dense", "fwd_bwd", "fa4")]
    assert (f["n"], f["of"]) == (2, 3) and f["geomean"] == pytest.approx(0.8)
    p = got[("packed", "fwd_bwd", "sdpa_cudnn")]
    assert (p["n"], p["of"], p["geomean"]) == (1, 1, pytest.approx(0.25))
    assert got[("packed", "fwd_bwd", "fa4")]["median"] == pytest.approx(2.0)
    a = got[("anchors", "fwd_bwd", "sdpa_cudnn")]
    assert (a["n"], a["of"], a["geomean"]) == (1, 1, pytest.approx(2.0))
    assert got[("anchors", "fwd_bwd", "fa4")]["n"] == 0
    assert math.isnan(got[("anchors", "fwd_bwd", "fa4")]["geomean"])
    assert not any(k[1] == "fwd" for k in got)  # no forward rows: no forward lines
    # an uneven count: the median is the middle ratio, the geomean the n-th root
    more = rows + [_row("triton", 90.0, s=512, batch=64), _row("sdpa_cudnn", 100.0, s=512,
                                                                batch=64)]
    c = {(x["group"], x["peer"]): x for x in training.summarize(more, packed, ["sdpa_cudnn"])
         }[("dense", "sdpa_cudnn")]
    want = [0.5, 1.0, 2.0, 0.9]
    assert c["median"] == pytest.approx(statistics.median(want))
    assert c["geomean"] == pytest.approx(math.prod(want) ** (1 / 4))
    lines = training.summary_lines(rows, packed, ["sdpa_cudnn", "fa4"])
    assert lines[-1] == "| anchors | fwd+bwd | fa4 | 0/1 | - | - | - | - |"
    assert "| dense | fwd+bwd | sdpa_cudnn | 3/3 | 1.00 | 1.00 | 0.50 | 2.00 |" in lines
    assert any("d=128 H_kv=32 s=4096: sdpa_cudnn - | 2.00, fa4 - | -" in x for x in lines)


@pytest.mark.parametrize("argv,said", [
    (["--preset", "training", "--part", "0/2"], "--part must be K/N"),
    (["--preset", "training", "--part", "3/2"], "got '3/2'"),
    (["--preset", "training", "--part", "half"], "got 'half'"),
    (["--part", "1/2"], "--part K/N splits a --preset or --shapes list"),
    (["--preset", "anchors", "--part", "9/9"], "no shape falls in that part"),
    (["--preset", "training", "--batch", "4"], "--batch 4: these shapes give their own batch"),
    (["--shapes", "bf16/128/1024/b=0"], "'bf16/128/1024/b=0'"),
    (["--shapes", "bf16/128/1024/b=2/b=3"], "DTYPE/D/S[/causal][/kv=H_KV][/b=B]"),
    (["--preset", "training", "--heads", "12"], "must divide --heads 12"),
])
def test_bad_options_are_refused_in_one_line(capsys, argv, said):
    with pytest.raises(SystemExit) as info:
        bench.parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert said in err[-1] and err[-1].startswith("usage") is False


def test_summarize_refuses_a_file_that_is_not_a_bench_csv(tmp_path, capsys):
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    assert bench.main(["--summarize", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other.csv" in err[0] and "not an attnmem.measure.bench CSV" in err[0]
    assert bench.main(["--summarize", str(tmp_path / "absent.csv")]) == 2
    assert "absent.csv" in capsys.readouterr().err


def test_parts_split_the_grid_and_the_estimate_fits_one_call():
    """--part 1/2 and 2/2 cover the 40 shapes once together; the whole preset with the four
    peers and 3 rounds is estimated under 6.5 minutes (one GPU call of 10), each half well
    under."""
    whole = _training_args()
    halves = [_training_args("--part", f"{k}/2") for k in (1, 2)]
    assert sorted(s.spec() for h in halves for s in h.shapes) == sorted(
        s.spec() for s in whole.shapes)
    assert sorted(b.name for h in halves for b in h.packed) == sorted(b.name for b in whole.packed)

    def est(a):
        return training.estimate_seconds(a.shapes, a.packed, a.impls, a.modes, a.rounds)

    assert est(whole) < 390 and all(est(h) < 0.75 * est(whole) for h in halves)
    # more rounds, more time; the arithmetic counts every shape: a grid twice as long doubles
    assert est(_training_args("--rounds", "1")) < est(whole)
    one = training.estimate_seconds(whole.shapes[:1], [], ["sdpa_cudnn"], ["fwd"], 1)
    two = training.estimate_seconds(whole.shapes[:1] * 2, [], ["sdpa_cudnn"], ["fwd"], 1)
    assert two == pytest.approx(2 * one)


def _eager_packed(cu_list):
    """fn(q, k, v, causal) on (total, H, d): each sequence alone through the eager reference."""
    from attnmem.measure import registry

    def fn(q, k, v, causal):
        outs = []
        for a, b in zip(cu_list[:-1], cu_list[1:], strict=True):
            qs, ks, vs = (t[a:b].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            outs.append(registry.naive(qs, ks, vs, causal)[0].transpose(0, 1))
        return torch.cat(outs)
    return fn


def test_packed_rows_on_the_cpu(tmp_path, monkeypatch, capsys):
    """The packed path of run_grid: every implementation x pass gives one row, checked against
    the per-sequence reference (a kernel that attends across sequences is 'wrong' and gets no
    time), refusals are 'unavailable: <reason>' (nested SDPA refuses causal on the math
    backend; fa4 on CPU tensors), FLOPs are each sequence's summed; the CSV carries the
    lengths, read_rows still reads it, and --summarize tells packed from dense rows."""
    import triton.testing

    from attnmem.measure import registry

    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: (fn(), 0.5)[1])
    batch = training.PackedBatch("tiny", "bf16", 16, 2, (5, 33, 40))
    starts = batch.starts()
    real = training.packed_fn

    def fake(name, cu, lengths, device="cuda"):
        if name == "triton":  # ours stands in as the per-sequence eager reference
            return _eager_packed(starts)
        if name == "sdpa_flash":  # attends across the whole packed batch: wrong
            return lambda q, k, v, causal: registry.naive(
                q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                causal)[0].transpose(0, 1)
        return real(name, cu, lengths, device)

    monkeypatch.setattr(training, "packed_fn", fake)
    out = tmp_path / "p.csv"
    args = bench.parse_args(["--impls", "triton", "sdpa_flash", "sdpa_math", "fa4", "--shapes",
                             "bf16/16/32/b=2", "--heads", "4", "--rounds", "2", "--csv",
                             str(out)])
    args.packed = [batch]
    monkeypatch.setattr(impls, "impl_fn", lambda name: lambda q, k, v, causal: registry.naive(
        q, k, v, causal))
    rows = bench.run_grid(args, device="cpu")
    packed = {(r.impl, r.mode): r for r in rows if r.seq_len == batch.total}
    assert len(packed) == 4 * 2 and len(rows) == 2 * 4 * 2
    for mode in ("fwd", "fwd_bwd"):
        mine = packed[("triton", mode)]
        assert mine.status == "ok" and mine.rel_err < 1e-2 and mine.batch == 3
        assert mine.kv_heads == 2 and mine.causal
        flop = sum(bench.flops(1, 4, n, 16, True, mode) for n in batch.lengths)
        assert mine.tflops == pytest.approx(flop / 0.5e-3 / 1e12)
        assert packed[("sdpa_flash", mode)].status.startswith("wrong")
        assert math.isnan(packed[("sdpa_flash", mode)].median_ms)
        math_row = packed[("sdpa_math", mode)].status
        assert math_row.startswith("unavailable: ") and "is_causal" in math_row
        assert packed[("fa4", mode)].status.startswith("unavailable: ")
    # the CSV: lengths on packed rows only, and the rows read back as written
    assert [repr(r) for r in speed_results.read_rows(out)] == [repr(r) for r in rows]
    assert training.read_packed_column(out) == [""] * 8 + ["5+33+40"] * 8
    text = bench.summarize_csvs([str(out)])
    assert "Packed batches" in text and "| packed | fwd+bwd | sdpa_flash | 0/1 |" in text
    assert text.splitlines()[-1] == "| packed | fwd+bwd | fa4 | 0/1 | - | - | - | - |"


CHILD = r"""
import json, sys
sys.path.insert(0, "tests")  # run from the repository root: tests/_interp.py
from _interp import quick_interpreter
quick_interpreter()
import triton.testing
triton.testing.do_bench = lambda fn, **kw: (fn(), 0.25)[1]
from attnmem.measure.bench import speed, training
from attnmem.kernels.flash import api
assert api.interpreting()
args = speed.parse_args(["--impls", "triton", "sdpa_math", "--shapes", "bf16/16/8",
                         "--modes", "fwd", "fwd_bwd", "--heads", "2", "--csv", sys.argv[1]])
args.shapes = []
args.packed = [training.PackedBatch("tiny", "fp16", 16, 1, (5, 33, 40))]
rows = speed.run_grid(args, device="cpu")
print("JSON" + json.dumps([[r.impl, r.mode, r.status, r.rel_err, r.median_ms] for r in rows]))
"""


def test_packed_path_runs_our_kernel_under_the_interpreter(tmp_path):
    """Under TRITON_INTERPRET=1 (a child process: the switch must precede triton's import) the
    bench's packed path runs our real kernel through cu_seqlens, forward and forward+backward,
    and its output passes the per-sequence check."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "i.csv")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("JSON"))
    got = {(impl, mode): (status, rel, ms) for impl, mode, status, rel, ms in json.loads(line[4:])}
    for mode in ("fwd", "fwd_bwd"):
        status, rel, ms = got[("triton", mode)]
        assert status == "ok" and rel < 1e-2 and ms == 0.25
        assert got[("sdpa_math", mode)][0].startswith("unavailable: ")


def test_packed_only_keeps_the_packed_batches():
    """--packed-only with --preset training: no dense shape, the four packed batches (split by
    --part as before); without the training preset it is refused in one line."""
    args = bench.parse_args(["--preset", "training", "--packed-only"])
    assert args.shapes == [] and bench.shapes_of(args) == []
    assert [b.name for b in args.packed] == [b.name for b in training.PACKED]
    half = bench.parse_args(["--preset", "training", "--packed-only", "--part", "2/2"])
    assert half.shapes == [] and half.packed == list(training.PACKED)[1::2]
    for argv in (["--packed-only"], ["--preset", "anchors", "--packed-only"]):
        with pytest.raises(SystemExit) as info:
            bench.parse_args(argv)
        assert info.value.code == 2
    with pytest.raises(SystemExit):
        bench.parse_args(["--preset", "training", "--packed-only", "--dims", "64"])


def test_packed_variants_of_our_kernel():
    """On packed batches: triton_generic forces the portable forward, triton_sm90_3wg the
    Hopper one with three warpgroups, triton_sm90_bwd / triton_portable_bwd the Hopper / the
    portable packed backward."""
    from attnmem.kernels.flash.config import KernelConfig

    seen = []
    real = training.packed_fn
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    import attnmem.kernels.flash.api as api

    def fake_fa(q, k, v, causal=False, **kw):
        seen.append(kw["config"])
        return q

    orig = api.flash_attention
    api.flash_attention = fake_fa
    try:
        for name in ("triton", "triton_generic", "triton_sm90_3wg", "triton_sm90_bwd",
                     "triton_portable_bwd"):
            real(name, cu, (3, 5), "cpu")(cu, cu, cu, True)
    finally:
        api.flash_attention = orig
    assert seen == [None, KernelConfig(sm90=False),
                    KernelConfig(sm90=True, sm90_consumers=3, sm90_stages=2),
                    KernelConfig(sm90_bwd=True), KernelConfig(sm90_bwd=False)]
