"""Shared pytest set-up: one OpenMP thread per process, no per-example deadline for
hypothesis, and the `gpu` marker skips with a stated reason where CUDA is absent."""

from __future__ import annotations

import gc
import os
import resource
import sys
import time
from pathlib import Path

import pytest

# One OpenMP thread per process (torch's CPU ops, in this process and in the child processes
# the tests start, which inherit the variable). The tests' tensors are tiny, so a second thread
# only adds synchronisation; with two xdist workers on two cores, two threads each
# oversubscribe the cores and the threads' spin-waits cost more than the work. Measured on
# the Triton-interpreter run of tests/kernels/test_flash_attention.py on a busy 2-core
# machine: 80 s wall / 23 s CPU with the default, 21 s wall / 15 s CPU with one thread.
# Set before any test module imports torch; an explicit setting by the caller wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Property tests check results, not speed: hypothesis's default 200 ms per example is a timing
# assertion that a busy 2-core CI machine can trip (two such examples did while other work ran).
try:
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("suite", deadline=None)
    _hyp_settings.load_profile("suite")
except ImportError:  # hypothesis is a dev requirement; without it those tests skip
    pass


def _cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (torch.cuda.is_available() is False)"
    return None


# Test files run longest first. Under `pytest -n 2 --dist loadfile` (make test) each worker
# takes the next whole file whenever it runs out, in the order of the collection; a long file
# taken last is run by one worker while the other has finished (the longest file alone is
# about a tenth of the suite). Longest first (LPT scheduling) leaves only short files for the
# end. The seconds per file are tests/file_seconds.txt's (measured; see that file, read by
# tests/_schedule.py); files not listed there (under 2 s) follow in collection order.
# pytest-xdist's own reordering, by the number of tests in a file (its default with
# loadscope/loadfile), ran the few-test files last, which are the long ones here (a browser
# walk of every page is 1 test, 26 s): off.
def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist is installed
        config.option.loadscopereorder = False


def _longest_files_first(items: list[pytest.Item]) -> None:
    from _schedule import read_file_seconds  # tests/ is on sys.path (below)

    # the table's own order (longest first; ties as the table lists them), then the files it
    # does not list in collection order
    rank = {path: r for r, path in enumerate(read_file_seconds())}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], i)

    def key(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::")[0]
        return rank.get(path, len(rank)), first[path]

    items.sort(key=key)  # stable: a file's tests keep their order


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    if not any("gpu" in item.keywords for item in items):
        return
    reason = _cuda_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test skipped: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Shared helpers for the tests in the layer folders (``from _robust import ...``).
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Python's cyclic garbage collector, at each full collection, walks every object the process
# holds; in a test worker that is torch, transformers, pandas, streamlit and every test module
# (about 440,000 objects), and the measurement code the tests run calls gc.collect() several
# times a step (attnmem/measure: before each memory reading). At the start of each test file
# the garbage is collected and what survives is frozen (gc.freeze: moved to a generation the
# collector skips), so later collections walk only what was made since. Objects still free
# normally when their last reference goes; only a reference cycle among frozen objects would
# wait until the end of the session. Measured in one pytest process on a busy 2-core machine:
# tests/measure/test_train_harness.py with tests/calc/test_training_step.py 21 -> 16 s CPU
# (the collector's share 4.6 -> 2.2 s); test_fuzz_hostile_inputs, app/test_pages,
# test_infer_harness and test_training_lora 49 -> 41 and 54 -> 44 s CPU (two runs each).
_last_file: list[object] = [None]


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.path != _last_file[0]:
        _last_file[0] = item.path
        gc.collect()
        gc.freeze()


def pytest_sessionfinish(session: pytest.Session) -> None:
    gc.unfreeze()  # a normal interpreter exit: every remaining object is collected


# Where the suite's time goes, printed after pytest's slowest-durations list: the seconds of
# each test file (setup + call + teardown of its tests), the CPU seconds its process and the
# child processes it waited for used meanwhile (a file far below its seconds mostly waits:
# sleeps, time limits, a browser's quiet periods), and, under xdist, which worker ran it; then
# each worker's total and when (seconds after the session started) it sent its last report.
# Two workers finishing far apart is time lost to the split (a big file scheduled last), not to
# any one test. In the xdist controller a report carries the worker that ran it (report.node)
# and the CPU seconds its worker measured (report.cpu_s, sent with the report).
FILE_SECONDS_SHOWN = 2.0  # files that took at least this long are listed (the table's cut)
_file_seconds: dict[tuple[str, str], list[float]] = {}
_worker_last: dict[str, float] = {}
_session_start: list[float] = []
_cpu_mark: list[float] = []


def _cpu_seconds() -> float:
    """User + system CPU of this process and of its waited-for children, so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_sessionstart(session: pytest.Session) -> None:
    _session_start.append(time.monotonic())


def pytest_collection_finish(session: pytest.Session) -> None:
    _cpu_mark[:] = [_cpu_seconds()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    now = _cpu_seconds()
    outcome.get_result().cpu_s = now - (_cpu_mark[0] if _cpu_mark else now)
    _cpu_mark[:] = [now]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)
    worker = node.gateway.id if node is not None else "-"
    key = (worker, report.nodeid.split("::")[0])
    wall_cpu = _file_seconds.setdefault(key, [0.0, 0.0])
    wall_cpu[0] += report.duration
    wall_cpu[1] += getattr(report, "cpu_s", 0.0)
    if _session_start:
        _worker_last[worker] = time.monotonic() - _session_start[0]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _file_seconds:
        return  # an xdist worker: the controller prints the whole picture
    tr = terminalreporter
    tr.write_sep("=", "seconds per test file (CPU seconds, worker)")
    files = sorted(_file_seconds.items(), key=lambda kv: -kv[1][0])
    for (worker, path), (seconds, cpu) in files:
        if seconds >= FILE_SECONDS_SHOWN:
            tr.write_line(f"{seconds:8.1f}s {cpu:7.1f}s cpu {worker:>4} {path}")
    totals: dict[str, list[float]] = {}
    for (worker, _), (seconds, cpu) in files:
        total = totals.setdefault(worker, [0.0, 0.0, 0])
        total[0] += seconds
        total[1] += cpu
        total[2] += 1
    for worker, (seconds, cpu, count) in sorted(totals.items()):
        tr.write_line(f"worker {worker}: {seconds:.1f} s of tests ({cpu:.1f} s CPU) in {count:.0f} "
                      f"files, last report {_worker_last.get(worker, 0.0):.1f} s after the session "
                      f"started")
