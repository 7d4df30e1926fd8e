"""The order tests/conftest.py runs the test files in: longest first, by the seconds per file
in tests/file_seconds.txt (a module of its own so that a test can read it: `conftest` is
not one importable name, tests/kernels has a conftest.py too)."""

from __future__ import annotations

from pathlib import Path

FILE_SECONDS = Path(__file__).resolve().with_name("file_seconds.txt")


def read_file_seconds(path: Path = FILE_SECONDS) -> dict[str, float]:
    """{test file's path from the repository root: seconds} from a "seconds path" table
    (lines starting with # are comments)."""
    seconds: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            value, name = line.split(maxsplit=1)
            seconds[name.strip()] = float(value)
    return seconds
