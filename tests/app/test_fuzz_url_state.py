"""Fuzzing the URL-parameter parser (attnmem/pages/ui/url_state.py): every value in a URL is hostile text.

Contract (issue 3 "a malformed or hostile URL value falls back to the default with a visible
warning, never a traceback"; issue 6 "never a wrong-but-plausible figure"):
- `parse` never raises, for any raw value (text of any length and alphabet, repeated values,
  non-text), returns a value valid for its spec, and finishes fast even for a megabyte value;
- a warning names the key, is short, and shows no control characters;
- a value accepted without a warning means what the text says (no silent reinterpretation);
- `is_valid` answers True/False for anything kept in a session, never raises;
- `md_escape` leaves no markdown/HTML active; `parse_query` ignores unknown keys.
"""

from __future__ import annotations

import math
import os
import re
from decimal import Decimal, InvalidOperation
from typing import Any

import pytest
from _robust import HOSTILE, time_limit
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from attnmem.calc import DTYPES, IMPLEMENTATIONS, MAX_BATCH, MAX_SEQ_LEN
from attnmem.calc.units import DTYPE_ALIASES
from attnmem.hub import MAX_REPO_ID_LEN, REPO_ID_RULE
from attnmem.pages.ui.url_state import (
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

pytestmark = pytest.mark.robustness

EXAMPLES = int(os.environ.get("ROBUST_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 200,
                database=None, suppress_health_check=[HealthCheck.too_slow])

#: Specs like the pages' (attnmem/pages/*.py SPECS), one of each kind and bound.
SPECS: dict[str, Any] = {
    "s": IntParam(4096, 1, MAX_SEQ_LEN),
    "b": IntParam(1, 1, MAX_BATCH),
    "step": IntParam(0, 0, 10_000),
    "e": FloatParam(2.0, 0.125, 64.0),
    "frac": FloatParam(0.5, 0.0, 1.0, lo_open=True),
    "dtype": ChoiceParam("fp16", (*DTYPES, "custom"), aliases=DTYPE_ALIASES),
    "unit": ChoiceParam("GB", ("GB", "GiB")),
    "causal": BoolParam(True),
    "impls": MultiChoiceParam(IMPLEMENTATIONS, IMPLEMENTATIONS, min_items=1),
    "gpus": MultiChoiceParam((), ("NVIDIA H100 80GB", "NVIDIA H200 141GB")),
    "hub": TextParam("", REPO_ID_RULE, MAX_REPO_ID_LEN, what="a Hugging Face model id, owner/name"),
    "label": TextParam("run", r"[a-z][a-z0-9_]{0,15}", 16, what="a short name"),
}

#: Strings shaped like Hub ids, near misses included (a '.', '-' or '_' anywhere, doubled).
hub_like = st.from_regex(r"[A-Za-z0-9._-]{1,8}/[A-Za-z0-9._-]{1,8}", fullmatch=True)

raw_text = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=30),
    st.from_regex(r"[+-]?[0-9,_.eE]{0,12}", fullmatch=True),
    st.sampled_from(["NaN", "nan", "inf", "-inf", "1e999", "-5", "0", "4096.5", "1,024",
                     "12,8", "1__0", "0x10", "[x](javascript:alert(1))", "<script>x</script>",
                     "\x00\x1b[31m", "\u202etxt", "fp16", "FP16", "none", "naive,naive",
                     "naive,,sdpa_flash", " ", "", "org/name", "org/na--me", "a/b.git",
                     "../x", "org/", "a/b/c"]),
    hub_like,
)
raw_values = st.one_of(raw_text, st.lists(raw_text, max_size=3), HOSTILE)


