"""What the pages' sources promise a reader (issue 32, item 9).

- Every file a page or app.py names (a `*.md` name, a relative path) exists in this
  repository: a caption that sends the user to notes kept beside the repository sends them
  nowhere.
- Tables go through attnmem.pages.ui.tables.table, which shows a missing cell as a dash; a bare
  st.dataframe shows the text "None".
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "attnmem" / "pages").rglob("*.py")) + [ROOT / "app.py"]
TABLES = ROOT / "attnmem" / "pages" / "ui" / "tables.py"  # the helper itself
_MD = re.compile(r"[A-Za-z0-9_./-]*[A-Za-z0-9_-]+\.md\b")
_UP = re.compile(r"\.\./[A-Za-z0-9_./-]+")


def _in_repo(name: str) -> bool:
    """A path relative to the root, or a bare file name that some folder of the repo holds."""
    if (ROOT / name).is_file():
        return True
    return "/" not in name and any(p.is_file() for p in ROOT.glob(f"*/**/{name}"))


def test_pages_name_only_files_in_the_repository() -> None:
    missing = []
    for src in SOURCES:
        text = src.read_text()
        missing += [f"{src.relative_to(ROOT)}: {m}" for m in _MD.findall(text) if not _in_repo(m)]
        missing += [f"{src.relative_to(ROOT)}: {m}" for m in _UP.findall(text)]
    assert not missing, missing


def test_tables_show_missing_cells_as_a_dash() -> None:
    bare = [f"{src.relative_to(ROOT)}:{n}" for src in SOURCES if src != TABLES
            for n, line in enumerate(src.read_text().splitlines(), 1) if "st.dataframe(" in line]
    assert not bare, f"use tables.table (missing cells as '—'), not st.dataframe: {bare}"


def test_table_helper_sets_the_placeholder() -> None:
    from attnmem.pages.ui import tables

    seen = {}

    class Where:
        def dataframe(self, data, **kw):
            seen.update(kw)

    tables.table([1], where=Where(), hide_index=True)
    assert seen == {"placeholder": tables.MISSING, "hide_index": True}
