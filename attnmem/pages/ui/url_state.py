"""Parse URL query values (always strings) into typed, bounded values: never a traceback.

A link such as ``?s=8192&h=32&dtype=bf16`` reproduces a page's view. Everything in a URL is
untrusted text: a value may be malformed (``s=abc``), hostile (``s=1e999``, ``s=NaN``,
``s=-5``, a 10 kB string, markdown such as ``[x](javascript:...)``), repeated
(``?s=1&s=2`` arrives as a list) or empty. Each parameter spec below turns such a value into
its default plus a warning that names the key, shows the bad value (shortened and escaped) and
says what is accepted. Valid values come back unchanged and without a warning.

Pure: stdlib only, so it is tested without Streamlit (tests/app/test_url_state.py, tests/app/test_fuzz_url_state.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

#: Longest raw URL value looked at; anything longer is refused before parsing (no big-int work).
MAX_RAW_LEN = 64
#: Longest comma-separated list value (multi-choice parameters).
MAX_RAW_LIST_LEN = 512

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&=\"'])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class Parsed(NamedTuple):
    """A parsed URL value: the value to use and, if the raw value was refused, why."""

    value: Any
    warning: str | None


def md_escape(text: str) -> str:
    """Escape text so that Streamlit's markdown shows it literally (no links, images, HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", _CONTROL.sub("?", text))


def show_raw(raw: object, limit: int = 40) -> str:
    """A short, printable, quoted rendering of a raw URL value for a warning message."""
    text = raw if isinstance(raw, str) else repr(raw)
    text = _CONTROL.sub("?", text)
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text):,} characters)"
    return f"'{text}'"


def _single(raw: str | Sequence[str]) -> tuple[str | None, str | None]:
    """Reduce a raw value to one string, or explain why it cannot be (repeated, not a string)."""
    if isinstance(raw, str):
        return raw, None
    if isinstance(raw, Sequence) and not isinstance(raw, (bytes, bytearray)):
        items = list(raw)
        if len(items) == 1 and isinstance(items[0], str):
            return items[0], None
        return None, f"given {len(items)} times"
    return None, f"not text ({type(raw).__name__})"


@dataclass(frozen=True)
class _Param:
    """Common behaviour: the default, and the warning text when a raw value is refused."""

    default: Any

    def accepted(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def show_default(self) -> str:
        return str(self.default)

    def refuse(self, key: str, raw: object, why: str | None = None) -> Parsed:
        reason = f" ({why})" if why else ""
        msg = (
            f"URL parameter '{key}' = {show_raw(raw)} is not valid{reason}; "
            f"accepted: {self.accepted()}. Using the default, {self.show_default()}."
        )
        return Parsed(self.default, msg)

    def parse(self, key: str, raw: str | Sequence[str] | None) -> Parsed:
        """Typed value for a raw URL value; None (absent) gives the default without a warning."""
        if raw is None:
            return Parsed(self.default, None)
        text, why = _single(raw)
        if text is None:
            return self.refuse(key, raw, why)
        limit = self.raw_limit()
        if len(text) > limit:
            return self.refuse(key, text, f"longer than {limit} characters")
        if text.strip() == "":
            return self.refuse(key, text, "empty")
        return self._parse_text(key, text.strip())

    def _parse_text(self, key: str, text: str) -> Parsed:  # pragma: no cover - overridden
        raise NotImplementedError

    def raw_limit(self) -> int:
        """Longest raw value looked at; a longer one is refused before any parsing."""
        return MAX_RAW_LEN

    def to_url(self, value: Any) -> str:
        """The URL spelling of a valid value (parse(to_url(v)) == v)."""
        return str(value)

    def is_valid(self, value: Any) -> bool:
        """Whether an already-typed value (e.g. remembered in the session) is acceptable.

        Never raises: a value of the wrong type (a list of numbers for names, 10**400 for a
        float) is simply not valid.
        """
        if value is None:
            return False
        try:
            parsed = self.parse("_", self.to_url(value))
            return parsed.warning is None and parsed.value == value
        except (TypeError, ValueError, OverflowError):
            return False


#: Digits as a person writes them: plain (4096), thousands commas in groups of three (1,048,576)
#: or Python-style single underscores (1_048_576); then an optional fraction and exponent.
#: '12,8' (a European decimal comma), '1,2,3' or '1__0' are not numbers: refused, never guessed.
_NUMBER = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+(?:_[0-9]+)*|)"
    r"(?P<frac>\.[0-9]*)?(?P<exp>[eE][+-]?[0-9]{1,3})?"
)


