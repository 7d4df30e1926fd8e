"""Loading untrusted JSON (an uploaded or pasted `config.json`) within fixed limits.

Shared by the Model memory page (upload or paste), `attnmem --model PATH` and attnmem.hub (a
fetched config.json), before attnmem.calc.models.ModelConfig.from_hf_config reads the dict.

`json.loads` on its own trusts its input: it reads whatever size it is given, recurses once per
nesting level (100,000 nested brackets raise RecursionError deep inside the parser), accepts
the non-standard constants NaN and Infinity, turns 1e999 into inf, and keeps the last of two
duplicate keys without a word. `load_json_bounded` refuses each of those with a message that
says what was wrong and what the limit is:

- size: reads at most `max_bytes + 1` bytes from a stream (never the whole of a 100 MB file);
- text: UTF-8 (a byte-order mark is allowed), no NUL bytes;
- depth: nesting is measured by a linear scan before parsing (no recursion at all);
- numbers: NaN and floats that overflow to inf (1e999) are refused. The literals Infinity and
  -Infinity are read as floats: transformers writes them (`json.dumps` of a Mamba-2 config's
  `time_step_limit = (0.0, inf)`), so real config.json files carry them; a width or count given
  as Infinity is refused by the reader of that field, which names it;
- keys: a key given twice in one object is refused (which value was meant?).

Pure stdlib, nothing is evaluated or executed: JSON is data only.
"""

from __future__ import annotations

import json
import math
import re
from typing import IO, Any

#: A Hugging Face config.json is a few kB; 1 MB leaves room for long comments and lists.
MAX_CONFIG_BYTES = 1_000_000
#: Real configs nest 3 levels (text_config, rope_scaling); 32 is generous.
MAX_CONFIG_DEPTH = 32

_CHUNK = 64 * 1024
_SPECIAL = re.compile(r'["\\\[\]{}]')  # the only characters that matter for nesting


def read_bounded(source: bytes | bytearray | str | IO[bytes] | IO[str], max_bytes: int,
                 what: str = "file") -> bytes | str:
    """The content of `source`, or ValueError if it has more than max_bytes.

    A stream is read in chunks and never beyond max_bytes + 1 bytes (so a 100 MB upload costs
    at most max_bytes of memory here); bytes and str are measured directly.
    """
    if isinstance(source, (bytes, bytearray)):
        data: bytes | str = bytes(source)
        size = len(data)
    elif isinstance(source, str):
        data = source
        size = len(source.encode("utf-8", "surrogatepass"))
    else:
        size_hint = getattr(source, "size", None)
        if isinstance(size_hint, int) and size_hint > max_bytes:
            raise ValueError(f"{what} is {size_hint:,} bytes; the limit is {max_bytes:,} bytes")
        parts: list[Any] = []
        got = 0
        while got <= max_bytes:
            chunk = source.read(min(_CHUNK, max_bytes + 1 - got))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        data = (b"" if not parts or isinstance(parts[0], bytes) else "").join(parts)
        size = got
    if size > max_bytes:
        raise ValueError(f"{what} is larger than the limit of {max_bytes:,} bytes")
    return data


def nesting_depth(text: str) -> int:
    """Deepest bracket nesting of a JSON text (brackets inside strings do not count).

    One pass over the special characters only (quotes, backslashes, brackets): linear time, no
    regex backtracking, no recursion.
    """
    depth = deepest = 0
    in_string = False
    escaped_at = -1  # position of the character a backslash escapes
    for m in _SPECIAL.finditer(text):
        pos, ch = m.start(), m.group()
        if in_string:
            if pos == escaped_at:
                continue
            if ch == "\\":
                escaped_at = pos + 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> Any:
    if name in ("Infinity", "-Infinity"):  # what json.dumps writes for inf (module docstring)
        return float("inf") if name == "Infinity" else float("-inf")
    raise ValueError(f"{name} is not a JSON number (use a finite number or null)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:30]} is too large for a float")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key[:60]!r} is given twice in one object")
        out[key] = value
    return out


def load_json_bounded(source: bytes | bytearray | str | IO[bytes] | IO[str], *,
                      max_bytes: int = MAX_CONFIG_BYTES, max_depth: int = MAX_CONFIG_DEPTH,
                      what: str = "config.json") -> Any:
    """Parse untrusted JSON within limits (module docstring); ValueError says what is wrong."""
    data = read_bounded(source, max_bytes, what)
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{what} is not UTF-8 text (byte {err.start}): is it really a JSON file?"
            ) from None
    else:
        text = data.removeprefix("\ufeff")
    if "\x00" in text:
        raise ValueError(f"{what} contains NUL bytes: not a JSON text file")
    if not text.strip():
        raise ValueError(f"{what} is empty")
    depth = nesting_depth(text)
    if depth > max_depth:
        raise ValueError(f"{what} is nested {depth:,} levels deep; the limit is {max_depth}")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                          object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as err:
        raise ValueError(f"{what} is not valid JSON: {err.msg} at line {err.lineno}, "
                         f"column {err.colno}") from None
    except RecursionError:  # not reachable after the depth check; kept as a last guard
        raise ValueError(f"{what} is nested too deeply") from None
    except ValueError as err:  # our hooks, and ints longer than Python's digit limit
        raise ValueError(f"{what}: {err}") from None


def load_config_json(source: bytes | bytearray | str | IO[bytes] | IO[str], *,
                     max_bytes: int = MAX_CONFIG_BYTES, max_depth: int = MAX_CONFIG_DEPTH
                     ) -> dict[str, Any]:
    """A Hugging Face config.json as a dict (a JSON object at the top), within the limits."""
    data = load_json_bounded(source, max_bytes=max_bytes, max_depth=max_depth)
    if not isinstance(data, dict):
        raise ValueError(
            f"config.json must be a JSON object {{...}} of settings, got a {type(data).__name__}")
    return data
