"""attnmem.pages.ui.url_state: URL query values -> typed values; bad ones -> default + a warning, never raise."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmem.hub import MAX_REPO_ID_LEN, REPO_ID_RULE
from attnmem.pages.ui.url_state import (
    MAX_RAW_LEN,
    MAX_TEXT_LEN,
    BoolParam,
    ChoiceParam,
    FloatParam,
    IntParam,
    MultiChoiceParam,
    TextParam,
    md_escape,
    nearest_power_of_two,
    parse_query,
    show_raw,
)

S = IntParam(4096, 1, 100_000_000)
E = FloatParam(2.0, 0.125, 64.0)
DT = ChoiceParam("fp16", ("fp32", "bf16", "fp16"), aliases={"float16": "fp16"})
FLAG = BoolParam(False)
IMPLS = MultiChoiceParam(("naive", "triton"), ("naive", "sdpa_flash", "triton"), min_items=1)
HUB = TextParam("", REPO_ID_RULE, MAX_REPO_ID_LEN, what="a Hugging Face model id, owner/name",
                example="deepseek-ai/DeepSeek-V3")
NAME = TextParam("run", r"[a-z]{1,8}", 8, what="1 to 8 small letters")
ALL = [S, E, DT, FLAG, IMPLS, HUB]

HOSTILE = [
    "abc", "-5", "0", "1e999", "NaN", "nan", "inf", "-inf", "Infinity", "", "   ", "4.5",
    "0x10", "1e30", "9" * 5000, "４０９６", "٣", "[x](javascript:alert(1))", "<script>", "\x00",
    "4096\n", ["1", "2"], [], "None", "true",
]


@pytest.mark.parametrize("raw", HOSTILE, ids=lambda r: repr(r)[:20])
def test_hostile_int_values_fall_back_with_a_warning(raw: object) -> None:
    parsed = S.parse("s", raw)  # type: ignore[arg-type]
    if raw == "4096\n":  # surrounding whitespace is tolerated
        assert parsed == (4096, None)
        return
    assert parsed.value == 4096
    assert parsed.warning is not None
    assert "'s'" in parsed.warning and "whole number from 1 to 100,000,000" in parsed.warning
    assert "default, 4,096" in parsed.warning


@pytest.mark.parametrize(
    ("raw", "value"),
    [("8192", 8192), (" 8192 ", 8192), ("8,192", 8192), ("1_048_576", 1048576), ("4096.0", 4096),
     ("4e3", 4000), ("+7", 7), (["16"], 16), ("100000000", 100_000_000), ("1", 1)],
)
def test_valid_int_spellings(raw: object, value: int) -> None:
    assert S.parse("s", raw) == (value, None)  # type: ignore[arg-type]


def test_absent_value_is_the_default_without_warning() -> None:
    for spec in ALL:
        assert spec.parse("k", None) == (spec.default, None)


def test_warning_names_key_value_and_what_is_accepted() -> None:
    w = E.parse("e", "NaN").warning
    assert w is not None and "'e'" in w and "'NaN'" in w and "from 0.125 to 64" in w
    w = DT.parse("dtype", "fp13").warning
    assert w is not None and "one of fp32, bf16, fp16" in w
    w = FLAG.parse("causal", "maybe").warning
    assert w is not None and "true or false" in w
    w = IMPLS.parse("impls", "naive,bogus").warning
    assert w is not None and "'bogus'" in w


def test_long_values_are_cut_in_the_warning() -> None:
    w = S.parse("s", "9" * 100_000).warning
    assert w is not None and len(w) < 400 and "100,000 characters" in w


def test_choices_match_case_and_aliases() -> None:
    assert DT.parse("dtype", "BF16") == ("bf16", None)
    assert DT.parse("dtype", "float16") == ("fp16", None)


def test_floats_refuse_non_finite_and_out_of_range() -> None:
    for raw in ("nan", "inf", "0", "0.1", "65", "-2", "1e400"):
        assert E.parse("e", raw).value == 2.0 and E.parse("e", raw).warning
    assert E.parse("e", "0.5") == (0.5, None)
    assert FloatParam(1.0, 0.0, 2.0, lo_open=True).parse("x", "0").warning


def test_bool_spellings() -> None:
    for raw in ("1", "true", "YES", "on"):
        assert FLAG.parse("c", raw) == (True, None)
    for raw in ("0", "False", "no", "off"):
        assert FLAG.parse("c", raw) == (False, None)


def test_multichoice() -> None:
    assert IMPLS.parse("i", "triton,naive") == (("triton", "naive"), None)
    assert IMPLS.parse("i", "naive,naive").warning  # duplicate
    assert IMPLS.parse("i", "none").warning  # fewer than min_items
    assert MultiChoiceParam((), ("a",)).parse("i", "none") == ((), None)


def test_parse_query_collects_values_and_warnings() -> None:
    values, warnings = parse_query({"s": "8192", "dtype": "nope", "other": "x"}, {"s": S, "dtype": DT})
    assert values == {"s": 8192, "dtype": "fp16"}
    assert len(warnings) == 1 and "'dtype'" in warnings[0]


def test_md_escape_defuses_markdown() -> None:
    text = md_escape("[x](javascript:alert(1)) ![i](http://e/x.png) <b>*bold*</b> `code`")
    assert re.search(r"(?<!\\)[\[\]()<>*`!]", text) is None


def test_show_raw_strips_control_characters() -> None:
    assert "\x1b" not in show_raw("a\x1b[31mred")


def test_nearest_power_of_two() -> None:
    assert nearest_power_of_two(4096, 128, 1 << 20) == 4096
    assert nearest_power_of_two(5000, 128, 1 << 20) == 4096
    assert nearest_power_of_two(7000, 128, 1 << 20) == 8192
    assert nearest_power_of_two(1, 128, 1 << 20) == 128
    assert nearest_power_of_two(10**8, 128, 1 << 20) == 1 << 20


# --- fuzzing ----------------------------------------------------------------------------------

raw_values = st.one_of(
    st.none(),
    st.text(max_size=80),
    st.text(alphabet="0123456789.,_+-eE naifINF", max_size=30),
    st.lists(st.text(max_size=10), max_size=3),
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


@settings(max_examples=400, deadline=None)
@given(raw=raw_values)
def test_fuzz_parser_never_raises_and_stays_in_bounds(raw: object) -> None:
    for key, spec in zip(("s", "e", "dtype", "causal", "impls", "hub"), ALL, strict=True):
        value, warning = spec.parse(key, raw)  # type: ignore[arg-type]
        assert warning is None or (key in warning and "default" in warning)
        if warning is not None:
            assert value == spec.default
        if isinstance(spec, IntParam):
            assert isinstance(value, int) and spec.lo <= value <= spec.hi
        elif isinstance(spec, FloatParam):
            assert math.isfinite(value) and spec.lo <= value <= spec.hi
        elif isinstance(spec, ChoiceParam):
            assert value in spec.choices
        elif isinstance(spec, BoolParam):
            assert isinstance(value, bool)
        elif isinstance(spec, TextParam):
            assert value == "" or (re.fullmatch(REPO_ID_RULE, value) and len(value) <= 193)
        else:
            assert set(value) <= set(spec.choices) and len(value) >= spec.min_items


@settings(max_examples=200, deadline=None)
@given(v=st.integers(1, 100_000_000))
def test_fuzz_int_round_trip(v: int) -> None:
    assert S.parse("s", S.to_url(v)) == (v, None)
    assert S.is_valid(v)


@settings(max_examples=200, deadline=None)
@given(v=st.floats(0.125, 64.0))
def test_fuzz_float_round_trip(v: float) -> None:
    value, warning = E.parse("e", E.to_url(v))
    assert warning is None and math.isclose(value, v, rel_tol=1e-5)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.sampled_from(("naive", "sdpa_flash", "triton")), min_size=1, unique=True))
def test_fuzz_multichoice_round_trip(items: list[str]) -> None:
    assert IMPLS.parse("impls", IMPLS.to_url(tuple(items))) == (tuple(items), None)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_fuzz_md_escape_leaves_no_active_markdown(text: str) -> None:
    escaped = md_escape(text)
    assert re.search(r"(?<!\\)[\[\]()<>*`_!#|]", escaped.replace("\\\\", "")) is None


def test_overlong_values_are_refused_before_parsing() -> None:
    assert S.parse("s", "1" * (MAX_RAW_LEN + 1)).warning


@pytest.mark.parametrize("raw", ["12,8", "1,2,3", "1__0", "_1", "1_", "1,0000", ",4096", "+", "."])
def test_misplaced_separators_are_refused_not_guessed(raw: str) -> None:
    assert S.parse("s", raw).warning is not None


def test_is_valid_never_raises() -> None:
    assert IMPLS.is_valid([1]) is False and IMPLS.is_valid(5) is False
    assert E.is_valid(10**400) is False and S.is_valid(None) is False and S.is_valid(True) is False
    assert IMPLS.is_valid(("naive",)) and S.is_valid(4096) and E.is_valid(0.5)


# --- free text (TextParam): Hub ids ----------------------------------------------------------


@pytest.mark.parametrize("raw", ["deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-Next-80B-A3B-Instruct",
                                 "a/b", "a_/b_", "meta-llama/Llama-3.1-8B", "x" * 96 + "/" + "y" * 96,
                                 ["org/name"]])
def test_hub_ids_are_accepted_unchanged(raw: object) -> None:
    text = raw[0] if isinstance(raw, list) else raw
    assert HUB.parse("hub", raw) == (text, None)  # type: ignore[arg-type]
    assert HUB.is_valid(text) and HUB.to_url(text) == text


def test_hub_id_whitespace_is_dropped_and_empty_is_none() -> None:
    assert HUB.parse("hub", "  org/name\n") == ("org/name", None)
    for raw in ("", "   ", [""]):
        assert HUB.parse("hub", raw) == ("", None)  # the default (no id): not an error
    assert HUB.parse("hub", None) == ("", None)
    assert NAME.parse("n", "").warning is not None  # a non-empty default: empty is refused


@pytest.mark.parametrize("raw", ["noslash", "a/b/c", "../etc/passwd", "a/..", "x y/z", "org/na--me",
                                 "org/name.git", "org./name", "-org/name", "org/name-", "org/name.",
                                 "org/ná", "[x](javascript:alert(1))", "<script>", "org/\x00",
                                 "o" * 97 + "/n", "o/" + "n" * 97, "a/" + "b" * 10_000,
                                 ["a/b", "c/d"], [], "/", "org/"])
def test_bad_hub_ids_fall_back_with_a_warning(raw: object) -> None:
    value, warning = HUB.parse("hub", raw)  # type: ignore[arg-type]
    assert value == ""
    assert warning is not None and "'hub'" in warning
    assert "a Hugging Face model id, owner/name" in warning and "e.g. deepseek-ai/DeepSeek-V3" in warning
    assert "Using the default, none" in warning
    assert len(warning) < 400 and "\x00" not in warning


def test_overlong_text_is_refused_before_matching() -> None:
    w = HUB.parse("hub", "a/" + "b" * 10_000).warning
    assert w is not None and "longer than 193 characters" in w and "10,002 characters" in w
    assert NAME.parse("n", "abcdefghi").warning and NAME.parse("n", "abc") == ("abc", None)


def test_text_is_valid_never_raises() -> None:
    for bad in (None, 5, ["a/b"], ("a/b",), b"a/b", " a/b", "a/b ", 10**400, float("nan")):
        assert HUB.is_valid(bad) is False
    assert HUB.is_valid("") and HUB.is_valid("a/b") and not NAME.is_valid("")


def test_text_param_bounds_are_checked_when_written() -> None:
    with pytest.raises(ValueError, match="max_len"):
        TextParam("", r".*", MAX_TEXT_LEN + 1)
    with pytest.raises(re.error):
        TextParam("", r"(", 10)
