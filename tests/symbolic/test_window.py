"""Sliding-window pruning (spec/window/__init__.py): the guard of PrefillPruneWindow, the
pool it frees, the transfers a pruned copy no longer starts, the property a prune under
a transfer breaks (read from the state), the mutant, the z3 encoding and the log's world."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from model_checks.conformance.sizing import prescan
from model_checks.explicit.runner import check_config, check_mutant
from spec import window
from spec.actions import apply
from spec.behaviours import host_cache
from spec.behaviours.compose import world
from spec.common import used_p
from spec.config import CONFIGS
from spec.properties import violated_safety
from spec.state import (
    AWAIT_ACK,
    CANCELLED,
    COMPLETE,
    FILLING,
    M_CHUNK,
    NONE,
    RUNNING,
    SENDING,
    WRITABLE,
    World,
    msg,
)
from tests.spec.spec_helpers import FROZEN, HO, RUN_P, R, W, check_guard

WP = CONFIGS["window_prune"]  # one request, 2 blocks, handoff + offload + recompute
ASYNC = replace(WP, async_steps=True)
STORING = R(st=RUNNING, p=COMPLETE, h=FILLING, mv=1)  # an offload store reads the copy
HOST_STORING = R(st=RUNNING, p=COMPLETE, hk=host_cache.HK_STORE, mv=1)
SENT = R(st=RUNNING, p=COMPLETE, d=FILLING, ep=1, dep=1, ps=AWAIT_ACK, net=(msg(M_CHUNK, 1),))

# (config, state, expected): as tests/spec/test_guards_decode.py
CASES: list[tuple[Any, World, Any]] = [
    (WP, W(RUN_P), {"pw": 1, "p": WRITABLE}),
    (HO, W(RUN_P), ("disabled", None)),  # window off
    (WP, W(RUN_P._replace(pw=1)), ("disabled", None)),  # the window keeps its newest block
    (WP, W(RUN_P, p_up=False), ("disabled", None)),
    (WP, W(RUN_P._replace(st=CANCELLED)), ("disabled", None)),  # not running
    (ASYNC, W(RUN_P._replace(pstep=1)), ("refused", "NoReuseUnderIO")),  # a step reads it
    (WP, W(STORING), ("refused", "NoReuseUnderIO")),
    (WP, W(HOST_STORING), ("refused", "NoReuseUnderIO")),
    (WP, W(FROZEN), ("refused", "NoReuseUnderIO")),  # the handoff has still to send
    (WP, W(FROZEN._replace(ps=SENDING)), ("refused", "NoReuseUnderIO")),
    (WP, W(SENT), ("refused", "NoReuseUnderIO")),  # a chunk in flight reads the source
    (WP, W(SENT._replace(net=())), ("disabled", None)),  # nothing reads it any more
    (WP, W(R(st=RUNNING, p=NONE, h=COMPLETE)), ("disabled", None)),
]


@pytest.mark.parametrize("c,w,expected", CASES)
def test_guard(c: Any, w: World, expected: Any) -> None:
    check_guard("PrefillPruneWindow", c, w, 0, 0, expected)


def test_a_prune_frees_a_block_and_a_new_copy_starts_whole() -> None:
    w = W(RUN_P)
    assert used_p(w, WP) == 2
    w2 = apply(w, WP, frozenset(), "PrefillPruneWindow", 0, 0)
    assert isinstance(w2, World) and used_p(w2, WP) == 1 and not violated_safety(w2, WP)
    gone = apply(w2, WP, frozenset(), "PrefillPreempt", 0, 0)
    assert isinstance(gone, World) and gone.reqs[0].p == NONE
    again = apply(gone, WP, frozenset(), "PrefillAdmit", 0, 0)
    assert isinstance(again, World) and again.reqs[0].pw == 0 and used_p(again, WP) == 2


@pytest.mark.parametrize("action", ["PrefillFreeze", "PrefillOffloadBegin"])
def test_a_pruned_copy_is_not_transferred(action: str) -> None:
    assert isinstance(apply(W(RUN_P), WP, frozenset(), action, 0, 0), World)
    check_guard(action, WP, W(RUN_P._replace(pw=1)), 0, 0, ("disabled", None))


def test_the_property_reads_the_pruned_copy_under_a_transfer() -> None:
    for r in (STORING, HOST_STORING, FROZEN, SENT):
        hc = FILLING if r is HOST_STORING else NONE  # the host key's copy being stored
        assert "NoReuseUnderIO" not in violated_safety(W(r, hc=hc), WP)
        assert "NoReuseUnderIO" in violated_safety(W(r._replace(pw=1), hc=hc), WP)
    assert window._STORE == host_cache.HK_STORE


def test_the_world_holds_and_the_mutant_is_caught() -> None:
    """(z3 BMC finds it at the same depth: tests/model_checks/test_z3_bmc.py)"""
    assert not check_config("window_prune").violations
    r = check_mutant("window_prunes_under_io")
    assert r.caught and r.trace_length == 4


def test_a_log_declares_the_window_and_is_sized_by_its_prunes() -> None:
    assert world(["window"], [], {}).window
    lines = [
        '{"format": "kvown-eventlog", "version": 1, "behaviours": ["window"]}',
        '{"action": "PrefillAdmit", "args": {"req": 0}}',
        *['{"action": "PrefillPruneWindow", "args": {"req": 0}}'] * 3,
    ]
    assert prescan(enumerate(lines, 1))["blocks"] == 4