def value_ok(spec: Any, v: Any) -> bool:
    if isinstance(spec, IntParam):
        return isinstance(v, int) and not isinstance(v, bool) and spec.lo <= v <= spec.hi
    if isinstance(spec, FloatParam):
        low_ok = v > spec.lo if spec.lo_open else v >= spec.lo
        return isinstance(v, float) and math.isfinite(v) and low_ok and v <= spec.hi
    if isinstance(spec, ChoiceParam):
        return v in spec.choices
    if isinstance(spec, BoolParam):
        return isinstance(v, bool)
    if isinstance(spec, TextParam):
        return isinstance(v, str) and (v == spec.default or (
            len(v) <= spec.max_len and re.fullmatch(spec.pattern, v) is not None))
    return (isinstance(v, tuple) and len(set(v)) == len(v) and len(v) >= spec.min_items
            and all(i in spec.choices for i in v))


@FUZZ
@given(key=st.sampled_from(sorted(SPECS)), raw=raw_values)
@example(key="s", raw="9" * 100_000)
@example(key="impls", raw=",".join(["naive"] * 10_000))
@example(key="e", raw=["2", "3"])
def test_parse_never_raises_and_gives_a_valid_value(key: str, raw: Any) -> None:
    spec = SPECS[key]
    with time_limit(1.0):
        got = spec.parse(key, raw)
    assert value_ok(spec, got.value), f"parse({key}={raw!r:.80}) gave {got.value!r}"
    if got.warning is not None:
        assert f"'{key}'" in got.warning, got.warning
        assert len(got.warning) < 800, f"warning of {len(got.warning)} characters"
        assert not re.search(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", got.warning)
        assert got.value == spec.default
    if raw is None:
        assert got == (spec.default, None)


@FUZZ
@given(key=st.sampled_from(sorted(SPECS)), data=st.data())
def test_valid_values_round_trip_without_warning(key: str, data: st.DataObject) -> None:
    spec = SPECS[key]
    if isinstance(spec, IntParam):
        v: Any = data.draw(st.integers(spec.lo, spec.hi))
    elif isinstance(spec, FloatParam):
        v = data.draw(st.floats(spec.lo, spec.hi, exclude_min=spec.lo_open).map(
            lambda f: float(f"{f:g}")).filter(lambda f: value_ok(spec, f)))
    elif isinstance(spec, ChoiceParam):
        v = data.draw(st.sampled_from(spec.choices))
    elif isinstance(spec, BoolParam):
        v = data.draw(st.booleans())
    elif isinstance(spec, TextParam):
        v = data.draw(hub_like.filter(lambda t: re.fullmatch(spec.pattern, t) is not None)
                      if key == "hub" else st.from_regex(spec.pattern, fullmatch=True))
    else:
        v = tuple(data.draw(st.lists(st.sampled_from(spec.choices), unique=True,
                                     min_size=spec.min_items)))
    got = spec.parse(key, spec.to_url(v))
    assert got == (v, None), f"{key}: {v!r} -> {spec.to_url(v)!r} -> {got}"


def _honest_int(text: str) -> int | None:
    """The whole number a person reads in `text`: digits with optional thousands commas in
    groups of three (1,024) or Python-style single underscores (1_024), optional '.0' and
    exponent. None when a careful reader would not call it a number."""
    t = text.strip()
    grouped = r"[+-]?(\d{1,3}(,\d{3})+|\d+(_\d+)*)(\.\d*)?([eE][+-]?\d{1,3})?"
    if not re.fullmatch(grouped, t, flags=re.ASCII):
        return None
    try:
        d = Decimal(t.replace(",", "").replace("_", ""))
    except InvalidOperation:
        return None
    return int(d) if d == d.to_integral_value() else None


@FUZZ
@example(text="12,8")
@given(text=st.from_regex(r"[+-]?[0-9][0-9,_]{0,9}(\.0*)?", fullmatch=True))
def test_accepted_number_means_what_the_text_says(text: str) -> None:
    spec = SPECS["s"]
    got = spec.parse("s", text)
    if got.warning is None:
        assert _honest_int(text) == got.value, f"{text!r} accepted as {got.value}"


@FUZZ
@given(key=st.sampled_from(sorted(SPECS)), value=st.one_of(HOSTILE, raw_text))
def test_is_valid_answers_for_anything(key: str, value: Any) -> None:
    """attnmem.pages.ui.state keeps widget values in the session and asks is_valid: never a traceback."""
    assert SPECS[key].is_valid(value) in (True, False)


@pytest.mark.parametrize(("key", "value"), [("impls", [1]), ("impls", (1,)), ("impls", 5),
                                            ("e", 10**400)])
def test_is_valid_on_values_that_once_crashed_it(key: str, value: Any) -> None:
    assert SPECS[key].is_valid(value) is False


@FUZZ
@given(text=st.text(max_size=200))
@example(text="[x](javascript:alert(1)) <img src=x onerror=alert(1)> **b** `c` $x$ \x1b")
def test_md_escape_leaves_nothing_active(text: str) -> None:
    out = md_escape(text)
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]", out)
    specials = set("\\`*_{}[]()#+-.!|<>~$:&=\"'")
    i = 0
    while i < len(out):  # every special character is escaped by a backslash
        if out[i] == "\\":
            assert i + 1 < len(out) and out[i + 1] in specials, f"dangling backslash in {out!r}"
            i += 2
            continue
        assert out[i] not in specials, f"unescaped {out[i]!r} in {out!r}"
        i += 1


