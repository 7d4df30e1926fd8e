"""The suite's own set-up (tests/conftest.py): torch in the test processes runs on the number
of OpenMP threads that OMP_NUM_THREADS names (1 unless the caller chose), i.e. the variable
was set before torch was first imported; child processes inherit it from the environment."""

from __future__ import annotations

import os

import pytest


def test_torch_uses_the_thread_count_the_conftest_set() -> None:
    torch = pytest.importorskip("torch")
    want = os.environ.get("OMP_NUM_THREADS")
    assert want is not None, "tests/conftest.py did not set OMP_NUM_THREADS"
    assert torch.get_num_threads() == int(want), (torch.get_num_threads(), want)
