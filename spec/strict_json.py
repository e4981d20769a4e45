"""Strict JSON for untrusted documents (pure Python): what ``json.loads`` lets through and a
protocol must not.

``loads_strict`` refuses, each with a :class:`StrictJSONError` naming the problem:

- a key given twice in one object (``json`` keeps the last one silently);
- ``NaN``, ``Infinity`` and ``-Infinity``, and float literals that overflow to infinity;
- integer literals longer than ``max_int_digits`` digits (before ``int()`` runs, so a
  100,000-digit literal costs nothing and never meets Python's 4,300-digit limit);
- nesting deeper than ``max_depth`` (checked before parsing, so no ``RecursionError``);
- anything ``json`` itself refuses.

Messages quote at most :data:`QUOTE_CHARS` printable characters of a value (``short``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Final

QUOTE_CHARS: Final = 40  # longest value prefix an error message repeats
MAX_FLOAT_CHARS: Final = 64  # longest float literal accepted

_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class StrictJSONError(ValueError):
    """An untrusted document that is not strict JSON; the message is one short line."""


def short(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, non-printable characters escaped."""
    if isinstance(value, str):
        text = repr(value[: limit + 1])
    elif isinstance(value, int) and value.bit_length() > 4 * limit:  # repr may even raise
        text = f"<int of {value.bit_length()} bits>"
    else:
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - a hostile __repr__ must not escape
            text = f"<{type(value).__name__}>"
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def nesting_depth(text: str, max_depth: int) -> int:
    """The deepest bracket nesting of ``text`` outside strings, stopping once past
    ``max_depth`` (it then returns ``max_depth + 1``)."""
    depth = deepest = 0
    for m in _STRING_OR_BRACKET.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > max_depth:
                    return deepest
        elif c in "]}":
            depth -= 1
    return deepest


def _pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in pairs:
        if k in out:
            raise StrictJSONError(f"duplicate key {short(k)}")
        out[k] = v
    return out


def _constant(name: str) -> float:
    raise StrictJSONError(f"non-finite number {name} is not JSON")


def _float(text: str) -> float:
    if len(text) > MAX_FLOAT_CHARS:
        raise StrictJSONError(f"number literal of {len(text)} characters (max {MAX_FLOAT_CHARS})")
    f = float(text)
    if not math.isfinite(f):
        raise StrictJSONError(f"number {short(text)} overflows a float")
    return f


def loads_strict(text: str | bytes, *, max_depth: int, max_int_digits: int) -> object:
    """Parse one untrusted JSON document under the rules of the module docstring."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise StrictJSONError(f"not UTF-8 (byte {e.start})") from None
    if nesting_depth(text, max_depth) > max_depth:
        raise StrictJSONError(f"nested deeper than {max_depth} levels")

    def _int(lit: str) -> int:
        if len(lit.lstrip("-")) > max_int_digits:
            raise StrictJSONError(
                f"integer literal of {len(lit)} characters (max {max_int_digits} digits)"
            )
        return int(lit)

    try:
        return json.loads(
            text,
            object_pairs_hook=_pairs,
            parse_constant=_constant,
            parse_float=_float,
            parse_int=_int,
        )
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as e:  # json.JSONDecodeError is a ValueError
        raise StrictJSONError(f"not valid JSON ({short(str(e), 80)})") from None
