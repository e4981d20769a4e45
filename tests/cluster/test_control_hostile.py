"""A peer's control message is untrusted (issue #34, What to build 1 and 5): the cluster's
control channel (``refimpl.cluster.control``) reads each one with the strict reader, so a
deep, huge, NaN, duplicate-keyed or shapeless message is taken out of its mailbox, counted
in ``malformed`` with its reason, and the messages after it are delivered: nothing raises
out of ``poll``. The store here is a dict with the four calls ``Channel`` makes (the
TCPStore's semantics for them), so each case costs microseconds."""

from __future__ import annotations

import json

import pytest
import torch

from refimpl.cluster.control import (
    KEEP_REFUSALS,
    MAX_MESSAGE_BYTES,
    Channel,
    read_message,
)
from refimpl.cluster.link import Link
from spec.manifest import MAX_JSON_DEPTH
from spec.strict_json import StrictJSONError
from tests.refimpl.test_hostile_headers import HOSTILE


class DictStore:
    """check / get / set / add / delete_key over a dict (values are bytes, as TCPStore's)."""

    def __init__(self) -> None:
        self.d: dict[str, bytes] = {}

    def check(self, keys: list[str]) -> bool:
        return all(k in self.d for k in keys)

    def get(self, key: str) -> bytes:
        return self.d[key]

    def set(self, key: str, value: str | bytes) -> None:
        self.d[key] = value.encode() if isinstance(value, str) else value

    def add(self, key: str, n: int) -> int:
        v = int(self.d.get(key, b"0")) + n
        self.d[key] = str(v).encode()
        return v

    def delete_key(self, key: str) -> bool:
        return self.d.pop(key, None) is not None


BOX = "ctl/p0.0>d0.0"


def _channel() -> tuple[Channel, DictStore, list[int]]:
    store, seen = DictStore(), []

    def clock(lc: int) -> int:
        seen.append(lc)
        return lc

    return Channel(store, "d0", ("p0",), clock), store, seen


def _put(store: DictStore, seq: int, raw: str | bytes) -> None:
    """What a peer's ``Channel.send`` does: the message, then the receiver's doorbell."""
    store.set(f"{BOX}/{seq}", raw)
    store.add("n/d0.0", 1)


SHAPELESS = [
    ("no kind", '{"lc":1}', "no string 'kind'"),
    ("kind not a string", '{"kind":7,"lc":1}', "no string 'kind'"),
    ("lc a string", '{"kind":"ack","lc":"9"}', "'lc' is not an int"),
    ("lc a float", '{"kind":"ack","lc":1.5}', "'lc' is not an int"),
    ("lc negative", '{"kind":"ack","lc":-1}', "'lc' is not an int"),
    ("lc huge", '{"kind":"ack","lc":' + "9" * 19 + "}", "'lc' is not an int"),
    ("not UTF-8", b'{"kind":"\xff"}', "not UTF-8"),
]
CASES = HOSTILE + SHAPELESS


@pytest.mark.parametrize(("name", "raw", "why"), CASES, ids=[c[0] for c in CASES])
def test_a_hostile_message_is_refused_by_name_and_the_next_is_delivered(
    name: str, raw: str | bytes, why: str
) -> None:
    ch, store, seen = _channel()
    _put(store, 1, raw)
    _put(store, 2, json.dumps({"kind": "ack", "src": "p0", "inc": 0, "lc": 5, "rid": "r"}))
    got = ch.poll()
    assert [m["kind"] for m in got] == ["ack"] and seen == [5]
    assert ch.malformed == 1 and why in ch.refused[-1] and BOX + "/1" in ch.refused[-1]
    assert not store.check([f"{BOX}/1"]) and not store.check([f"{BOX}/2"])  # both taken
    assert ch.poll() == [] and ch.malformed == 1


def test_an_oversized_message_is_refused_on_its_size() -> None:
    with pytest.raises(StrictJSONError, match=f"cap of {MAX_MESSAGE_BYTES} bytes"):
        read_message(b'{"kind":"x","a":"' + b"y" * MAX_MESSAGE_BYTES + b'"}')


