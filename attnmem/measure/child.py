"""Run measurement points in a child process: a crash, a hang or a fragmented allocator never
takes the caller (the app, the command line) down.

Protocol: the parent starts ``python -m attnmem.measure.child`` and writes one JSON line per request
on its stdin (``{"cfg": {...}, "options": {...}}`` to measure, ``{"trace": {...}}`` for a trace
fingerprint); the child answers one JSON line per request on its stdout (``{"result": row}`` or
``{"trace": rows}``). Anything the implementations print goes to the child's stderr, never into
the protocol. The parent reads with a time limit per point: past it the child is killed, the
point is recorded as ``timeout`` and a fresh child starts for the next point. A child that dies
mid-point is recorded as ``crashed`` (exit code and the end of its stderr in the message).

One child serves a whole run (CUDA start-up and compilation are paid once, which the 90-second
default sweep needs); the harness empties the allocator's cache and resets its counters before
every point, so each point starts from a clean allocator.

One measurement at a time per GPU, across processes and browser sessions: ``gpu_lock`` takes an
exclusive ``fcntl.flock`` on ``<data dir>/gpu<index>.lock``; a second requester waits up to
``wait_s`` and then gets ``GpuBusy`` with a message naming the holder. Cancel: set the
``cancel`` Event (or raise from ``on_result``): the child is killed and the lock released.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from attnmem.measure.harness import BenchOptions, PointConfig, PointResult, result_for
from attnmem.measure.store import data_dir

REPO_ROOT = Path(__file__).resolve().parents[2]


class GpuBusy(RuntimeError):
    """Another measurement holds this GPU's lock."""


@contextlib.contextmanager
def gpu_lock(gpu_index: int = 0, *, wait_s: float = 0.0, lock_dir: str | os.PathLike[str] | None = None,
             poll_s: float = 0.2) -> Iterator[Path]:
    """Hold the GPU's measurement lock for the duration of the block (fcntl.flock, exclusive).

    The kernel releases a flock when its holder dies, so a crashed app never leaves it stuck.
    """
    d = Path(lock_dir) if lock_dir is not None else data_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"gpu{gpu_index}.lock"
    fh = open(path, "a+")  # noqa: SIM115 - held open for the lock's lifetime
    try:
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.seek(0)
                    holder = fh.read().strip()[:200] or "another process"
                    raise GpuBusy(
                        f"GPU {gpu_index} is busy: a measurement is already running "
                        f"({holder}). Only one runs at a time per GPU; try again when it "
                        f"finishes (lock file {path})."
                    ) from None
                time.sleep(poll_s)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        fh.flush()
        yield path
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        fh.close()


# --------------------------------------------------------------------------------------------
# The parent side.
# --------------------------------------------------------------------------------------------


class WorkerProcess:
    """One worker process (``python -m <args>``, run from the repository root) and a thread that
    turns its stdout into a queue of JSON messages; the attention points' worker (`_Child`),
    the training steps' worker (attnmem.measure.train.worker) and the inference worker
    (attnmem.measure.infer.worker) speak this protocol."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None) -> None:
        cmd = [sys.executable, "-m", *args]
        self.stderr = tempfile.TemporaryFile(mode="w+b")
        child_env = dict(os.environ)
        child_env["PYTHONUNBUFFERED"] = "1"
        child_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT)] + ([child_env["PYTHONPATH"]] if child_env.get("PYTHONPATH") else []))
        child_env.update(env or {})
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, cwd=str(REPO_ROOT), env=child_env,
                                     text=True, bufsize=1, start_new_session=True)
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.points_done = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                self.messages.put(json.loads(line))
            except json.JSONDecodeError:
                continue  # not ours; the protocol is JSON lines only
        self.messages.put(None)  # EOF: the child is gone

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def stderr_tail(self, n: int = 600) -> str:
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - n))
            return " ".join(self.stderr.read().decode("utf-8", "replace").split())
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()  # our own child, by its pid
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        with contextlib.suppress(OSError):
            self.stderr.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.send({"cmd": "exit"})
                self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


class _Child(WorkerProcess):
    """The attention points' worker (this module's ``worker_main``)."""

    def __init__(self, impl_module: str | None, env: dict[str, str] | None) -> None:
        args = ["attnmem.measure.child"] + (["--impl-module", impl_module] if impl_module else [])
        super().__init__(args, env)


@dataclass
class RunSummary:
    """What run_points did."""

    results: list[PointResult] = field(default_factory=list)
    cancelled: bool = False
    wall_s: float = 0.0
    children_started: int = 0


class Cancelled(Exception):
    """Raised inside run_points when the cancel event is set (caught there)."""


def _wait(child: _Child, timeout_s: float, cancel: threading.Event | None) -> dict[str, Any] | None | str:
    """The child's next message; 'timeout' or 'cancel' as strings; None when it died."""
    deadline = time.monotonic() + timeout_s
    while True:
        if cancel is not None and cancel.is_set():
            return "cancel"
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        try:
            return child.messages.get(timeout=min(0.2, left))
        except queue.Empty:
            continue


