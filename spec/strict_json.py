"""The one reader of untrusted JSON (pure Python, the lowest layer): every document the
project takes from outside (a handoff manifest, a disk tier's header and metadata, a saved
counterexample, an event-log line) becomes a Python value through ``loads_strict``.

``loads_strict`` refuses, each with a :class:`StrictJSONError` naming the problem, before
anything large is built:

- a document longer than ``max_bytes`` (its size and the cap in the message);
- nesting deeper than ``max_depth`` (checked before parsing, so no ``RecursionError``);
- more than ``max_items`` members and elements in all (when given: checked before
  parsing, so 5 M junk keys cost a count, not a dictionary);
- a key given twice in one object (``json`` keeps the last one silently);
- ``NaN``, ``Infinity`` and ``-Infinity``, and float literals that overflow to infinity;
- integer literals longer than ``max_int_digits`` digits (before ``int()`` runs, so a
  100,000-digit literal costs nothing and never meets Python's 4,300-digit limit), and
  number literals longer than ``max_float_chars`` characters;
- anything ``json`` itself refuses (``bad JSON: ...``).

Every check is linear in the document's length and runs at C speed (``re`` without
backtracking, ``str.count``, ``bytes.translate`` and ``replace``, ``json``): a string of
escaped quotes, unbalanced brackets or a megabyte of ``[]`` cost about what an ordinary
document does per byte (``benchmarks/hostile_readers.py`` measures it). Messages quote at most
:data:`QUOTE_CHARS` printable characters of a value (``short``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

QUOTE_CHARS: Final = 40  # longest value prefix an error message repeats
MAX_FLOAT_CHARS: Final = 64  # longest float literal accepted (unless a caller says otherwise)

# The skeleton of a document: its brackets, commas and colons outside strings, found at C
# speed (``bytes.replace``, ``translate``, one regex that cannot backtrack): escaped
# backslashes go, then escaped quotes (no quote inside a string is left), then every byte
# but ``"[]{},:``, then each string (``""`` first: most strings hold none of those). (The
# backtracking regex this replaced retried from every quote of a run of escaped quotes:
# quadratic, 42 s for 64 KB.)
_STRUCTURAL = b'"[]{},:'
_NOT_STRUCTURAL = bytes(c for c in range(256) if c not in _STRUCTURAL)
_STRING = re.compile(rb'"[^"]*+"')
_SLICE = 1 << 20  # bytes translated at a time
# The brackets of a skeleton, one kind: ``{`` read as ``[`` and ``}`` as ``]`` (the depth is
# the same; a mismatched pair is left for json to name).
_BRACKETS = bytes.maketrans(b"{}", b"[]")


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


def _skeleton(text: str) -> bytes:
    """``text``'s brackets, commas and colons outside its strings (an unterminated string is
    read as outside, and json names the error)."""
    raw = text.encode("utf-8", "replace")
    raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # no escaped quote is left
    # translate by slices into one growing buffer: a whole-input translate allocates its
    # input's length at once, and ``b"".join`` of the slices holds them all beside the
    # result (a megabyte of brackets cost 3 copies of itself at once; now 2)
    acc = bytearray()
    for i in range(0, len(raw), _SLICE):
        acc += raw[i : i + _SLICE].translate(None, _NOT_STRUCTURAL)
    del raw
    skel = bytes(acc)
    del acc
    skel = skel.replace(b'""', b"")  # most strings: gone
    return _STRING.sub(b"", skel) if b'"' in skel else skel  # those holding ,:[]{}


def _brackets(skeleton: bytes) -> bytes:
    """The brackets of a skeleton as ``[`` and ``]`` only."""
    return skeleton.translate(_BRACKETS, b'",:')


def _depth(brackets: bytes, max_depth: int) -> int | None:
    """The nesting depth of a string of brackets (``max_depth + 1`` once past it), or None
    when they do not balance. Each pass removes every empty pair ``[]`` at once
    (``bytes.replace`` does not rescan what it produced), so ``k`` passes empty a balanced
    string of depth ``k``."""
    for k in range(max_depth + 1):
        if not brackets:
            return k
        if b"[" * (max_depth + 1 - k) in brackets:
            return max_depth + 1  # that many openers in a row, k levels already gone: deeper
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            return None  # no empty pair left in a non-empty string: they do not balance
        brackets = shorter
    return max_depth + 1 if brackets else max_depth


def nesting_depth(text: str, max_depth: int) -> int:
    """The deepest bracket nesting of ``text`` outside strings, stopping once past
    ``max_depth`` (it then returns ``max_depth + 1``, as it does for brackets that do not
    balance: an unclosed run is as deep as it goes)."""
    d = _depth(_brackets(_skeleton(text)), max_depth)
    return max_depth + 1 if d is None else d


def _pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in pairs:
        if k in out:
            raise StrictJSONError(f"duplicate key {short(k)}")
        out[k] = v
    return out


def _constant(name: str) -> float:
    raise StrictJSONError(f"non-finite number {name} is not JSON")


def _checked_text(text: str | bytes | bytearray, max_bytes: int, what: str) -> str:
    if isinstance(text, str):  # isascii is a flag: no copy to learn an ASCII text's size
        short_enough = len(text) * 4 <= max_bytes or text.isascii()
        size = len(text) if short_enough else len(text.encode("utf-8", "replace"))
    else:
        size = len(text)
    if size > max_bytes:
        raise StrictJSONError(f"{what} of {size} bytes is longer than the cap of {max_bytes} bytes")
    if isinstance(text, str):
        return text
    try:
        return bytes(text).decode("utf-8")
    except UnicodeDecodeError as e:
        raise StrictJSONError(f"not UTF-8 (byte {e.start})") from None


def _shape(text: str, max_depth: int, max_items: int | None) -> None:
    """Refuse nesting past ``max_depth`` and more than ``max_items`` members, unparsed."""
    deep = text.count("[") + text.count("{") > max_depth
    many = max_items is not None and text.count(",") + text.count(":") > max_items
    if not (deep or many):
        return  # the raw counts bound the real ones: nothing to strip
    skel = _skeleton(text)
    if many:
        assert max_items is not None
        items = skel.count(b",") + skel.count(b":")
        if items > max_items:
            raise StrictJSONError(f"more than {max_items} members and elements ({items})")
    if deep:
        brackets = _brackets(skel)
        del skel  # a skeleton of brackets is as long as its document: one copy at a time
        d = _depth(brackets, max_depth)
        if d is not None and d > max_depth:
            raise StrictJSONError(f"nested deeper than {max_depth} levels")
        # None: the brackets do not balance, and json names where it breaks


def loads_strict(
    text: str | bytes | bytearray,
    *,
    max_bytes: int,
    max_depth: int,
    max_int_digits: int,
    max_float_chars: int = MAX_FLOAT_CHARS,
    max_items: int | None = None,
    what: str = "document",
) -> object:
    """Parse one untrusted JSON document under the rules of the module docstring;
    ``what`` names the document in the size refusal. Raises only StrictJSONError."""
    try:
        doc = _checked_text(text, max_bytes, what)
        _shape(doc, max_depth, max_items)
    except MemoryError:
        raise StrictJSONError("bad JSON (MemoryError)") from None

    def _int(lit: str) -> int:
        if len(lit.lstrip("-")) > max_int_digits:
            raise StrictJSONError(
                f"integer literal of {len(lit)} characters (max {max_int_digits} digits)"
            )
        return int(lit)

    def _float(lit: str) -> float:
        if len(lit) > max_float_chars:
            raise StrictJSONError(
                f"number literal of {len(lit)} characters (max {max_float_chars})"
            )
        f = float(lit)
        if not math.isfinite(f):
            raise StrictJSONError(f"number {short(lit)} overflows a float")
        return f

    try:
        return json.loads(
            doc,
            object_pairs_hook=_pairs,
            parse_constant=_constant,
            parse_float=_float,
            parse_int=_int,
        )
    except StrictJSONError:
        raise
    except json.JSONDecodeError as e:
        where = f"column {e.colno}" if e.lineno == 1 else f"line {e.lineno} column {e.colno}"
        raise StrictJSONError(f"bad JSON: {e.msg} ({where})") from None
    except RecursionError:  # brackets that do not balance, nested past the stack
        raise StrictJSONError(f"nested deeper than {max_depth} levels (RecursionError)") from None
    except (ValueError, OverflowError, TypeError, MemoryError) as e:
        raise StrictJSONError(f"bad JSON ({type(e).__name__})") from None


def loads_object(
    text: str | bytes | bytearray,
    *,
    prefix: str,
    max_bytes: int,
    max_depth: int,
    max_int_digits: int,
    what: str = "document",
) -> dict[str, Any]:
    """``loads_strict``, and the document must be a JSON object: a peer's message or
    header. Every refusal is a StrictJSONError starting with ``prefix``."""
    try:
        out = loads_strict(
            text, max_bytes=max_bytes, max_depth=max_depth, max_int_digits=max_int_digits,
            what=what,
        )  # fmt: skip
    except StrictJSONError as e:
        raise StrictJSONError(f"{prefix}: {e}") from None
    if not isinstance(out, dict):
        raise StrictJSONError(f"{prefix}: not a JSON object ({type(out).__name__})")
    return out
