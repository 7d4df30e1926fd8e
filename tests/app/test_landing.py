"""The page a user lands on (issue 32, item 8): "/" opens Will it fit?, the first page in the
sidebar, while the links the app issued before keep opening the page they were made on: "/?..."
with Score-matrix inputs (made when Score matrix was the root page) opens Score matrix with
those inputs, and Will it fit?'s own links stay on it. /will_it_fit (its old address) is
checked in the browser (tests/browser/test_pages_in_chromium.py): AppTest cannot open a path."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnmem.calc import format_bytes, score_matrix_bytes

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
WILL, SCORE = "Will it fit?", "Score matrix memory"


def open_app(**query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def title(at: AppTest) -> str:
    return at.title[0].value


def url(at: AppTest) -> dict[str, str]:
    return {k: (v[0] if isinstance(v, list) else v) for k, v in at.query_params.items()}


def spec_keys(page: str) -> set[str]:
    """The keys of a page's SPECS dict, read from its source (importing a page runs it)."""
    tree = ast.parse((ROOT / "attnmem" / "pages" / page).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SPECS" for t in node.targets):
            return {k.value for k in node.value.keys}
    raise AssertionError(f"no SPECS in attnmem/pages/{page}")


def score_keys() -> frozenset[str]:
    """app.py's SCORE_KEYS, read from its source (importing app.py runs it)."""
    tree = ast.parse((ROOT / "app.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "SCORE_KEYS")
    return frozenset(ast.literal_eval(node.value.args[0]))


def test_root_opens_will_it_fit() -> None:
    at = open_app()
    assert title(at) == WILL
    assert {"model", "gpu", "task"} <= set(url(at))  # its own inputs are written into the URL
    assert title(open_app(unit="GiB")) == WILL  # the unit alone names no page


def test_the_score_keys_are_the_score_pages_inputs() -> None:
    assert score_keys() == spec_keys("score_matrix.py")
    # every link Will it fit? writes names an input the Score matrix does not have
    assert {"model", "gpu", "task"} <= spec_keys("will_it_fit.py") - score_keys()


@pytest.mark.parametrize("query,expected", [
    ({"b": "2", "h": "8", "s": "1024", "dtype": "fp32"}, score_matrix_bytes(2, 8, 1024, "fp32")),
    ({"s": "8192"}, score_matrix_bytes(1, 32, 8192, "fp16")),
    ({"s": "8192", "h": "32", "b": "1", "dtype": "fp16", "unit": "GiB"}, score_matrix_bytes(1, 32, 8192, "fp16")),
    ({"dtype": "custom", "e": "0.5", "h": "64"}, score_matrix_bytes(1, 64, 4096, 0.5)),
])
def test_an_old_score_matrix_link_opens_the_score_matrix_with_its_inputs(
        query: dict[str, str], expected: int) -> None:
    at = open_app(**query)
    assert title(at) == SCORE
    unit = query.get("unit", "GB")
    assert at.metric[0].value == format_bytes(expected, unit)
    assert {k: url(at)[k] for k in query} == query  # the inputs carried over


def test_a_hostile_old_link_still_goes_to_the_score_matrix_and_warns() -> None:
    at = open_app(s="NaN", h="[x](javascript:alert(1))")
    assert title(at) == SCORE and at.warning
    assert at.metric[0].value == format_bytes(score_matrix_bytes(1, 32, 4096, "fp16"))


def test_a_will_it_fit_link_stays_on_will_it_fit() -> None:
    first = open_app(task="serving", s="4096")
    assert title(first) == WILL
    again = open_app(**url(first))
    assert title(again) == WILL and url(again) == url(first)


def test_only_the_first_run_redirects() -> None:
    """After landing, a run at "/" is Will it fit?'s own even if the URL holds Score-matrix
    inputs (a page left mid-run may have written them)."""
    at = open_app()
    at.query_params.clear()
    for k, v in {"b": "2", "h": "8"}.items():
        at.query_params[k] = v
    at.run()
    assert title(at) == WILL
