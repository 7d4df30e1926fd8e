"""The measurement harness on a CPU: fake implementations and a fake device injected, the child
process (time limit, crash, cancel), simulated out-of-memory, the GPU lock; and, marked gpu, the
real thing on an NVIDIA GPU (registry, a small sweep, predictions within 2% at s >= 1024).

This module doubles as the ``--impl-module`` of the child process in these tests: it defines
``get_implementation(name)`` and ``make_device()`` below, so the child runs the same fakes.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from attnmem.measure import registry
from attnmem.measure.child import GpuBusy, gpu_lock, run_points
from attnmem.measure.harness import (
    COLUMNS,
    BenchOptions,
    CpuDevice,
    PointConfig,
    expand_points,
    measure_point,
    rel_error,
)
from attnmem.measure.store import COLUMNS as STORE_COLUMNS
from attnmem.measure.store import validate_csv
from attnmem.measure.trace import summarise

THIS_MODULE = "tests.measure.test_harness"
FAST = BenchOptions(warmup_ms=1, rep_ms=2)

# --------------------------------------------------------------------------------------------
# Fakes: a device whose allocator counters the fake implementations drive.
# --------------------------------------------------------------------------------------------


class FakeMemory:
    def __init__(self) -> None:
        self.allocated = 0
        self.peak = 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n


MEM = FakeMemory()
FAKE_EXTRA_BYTES = 123_456


class FakeDevice(CpuDevice):
    name = "fake"

    def reset_peak(self) -> None:
        MEM.peak = MEM.allocated

    def allocated(self) -> int:
        return MEM.allocated

    def max_allocated(self) -> int:
        return MEM.peak

    def reserved(self) -> int:
        return MEM.allocated

    def max_reserved(self) -> int:
        return MEM.peak


def _fake_ok(q, k, v, causal=False, scale=None):
    MEM.alloc(FAKE_EXTRA_BYTES)
    MEM.free(FAKE_EXTRA_BYTES)
    return q * 1.0


def _fake_oom(q, k, v, causal=False, scale=None):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB (simulated)")


def _fake_error(q, k, v, causal=False, scale=None):
    raise ValueError("a simulated bug")


def _fake_sleep(q, k, v, causal=False, scale=None):
    time.sleep(30)
    return q


def _fake_crash(q, k, v, causal=False, scale=None):
    os._exit(3)


FAKES = {
    "fake_ok": _fake_ok,
    "fake_oom": _fake_oom,
    "fake_error": _fake_error,
    "fake_sleep": _fake_sleep,
    "fake_crash": _fake_crash,
}


def get_implementation(name: str):
    """Used by the child process (--impl-module tests.measure.test_harness)."""
    fn = FAKES.get(name)
    return None if fn is None else registry.Implementation(name, name, fn)


def make_device():
    return FakeDevice()


def cfg(impl: str = "fake_ok", s: int = 16, backward: bool = False, **kw) -> PointConfig:
    base = dict(batch=1, heads=2, seq_len=s, head_dim=8, dtype="fp32", causal=False,
                backward=backward)
    base.update(kw)
    return PointConfig(impl, **base)


# --------------------------------------------------------------------------------------------
# Registry.
# --------------------------------------------------------------------------------------------


def _reference(q, k, v, causal):
    q, k, v = (t.double() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("name", ["naive", "naive_inplace", "sdpa_math"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_cpu_implementations_match_reference(name, causal, kv_heads):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 37, 24)  # odd length on purpose
    k = torch.randn(2, kv_heads, 37, 24)
    v = torch.randn(2, kv_heads, 37, 24)
    ok, why = registry.available(name, "fp32", 24, heads=4, kv_heads=kv_heads, device="cpu")
    assert ok, why
    fn = registry.get(name, dtype="fp32", head_dim=24, gqa=kv_heads != 4, device="cpu").fn
    out = fn(q, k, v, causal, None)
    ref = _reference(q, k, v, causal)
    err = (out.double() - ref).norm() / ref.norm()
    assert err < 1e-5, f"{name} causal={causal} kv_heads={kv_heads}: rel err {err:.2e}"


def test_registry_names_match_calc():
    """calc models every measurable implementation in the registry's order; fa4 (optional) may
    be the one name calc does not list yet."""
    import attnmem.calc

    assert tuple(n for n in registry.NAMES if n in attnmem.calc.IMPLEMENTATIONS) == tuple(attnmem.calc.IMPLEMENTATIONS)
    assert set(registry.NAMES) - set(attnmem.calc.IMPLEMENTATIONS) <= {"fa4"}


def test_available_says_why():
    ok, why = registry.available("nope", "fp16", 64)
    assert not ok and "unknown implementation" in why and "naive" in why
    ok, why = registry.available("naive", "int8", 64)
    assert not ok and "fp16" in why
    ok, why = registry.available("naive", "fp16", 64, heads=6, kv_heads=4)
    assert not ok and "multiple" in why
    ok, why = registry.available("sdpa_flash", "fp16", 64, device="cpu")
    assert not ok and "CUDA" in why
    if not torch.cuda.is_available():
        for name in registry.NAMES:
            ok, why = registry.available(name, "fp16", 64)
            assert not ok and ("no CUDA GPU" in why or (
                name == "fa4" and "flash_attn.cute is not installed" in why)), (name, why)


def test_import_touches_no_gpu():
    code = ("import sys, torch; torch.cuda.is_available = None\n"
            "import attnmem.measure.registry, attnmem.measure.harness, attnmem.measure.child, attnmem.measure.cli, attnmem.measure.trace\n"
            "import attnmem.measure.store\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_store_does_not_import_torch():
    code = "import sys; import attnmem.measure.store; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "importing attnmem.measure.store pulled in torch"
    src = (Path(__file__).resolve().parents[2] / "attnmem" / "measure" / "store.py").read_text()
    assert "import torch" not in src


# --------------------------------------------------------------------------------------------
# The harness, in process.
# --------------------------------------------------------------------------------------------


def test_measure_point_fake_device_counts_extra_bytes():
    res = measure_point(cfg(), device=FakeDevice(), impl=get_implementation("fake_ok"),
                        options=FAST)
    assert res.status == "ok", res.message
    assert res.peak_extra_bytes == FAKE_EXTRA_BYTES
    assert res.median_ms is not None and res.median_ms >= 0
    assert res.wall_s is not None and res.wall_s >= 0
    assert res.gpu_name == "cpu" and res.torch_version == torch.__version__
    assert res.timestamp.endswith("+00:00")
    assert tuple(res.to_row()) == COLUMNS == STORE_COLUMNS


def test_measure_point_backward_fake():
    res = measure_point(cfg(backward=True), device=FakeDevice(),
                        impl=get_implementation("fake_ok"), options=FAST)
    assert res.status == "ok", res.message
    assert res.backward is True and res.peak_extra_bytes == FAKE_EXTRA_BYTES


def test_simulated_oom_is_a_result_and_the_harness_goes_on():
    dev = FakeDevice()
    res = measure_point(cfg("fake_oom"), device=dev, impl=get_implementation("fake_oom"),
                        options=FAST)
    assert res.status == "oom"
    assert "out of memory" in res.message
    nxt = measure_point(cfg(), device=dev, impl=get_implementation("fake_ok"), options=FAST)
    assert nxt.status == "ok"


def test_error_is_a_row():
    res = measure_point(cfg("fake_error"), device=FakeDevice(),
                        impl=get_implementation("fake_error"), options=FAST)
    assert res.status == "error" and "simulated bug" in res.message


def test_real_naive_on_cpu_with_prediction():
    res = measure_point(cfg("naive", s=64, dtype="fp32", causal=True), device=CpuDevice(),
                        options=FAST)
    assert res.status == "ok", res.message
    assert res.predicted_bytes and res.predicted_bytes > 0
    assert res.tflops is not None and res.tflops > 0
    assert res.peak_extra_bytes is None  # no allocator counters on a CPU: no fake numbers


def test_unavailable_and_skipped():
    res = measure_point(cfg("sdpa_flash", dtype="fp16"), device=CpuDevice(), options=FAST)
    assert res.status == "unavailable" and "CUDA" in res.message
    res = measure_point(cfg("naive", s=64), device=CpuDevice(),
                        options=BenchOptions(max_predicted_bytes=10))
    assert res.status == "skipped" and "exceeds" in res.message


def test_bad_dtype_and_heads_are_errors_not_exceptions():
    res = measure_point(cfg("naive", dtype="int4"), device=CpuDevice(), options=FAST)
    assert res.status == "error" and "fp16" in res.message
    res = measure_point(cfg("naive", heads=3, kv_heads=2), device=CpuDevice(), options=FAST)
    assert res.status == "error" and "multiple" in res.message


def test_rel_error_and_expand_points():
    assert rel_error(102, 100) == pytest.approx(0.02)
    assert rel_error(None, 100) is None and rel_error(5, 0) is None
    pts = expand_points(["naive", "sdpa_flash"], [256, 512], dtypes=["fp16", "bf16"],
                        causals=[False, True], backwards=[False, True], head_dims=[64, 128])
    assert len(pts) == 2 * 2 * 2 * 2 * 2 * 2
    assert len(set(pts)) == len(pts)


# --------------------------------------------------------------------------------------------
# The child process.
# --------------------------------------------------------------------------------------------


def test_child_process_ok_oom_timeout_crash_then_fresh_child(tmp_path):
    points = [cfg("fake_ok"), cfg("fake_oom"), cfg("fake_sleep"), cfg("fake_ok", s=32),
              cfg("fake_crash"), cfg("fake_ok", s=64)]
    seen = []
    summary = run_points(points, options=FAST, impl_module=THIS_MODULE, timeout_s=4,
                         startup_s=60, lock_dir=tmp_path,
                         on_result=lambda r, i, n: seen.append((i, n, r.status)))
    statuses = [r.status for r in summary.results]
    assert statuses == ["ok", "oom", "timeout", "ok", "crashed", "ok"], summary.results
    assert [i for i, _, _ in seen] == list(range(6)) and all(n == 6 for _, n, _ in seen)
    assert summary.children_started == 3  # the first, after the timeout, after the crash
    assert summary.results[0].peak_extra_bytes == FAKE_EXTRA_BYTES
    assert "killed" in summary.results[2].message
    assert "exit code 3" in summary.results[4].message
    assert not summary.cancelled


def test_child_cancel(tmp_path):
    cancel = threading.Event()
    points = [cfg("fake_ok", s=s) for s in (8, 16, 32, 64)]

    def on_result(r, i, n):
        cancel.set()

    summary = run_points(points, options=FAST, impl_module=THIS_MODULE, cancel=cancel,
                         on_result=on_result, lock_dir=tmp_path)
    assert summary.cancelled and len(summary.results) == 1


def test_cancel_while_a_point_runs(tmp_path):
    cancel = threading.Event()
    threading.Timer(3.0, cancel.set).start()
    t0 = time.monotonic()
    summary = run_points([cfg("fake_sleep")], options=FAST, impl_module=THIS_MODULE,
                         cancel=cancel, timeout_s=60, lock_dir=tmp_path)
    assert summary.cancelled and summary.results == []
    assert time.monotonic() - t0 < 20


def test_skip_longer_after_oom_and_deadline(tmp_path):
    points = [cfg("fake_oom", s=16), cfg("fake_oom", s=32), cfg("fake_ok", s=32)]
    summary = run_points(points, options=FAST, impl_module=THIS_MODULE, lock_dir=tmp_path)
    assert [r.status for r in summary.results] == ["oom", "skipped", "ok"]
    summary = run_points([cfg("fake_ok"), cfg("fake_ok", s=32)], options=FAST,
                         impl_module=THIS_MODULE, lock_dir=tmp_path, deadline_s=0.0)
    assert {r.status for r in summary.results} == {"skipped"}


def test_lock_refuses_a_second_measurement(tmp_path):
    with gpu_lock(0, lock_dir=tmp_path):
        with pytest.raises(GpuBusy, match="busy"):
            run_points([cfg()], options=FAST, impl_module=THIS_MODULE, lock_dir=tmp_path)
        t0 = time.monotonic()
        with pytest.raises(GpuBusy):
            with gpu_lock(0, lock_dir=tmp_path, wait_s=0.5):
                pass
        assert time.monotonic() - t0 >= 0.45
        with gpu_lock(1, lock_dir=tmp_path):  # another GPU has its own lock
            pass
    with gpu_lock(0, lock_dir=tmp_path):  # released
        pass


def test_lock_across_processes(tmp_path):
    code = ("import fcntl, sys, time\n"
            f"fh = open({str(tmp_path / 'gpu0.lock')!r}, 'a+')\n"
            "fcntl.flock(fh.fileno(), fcntl.LOCK_EX)\n"
            "fh.write('pid other'); fh.flush(); print('locked', flush=True)\n"
            "time.sleep(30)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(GpuBusy, match="already running"):
            with gpu_lock(0, lock_dir=tmp_path, wait_s=0.3):
                pass
    finally:
        holder.kill()
        holder.wait()
    with gpu_lock(0, lock_dir=tmp_path, wait_s=5):  # the kernel released the dead holder's lock
        pass


def test_waiting_for_the_lock(tmp_path):
    got = []

    def later():
        with gpu_lock(0, lock_dir=tmp_path, wait_s=10):
            got.append(True)

    with gpu_lock(0, lock_dir=tmp_path):
        t = threading.Thread(target=later)
        t.start()
        time.sleep(0.5)
        assert not got
    t.join(timeout=10)
    assert got == [True]


# --------------------------------------------------------------------------------------------
# The command line (real eager implementations on the CPU, through the child).
# --------------------------------------------------------------------------------------------


def test_cli_writes_the_page_rows(tmp_path, monkeypatch):
    from attnmem.measure import cli as measure

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    out = tmp_path / "r.csv"
    db = tmp_path / "r.sqlite"
    rc = measure.main(["--impl", "naive,naive_inplace,sdpa_flash", "--seq-len", "32,64",
                       "--heads", "2", "--head-dim", "16", "--dtype", "fp32", "--causal-both",
                       "--both", "--out", str(out), "--db", str(db), "--rep-ms", "2",
                       "--warmup-ms", "1", "--quiet"])
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
    assert tuple(rows[0]) == COLUMNS
    assert len(rows) == 3 * 2 * 2 * 2
    assert {r["status"] for r in rows if r["impl"] == "sdpa_flash"} == {"unavailable"}
    assert {r["status"] for r in rows if r["impl"] != "sdpa_flash"} == {"ok"}
    v = validate_csv(out.read_bytes())
    assert v.ok, v.errors
    from attnmem.measure.store import ResultStore

    st = ResultStore(db)
    (run,) = st.runs()
    assert run.n_rows == len(rows) and run.gpu_name == "cpu"


def test_cli_rejects_bad_arguments(capsys):
    from attnmem.measure import cli as measure

    with pytest.raises(SystemExit):
        measure.main(["--impl", "naive,bogus"])
    assert "bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        measure.main(["--seq-len", "0,-5"])


def test_trace_summarise():
    events = [
        {"ph": "X", "cat": "kernel", "name": "softmax_warp_forward", "dur": 30.0},
        {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 60.0},
        {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 60.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "dur": 10.0,
         "args": {"bytes": 4096}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 500.0},
    ]
    rows = summarise(events, {"impl": "naive"})
    by = {r["kernel"]: r for r in rows}
    assert by["gemm"]["count"] == 2 and by["gemm"]["share"] == pytest.approx(120 / 160, abs=1e-3)
    assert by["Memcpy DtoD"]["bytes"] == 4096 and by["Memcpy DtoD"]["category"] == "memcpy"
    assert by["(all)"]["count"] == 4 and "aten::mm" not in by


# --------------------------------------------------------------------------------------------
# On a GPU.
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_registry_reports_each_implementation():
    for name in registry.NAMES:
        ok, why = registry.available(name, "fp16", 128, heads=32)
        if name == "triton":
            assert ok or "import" in why
        elif name == "fa4":  # optional: installed and on a 9.x/10.x GPU, or it says why not
            assert ok or "flash_attn.cute" in why or "compute capability" in why, why
        else:
            assert ok, f"{name}: {why}"


@pytest.mark.gpu
def test_gpu_outputs_agree():
    torch.manual_seed(0)
    q = torch.randn(1, 8, 1025, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 8, 1025, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(1, 8, 1025, 64, device="cuda", dtype=torch.float16)
    ref = _reference(q, k, v, True)
    for name in registry.NAMES:
        ok, why = registry.available(name, "fp16", 64, causal=True, heads=8)
        if not ok:
            continue
        out = registry.get(name, dtype="fp16", head_dim=64, causal=True).fn(q, k, v, True, None)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 5e-3, f"{name}: rel err {err:.2e}"


@pytest.mark.gpu
def test_gpu_small_sweep_predictions_within_2_percent(tmp_path):
    points = expand_points(list(registry.NAMES), [1024, 2048], heads=32, head_dim=128,
                           dtypes=["fp16"], causals=[False, True], backwards=[False, True])
    summary = run_points(points, options=BenchOptions(warmup_ms=5, rep_ms=20), lock_dir=tmp_path)
    bad = []
    for r in summary.results:
        if r.status == "unavailable" and r.impl in ("triton", "fa4"):
            continue
        assert r.status == "ok", (r.impl, r.seq_len, r.status, r.message)
        assert r.peak_extra_bytes and r.peak_extra_bytes > 0
        assert r.median_ms and r.median_ms > 0 and r.gpu_name
        if r.impl == "fa4" and r.predicted_bytes is None:  # calc has no FA4 model (yet)
            continue
        if r.rel_error is None or abs(r.rel_error) > 0.02:
            bad.append((r.impl, r.mode, r.seq_len, r.causal, r.peak_extra_bytes,
                        r.predicted_bytes, r.rel_error))
    assert not bad, bad


@pytest.mark.gpu
def test_gpu_real_out_of_memory_is_a_result(tmp_path):
    # naive at s = 65,536 needs 2 * 32 * 65,536^2 * 2 bytes = 550 GB: refused at once
    points = [PointConfig("naive", 1, 32, 65536, 64, "fp16"), PointConfig("sdpa_flash", 1, 32, 1024, 64, "fp16")]
    summary = run_points(points, options=BenchOptions(warmup_ms=1, rep_ms=5), lock_dir=tmp_path)
    assert [r.status for r in summary.results] == ["oom", "ok"]
    assert "out of memory" in summary.results[0].message.lower()
