"""The shared host cache (spec/behaviours/host_cache.py, issue #22 items 1-3): guards on the
spec, the same refusals on the engine, and the seven mutants caught where pinned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_checks.conformance import check_text
from model_checks.explicit.runner import check_mutant
from refimpl.engine import Engine
from refimpl.errors import OwnershipError
from spec.actions import apply
from spec.behaviours.host_cache import HK_HIT, HK_LOAD, HK_READ_BAD, HK_STORE
from spec.common import Refused
from spec.config import CONFIGS
from spec.properties import violated_safety
from spec.state import (
    COMPLETE,
    FILLING,
    NONE,
    PREFILLING,
    QUARANTINED,
    QUEUED,
    WRITABLE,
    World,
)
from tests.spec.spec_helpers import check_guard

WARM, STORE = CONFIGS["host_cache_warm"], CONFIGS["host_cache_store"]
TRACES = Path(__file__).resolve().parents[2] / "repro" / "traces"
M0: frozenset[str] = frozenset()


def go(w: World, c: object, *steps: tuple[str, int]) -> World:
    for name, i in steps:
        s = apply(w, c, M0, name, i, 0)  # type: ignore[arg-type]
        assert isinstance(s, World), (name, s)
        assert violated_safety(s, c) == [], (name, violated_safety(s, c))  # type: ignore[arg-type]
        w = s
    return w


def refused(w: World, c: object, name: str, i: int = 0) -> str | None:
    s = apply(w, c, M0, name, i, 0)  # type: ignore[arg-type]
    assert isinstance(s, Refused), (name, s)
    return s.prop


LOADED = (("HostLookup", 0), ("HostLoadBegin", 0), ("HostLoadCopy", 0), ("HostLoadCopy", 0))


def _w(c: object, *steps: tuple[str, int]) -> World:
    return go(c.initial(), c, *steps)  # type: ignore[attr-defined]


# r0's load reads its second block after the copy's bytes went bad: it found them out
BAD = (*LOADED[:3], ("EnvLoadFail", 0), LOADED[3])
RAN = (("PrefillAdmit", 0), ("PrefillRun", 0))  # r0 computed its KV (host_cache_store)
BEGUN = (*RAN, ("HostStoreBegin", 0))
OFF = ("disabled", None)
# The guard table of the cache's actions (tests/spec/test_guards_decode.py takes every
# action's enabled and disabled cases): (action, config, world, i, arg, expected).
CASES = [
    ("HostLookup", WARM, _w(WARM), 0, 0, {"hk": HK_HIT}),
    ("HostLookup", WARM, _w(WARM, ("HostLookup", 0)), 0, 0, OFF),  # already a hit
    ("HostLookup", WARM, _w(WARM, ("HostEvict", 0)), 0, 0, ("refused", "PublishAfterCommit")),
    ("HostLoadBegin", WARM, _w(WARM, LOADED[0]), 0, 0, {"hk": HK_LOAD, "p": FILLING}),
    ("HostLoadBegin", WARM, _w(WARM), 0, 0, OFF),  # no hit to load
    ("HostLoadCopy", WARM, _w(WARM, *LOADED[:2]), 0, 0, {"gl": 1}),
    ("HostLoadCopy", WARM, _w(WARM, LOADED[0]), 0, 0, OFF),  # the load has not begun
    ("HostLoadCommit", WARM, _w(WARM, *LOADED), 0, 0, {"st": PREFILLING, "hk": 0}),
    ("HostLoadCommit", WARM, _w(WARM, *LOADED[:3]), 0, 0, ("refused", "NoPartialUse")),
    ("HostLoadCommit", WARM, _w(WARM), 0, 0, OFF),
    ("HostLoadCommit", WARM, _w(WARM, *BAD), 0, 0, ("refused", "NoPartialUse")),  # read bad
    ("HostLoadCommit", WARM, _w(WARM, *LOADED, ("EnvLoadFail", 0)), 0, 0, {"st": PREFILLING}),
    ("HostLoadCopy", WARM, _w(WARM, *LOADED[:3], ("EnvLoadFail", 0)), 0, 0, {"hk": HK_READ_BAD}),
    ("HostLoadCopy", WARM, _w(WARM, *LOADED[:2], ("EnvLoadFail", 0), LOADED[2]), 0, 0, OFF),
    ("HostLoadFail", WARM, _w(WARM, *BAD), 0, 0, {"p": NONE, "hk": 0, "gl": 0}),
    ("HostLoadFail", WARM, _w(WARM, *LOADED[:3]), 0, 0, OFF),  # the bytes read fine
    # one step reads the next block and finds it bad (a log without the failed read)
    ("HostLoadFail", WARM, _w(WARM, *LOADED[:3], ("EnvLoadFail", 0)), 0, 0, {"p": NONE, "hk": 0}),
    ("HostLoadFail", WARM, _w(WARM, *LOADED, ("EnvLoadFail", 0)), 0, 0, OFF),  # all read: commits
    ("EnvLoadFail", WARM, _w(WARM), 0, 0, {"hk": 0}),
    ("EnvLoadFail", WARM, _w(WARM, ("EnvLoadFail", 0)), 0, 0, OFF),  # already unreadable
    ("HostStoreBegin", STORE, _w(STORE, *RAN), 0, 0, {"hk": HK_STORE, "p": COMPLETE}),
    ("HostStoreBegin", STORE, _w(STORE), 0, 0, OFF),  # nothing computed to store
    ("HostStoreCopy", STORE, _w(STORE, *BEGUN), 0, 0, {"hk": HK_STORE}),
    ("HostStoreCopy", STORE, _w(STORE, *BEGUN, ("HostStoreCopy", 0)), 0, 0, OFF),  # all in
    ("HostPublish", STORE, _w(STORE, *BEGUN, ("HostStoreCopy", 0)), 0, 0, {"hk": 0}),
    ("HostPublish", STORE, _w(STORE, *BEGUN), 0, 0, ("refused", "PublishAfterCommit")),
    ("HostPublish", STORE, _w(STORE, *RAN), 0, 0, OFF),  # no store
    ("HostStoreAbort", STORE, _w(STORE, *BEGUN), 0, 0, {"hk": 0, "p": WRITABLE}),
    ("HostStoreAbort", STORE, _w(STORE, *RAN), 0, 0, OFF),
    ("HostLateComplete", STORE, _w(STORE, *BEGUN, ("HostStoreAbort", 0)), 0, 0, {"hk": 0}),
    ("HostLateComplete", STORE, _w(STORE, *BEGUN), 0, 0, OFF),  # nothing given up
    ("HostEvict", WARM, _w(WARM), 0, 0, {"hk": 0}),
    ("HostEvict", WARM, _w(WARM, ("HostEvict", 0)), 0, 0, OFF),  # already unpublished
    ("HostFree", WARM, _w(WARM, ("HostEvict", 0)), 0, 0, {"hk": 0}),
    ("HostFree", WARM, _w(WARM, LOADED[0], ("HostEvict", 0)), 0, 0, ("refused", "NoReuseUnderIO")),
    ("HostFree", WARM, _w(WARM), 0, 0, OFF),  # published: unpublish it first
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)])
def test_guard(case: tuple) -> None:  # type: ignore[type-arg]
    check_guard(*case)


def test_a_lookup_pins_and_a_load_does_not_consume_the_copy() -> None:
    w = go(WARM.initial(), WARM, ("HostLookup", 0), ("HostLookup", 1))
    assert w.hc_pin == 2 and w.reqs[0].hk == w.reqs[1].hk == HK_HIT
    assert refused(w, WARM, "PrefillAdmit") is None  # a hit is loaded, not computed
    w = go(w, WARM, *LOADED[1:], ("HostLoadCommit", 0))
    assert w.hc == COMPLETE and w.hc_pin == 1 and w.reqs[0].st == PREFILLING


def test_a_delete_is_two_phases_and_waits_for_the_pins() -> None:
    w = go(WARM.initial(), WARM, ("HostLookup", 0), ("HostEvict", 0))
    assert w.hc == QUARANTINED
    assert refused(w, WARM, "HostLookup", 1) == "PublishAfterCommit"  # unpublished: a miss
    assert refused(w, WARM, "HostFree") == "NoReuseUnderIO"  # r0's pin
    w = go(w, WARM, *LOADED[1:], ("HostLoadCommit", 0), ("HostFree", 0))
    assert w.hc == NONE and w.hc_hl == 0


def test_a_failed_load_gives_back_its_blocks_and_turns_the_hit_into_a_miss() -> None:
    w = go(WARM.initial(), WARM, *BAD)
    assert (w.reqs[0].hk, w.reqs[0].gl, w.hc) == (HK_READ_BAD, WARM.blocks, COMPLETE)
    assert refused(w, WARM, "HostLoadCommit") == "NoPartialUse"  # never reported loaded
    w = go(w, WARM, ("HostLoadFail", 0))
    r = w.reqs[0]
    assert (r.st, r.p, r.gl, r.hk, w.hc_pin, w.hc) == (QUEUED, NONE, 0, 0, 0, QUARANTINED)
    w = go(w, WARM, ("PrefillAdmit", 0))  # the next lookup misses: r0 is computed again
    assert w.reqs[0].st == PREFILLING


def test_publish_after_commit_and_a_late_completion_is_a_no_op() -> None:
    w = go(STORE.initial(), STORE, ("PrefillAdmit", 0), ("PrefillRun", 0), ("HostStoreBegin", 0))
    assert w.hc == FILLING and refused(w, STORE, "HostPublish") == "PublishAfterCommit"
    late = go(w, STORE, ("HostStoreAbort", 0))
    assert late.hc == NONE and late.hc_late == 1
    done = go(late, STORE, ("HostLateComplete", 0))
    assert done.hc == NONE and done.hc_late == 0  # its bytes are gone, nothing published
    w = go(w, STORE, ("HostStoreCopy", 0), ("HostPublish", 0))
    assert w.hc == COMPLETE and w.hc_hl == STORE.blocks and w.reqs[0].hk == 0


def test_an_ended_request_lets_go_of_its_pin() -> None:
    w = go(WARM.initial(), WARM, *LOADED[:2], ("ClientCancel", 0))
    assert w.reqs[0].hk == HK_LOAD
    w = go(w, WARM, ("PrefillQuiesce", 0))
    assert w.hc_pin == 0 and w.reqs[0].p == NONE and w.reqs[0].hk == 0
    assert w.hc == COMPLETE  # its load read good bytes: the copy stays published


def test_a_load_cancelled_after_it_read_bad_bytes_unpublishes_the_copy() -> None:
    w = go(WARM.initial(), WARM, ("HostLookup", 1), *BAD, ("ClientCancel", 0))
    w = go(w, WARM, ("PrefillQuiesce", 0))  # the reader learned the copy is bad, as a fail
    assert (w.reqs[0].hk, w.hc_pin, w.hc, w.hc_bad) == (0, 1, QUARANTINED, True)  # a miss now
    cold = go(WARM.initial(), WARM, ("EnvLoadFail", 0), ("HostLookup", 0), ("ClientCancel", 0))
    assert go(cold, WARM, ("PrefillQuiesce", 0)).hc == COMPLETE  # nothing read: not known bad


@pytest.mark.parametrize(
    "c,steps,name,prop",
    [
        (WARM, (("HostLookup", 0), ("HostEvict", 0)), "HostFree", "NoReuseUnderIO"),
        (WARM, (("HostEvict", 0),), "HostLookup", "PublishAfterCommit"),
        (WARM, BAD, "HostLoadCommit", "NoPartialUse"),
    ],
)
def test_the_engine_refuses_as_the_spec_and_changes_nothing(
    c: object, steps: tuple[tuple[str, int], ...], name: str, prop: str
) -> None:
    w = go(c.initial(), c, *steps)  # type: ignore[attr-defined]
    assert refused(w, c, name) == prop
    e = Engine(c)  # type: ignore[arg-type]
    for a, i in steps:
        e.step(a, {} if a in ("HostEvict", "HostFree", "EnvLoadFail") else {"req": i})
    assert e.abstract() == w
    before = e.fingerprint()
    args = {} if name == "HostFree" else {"req": 0}
    with pytest.raises(OwnershipError) as err:
        e.step(name, args)
    assert err.value.prop == prop and e.fingerprint() == before


@pytest.mark.parametrize(
    "name,length",
    [
        ("evict_pinned_copy", 3),
        ("unpin_at_load_start", 2),
        ("reload_consumes_shared", 6),
        ("publish_before_commit", 4),
        ("late_completion_publishes", 5),
        ("failed_load_counted_loaded", 4),
        ("failed_load_keeps_hit", 1),
    ],
)
def test_each_mutant_is_caught_at_its_pinned_length(name: str, length: int) -> None:
    r = check_mutant(name)
    assert r.caught and r.trace_length == length


def test_a_fail_without_its_logged_read_is_that_read_and_the_fail_in_one_step() -> None:
    for k in (2, 3):  # before block 0 and before block 1: a block left to read
        w = go(WARM.initial(), WARM, ("HostLookup", 1), *LOADED[:k], ("EnvLoadFail", 0))
        assert go(w, WARM, ("HostLoadFail", 0)) == go(w, WARM, LOADED[3], ("HostLoadFail", 0))


@pytest.mark.parametrize(
    "log,line",
    [
        ("bug_failed_load_keeps_hit.jsonl", 7),
        ("fixed_failed_load_keeps_hit.jsonl", None),
        ("fixed_failed_load_counted_loaded.jsonl", None),
    ],
)
def test_the_example_logs_with_their_failed_read_logged(log: str, line: int | None) -> None:
    """The other form of repro/traces' logs (there, as engines log it, no failed read;
    tests/model_checks/test_trace_check.py): each failed read logged as its HostLoadCopy."""
    out = []
    for text in (TRACES / log).read_text().splitlines():
        ev = json.loads(text)
        if ev.get("action") == "HostLoadFail":
            out.append(json.dumps({"action": "HostLoadCopy", "args": ev["args"]}))
        out.append(text)
    v = check_text("\n".join(out) + "\n")
    assert (v.conforms, v.line) == (line is None, line)
    assert line is None or v.properties == ["PublishAfterCommit"]
