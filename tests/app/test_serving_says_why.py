"""Serving at a context no request fits says why instead of a bare 'Concurrent requests: 0'
(issue 32, item 3)."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]


def _run(**query: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / "attnmem" / "pages" / "serving.py"), default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def test_a_million_tokens_says_why_nothing_runs() -> None:
    at = _run(s="1000000")
    assert not at.exception
    assert any(m.value == "0" for m in at.metric)
    errors = " ".join(e.value for e in at.error)
    assert "Not one request of 1,000,000 tokens fits" in errors, errors
    assert "longest request that fits is" in errors


def test_a_fitting_context_has_no_such_message() -> None:
    at = _run(s="32768")
    assert not any("Not one request" in e.value for e in at.error)