def _parse_number(text: str) -> float | int | None:
    """A finite number from text like '4096', '4,096', '1_048_576', '4096.0', '1e6'; else None.

    Refuses nan, inf, hex, words, misplaced separators ('12,8', '1__0') and a lone sign or dot.
    """
    m = _NUMBER.fullmatch(text)
    if m is None or not (m["int"] or (m["frac"] and len(m["frac"]) > 1)):
        return None
    digits = m["int"].replace(",", "").replace("_", "")
    if not m["frac"] and not m["exp"]:
        return int(m["sign"] + digits)
    value = float(m["sign"] + (digits or "0") + (m["frac"] or "") + (m["exp"] or ""))
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class IntParam(_Param):
    """A whole number in [lo, hi]. Integral floats ('4096.0', '4e3') are accepted."""

    default: int = 1
    lo: int = 1
    hi: int = 1_000_000

    def accepted(self) -> str:
        return f"a whole number from {self.lo:,} to {self.hi:,}"

    def show_default(self) -> str:
        return f"{self.default:,}"

    def _parse_text(self, key: str, text: str) -> Parsed:
        number = _parse_number(text)
        if number is None:
            return self.refuse(key, text, "not a number")
        if isinstance(number, float):
            if number != math.floor(number):
                return self.refuse(key, text, "not a whole number")
            if abs(number) > 1e18:
                return self.refuse(key, text, "out of range")
            number = int(number)
        if not self.lo <= number <= self.hi:
            return self.refuse(key, text, "out of range")
        return Parsed(number, None)


@dataclass(frozen=True)
class FloatParam(_Param):
    """A finite number in [lo, hi] (lo_open makes the lower bound exclusive)."""

    default: float = 1.0
    lo: float = 0.0
    hi: float = 1.0
    lo_open: bool = False

    def accepted(self) -> str:
        left = "above" if self.lo_open else "from"
        to = "and at most" if self.lo_open else "to"
        return f"a number {left} {self.lo:g} {to} {self.hi:g}"

    def show_default(self) -> str:
        return f"{self.default:g}"

    def _parse_text(self, key: str, text: str) -> Parsed:
        number = _parse_number(text)
        if number is None:
            return self.refuse(key, text, "not a finite number")
        number = float(number)
        too_low = number <= self.lo if self.lo_open else number < self.lo
        if too_low or number > self.hi:
            return self.refuse(key, text, "out of range")
        return Parsed(number, None)

    def to_url(self, value: Any) -> str:
        return f"{float(value):g}" if isinstance(value, (int, float)) else str(value)


@dataclass(frozen=True)
class ChoiceParam(_Param):
    """One of a fixed set of names; matching ignores case; aliases map other spellings."""

    default: str = ""
    choices: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)

    def accepted(self) -> str:
        shown = ", ".join(self.choices[:12]) + (", …" if len(self.choices) > 12 else "")
        return f"one of {shown}"

    def _parse_text(self, key: str, text: str) -> Parsed:
        match = _match_choice(text, self.choices, self.aliases)
        if match is None:
            return self.refuse(key, text, "unknown name")
        return Parsed(match, None)


def _match_choice(text: str, choices: Iterable[str], aliases: Mapping[str, str]) -> str | None:
    by_lower = {c.lower(): c for c in choices}
    low = text.strip().lower()
    if low in by_lower:
        return by_lower[low]
    alias = {k.lower(): v for k, v in aliases.items()}.get(low)
    return alias if alias in by_lower.values() else None


@dataclass(frozen=True)
class BoolParam(_Param):
    """true/false, 1/0, yes/no, on/off (any case)."""

    default: bool = False

    def accepted(self) -> str:
        return "true or false (also 1/0, yes/no, on/off)"

    def show_default(self) -> str:
        return "true" if self.default else "false"

    def _parse_text(self, key: str, text: str) -> Parsed:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return Parsed(True, None)
        if low in ("0", "false", "no", "off"):
            return Parsed(False, None)
        return self.refuse(key, text, "not true/false")

    def to_url(self, value: Any) -> str:
        return "true" if value else "false"


