"""The checker's effect table (model_checks/conformance/effects.py), derived from the spec's
traced actions: fresh, one entry per action, and equal to the hand-written tables of
blame.py but for the reviewed differences below."""

from __future__ import annotations

from model_checks.conformance import blame as B
from model_checks.conformance import effects as E
from spec.actions import ACTIONS
from spec.state import Req


def test_the_stored_table_is_the_derived_one() -> None:
    """effects.json is what the spec's actions give now (else: the command to rewrite it)."""
    now = E.derive()
    stale = sorted(n for n in set(now) | set(E.TABLE) if now.get(n) != E.TABLE.get(n))
    assert stale == [], f"run python -m model_checks.conformance.effects --write ({stale})"


def test_every_action_has_a_derived_entry() -> None:
    """Every spec action is in the table, or one the tracer itself declares it leaves out."""
    assert set(E.TABLE).isdisjoint(E.untraced())
    assert set(E.TABLE) | set(E.untraced()) == set(ACTIONS)


_PROBE = Req(**{f: 9 for f in Req._fields if f != "net"})  # 9: no field's constant


def _hand_writes(name: str) -> dict[str, int]:
    fx = B._EFFECT.get(name)
    if fx is None:
        return {}
    r = fx(_PROBE)
    return {f: getattr(r, f) for f in Req._fields if getattr(r, f) != getattr(_PROBE, f)}


# Where the derived table differs from the hand-written one, each case reviewed against
# the spec (spec/actions*.py, spec/behaviours/, SPEC.md's action table):
REVIEWED_FREES = {  # hand (), derived: the spec frees there too; the hand table lacked them
    "EnvStoreFail": ("h",),  # the failed store's host copy goes (an env step: blame skips it)
    "DecodeRetract": ("d",),  # decode's committed copy is dropped (spec _free)
    "HostLoadFail": ("p",),  # the GPU blocks of the failed load go
    "SessionEvict": ("d",),  # the idle session's KV goes (spec _free)
}
REVIEWED_ALLOCS = {"HostLoadBegin": ("p",)}  # a host-cache load takes GPU blocks, as a reload
# Writes: (fields the derived effect adds, fields it drops) against the hand table.
_SENDER = {"sent": 0, "phit": 0}  # the sender's position, reset with its phase
_FREED_D = {"rcnt": 0, "dmask": 0, "sl": 0}  # spec _free resets decode's whole record
REVIEWED_WRITES: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "PrefillRelease": (_SENDER, {}),
    "PrefillResume": (_SENDER, {}),
    "PrefillTimeout": (_SENDER, {}),
    "PrefillQuiesce": (_SENDER, {}),
    "PrefillReloadCommit": ({"gl": 0}, {}),  # the load's count, reset
    "DecodeFinish": ({"landed": 0, "rmask": 0, **_FREED_D}, {}),
    "DecodeAbort": (_FREED_D, {}),
    "DecodeAbortFenced": (_FREED_D, {}),
    "DecodeTimeout": (_FREED_D, {}),
    "DecodeReclaim": (_FREED_D, {}),
    # a token step changes no field of the spec's state (the KV it appends is not in it);
    # the hand table wrote the replica, so that it must be the one writable copy
    "PrefillDecodeStep": ({}, {"p": 4}),
    "DecodeStep": ({}, {"d": 4}),
}
# Actions the hand table gave no effect to judge, the derived one does (their writes).
REVIEWED_NEW = {
    *("PrefillAdmit", "PrefillRun", "PrefillOffloadBegin", "PrefillReloadBegin"),
    *("PrefillFreeze", "PrefillRecvReady", "DecodeReserve", "DecodeReject"),
    *("DecodeReceiveDone", "ClientCancel", "PrefillStepComplete", "DecodeStepComplete"),
    *("DecodeRetract", "HostLoadBegin", "TurnEnd", "TurnEdit", "TurnRoute", "TurnPrefill"),
    *("DecodeTurnCut", "DecodeAppendCommit", "SessionEvict"),
}


def _hand_writes(name: str) -> dict[str, int] | None:
    fx = B._EFFECT.get(name)
    if fx is None:
        return None
    r = fx(_PROBE)
    return {f: getattr(r, f) for f in Req._fields if getattr(r, f) != getattr(_PROBE, f)}


def test_derived_table_equals_the_hand_tables_but_for_the_reviewed_cases() -> None:
    frees, allocs, writes, new = {}, {}, {}, set()
    for name in ACTIONS:
        e = E.TABLE.get(name, E.Effect({}, (), ()))
        if B._FREES.get(name, ()) != e.frees:
            frees[name] = e.frees if not B._FREES.get(name) else (B._FREES[name], e.frees)
        hand_alloc = (B._ALLOCS[name],) if name in B._ALLOCS else ()
        if hand_alloc != e.allocs:
            allocs[name] = e.allocs if not hand_alloc else (hand_alloc, e.allocs)
        hand = _hand_writes(name)
        if hand is None:
            if e.writes:
                new.add(name)
            continue
        added = {f: v for f, v in e.writes.items() if hand.get(f) != v}
        dropped = {f: v for f, v in hand.items() if e.writes.get(f) != v}
        if added or dropped:
            writes[name] = (added, dropped)
    assert frees == REVIEWED_FREES
    assert allocs == REVIEWED_ALLOCS
    assert writes == REVIEWED_WRITES
    assert new == REVIEWED_NEW