@FUZZ
@given(raw=st.one_of(HOSTILE, st.text(max_size=50)))
@example(raw="x" * 1_000_000)
def test_show_raw_is_short_and_printable(raw: Any) -> None:
    with time_limit(1.0):
        out = show_raw(raw)
    assert len(out) < 80
    assert not re.search(r"[\x00-\x1f\x7f-\x9f]", out)


@FUZZ
@given(query=st.dictionaries(st.one_of(st.sampled_from(sorted(SPECS)), st.text(max_size=5)),
                             st.one_of(raw_text, st.lists(raw_text, max_size=3)), max_size=12))
def test_parse_query_takes_any_query(query: dict[str, Any]) -> None:
    values, warnings = parse_query(query, SPECS)
    assert set(values) == set(SPECS)
    for key, v in values.items():
        assert value_ok(SPECS[key], v), (key, v)
    assert all(isinstance(w, str) for w in warnings)
    assert len(warnings) <= len(SPECS)


@FUZZ
@given(n=st.integers(-(10**30), 10**30), lo_p=st.integers(0, 10), span=st.integers(0, 20))
def test_nearest_power_of_two_stays_in_bounds(n: int, lo_p: int, span: int) -> None:
    lo, hi = 1 << lo_p, 1 << (lo_p + span)
    got = nearest_power_of_two(n, lo, hi)
    assert lo <= got <= hi and got & (got - 1) == 0


@FUZZ
@given(text=st.one_of(hub_like, raw_text))
@example(text="org./name")
@example(text="org/name.git")
@example(text="org/name\n")
def test_hub_ids_accepted_by_the_url_are_accepted_by_huggingface_hub(text: str) -> None:
    """The URL rule is never looser than huggingface_hub's validate_repo_id (an id it accepts
    reaches the Hub; one it would refuse must be refused in the URL, not deep in a fetch)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    got = SPECS["hub"].parse("hub", text)
    if got.warning is None and got.value:
        try:
            validate_repo_id(got.value)
        except HFValidationError as err:
            raise AssertionError(f"{got.value!r} accepted in the URL, refused by the Hub: {err}") from err
        assert "/" in got.value


@pytest.mark.parametrize("key", ["hub", "label"])
def test_text_warning_shows_the_value_escaped(key: str) -> None:
    got = SPECS[key].parse(key, "[x](javascript:alert(1))\x1b[31m")
    assert got.value == SPECS[key].default and got.warning is not None
    shown = md_escape(got.warning)
    assert re.search(r"(?<!\\)[\[\]()]", shown) is None and "\x1b" not in shown
