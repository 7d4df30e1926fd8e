"""attnmem.pages.ui.tables.table: a short frame is an HTML table (st.table) that shows what the
grid showed (missing cells a dash, text as written, numbers readable), a long one a grid."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from streamlit.testing.v1 import AppTest

from attnmem.pages.ui import tables


def test_cells_show_their_text_not_markdown() -> None:
    """st.table renders each cell as markdown: the characters it would read as markup are
    escaped, a word-inner underscore is not (masked_fill_ is no emphasis)."""
    assert tables.cell_display("a*b*c") == r"a\*b\*c"
    assert tables.cell_display("$x$ `y` ~z~ [l](u) <b> c|d") == r"\$x\$ \`y\` \~z\~ \[l\](u) \<b\> c\|d"
    assert tables.cell_display("Eager (masked_fill_)") == "Eager (masked_fill_)"
    assert tables.cell_display("# heading") == r"\# heading"
    assert tables.cell_display("1. first") == r"1\. first"
    assert tables.cell_display("- 5") == r"\- 5"
    assert tables.cell_display("-0.5%") == "-0.5%"


def test_numbers_are_written_as_the_app_writes_them() -> None:
    assert tables.cell_display(335_544_320) == "335,544,320"
    assert tables.cell_display(np.int64(2 ** 40)) == "1,099,511,627,776"
    assert tables.cell_display(1.5) == "1.5" and tables.cell_display(2.0) == "2"
    assert tables.cell_display(np.float64(0.123456)) == "0.1235"
    assert tables.cell_display(True) == "True" and tables.cell_display(math.inf) == "inf"


def test_styled_frame_keeps_the_data_and_shows_a_dash_for_a_missing_cell() -> None:
    df = pd.DataFrame({"s*": [1024, 2048], "ms": [1.25, None], "note": ["ok", None]})
    styled = tables.html_styled(df)
    html = styled.to_html()
    assert tables.MISSING in html and "1,024" in html and "1.25" in html and r"s\*" in html
    assert styled.data["ms"].isna().tolist() == [False, True]  # the data stay as they are
    assert styled.data["s\\*"].tolist() == [1024, 2048]


def test_repeated_labels_are_shown_as_text() -> None:
    df = pd.DataFrame([[1, None]], columns=["a", "a"])
    shown = tables.html_styled(df)
    assert isinstance(shown, pd.DataFrame) and shown.iloc[0].tolist() == ["1", tables.MISSING]


def _kinds(n_rows: int) -> tuple[int, int]:
    at = AppTest.from_string(f"""
import pandas as pd
from attnmem.pages.ui import tables
tables.table(pd.DataFrame({{"s": range({n_rows})}}), hide_index=True)
""", default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return len(at.table), len(at.dataframe)


def test_short_frames_are_html_tables_long_ones_grids() -> None:
    assert _kinds(tables.HTML_MAX_ROWS) == (1, 0)
    assert _kinds(tables.HTML_MAX_ROWS + 1) == (0, 1)