def test_a_flood_of_junk_is_bounded_per_poll_and_the_real_message_still_comes() -> None:
    ch, store, _ = _channel()
    for seq in range(1, 201):
        _put(store, seq, "[" * 1000)
    _put(store, 201, '{"kind":"ready","lc":1}')
    polls, got = 0, []
    while not got and polls < 10:
        got, polls = ch.poll(limit=64), polls + 1
    assert [m["kind"] for m in got] == ["ready"] and polls == 4  # 64 keys a poll, at most
    assert ch.malformed == 200 and len(ch.refused) == KEEP_REFUSALS
    assert ch.refused[-1].startswith(f"{BOX}/200: ")


def test_the_control_channel_sends_no_non_finite_number() -> None:
    ch, _, _ = _channel()
    with pytest.raises(ValueError, match="not JSON compliant"):
        ch.send("p0", "ack", x=float("nan"))


def test_a_kv_message_carrying_a_manifest_of_the_deepest_allowed_shape_is_read() -> None:
    # message -> kv list -> [channel, header, n] -> header -> manifest (MAX_JSON_DEPTH deep):
    # the cluster's own batches; a limit one level short refused every handoff (all failed)
    deepest: object = 0
    for _ in range(MAX_JSON_DEPTH - 1):
        deepest = [deepest]
    manifest = {"rope": deepest}
    msg = {"kind": "kv", "lc": 1, "kv": [["0>d", {"type": "manifest", "m": manifest}, 0]]}
    assert read_message(json.dumps(msg))["kv"][0][1]["m"] == manifest
    too_deep = {**msg, "kv": [["0>d", {"type": "manifest", "m": {"rope": [deepest]}}, 0]]}
    with pytest.raises(StrictJSONError):
        read_message(json.dumps(too_deep))


class RecordingPairs:
    """The data plane's pairs, recording each receive posted (none completes)."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, int, int]] = []

    def irecv(self, peer: str, buf: torch.Tensor, tag: int) -> None:
        self.posted.append((peer, buf.numel(), tag))
        return None


GOOD_KV = [["kv:r1>rx", {"type": "manifest", "epoch": 1}, 4]]
HOSTILE_KV = [
    ("tag past a gloo int", {"kv": GOOD_KV, "nbytes": 4, "tag": 1 << 40}),
    ("tag negative", {"kv": GOOD_KV, "nbytes": 4, "tag": -1}),
    ("tag a bool", {"kv": GOOD_KV, "nbytes": 4, "tag": True}),
    ("nbytes a float", {"kv": GOOD_KV, "nbytes": 4.0, "tag": 1}),
    ("nbytes past the batch bound", {"kv": GOOD_KV, "nbytes": 1 << 40, "tag": 1}),
    ("sizes do not add up", {"kv": GOOD_KV, "nbytes": 5, "tag": 1}),
    ("kv not a list", {"kv": {"a": 1}, "nbytes": 4, "tag": 1}),
    ("item header a string", {"kv": [["kv:r1>rx", "{}", 4]], "nbytes": 4, "tag": 1}),
    ("item size negative", {"kv": [["kv:r1>rx", {}, -4]], "nbytes": -4, "tag": 1}),
    ("item too short", {"kv": [["kv:r1>rx", {}]], "nbytes": 0, "tag": 1}),
]


@pytest.mark.parametrize(("name", "msg"), HOSTILE_KV, ids=[c[0] for c in HOSTILE_KV])
def test_a_hostile_batch_is_dropped_before_any_receive_is_posted(name: str, msg: dict) -> None:
    """``Link.deliver`` on a peer's ``kv`` message read from the control channel: a batch
    gloo cannot take (a tag past 2^31 raised TypeError out of ``irecv``, ending the worker)
    or whose shape is wrong is counted as malformed, no receive is posted, nothing filed;
    the next sound batch is received."""
    ch, _store, _ = _channel()
    pairs = RecordingPairs()
    link = Link(ch, pairs, lambda c: "d0", lambda work: True)  # type: ignore[arg-type]
    link.deliver({"kind": "kv", "src": "p0", "lc": 1, **msg})
    assert link.stats["malformed"] == 1 and pairs.posted == []
    assert link.poll("kv:r1>rx") == []
    link.deliver({"kind": "kv", "src": "p0", "lc": 2, "kv": GOOD_KV, "nbytes": 4, "tag": 1})
    assert pairs.posted == [("p0", 4, 1)] and link.stats["malformed"] == 1
