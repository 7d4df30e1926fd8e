"""The repository explains itself: no file sends a reader outside it, and every path of this
repository that a docstring or a doc names exists (issue 33, item 1).

- No tracked text file cites the notes that lived next to the repository (the design, style,
  anchors and machine-kinds notes, the folder shared beside the checkout; `EXTERNAL` spells
  the names): a reader who has only the repository
  cannot open them. The rule they stated is written where the code that follows it lives.
- A path that starts with a top-level folder of this repository (`attnmem/calc/peak.py`,
  `attnmem/measure/NOTES.md`, `data/attention_calls_h200.csv`, ...) names a file that exists.
  Paths of upstream sources (`flash_attn/cute/interface.py`, `aten/src/...`) name other
  repositories and are not checked. Pages and app.py are checked by
  tests/app/test_page_sources.py.
- A `*.md` file named anywhere here exists in the repository, unless it is an upstream file or
  a file a command writes (`ALLOWED_MD`).
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("attnmem", "tests", "data", "docs", "scripts")
TEXT = re.compile(r"(\.(py|md|toml|txt|cfg|sh|yml|yaml|ini)|Makefile)$")
#: Names of the notes outside the repository, and the relative way up to them (this
#: repository's own design note is docs/DESIGN.md, named with its folder).
EXTERNAL = re.compile(r"\.\./shared|(?<!docs/)\b(DESIGN|STYLE|ANCHORS|KINDS)\.md\b")
#: A path inside this repository: a top-level folder, then a file ending .py, .md or .csv.
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP) + r")/[A-Za-z0-9_./*-]*\.(?:py|md|csv))(?!\w)")
MD = re.compile(r"(?<![\w./-])([A-Za-z0-9_./*-]*[A-Za-z0-9_-]\.md)\b")
#: Files whose text states the rule above, so they name the outside notes on purpose.
STATES_THE_RULE = {"tests/test_self_contained.py", "tests/app/test_page_sources.py"}
#: Folders whose paths this test checks (attnmem/pages/ and app.py: tests/app/test_page_sources.py).
CHECKED = ("attnmem/calc/", "attnmem/kernels/", "attnmem/measure/", "attnmem/cli/",
           "attnmem/hub.py", "attnmem/__init__.py", "scripts/", "tests/", "docs/", "README.md",
           "NOTES.md", "Makefile")
#: `*.md` names that are not files of this repository, each with why that is right.
ALLOWED_MD = {
    "README_WEIGHTS.md": "a file of a Hugging Face checkpoint (tests/calc/test_models_now.py)",
    "training_grid.md": "what `python -m attnmem.measure.bench --markdown` writes (BENCH_H200.md)",
    "decode.md": "what `python -m attnmem.measure.bench --preset decode --out DIR` writes",
}


@cache
def tracked() -> tuple[str, ...]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:  # an exported tree without .git
        pytest.skip(f"git ls-files did not run here: {e}")
    return tuple(f for f in out.splitlines() if TEXT.search(f) and (ROOT / f).is_file())


def _lines(name: str) -> list[tuple[int, str]]:
    try:
        return list(enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1))
    except UnicodeDecodeError:
        return []


def _exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def _md_in_repo(name: str) -> bool:
    if "/" in name:
        return _exists(name)
    return name in {Path(f).name for f in tracked()}


def test_no_file_cites_notes_outside_the_repository() -> None:
    # The bundled measurements too: a row's message is text a page shows.
    data = tuple(str(p.relative_to(ROOT)) for p in sorted((ROOT / "data").glob("*.csv")))
    found = [f"{name}:{n}: {m.group(0)}" for name in tracked() + data
             for n, line in _lines(name) for m in EXTERNAL.finditer(line)]
    assert not found, "name the in-repo source or say it in words:\n" + "\n".join(found)


def test_paths_of_this_repository_that_docs_name_exist() -> None:
    missing = [f"{name}:{n}: {p}" for name in tracked() if name.startswith(CHECKED)
               for n, line in _lines(name) for p in PATH.findall(line) if not _exists(p)]
    assert not missing, "no such file in the repository:\n" + "\n".join(missing)


def test_markdown_files_named_exist() -> None:
    missing = [f"{name}:{n}: {m}" for name in tracked() if name.startswith(CHECKED)
               and name not in STATES_THE_RULE
               for n, line in _lines(name) for m in MD.findall(line)
               if m not in ALLOWED_MD and not EXTERNAL.search(m) and not _md_in_repo(m)]
    assert not missing, "no such Markdown file in the repository:\n" + "\n".join(missing)


@pytest.mark.parametrize("text, external", [
    # Spelled in pieces so that this file does not itself cite what it forbids.
    ("see " + "../" + "shared/tools/fa4/README.md", True), ("as " + "DESIGN" + ".md says", True),
    ("(shared/" + "ANCHORS" + ".md)", True), ("docs/APP.md", False), ("the design notes", False),
    ("docs/" + "DESIGN" + ".md", False),
])
def test_the_external_pattern(text: str, external: bool) -> None:
    assert bool(EXTERNAL.search(text)) is external


@pytest.mark.parametrize("text, paths", [
    ("see attnmem/kernels/flash/NOTES.md, and attnmem/calc/peak.py.", ["attnmem/kernels/flash/NOTES.md", "attnmem/calc/peak.py"]),
    ("`attnmem/pages/common.csv_safe`", []),  # a function, not a file
    ("flash_attn/cute/interface.py", []),  # upstream
    ("data/attention_calls_h200.csv)", ["data/attention_calls_h200.csv"]),
    ("--out my/data/x.csv", []),  # not at the repository's top
])
def test_the_path_pattern(text: str, paths: list[str]) -> None:
    assert PATH.findall(text) == paths


def test_calc_api_lists_every_public_name() -> None:
    """attnmem/calc/API.md is the reference of calc: every name `calc` exports is listed there."""
    import types

    from attnmem import calc

    api = (ROOT / "attnmem" / "calc" / "API.md").read_text(encoding="utf-8")
    names = [n for n in vars(calc) if not n.startswith("_") and n != "annotations"
             and not isinstance(getattr(calc, n), types.ModuleType)]
    missing = [n for n in names if not re.search("`" + re.escape(n) + "[`(]", api)]
    assert not missing, f"add to attnmem/calc/API.md: {missing}"