def run_points(
    points: Sequence[PointConfig],
    *,
    options: BenchOptions | None = None,
    on_result: Callable[[PointResult, int, int], None] | None = None,
    cancel: threading.Event | None = None,
    timeout_s: float = 120.0,
    startup_s: float = 60.0,
    impl_module: str | None = None,
    gpu_index: int = 0,
    lock_wait_s: float = 0.0,
    lock_dir: str | os.PathLike[str] | None = None,
    skip_longer_after_oom: bool = True,
    env: dict[str, str] | None = None,
    deadline_s: float | None = None,
) -> RunSummary:
    """Measure ``points`` one by one in a child process, holding the GPU lock.

    ``on_result(result, i, n)`` is called as each point finishes (stream it to a chart, a
    progress bar, the store). ``timeout_s`` limits each point (plus ``startup_s`` for the first
    point of a fresh child: torch import, CUDA start). With ``skip_longer_after_oom`` a point
    longer than one of the same series that ran out of memory is recorded as skipped.
    ``deadline_s`` bounds the whole run: points not started by then are recorded as skipped.
    Raises GpuBusy when another measurement holds the lock past ``lock_wait_s``.
    """
    options = options or BenchOptions()
    summary = RunSummary()
    t0 = time.monotonic()
    oom_at: dict[tuple, int] = {}
    with gpu_lock(gpu_index, wait_s=lock_wait_s, lock_dir=lock_dir):
        child: _Child | None = None
        try:
            for i, cfg in enumerate(points):
                if cancel is not None and cancel.is_set():
                    raise Cancelled
                series = (cfg.impl, cfg.batch, cfg.heads, cfg.h_kv, cfg.head_dim, cfg.dtype,
                          cfg.causal, cfg.backward)
                if deadline_s is not None and time.monotonic() - t0 > deadline_s:
                    res = result_for(cfg, "skipped", message=(
                        f"not run: the run's time budget of {deadline_s:g} s was spent"))
                elif skip_longer_after_oom and series in oom_at and cfg.seq_len >= oom_at[series]:
                    res = result_for(cfg, "skipped", message=(
                        f"not run: s={oom_at[series]} of the same series already ran out of memory"))
                else:
                    if child is None or child.proc.poll() is not None:
                        if child is not None:
                            child.kill()
                        child = _Child(impl_module, env)
                        summary.children_started += 1
                    limit = timeout_s + (startup_s if child.points_done == 0 else 0.0)
                    child.send({"cfg": cfg.to_dict(), "options": asdict(options)})
                    msg = _wait(child, limit, cancel)
                    if msg == "cancel":
                        raise Cancelled
                    if msg == "timeout":
                        child.kill()
                        child = None
                        res = result_for(cfg, "timeout", message=(
                            f"no result within {limit:.0f} s: the child process was killed and a "
                            "fresh one started for the next point"))
                    elif msg is None or not isinstance(msg, dict) or "result" not in msg:
                        code = child.proc.wait(timeout=10) if child.proc.poll() is None else child.proc.returncode
                        tail = child.stderr_tail()
                        child.kill()
                        child = None
                        res = result_for(cfg, "crashed", message=(
                            f"the child process died (exit code {code}) during this point; "
                            f"stderr ends: {tail[-300:]}"))
                    else:
                        res = PointResult(**msg["result"])
                        child.points_done += 1
                if res.status == "oom":
                    oom_at[series] = min(cfg.seq_len, oom_at.get(series, cfg.seq_len))
                summary.results.append(res)
                if on_result is not None:
                    on_result(res, i, len(points))
        except Cancelled:
            summary.cancelled = True
        finally:
            if child is not None:
                if summary.cancelled or sys.exc_info()[0] is not None:
                    child.kill()
                else:
                    child.close()
    summary.wall_s = time.monotonic() - t0
    return summary


