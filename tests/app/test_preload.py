"""Every page that draws a plotly chart (or a data grid) starts that bundle from the sidebar
as its run begins (attnmem.pages.ui.charts.preload, issue 45 item 3), naming a file the
installed Streamlit serves; a page without one does not load it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnmem.pages.ui import charts

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(p.name for p in (ROOT / "attnmem" / "pages").glob("*.py") if p.name != "__init__.py")


def _preloaded(at: AppTest) -> set[str]:
    """The bundle kinds the sidebar's scripts import."""
    html = " ".join(str(e.proto.body) for e in at.sidebar if e.type == "html")
    return {m for m in re.findall(r'"(\w+)\.[\w-]+\.js"', html)}


@pytest.mark.parametrize("page", PAGES)
def test_each_page_starts_the_bundles_it_draws(page: str) -> None:
    at = AppTest.from_file(str(ROOT / "attnmem" / "pages" / page), default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    drawn = {"PlotlyChart"} if at.get("plotly_chart") else set()
    drawn |= {"DataFrame"} if at.dataframe else set()
    assert _preloaded(at) == drawn, page


def test_the_named_bundles_are_served() -> None:
    html = charts._preload_html(("PlotlyChart", "DataFrame"))
    names = re.findall(r'"([\w.-]+\.js)"', html)
    assert len(names) == 2 and all((charts._BUNDLES / n).is_file() for n in names)
    assert charts._preload_html(("NoSuchElement",)) == ""
