"""The fields an instance is split on so that its message codes are concrete
(``model_checks.symbolic.finite.pin_fields``): derived from the action's traced message
operations, not listed by hand. Checked here in every world the encoding takes: with the
derived fields pinned, every message operation of every traced path names one code."""

from __future__ import annotations

from typing import Any

import pytest
import z3

from model_checks.symbolic.actions import PER_REQ
from model_checks.symbolic.bmc import shared_encoding
from model_checks.symbolic.core import Msg
from model_checks.symbolic.encoding import Encoding
from model_checks.symbolic.finite import PIN_GLOBALS, FCtx, Sub, pin_fields
from spec.actions import ACTIONS
from spec.config import CONFIGS
from spec.state import msg_epoch, msg_idx, msg_inc, msg_kind


def _symbolic_terms(enc: Encoding, u: Sub) -> list[Any]:
    """The epochs and indices of ``u``'s message operations that are not one value."""
    k, s = u.inst, enc.tmpl
    x, view = FCtx(enc, s), enc.view(s, k.i)
    for f, v in u.pins:
        setattr(x if f in PIN_GLOBALS else view, f, v)
    a = ACTIONS[k.name]
    code = (msg_kind(k.arg), msg_epoch(k.arg), msg_idx(k.arg), msg_inc(k.arg))
    m = Msg(*code) if a.arg == "msg" else None
    ops = [op for b in PER_REQ[k.name](x, view, m).branches if b.go for op in b.go.net]
    terms = [t for op in ops for t in ((op.e, op.i, op.inc) if op.op != "drop" else (op.e,))]
    return [t for t in terms if isinstance(t, z3.ExprRef) and not z3.is_bv_value(t)]


# The actions whose codes depend on the state (the reviewed list).
SPLIT = {
    *("PrefillFreeze", "PrefillSendChunk", "PrefillResume", "PrefillTimeout"),
    *("PrefillQuiesce", "DecodeCommit", "DecodeAbort", "DecodeAbortFenced"),
    "DecodeTimeout",
    *("DecodeReserve", "DecodeReject"),  # restarts: a Ready/Nack carries d_inc
}


def _split_actions(enc: Encoding) -> tuple[set[str], list[tuple[str, Any]]]:
    """(the actions split on a pinned field, the pinned parts whose codes are not concrete)."""
    bad, split = [], set()
    for k in enc._all_instances():
        if k.name not in PER_REQ:
            continue
        if not pin_fields(enc, enc.tmpl, k):
            continue  # no state variable in its codes: concrete by construction
        split.add(k.name)
        for u in enc._split(k):
            if not u.rest and _symbolic_terms(enc, u):
                bad.append((k.name, u.pins))
    return split, bad


# Each world's check reads its shared encoding, in that encoding's xdist group (tests/
# conftest.py by_encoding): the tracer's and the agreement's tests of the world build it
# anyway, and its traces are cached per encoding, so the check costs little on top (it
# built its own ``Encoding(c, instances=False)`` of all 36 worlds in one test: 29 CPU s).
@pytest.mark.by_encoding
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_code_is_concrete_once_the_derived_fields_are_pinned(name: str) -> None:
    split, bad = _split_actions(shared_encoding(CONFIGS[name]))
    assert bad == []
    assert split <= SPLIT, sorted(split - SPLIT)  # a new one: review it, add it above


@pytest.mark.by_encoding("restart_handoff")
def test_the_reviewed_list_is_what_the_worlds_split() -> None:
    """With every world's split actions in ``SPLIT`` (above), the list is exact: these two
    worlds split all of it between them (the restarts' Ready and Nack, and the Resume)."""
    got = set()
    for name in ("restart_handoff", "handoff_unrevocable"):
        got |= _split_actions(shared_encoding(CONFIGS[name]))[0]
    assert got == SPLIT
