"""attnmem.pages.ui.tables: column widths from the grid font's character widths, and
wide_table's refusal of a column it does not have."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from attnmem.pages.ui import tables


def test_text_width_is_the_sum_of_its_characters() -> None:
    assert tables.text_px("") == 0
    assert tables.text_px("1,099") == pytest.approx(4 * tables.CHAR_WIDTHS["1"] + tables.CHAR_WIDTHS[","])
    # a character that was not measured counts as the widest one that was
    assert tables.text_px("\u4e00") == tables.WIDEST_CHAR_PX == max(tables.CHAR_WIDTHS.values())
    assert all(ch in tables.CHAR_WIDTHS for ch in "0123456789,. —×")


def test_each_column_holds_its_longest_cell_or_header() -> None:
    df = pd.DataFrame({"n": [1_099_511_627_776, 5], "a long header": ["x", None],
                       "text": ["short", "m" * 200]})
    widths = {k: v["width"] for k, v in tables.fit_widths(df).items()}
    assert widths["n"] == math.ceil(tables.CELL_PAD_PX + tables.text_px("1,099,511,627,776"))  # as shown
    assert widths["a long header"] == math.ceil(tables.CELL_PAD_PX + tables.text_px("a long header"))
    assert widths["text"] == tables.MAX_COL_PX  # capped
    given = {"n": {"width": 33}}
    assert tables.fit_widths(df, given)["n"] == {"width": 33}  # a column given a config keeps it


def test_wide_table_names_a_column_it_lacks() -> None:
    with pytest.raises(ValueError, match=r"\['nope'\] are not in the table"):
        tables.wide_table(pd.DataFrame({"a": [1]}), ["a", "nope"], "cols")
