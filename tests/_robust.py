"""Shared pieces of the robustness suite (tests/*/test_fuzz_*.py, test_uploads_hostile.py, ...).

- `time_limit(seconds)`: turns a hang into a failure (SIGALRM; main thread, POSIX only).
- `HOSTILE`: a hypothesis strategy of values nobody should pass: None, bools, huge and
  negative ints, NaN/inf floats, text (including number-like text), lists, dicts, bytes.
- `assert_clear_error`: the error is a ValueError/TypeError whose message names one of the
  arguments that was given a hostile value.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from fractions import Fraction

from hypothesis import strategies as st


class Hang(AssertionError):
    """Raised inside the code under test when it runs past its time limit."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail (raise Hang) if the body runs longer than `seconds` of wall time.

    Shares SIGALRM with pytest-timeout's signal method: the outer timer (if any) is put back
    afterwards with the time that is left of it, so a test keeps its overall limit.
    """

    def _on_alarm(signum, frame):  # noqa: ARG001
        raise Hang(f"still running after {seconds} s: a hang or an unbounded loop")

    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer_left > 0:
            left = max(outer_left - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)


NUMBER_LIKE_TEXT = st.sampled_from(
    ["", " ", "0", "-1", "4096", "4096.0", "1e999", "nan", "NaN", "inf", "-inf", "0x10",
     "1_000", "½", "٣", "fp16", "bf16", "naive", "true", "false", "None", "null", "GB"]
)

HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.integers(min_value=10**18, max_value=10**400),
    st.integers(max_value=-(10**18), min_value=-(10**400)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.5, 1e-300, 1e300, 2.5]),
    st.text(max_size=12),
    NUMBER_LIKE_TEXT,
    st.lists(st.integers(min_value=-3, max_value=5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.binary(max_size=6),
    st.just(Fraction(1, 3)),
    st.just(object()),
)


def message_names(err: BaseException, names: Iterable[str]) -> bool:
    text = str(err)
    return any(n in text for n in names)


def assert_clear_error(err: BaseException, names: Iterable[str], call: str) -> None:
    names = list(names)
    assert isinstance(err, (ValueError, TypeError)), (
        f"{call} raised {type(err).__name__}: {err!s} (expected ValueError/TypeError)"
    )
    assert message_names(err, names), (
        f"{call} raised {type(err).__name__}({err!s}) whose message names none of {names}"
    )


def streamlit_server_option(root, key: str, default: object = None) -> object:
    """A [server] option of the repository's .streamlit/config.toml (tomllib on 3.11+, a
    plain line reader on 3.10, which is enough for this flat file)."""
    text = (root / ".streamlit" / "config.toml").read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10
        section = ""
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if line.startswith("["):
                section = line.strip("[]").strip()
            elif "=" in line and section == "server":
                k, v = (p.strip() for p in line.split("=", 1))
                if k == key:
                    v = v.strip('"').strip("'")
                    return int(v) if v.isdigit() else v
        return default
    return tomllib.loads(text).get("server", {}).get(key, default)
