"""Running a multi-process command from a test: in a session of its own, with the project on
PYTHONPATH and one OpenMP thread per process (2 CI cores, several ranks), killed as a whole
past its timeout so that a hung process group cannot hang the suite."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_in_session(cmd: list[str], timeout: float, env: dict[str, str] | None = None
                   ) -> subprocess.CompletedProcess:
    """Run cmd from the project's root; past ``timeout`` kill its session and fail the test
    with the end of its stderr."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s; stderr ends: "
                    f"{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
