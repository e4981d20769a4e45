"""``DistTransport``'s batches, without processes: what the send thread gathers from a
peer's queue and frames is what the receiving side cuts back into the same messages, in
order, large payloads too (one payload frame, uncopied where they lie side by side in
memory; one message past ``MAX_BATCH_BYTES`` alone); a receive buffer is reused only once
no view of it is left; a batch from a
hostile peer whose sizes do not add up to its payload frame is dropped whole and counted,
never cut at the wrong place."""

from __future__ import annotations

import json
import queue
from collections import Counter, deque
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from refimpl import transport_dist
from refimpl.checksum import byte_view
from refimpl.transport_dist import DistTransport, Slabs, _frames, _gather


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


def test_large_payloads_queued_together_leave_as_one_batch() -> None:
    blocks = [bytes([i]) * (1 << 20) for i in range(4)]  # 1 MiB each (went alone before)
    q = _queued(*[("c>rx", {"i": i}, b) for i, b in enumerate(blocks)])
    batch, nxt = _gather(q, q.get())
    assert len(batch) == 4 and nxt is None
    frames = _frames(batch)
    assert len(frames) == 3 and frames[2].numel() == 4 << 20  # not 3 frames per block
    got, side = _receive(frames)
    assert [(m["h"], bytes(p)) for m, p in got] == [({"i": i}, b) for i, b in enumerate(blocks)]


def test_payloads_side_by_side_go_uncopied_others_into_the_send_buffer() -> None:
    pool = torch.arange(4 * 1024, dtype=torch.int32).view(4, -1)  # 4 "blocks" of 4 KiB
    in_row = [byte_view(pool[b]) for b in range(4)]
    q = _queued(*[("c>rx", {"i": i}, b) for i, b in enumerate(in_row)])
    frames = _frames(_gather(q, q.get())[0], lambda n: pytest.fail("copied"))
    assert frames[2].data_ptr() == pool.data_ptr()  # the pool's own bytes, as they lie
    scattered = [byte_view(pool[b]) for b in (2, 0, 3)]
    staging = torch.empty(3 << 12, dtype=torch.uint8)
    q = _queued(*[("c>rx", {"i": i}, b) for i, b in enumerate(scattered)])
    frames = _frames(_gather(q, q.get())[0], lambda n: staging[:n])
    assert frames[2].data_ptr() == staging.data_ptr()
    got, _ = _receive(frames)
    assert [bytes(p) for _, p in got] == [bytes(b) for b in scattered]


def test_a_message_past_the_batch_bound_goes_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_dist, "MAX_BATCH_BYTES", 8)
    q = _queued(("c>rx", {"i": 0}, b"a"), ("c>rx", {"i": 1}, b"x" * 9), ("c>rx", {"i": 2}, b"b"))
    first, nxt = _gather(q, q.get())
    assert [m[2] for m in first] == [1] and nxt is not None and nxt[2] == 9
    alone, nxt = _gather(q, nxt)
    assert [m[2] for m in alone] == [9] and nxt is not None and nxt[2] == 1


def test_a_receive_buffer_is_reused_only_once_no_view_of_it_is_left() -> None:
    slabs = Slabs(keep=1 << 20)
    buf, view = slabs.take(1 << 16)
    kept = view[10:20]  # a message cut from the frame, still referenced
    del view
    other, view2 = slabs.take(1 << 16)
    assert other.data_ptr() != buf.data_ptr()  # the first one is still read
    ptrs = {buf.data_ptr(), other.data_ptr()}
    del kept, buf, other, view2
    assert slabs.kept == 2 << 16  # both given back, once nothing views them
    again, _ = slabs.take(1 << 16)
    assert again.data_ptr() in ptrs and slabs.kept == 1 << 16  # reused, not a new one
    big, v = slabs.take(1 << 21)
    del big, v
    assert slabs.kept == 1 << 16  # past ``keep``: not kept


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
