"""The scheduler's end of a request, and a refusal at intake, on the public API (issue
#30: divergences the tour on the API found). ``Receiver.end`` tells the receiver that the
router ended the request: its manifest is refused with a nack alone, and an attempt in
progress is never verified or committed (the spec's DecodeReject and StickyEnd). A
manifest refused at intake fences its epoch: a copy of it is not judged again (the spec
mutant ``reject_unfenced`` is the bug). Each test failed before its fix."""

from __future__ import annotations

from refimpl import State, channels
from tests.library.lib_helpers import Pair, geo, held, pair, prefill


def _answers(p: Pair, rid: str = "r") -> list[str]:
    return [str(h.get("type")) for h, _ in p.t.poll(channels(rid).to_sender)]


def test_a_manifest_of_an_ended_request_is_refused_with_a_nack_alone() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.rx.end("r", "cancelled")
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")
    assert _answers(p) == ["nack"]  # no ready first
    assert p.rx.state("r") is State.REFUSED and held(p.dst) == {}
    assert "ended here: cancelled" in str(p.rx.error("r"))


def test_an_attempt_of_an_ended_request_is_never_committed() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")  # reserved, ready
    p.rx.end("r", "cancelled")
    p.tx.poll("r")  # every chunk goes
    p.rx.poll("r")  # every chunk in: neither verified nor committed
    assert p.rx.state("r") is State.RECEIVING and _answers(p) == []  # no ack
    p.rx.abort("r", "cancelled")
    assert _answers(p) == ["nack"] and held(p.dst) == {}


def test_a_copy_of_a_manifest_refused_at_intake_is_not_judged_again() -> None:
    p = pair(geo(), geo(), dst_cap=3)
    prefill(p, "r", 10)
    p.dst.alloc.allocate("other", 3)  # no room for r (3 blocks)
    p.tx.offer("r", list(range(10)))
    to_rx = channels("r").to_receiver
    [(manifest, _)] = p.t.poll(to_rx)
    p.t.send(to_rx, manifest)
    p.rx.poll("r")
    assert _answers(p) == ["nack"] and p.rx.state("r") is State.REFUSED
    p.dst.alloc.free("other")  # room now, but the epoch was refused
    p.t.send(to_rx, manifest)  # a duplicate (or retransmission) of the refused manifest
    p.rx.poll("r")
    assert _answers(p) == [] and held(p.dst) == {}
    assert p.rx.state("r") is State.REFUSED
    p.rx.forget("r")  # forgotten: the request can be received again
    p.t.send(to_rx, manifest)
    p.rx.poll("r")
    assert _answers(p) == ["ready"]


def test_the_engine_fails_an_attempt_on_the_decode_side() -> None:
    """``Receiver.fail`` (the spec's DecodeFail, issue #30 item 1): the engine's own
    failure of an attempt being received gives back every block, nacks the sender with
    the reason (it may retry with a new offer), and the attempt is never committed; once
    final, ``fail`` does nothing. Failed first: the Receiver had no ``fail``."""
    from refimpl.errors import DecodeFailedError

    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")  # reserved, ready
    assert held(p.dst) != {}
    p.rx.fail("r", "its load failed")
    assert p.rx.state("r") is State.ABORTED and held(p.dst) == {}
    assert isinstance(p.rx.error("r"), DecodeFailedError)
    [(ready, _), (nack, _)] = p.t.poll(channels("r").to_sender)
    assert (ready["type"], nack["type"]) == ("ready", "nack")
    assert "failed on decode: its load failed" in nack["reasons"][0]
    p.t.send(channels("r").to_sender, ready)
    p.t.send(channels("r").to_sender, nack)
    p.tx.poll("r")  # every chunk goes, then the nack ends the attempt there
    assert p.tx.state("r").final and p.tx.state("r") is not State.DONE
    p.rx.poll("r")  # the chunks are the failed attempt's: fenced, nothing committed
    p.rx.fail("r", "again")
    assert p.rx.state("r") is State.ABORTED and held(p.dst) == {}
