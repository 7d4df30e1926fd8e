"""The suite's own set-up (tests/conftest.py): torch in the test processes runs on the number
of OpenMP threads that OMP_NUM_THREADS names (1 unless the caller chose), i.e. the variable
was set before torch was first imported; child processes inherit it from the environment.
Objects alive when a test file starts are frozen out of the garbage collector's passes."""

from __future__ import annotations

import gc
import os

import pytest


def test_torch_uses_the_thread_count_the_conftest_set() -> None:
    torch = pytest.importorskip("torch")
    want = os.environ.get("OMP_NUM_THREADS")
    assert want is not None, "tests/conftest.py did not set OMP_NUM_THREADS"
    assert torch.get_num_threads() == int(want), (torch.get_num_threads(), want)


_MADE_AT_IMPORT = [object()]  # a tracked container, made when pytest imported this file


def test_objects_alive_when_the_file_started_are_frozen() -> None:
    """tests/conftest.py froze what survived up to this file's first test (gc.freeze), this
    module's own objects among them: the collector's passes no longer walk them."""
    assert gc.get_freeze_count() > 0
    assert not any(o is _MADE_AT_IMPORT for o in gc.get_objects())
    made_now: list[object] = []
    assert any(o is made_now for o in gc.get_objects())  # new objects are still collected


def test_the_file_seconds_table_names_test_files_longest_first() -> None:
    """tests/file_seconds.txt (the order tests/conftest.py runs the files in) names only test
    files that exist, each once, longest first."""
    from _schedule import FILE_SECONDS, read_file_seconds

    table = read_file_seconds()
    root = FILE_SECONDS.parent.parent
    assert len(table) > 20
    missing = [p for p in table if not (root / p).is_file() or not p.startswith("tests/")]
    assert not missing, f"{FILE_SECONDS.name} names files that are not test files: {missing}"
    names = [line.split()[1] for line in FILE_SECONDS.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert len(names) == len(set(names)), "a file is listed twice"
    assert list(table.values()) == sorted(table.values(), reverse=True)


def test_files_run_longest_first(request: pytest.FixtureRequest) -> None:
    """The session's items: the files of the table in its order, before every other file."""
    from _schedule import read_file_seconds

    table = read_file_seconds()
    files = list(dict.fromkeys(i.nodeid.split("::")[0] for i in request.session.items))
    listed = [f for f in files if f in table]
    assert listed == [f for f in table if f in listed]
    assert files[:len(listed)] == listed
