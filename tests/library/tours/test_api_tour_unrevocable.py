"""The tour on the API over a transport with no revoke (issue #30 item 1): the
``unrevocable`` worlds (spec ``Config.revocable=False``, ``handoff_unrevocable``) on real
Senders and a Receiver, with the refinement map after every step, the refusal probes and
the content ghost. Decode that gives up an attempt while a write may still land keeps its
blocks quarantined until the writer's Quiesced (``refimpl.api.unrevocable``; the spec's
``DecodeAbort`` quarantine and ``DecodeReclaim``, never ``DecodeAbortFenced``). Before
this, the adapter refused these worlds ("SpecTransport revokes writes")."""

from __future__ import annotations

from typing import Any

import pytest

from refimpl.api.intake import revocable
from refimpl.api.wire import State
from refimpl.testing.harness import Divergence
from refimpl.testing.on_api.adapter import ApiAdapter, unexpressed
from refimpl.testing.on_api.pairs import plan_api_pairs
from refimpl.testing.on_api.tour import ApiHarness, api_report, plan_api, run_api_tour
from refimpl.testing.worlds import get_world
from tests.library.lib_helpers import geo, pair, prefill, quarantined_under_pending_writes
from tests.library.tours.tour_helpers import assert_every_pair, assert_machine_walks, first_lines

# per world: (closed edges, edges covered), (pairs, pairs covered): measured
EDGES = {"handoff_unrevocable": (23675, 23675), "unrevocable_one": (581, 581)}
PAIRS = {"handoff_unrevocable": (40, 40), "unrevocable_one": (38, 38)}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_every_pair_of_an_unrevocable_world_on_the_api(name: str) -> None:
    assert_every_pair(name, PAIRS[name])


def test_every_edge_of_the_small_unrevocable_world_on_the_api() -> None:
    """unrevocable_one (one attempt): 581/581 closed edges, 201 walks (2 CPU s)."""
    test_every_edge_of_an_unrevocable_world_on_the_api("unrevocable_one")


@pytest.mark.nightly
@pytest.mark.parametrize("name", ["handoff_unrevocable"])
def test_every_edge_of_an_unrevocable_world_on_the_api(name: str) -> None:
    """handoff_unrevocable: 23675/23675 closed edges (5281 closed states), 8696 walks,
    0 divergences (93 CPU s of tour; 3 to 7 min wall with its plan, on a shared core)."""
    plan = plan_api(get_world(name))
    res = run_api_tour(ApiAdapter(), plan)
    rep = api_report(plan, res)
    assert (rep["edges"], rep["edges_covered"]) == EDGES[name], rep
    assert not res.failures, first_lines(res)


def test_the_tour_kills_a_receiver_that_frees_a_quarantine_before_quiesced() -> None:
    """``free_quarantine_early``: the Receiver gives the blocks back at its abort while
    the attempt's writes are still in flight; the refinement map reads the pool (d none,
    not quarantined) and stops the walk there."""
    plan = plan_api_pairs(get_world("unrevocable_one"))
    res = run_api_tour(ApiAdapter(), plan, frozenset({"free_quarantine_early"}))
    kinds = api_report(plan, res)["divergences"]
    assert res.failures, kinds
    assert all(k.startswith("state differs at Decode") and "(d, " in k for k in kinds), kinds
    assert "quarantined -> none" in str(res.failures[0][1])


