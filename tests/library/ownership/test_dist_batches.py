"""``DistTransport``'s batches, without processes: what the send thread gathers from a
peer's queue and frames is what the receiving side cuts back into the same messages, in
order; a payload of ``ALONE`` bytes or more goes alone (uncopied); a batch from a
hostile peer whose sizes do not add up to its payload frame is dropped whole and counted,
never cut at the wrong place."""

from __future__ import annotations

import json
import queue
from collections import Counter, deque
from types import SimpleNamespace
from typing import Any

import pytest

from refimpl.checksum import byte_view
from refimpl.transport_dist import ALONE, DistTransport, _frames, _gather


def _queued(*messages: tuple[str, dict[str, Any], bytes]) -> queue.SimpleQueue[Any]:
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for ch, h, p in messages:
        q.put((json.dumps({"ch": ch, "h": h, "n": len(p)}), p, len(p)))
    return q


def _receive(frames: list[Any]) -> tuple[list[Any], Any]:
    side = SimpleNamespace(stats=Counter(), dropped=deque())
    head = bytes(byte_view(frames[1]))
    payload = bytes(byte_view(frames[2])) if len(frames) > 2 else b""
    assert frames[0].tolist() == [len(head), len(payload)]
    return DistTransport._unbatch(side, 0, head, payload), side  # type: ignore[arg-type]


def test_queued_messages_leave_as_one_batch_and_come_back_in_order() -> None:
    sent = [("kv:a>rx", {"type": "chunk", "i": i}, bytes([i]) * (i + 1)) for i in range(5)]
    sent.append(("kv:a>rx", {"type": "seal"}, b""))
    q = _queued(*sent)
    batch, rest = _gather(q, q.get())
    assert len(batch) == 6 and rest is None
    frames = _frames(batch)
    assert len(frames) == 3  # sizes, header, payloads: not three frames per message
    got, side = _receive(frames)
    assert [(m["ch"], m["h"], bytes(p)) for m, p in got] == sent and not side.stats


def test_a_large_payload_goes_alone() -> None:
    big = b"x" * ALONE
    q = _queued(("c>rx", {"i": 0}, b"a"), ("c>rx", {"i": 1}, big), ("c>rx", {"i": 2}, b"b"))
    first, nxt = _gather(q, q.get())
    assert [m[2] for m in first] == [1] and nxt is not None and nxt[2] == ALONE
    alone, nxt = _gather(q, nxt)
    assert [m[2] for m in alone] == [ALONE] and nxt is None  # the next one waits in q
    assert q.get_nowait()[2] == 1
    frames = _frames(alone)
    assert len(frames) == 3 and frames[2].numel() == ALONE
    got, _ = _receive(frames)
    assert [(m["h"], len(p)) for m, p in got] == [({"i": 1}, ALONE)]


@pytest.mark.parametrize(
    "entries",
    [
        [{"ch": "c>rx", "h": {}, "n": 3}, {"ch": "c>rx", "h": {}, "n": 3}],  # 6 != 5
        [{"ch": "c>rx", "h": {}, "n": "5"}],  # not an int
        [{"ch": "c>rx", "h": {}, "n": -1}, {"ch": "c>rx", "h": {}, "n": 6}],  # negative
        [],  # empty
    ],
)
def test_a_batch_whose_sizes_do_not_add_up_is_dropped_whole(entries: list[Any]) -> None:
    side = SimpleNamespace(stats=Counter(), dropped=deque())
    head = json.dumps({"batch": entries}).encode()
    got = DistTransport._unbatch(side, 0, head, b"12345")  # type: ignore[arg-type]
    assert got == [] and side.stats["malformed"] == 1 and "malformed" in side.dropped[0]