def run_trace(cfgs: Sequence[PointConfig], *, timeout_s: float = 300.0,
              impl_module: str | None = None, gpu_index: int = 0, lock_wait_s: float = 0.0,
              lock_dir: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Trace fingerprints (attnmem.measure.trace) of ``cfgs``, in a child process under the GPU lock."""
    out: list[dict[str, Any]] = []
    with gpu_lock(gpu_index, wait_s=lock_wait_s, lock_dir=lock_dir):
        child = _Child(impl_module, None)
        try:
            for cfg in cfgs:
                child.send({"trace": cfg.to_dict()})
                msg = _wait(child, timeout_s, None)
                if isinstance(msg, dict) and "trace" in msg:
                    out.extend(msg["trace"])
                else:
                    why = "timeout" if msg == "timeout" else "crashed"
                    out.append({"impl": cfg.impl, "seq_len": cfg.seq_len, "status": why,
                                "kernel": "", "message": child.stderr_tail()[-300:]})
                    child.kill()
                    child = _Child(impl_module, None)
        finally:
            child.close()
    return out


# --------------------------------------------------------------------------------------------
# The child side.
# --------------------------------------------------------------------------------------------


def _load_module(name: str | None) -> Any:
    if not name:
        return None
    import importlib

    return importlib.import_module(name)


def worker_main(impl_module: str | None, stdin: IO[str], proto: IO[str]) -> None:
    """Serve requests from stdin until EOF or {"cmd": "exit"}."""
    from attnmem.measure.harness import measure_point

    mod = _load_module(impl_module)
    device = mod.make_device() if mod is not None and hasattr(mod, "make_device") else None
    if device is None:
        # cuBLAS workspaces get segments of their own now, so that every point starts from an
        # emptied cache (attnmem/measure/prewarm.py says why); a no-op without a GPU
        from attnmem.measure.prewarm import prewarm

        prewarm()
    for line in stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        if msg.get("cmd") == "exit":
            break
        if "trace" in msg:
            from attnmem.measure.trace import fingerprint

            cfg = PointConfig.from_dict(msg["trace"])
            try:
                rows = fingerprint(cfg)
            except Exception as exc:  # noqa: BLE001 - a failed trace is a row, not a crash
                rows = [{"impl": cfg.impl, "seq_len": cfg.seq_len, "status": "error",
                         "kernel": "", "message": f"{type(exc).__name__}: {exc}"[:300]}]
            proto.write(json.dumps({"trace": rows}) + "\n")
            proto.flush()
            continue
        cfg = PointConfig.from_dict(msg["cfg"])
        options = BenchOptions(**msg.get("options", {}))
        impl = mod.get_implementation(cfg.impl) if mod is not None and hasattr(mod, "get_implementation") else None
        try:
            res = measure_point(cfg, device=device, impl=impl, options=options)
        except Exception as exc:  # noqa: BLE001 - keep serving; the row says what broke
            res = result_for(cfg, "error", message=f"{type(exc).__name__}: {exc}"[:400])
        proto.write(json.dumps({"result": res.to_row()}) + "\n")
        proto.flush()


def watch_parent(poll_s: float = 0.5) -> None:
    """End this worker when the process that started it dies (the app killed mid-point), so
    an orphan never keeps the GPU busy: PR_SET_PDEATHSIG where Linux offers it, and a thread
    that notices the parent's pid change (re-parented to init) as a fallback."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:  # the parent died before the call above took effect
        os._exit(70)

    def loop() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(70)

    threading.Thread(target=loop, daemon=True, name="watch-parent").start()


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="measurement worker (started by attnmem.measure.child)")
    ap.add_argument("--impl-module", default=None,
                    help="module with get_implementation(name) / make_device() (tests)")
    args = ap.parse_args(argv)
    watch_parent()
    # The protocol owns the real stdout; everything else printed (Python or C) goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker_main(args.impl_module, sys.stdin, proto)


if __name__ == "__main__":
    main()