# prefill sends, decode reserves and times out before any chunk lands: quarantined
TIMEOUT_BEFORE_WRITES = [
    ("PrefillAdmit", {"req": 0}),
    ("PrefillRun", {"req": 0}),
    ("PrefillFreeze", {"req": 0}),
    ("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0}),
    ("PrefillRecvReady", {"req": 0, "msg": "Ready", "epoch": 1, "idx": 0}),
    ("DecodeTimeout", {"req": 0}),
]


def _walk(steps: list[tuple[str, dict[str, Any]]]) -> ApiHarness:
    h = ApiHarness(ApiAdapter(), get_world("handoff_unrevocable"))
    h.check_state()
    for name, args in steps:
        h.step(name, args)
        h.check_state()
    return h


def test_a_quarantine_holds_the_blocks_until_the_writer_says_quiesced() -> None:
    """Through the public API: ``held()`` names the quarantined blocks, a late write lands
    in them (recorded, never installed), and they are free only once the Sender, nacked,
    has said Quiesced."""
    h = _walk(TIMEOUT_BEFORE_WRITES)
    sub: Any = h.impl
    assert not revocable(sub.net)
    rx = sub.rx
    assert rx.state("r0").value == "aborted"
    q = rx.quarantined()
    assert list(q) == ["r0"] and len(q["r0"]) == 2 and rx.held() == q
    assert sub.held_blocks()["D"] == 2
    for k in (0, 1):  # both writes land in the quarantined blocks
        h.step("DecodeReceiveChunk", {"req": 0, "msg": "Chunk", "epoch": 1, "idx": k})
        h.check_state()
    assert rx.quarantined() == q
    h.step("PrefillResume", {"req": 0, "msg": "Nack", "epoch": 1, "idx": 0})  # -> Quiesced
    h.check_state()
    assert rx.quarantined() == q  # the Quiesced is in flight
    h.step("DecodeReclaim", {"req": 0, "msg": "Quiesced", "epoch": 1, "idx": 0})
    h.check_state()
    assert rx.quarantined() == {} and rx.held() == {} and sub.held_blocks()["D"] == 0


def test_the_bug_switch_frees_under_the_writes() -> None:
    h = ApiHarness(
        ApiAdapter(), get_world("handoff_unrevocable"), frozenset({"free_quarantine_early"})
    )
    with pytest.raises(Divergence, match="quarantined -> none"):
        for name, args in TIMEOUT_BEFORE_WRITES:
            h.step(name, args)
            h.check_state()


def test_the_unrevocable_worlds_run_on_the_api() -> None:
    assert unexpressed(get_world("handoff_unrevocable")) == []
    assert unexpressed(get_world("unrevocable_one")) == []
    assert unexpressed(get_world("handoff_unrevocable"), remote=True) == []  # DistTransport


def test_the_hypothesis_machine_walks_an_unrevocable_world() -> None:
    assert_machine_walks("handoff_unrevocable")


@pytest.mark.parametrize("revocable_", [True, False])
def test_through_the_public_api_an_abort_under_writes_quarantines_until_quiesced(
    revocable_: bool,
) -> None:
    """A Sender and a Receiver over ``InProcessTransport(revocable=False)``: the receiver
    gives up while the chunks are still in flight; the blocks stay quarantined while they
    land, and go once the nacked Sender says Quiesced. A revocable transport frees at the
    abort (and no Quiesced is sent)."""
    from refimpl.transport import InProcessTransport

    p = pair(geo(), geo())
    p.t.revocable = revocable_  # the transport the pair's ends were built over
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")  # reserved, ready
    p.tx.poll("r")  # every chunk posted
    p.rx.abort("r", "cancelled")  # before any landed
    if revocable_:
        assert p.rx.held() == {} and p.rx.quarantined() == {}
        return
    q = p.rx.quarantined()
    assert list(q) == ["r"] and p.rx.held() == q and len(q["r"]) == 3
    assert p.rx.state("r") is State.ABORTED
    p.rx.forget("r")  # the attempt's record goes; its quarantine stays
    p.rx.poll("r")  # the writes land in the quarantined blocks: recorded, not installed
    assert p.rx.quarantined() == q
    p.tx.poll("r")  # the Nack: the Sender says Quiesced
    assert p.rx.quarantined() == q
    p.rx.poll("r")
    assert p.rx.quarantined() == {} and p.rx.held() == {} and p.dst.alloc.num_free == 16
    assert isinstance(p.t, InProcessTransport)


def test_the_tour_kills_a_sender_that_says_quiesced_before_its_writes_land() -> None:
    """``quiesced_at_nack``: the nacked Sender says Quiesced while its writes are still in
    flight. The tour hands it the Nack early (``on_api.tour.early_nacks``) and the
    refinement map reads the Sender (its phase, its source, Quiesced on the wire) where
    the spec's PrefillResume is refused (FrozenSnapshot): the walk stops there."""
    plan = plan_api(get_world("unrevocable_one"))
    res = run_api_tour(ApiAdapter(), plan, frozenset({"quiesced_at_nack"}))
    rep = api_report(plan, res)
    assert res.failures and rep["edges_covered"] < rep["edges"], rep
    assert all(k.startswith("state differs at ") and "ps" in k for k in rep["divergences"])
    assert "read early, writes in flight" in str(res.failures[0][1])
    assert "+Quiesced" in str(res.failures[0][1])


def test_the_tour_hands_nacks_and_aborts_over_while_writes_are_in_flight() -> None:
    plan = plan_api(get_world("unrevocable_one"))
    res = run_api_tour(ApiAdapter(), plan)
    assert not res.failures, first_lines(res)
    assert res.early_nacks == 27  # measured: walks where the Nack overtakes a write
    assert res.early_aborts == 185  # measured: the engine's abort while writes fly


@pytest.mark.parametrize("mutants", [frozenset(), frozenset({"quiesced_at_nack"})])
def test_a_nacked_sender_says_quiesced_only_once_its_writes_landed(
    mutants: frozenset[str],
) -> None:
    """Through the public API, over ``InProcessTransport(revocable=False)`` whose last
    write is overtaken by the next message: the receiver gives up before any write
    landed; the Sender, nacked, keeps its attempt (and its pins) while its writes are
    pending at the transport, so the quarantine holds while they land. The bug switch
    says Quiesced at the nack: it overtakes the last write, and the blocks are freed
    while that write is still in flight."""
    t, p, ch, q = quarantined_under_pending_writes(mutants)
    assert list(q) == ["r"] and t.writes_pending(ch, 1) == 3
    p.tx.poll("r")  # the Nack
    if mutants:
        assert p.tx.state("r").final and p.tx.held() == {}  # said Quiesced under 3 writes
        p.rx.poll("r")  # two land, the Quiesced frees the blocks, the third is still after it
        assert p.rx.quarantined() == {}
        return
    assert p.tx.state("r") is State.SENDING and list(p.tx.held()) == ["r"]
    p.rx.poll("r")  # the writes land (the overtaken one last): recorded, not installed
    assert p.rx.quarantined() == q and t.writes_pending(ch, 1) == 0
    p.tx.poll("r")  # its writes are over: Quiesced
    assert p.tx.state("r") is State.ABORTED and p.tx.held() == {}
    assert p.rx.quarantined() == q  # the Quiesced is in flight
    p.rx.poll("r")
    assert p.rx.quarantined() == {} and p.rx.held() == {} and p.dst.alloc.num_free == 16


def test_an_unrevocable_transport_without_a_batch_status_is_refused() -> None:
    from refimpl.api import Sender
    from tests.library.lib_helpers import MODEL

    class NoStatus:
        revocable = False

        def send(self, channel: str, header: Any, payload: Any = b"") -> None: ...

        def poll(self, channel: str) -> list[Any]:
            return []

        def abort(self, channel: str) -> int:
            return 0

    g = geo()
    with pytest.raises(ValueError, match="revocable=False but no writes_pending"):
        Sender(g.make_pools(4), g, NoStatus(), MODEL)  # type: ignore[arg-type]


def test_a_new_manifest_waits_for_the_quarantine_of_the_last_attempt() -> None:
    """The spec's ``DecodeReserve`` (and ``DecodeReject``) of a new attempt need the
    request's blocks gone (``d`` none): while an ended attempt's quarantine holds them, a
    newer manifest is neither reserved nor refused; it waits, and is taken at the first
    ``poll`` after the quarantine is over. Through the public API: the Sender's Quiesced
    is lost, it offers again, and only the longer timer (a second ``abort``) lets the new
    attempt in (before: reserved beside the quarantine, the Ready sent at once)."""
    from refimpl.api import Receiver, Sender
    from refimpl.api.wire import channels
    from refimpl.transport import InProcessTransport
    from tests.library.lib_helpers import MODEL, Pair

    t = InProcessTransport(revocable=False)
    g = geo()
    ps, pd = g.make_pools(16), g.make_pools(16)
    p = Pair(t, ps, pd, Sender(ps, g, t, MODEL), Receiver(pd, g, t, MODEL))
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")
    p.tx.poll("r")  # every write posted
    p.rx.abort("r", "cancelled")  # quarantined, nacked
    q = p.rx.quarantined()
    p.rx.poll("r")  # the writes land: recorded
    t.inject(channels("r").to_receiver, "lose")  # the Sender's Quiesced never arrives
    p.tx.poll("r")
    assert p.tx.state("r") is State.ABORTED
    p.tx.offer("r", list(range(10)))  # the retry, epoch 2
    p.rx.poll("r")  # its manifest comes while the quarantine holds: it waits
    assert p.rx.quarantined() == q and p.rx.held() == q
    assert p.rx.state("r") is State.ABORTED and p.dst.alloc.num_free == 16 - 3
    p.tx.poll("r")
    assert p.tx.state("r") is State.OFFERED  # no Ready
    p.rx.abort("r", "timeout")  # the longer quarantine timer: the blocks are free
    assert p.rx.quarantined() == {} and p.dst.alloc.num_free == 16
    p.rx.poll("r")  # the waiting manifest is taken now: reserved, ready
    assert p.rx.state("r") is State.RECEIVING
    p.tx.poll("r")  # ready: the writes of epoch 2
    p.rx.poll("r")
    p.tx.poll("r")
    assert p.rx.state("r") is State.DONE and p.tx.state("r") is State.DONE
    assert p.rx.quarantined() == {} and p.dst.alloc.num_free == 16 - 3
