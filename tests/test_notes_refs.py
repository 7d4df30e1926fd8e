"""Every notes section that code or docs cite by name exists (issue 33, item 2).

Docstrings and comments point into the notes files by a section's heading, quoted after the
file's name: `attnmem/kernels/flash/NOTES.md, "the Hopper region"`, `NOTES.md ("the host path", "the
route on by default")`, `NOTES.md, "DQ_FLAT" and "DQ_FLAT kept, the others deleted"`. A bare
`NOTES.md` is the one nearest the citing file, in its folder or the closest folder above.
A citation matches a heading (`#` to `######`, outside code fences) whose text is the same
after collapsing whitespace; only the case of the first letter may differ, since a heading
starts a sentence and a citation sits inside one.

Citations wrap across lines of a docstring or a comment (`# ...` continued on the next
line), so each file is read with comment markers removed and its lines joined.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Folders that hold no sources of this repository (virtualenvs, caches, git's own).
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".pytest_cache",
             ".ruff_cache"}
#: A notes file named in the text, with an optional folder path in front.
NOTES = re.compile(r"((?:[A-Za-z0-9_.-]+/)*NOTES\.md)")
#: What may stand between the file's name and its first quoted heading.
OPEN = re.compile(r"\s*(?:,\s*|\(\s*|,\s*sections?\s+)")
QUOTED = re.compile(r'"([^"\n]+)"')
#: What may stand between two quoted headings.
BETWEEN = re.compile(r"\s*(?:,\s*(?:and\s+)?|and\s+)")
#: Files whose citations are examples (this test's own parser cases).
EXAMPLES = {Path(__file__).resolve()}
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def source_files() -> list[Path]:
    """The repository's *.py and *.md files, outside SKIP_DIRS."""
    out = []
    for pattern in ("*.py", "*.md"):
        for p in ROOT.rglob(pattern):
            rel = p.relative_to(ROOT).parts
            if (not SKIP_DIRS.intersection(rel[:-1]) and p.is_file()
                    and p.resolve() not in EXAMPLES):
                out.append(p)
    return sorted(out)


def joined(text: str) -> str:
    """The text as one line: each line stripped of indentation and of a leading comment
    marker (`#`, `#:`), joined with a space, or with nothing after a line that ends in `/`
    (a path broken across lines)."""
    out = ""
    for line in text.splitlines():
        line = re.sub(r"^\s*(?:#:?(?!#)\s?)?", "", line).strip()
        if not line:
            out += " "
            continue
        out += line if out.endswith("/") else " " + line
    return out


def citations(text: str) -> list[tuple[str, str]]:
    """(notes file as written, heading) for every quoted heading that follows a notes file's
    name in text."""
    flat = joined(text)
    found = []
    for m in NOTES.finditer(flat):
        pos = m.end()
        opened = OPEN.match(flat, pos)
        if not opened:
            continue
        pos = opened.end()
        while (q := QUOTED.match(flat, pos)):
            found.append((m.group(1), " ".join(q.group(1).split())))
            pos = q.end()
            sep = BETWEEN.match(flat, pos)
            if not sep or not QUOTED.match(flat, sep.end()):
                break
            pos = sep.end()
    return found


def headings(text: str) -> set[str]:
    """The text of every Markdown heading outside code fences, whitespace collapsed."""
    out, fenced = set(), False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            out.add(" ".join(m.group(2).split()))
    return out


def same_heading(cited: str, heading: str) -> bool:
    return cited == heading or (cited[1:] == heading[1:] and cited[:1].lower() == heading[:1].lower())


def resolve(cited_file: str, citing: Path) -> Path | None:
    """The notes file a citation means: a path from the repository's root when it has a
    folder, else the NOTES.md nearest the citing file."""
    if "/" in cited_file:
        p = ROOT / cited_file
        return p if p.is_file() else None
    for folder in citing.parents:
        if (folder / cited_file).is_file():
            return folder / cited_file
        if folder == ROOT:
            break
    return None


def broken_citations() -> tuple[list[str], int]:
    """(what is wrong with each broken citation, how many citations there are)."""
    problems, count, cache = [], 0, {}
    for path in source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for cited_file, heading in citations(text):
            count += 1
            rel = path.relative_to(ROOT)
            notes = resolve(cited_file, path)
            if notes is None:
                problems.append(f"{rel}: cites {cited_file}, which is not in the repository")
                continue
            if notes not in cache:
                cache[notes] = headings(notes.read_text(encoding="utf-8"))
            if not any(same_heading(heading, h) for h in cache[notes]):
                problems.append(f'{rel}: {notes.relative_to(ROOT)} has no heading "{heading}"')
    return problems, count


def test_every_cited_notes_heading_exists() -> None:
    problems, count = broken_citations()
    # The kernel's files cite its notes by heading some thirty times: far fewer found means
    # the parser, not the notes, broke.
    assert count >= 20, f"only {count} citations found"
    assert not problems, ("cite a heading that exists, or add the heading:\n"
                          + "\n".join(sorted(set(problems))))


@pytest.mark.parametrize("text, expected", [
    ('(attnmem/kernels/flash/NOTES.md, "the Hopper region").',
     [("attnmem/kernels/flash/NOTES.md", "the Hopper region")]),
    # a heading and a path wrapped in a comment, two headings joined by "and"
    ('# see attnmem/kernels/flash/\n# NOTES.md, "DQ_FLAT" and "DQ_FLAT kept, the\n# others deleted".',
     [("attnmem/kernels/flash/NOTES.md", "DQ_FLAT"),
      ("attnmem/kernels/flash/NOTES.md", "DQ_FLAT kept, the others deleted")]),
    ('in NOTES.md ("the host path", "the\n    route on by default")."""',
     [("NOTES.md", "the host path"), ("NOTES.md", "the route on by default")]),
    ("the notes (NOTES.md) say so", []),  # no heading named
    ('NOTES.md step 12. Then "a quote" elsewhere', []),  # a quote not tied to the file
])
def test_citation_parser(text: str, expected: list[tuple[str, str]]) -> None:
    assert citations(text) == expected


def test_heading_parser_skips_code_and_matches_first_letter_only() -> None:
    text = "# Title\n\n## The Hopper region\n```\n## not a heading\n```\ntext ## not one\n"
    assert headings(text) == {"Title", "The Hopper region"}
    assert same_heading("the Hopper region", "The Hopper region")
    assert not same_heading("the hopper region", "The Hopper region")
    assert not same_heading("the Hopper", "The Hopper region")