@dataclass(frozen=True)
class MultiChoiceParam(_Param):
    """A comma-separated list of distinct names from a fixed set ('naive,sdpa_flash').

    The value is a tuple in the order given; an unknown name or a duplicate refuses the whole
    value (a half-applied link would be a wrong-but-plausible view). 'none' is the empty list.
    """

    default: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    min_items: int = 0

    def accepted(self) -> str:
        shown = ", ".join(self.choices[:12]) + (", …" if len(self.choices) > 12 else "")
        least = f"at least {self.min_items} of" if self.min_items else "names from"
        return f"comma-separated {least}: {shown}"

    def show_default(self) -> str:
        return ", ".join(self.default) or "none"

    def _parse_text(self, key: str, text: str) -> Parsed:
        if text.lower() == "none":
            items: list[str] = []
        else:
            items = []
            for part in text.split(","):
                match = _match_choice(part, self.choices, self.aliases)
                if match is None:
                    return self.refuse(key, text, f"unknown name {show_raw(part.strip(), 20)}")
                if match in items:
                    return self.refuse(key, text, f"{match} given twice")
                items.append(match)
        if len(items) < self.min_items:
            return self.refuse(key, text, f"fewer than {self.min_items}")
        return Parsed(tuple(items), None)

    def raw_limit(self) -> int:
        return MAX_RAW_LIST_LEN

    def to_url(self, value: Any) -> str:
        return ",".join(value) if value else "none"


#: Longest free-text value a TextParam may allow (its max_len is capped here).
MAX_TEXT_LEN = 256


@dataclass(frozen=True)
class TextParam(_Param):
    """Free text that must match `pattern` as a whole, at most `max_len` characters (e.g. a
    Hugging Face model id). Surrounding whitespace is dropped, as for the other kinds.

    `what` says in words what is accepted (shown in the warning, with `example`). When the
    default is "" (nothing chosen), an empty value means that default, without a warning;
    otherwise an empty value is refused like any other kind's. The value is never changed
    beyond the strip: text that does not match is refused, never repaired.
    """

    default: str = ""
    pattern: str = r"[A-Za-z0-9]+"
    max_len: int = MAX_RAW_LEN
    what: str = "letters and digits"
    example: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.max_len <= MAX_TEXT_LEN:
            raise ValueError(f"TextParam max_len must be from 1 to {MAX_TEXT_LEN}, got {self.max_len}")
        re.compile(self.pattern)  # a bad pattern fails when the page is written, not when used

    def accepted(self) -> str:
        eg = f", e.g. {self.example}" if self.example else ""
        return f"{self.what}, at most {self.max_len} characters{eg}"

    def show_default(self) -> str:
        return self.default if self.default else "none"

    def raw_limit(self) -> int:
        return self.max_len

    def parse(self, key: str, raw: str | Sequence[str] | None) -> Parsed:
        if raw is not None and self.default == "":
            text, _ = _single(raw)
            if text is not None and len(text) <= self.max_len and text.strip() == "":
                return Parsed("", None)
        return super().parse(key, raw)

    def _parse_text(self, key: str, text: str) -> Parsed:
        if re.fullmatch(self.pattern, text) is None:
            return self.refuse(key, text)
        return Parsed(text, None)

    def is_valid(self, value: Any) -> bool:
        return isinstance(value, str) and super().is_valid(value)


Param = IntParam | FloatParam | ChoiceParam | BoolParam | MultiChoiceParam | TextParam


def parse_query(
    query: Mapping[str, str | Sequence[str]], specs: Mapping[str, _Param]
) -> tuple[dict[str, Any], list[str]]:
    """Parse every key of `specs` from a query mapping: (values, warnings). Unknown keys are
    ignored (other pages' parameters may share the URL)."""
    values: dict[str, Any] = {}
    warnings: list[str] = []
    for key, spec in specs.items():
        parsed = spec.parse(key, query.get(key))
        values[key] = parsed.value
        if parsed.warning:
            warnings.append(parsed.warning)
    return values, warnings


def nearest_power_of_two(n: int, lo: int, hi: int) -> int:
    """The power of two nearest to n (in log scale), clamped to [lo, hi] (both powers of two)."""
    if n <= lo:
        return lo
    if n >= hi:
        return hi
    below = 1 << (int(n).bit_length() - 1)
    above = below * 2
    return below if n / below <= above / n else above
