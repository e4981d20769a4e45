"""Peer headers are read by the one strict reader (issue #34, What to build 1 and 5): the
engine's wire (``refimpl.engine.wire``) and ``DistTransport``'s frames refuse deep
nesting, NaN, duplicate keys, non-objects and oversized text by name
(``StrictJSONError``), never with a ``RecursionError`` or a silently kept value, and
nothing is half-applied: a refused ``replace`` leaves the entry, a refused frame is
counted and the link keeps serving."""

from __future__ import annotations

import threading
from collections import Counter, deque

import pytest

from refimpl.engine.wire import MAX_HEADER_CHARS, Wire, channel, dumps, loads_header, parse
from refimpl.transport import Inbox
from refimpl.transport_dist import MAX_HEADER, DistTransport
from spec.strict_json import StrictJSONError

GOOD = {"kind": "Ready", "req": 0, "epoch": 1, "idx": 0}

# (name, text, what the refusal names)
HOSTILE = [
    ("deep nesting", '{"a":' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper"),
    ("unclosed nesting", "[" * 200_000, "nested deeper"),
    ("NaN", '{"kind":"Ready","epoch":NaN}', "non-finite number NaN"),
    ("Infinity", '{"kind":"Ready","epoch":-Infinity}', "non-finite"),
    ("overflowing float", '{"kind":"Ready","x":1e999}', "overflows a float"),
    ("duplicate key", '{"kind":"Ready","kind":"Ack"}', "duplicate key 'kind'"),
    ("huge integer", '{"epoch":' + "9" * 100_000 + "}", "integer literal of 100000"),
    ("not an object", "[1,2,3]", "not a JSON object"),
    ("truncated", '{"kind":"Ready"', "bad JSON"),
    ("escaped-quote run, unterminated", '{"a":"' + '\\"' * 100_000, "bad JSON"),
]


@pytest.mark.parametrize(("name", "text", "why"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_the_wire_refuses_a_hostile_header_by_name(name: str, text: str, why: str) -> None:
    with pytest.raises(StrictJSONError, match=why) as e:
        loads_header(text)
    assert str(e.value).startswith("wire header: ") and len(str(e.value)) < 200


def test_an_oversized_header_is_refused_on_its_size_before_it_is_read() -> None:
    text = '{"a":"' + "x" * MAX_HEADER_CHARS + '"}'
    with pytest.raises(StrictJSONError, match=f"longer than the cap of {MAX_HEADER_CHARS}"):
        loads_header(text)


def test_a_long_run_of_escaped_quotes_is_read_as_the_string_it_is() -> None:
    text = '{"kind":"Ready","a":"' + '\\"' * 200_000 + '"}'
    assert loads_header(text)["a"] == '"' * 200_000


def _wire() -> tuple[Wire, str]:
    w = Wire()
    ch = channel(0, False)
    w.send(ch, GOOD)
    return w, ch


@pytest.mark.parametrize(("name", "text", "why"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_refused_replace_leaves_the_entry_as_it_was(name: str, text: str, why: str) -> None:
    w, ch = _wire()
    before = w.entries(ch)
    with pytest.raises(StrictJSONError, match=why):
        w.replace(ch, 0, text=text)
    assert w.entries(ch) == before and w.stats["corrupted"] == 0
    assert w.take(ch, 0)[0] == GOOD


def test_a_sound_replace_is_delivered_and_each_take_is_a_fresh_dict() -> None:
    w, ch = _wire()
    w.replace(ch, 0, text=dumps({**GOOD, "epoch": 2}))
    w.duplicate(ch, 0)
    a, _ = w.take(ch, 0)
    a["epoch"] = 99  # a caller may change what it took: the wire's copy is not touched
    assert w.take(ch, 0)[0]["epoch"] == 2 and parse(dumps(GOOD)) == GOOD


def _bare_dist_transport() -> DistTransport:
    """A ``DistTransport`` with no process group: only what ``_arrive`` reads (one rank)."""
    t = DistTransport.__new__(DistTransport)
    t.route, t.me, t._lock = (lambda ch: 0), 0, threading.Lock()
    t.stats = Counter(sent=0, delivered=0, aborted=0, bytes_sent=0)
    t._inbox = Inbox(t.stats)
    t.dropped = deque(maxlen=16)
    return t


@pytest.mark.parametrize(("name", "text", "why"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_dist_frame_is_dropped_and_counted_and_the_next_is_filed(
    name: str, text: str, why: str
) -> None:
    t = _bare_dist_transport()
    if name == "not an object":
        frame, why = text, "not {'ch': str, 'h': object}"
    else:
        frame = '{"ch":"c","h":' + text + "}"
    t._arrive(1, frame.encode(), b"")  # a RecursionError here would end the link
    assert t.stats["malformed"] == 1 and why in t.dropped[-1], t.dropped
    t._arrive(1, b'{"ch":"c","h":{"epoch":1}}', b"xy")
    assert t.poll("c") == [({"epoch": 1}, b"xy")]


def test_a_dist_frame_past_the_size_bound_is_dropped() -> None:
    t = _bare_dist_transport()
    t._arrive(1, b'{"ch":"c","h":{"a":"' + b"x" * MAX_HEADER + b'"}}', b"")
    assert t.stats["malformed"] == 1 and "longer than the cap" in t.dropped[-1]
