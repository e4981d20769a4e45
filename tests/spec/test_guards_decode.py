"""Each decode, environment and client action's guard, enabled and disabled, on hand-made states.

A row: (action, config, state, request, message, expected). ``expected`` is either a
dict of request-0 fields the successor must have, or ``("refused", PROP)`` /
``("disabled", None)``.
"""

from __future__ import annotations

import pytest

from spec.actions import ACTIONS, apply
from spec.config import CONFIGS
from spec.state import (
    CANCELLED,
    COMPLETE,
    DF_CORRUPT,
    DF_FENCED,
    DF_MISMATCH,
    FAILED,
    FILLING,
    FINISHED,
    M_ACK,
    M_CHUNK,
    M_CHUNK_BAD,
    M_DONE,
    M_HANDOFF,
    M_HANDOFF_BAD,
    M_NACK,
    M_QUIESCED,
    NONE,
    QUARANTINED,
    RESERVED,
    RUNNING,
    WRITABLE,
    msg,
)
from tests.behaviours.test_async_steps_spec import CASES as ASYNC_CASES
from tests.behaviours.test_decode_failure import CASES as DECODE_FAILURE_CASES
from tests.behaviours.test_decode_ranks import CASES as DECODE_RANKS_CASES
from tests.behaviours.test_host_cache import CASES as HOST_CACHE_CASES
from tests.behaviours.test_identity_guards import CASES as IDENTITY_CASES
from tests.behaviours.test_irrevocable import CASES as IRREVOCABLE_CASES
from tests.behaviours.test_retract import CASES as RETRACT_CASES
from tests.behaviours.test_stream import CASES as STREAM_CASES
from tests.behaviours.test_turns import CASES as TURNS_CASES
from tests.spec.spec_helpers import (
    ALL_SENT,
    CR,
    FROZEN,
    HELD,
    HO,
    OFF,
    PFX,
    RUN_P,
    SENDING1,
    R,
    W,
    check_guard,
)
from tests.spec.test_guards_prefill import CASES as PREFILL_CASES
from tests.symbolic.test_window import CASES as WINDOW_CASES

RS = CONFIGS["restart_handoff"]

CASES = [
    # --- decode ------------------------------------------------------------------------
    ("DecodeReserve", HO, W(FROZEN), 0, msg(M_HANDOFF, 1), {"d": RESERVED, "dep": 1}),
    (
        "DecodeReserve",
        HO,
        W(FROZEN._replace(dep=1)),
        0,
        msg(M_HANDOFF, 1),
        ("refused", "Fencing"),
    ),
    (
        "DecodeReserve",
        CONFIGS["handoff_two"],
        W(FROZEN._replace(net=(msg(M_HANDOFF, 1),)), R(st=RUNNING, d=WRITABLE, dep=1)),
        0,
        msg(M_HANDOFF, 1),
        ("refused", "CapacityRefcount"),
    ),
    (
        "DecodeReserve",
        HO,
        W(FROZEN._replace(net=(msg(M_HANDOFF_BAD, 1),))),
        0,
        msg(M_HANDOFF_BAD, 1),
        {"d": RESERVED, "dfl": DF_MISMATCH},
    ),
    ("DecodeReject", HO, W(FROZEN._replace(st=CANCELLED)), 0, msg(M_HANDOFF, 1), {"dep": 1}),
    ("DecodeReject", HO, W(FROZEN), 0, msg(M_HANDOFF, 1), ("disabled", None)),
    (  # an incompatible manifest refused at intake (the alternative to DecodeReserve's)
        "DecodeReject",
        HO,
        W(FROZEN._replace(net=(msg(M_HANDOFF_BAD, 1),))),
        0,
        msg(M_HANDOFF_BAD, 1),
        {"d": NONE, "dep": 1, "net": (msg(M_NACK, 1),)},
    ),
    (
        "DecodeReceiveChunk",
        HO,
        W(SENDING1._replace(net=(msg(M_CHUNK, 1, 2),))),
        0,
        msg(M_CHUNK, 1, 2),
        {"d": FILLING, "landed": 0b100},
    ),
    (
        "DecodeReceiveChunk",
        HO,
        W(SENDING1._replace(net=(msg(M_CHUNK_BAD, 1, 0),))),
        0,
        msg(M_CHUNK_BAD, 1, 0),
        {"dfl": DF_CORRUPT},
    ),
    (
        "DecodeReceiveChunk",
        HO,
        W(SENDING1._replace(d=NONE, dfl=DF_FENCED, net=(msg(M_CHUNK, 1, 0),))),
        0,
        msg(M_CHUNK, 1, 0),
        {"landed": 0, "g": 0, "net": ()},
    ),
    (
        "DecodeReceiveChunk",
        CR,
        W(SENDING1._replace(net=(msg(M_CHUNK, 1, 0),)), d_up=False),
        0,
        msg(M_CHUNK, 1, 0),
        ("disabled", None),
    ),
    (
        "DecodeReceiveDone",
        HO,
        W(SENDING1._replace(net=(msg(M_DONE, 1, 1),))),
        0,
        msg(M_DONE, 1, 1),
        {"rmask": 0b10},
    ),
    (
        "DecodeReceiveDone",
        HO,
        W(SENDING1._replace(ep=2, dep=2, net=(msg(M_DONE, 1, 1),))),
        0,
        msg(M_DONE, 1, 1),
        ("refused", "Fencing"),
    ),
    ("DecodeValidate", HO, W(ALL_SENT), 0, 0, {"d": COMPLETE}),
    ("DecodeValidate", HO, W(ALL_SENT._replace(rmask=0b01)), 0, 0, ("refused", "RankAgreement")),
    ("DecodeValidate", HO, W(ALL_SENT._replace(landed=0b0111)), 0, 0, ("refused", "NoPartialUse")),
    ("DecodeValidate", HO, W(ALL_SENT._replace(dfl=DF_CORRUPT)), 0, 0, ("refused", "NoPartialUse")),
    (
        "DecodeValidate",
        HO,
        W(ALL_SENT._replace(dfl=DF_MISMATCH)),
        0,
        0,
        ("refused", "ManifestGate"),
    ),
    ("DecodeValidate", HO, W(ALL_SENT._replace(st=CANCELLED)), 0, 0, ("refused", "StickyEnd")),
    (
        "DecodeCommit",
        HO,
        W(ALL_SENT._replace(d=COMPLETE)),
        0,
        0,
        {"d": WRITABLE, "net": (msg(M_ACK, 1),)},
    ),
    (
        "DecodeCommit",
        HO,
        W(ALL_SENT._replace(d=COMPLETE, st=FAILED)),
        0,
        0,
        ("refused", "StickyEnd"),
    ),
    ("DecodeStep", HO, W(R(st=RUNNING, d=WRITABLE, dep=1)), 0, 0, {"d": WRITABLE}),
    ("DecodeStep", HO, W(R(st=RUNNING, d=COMPLETE, dep=1)), 0, 0, ("disabled", None)),
    ("DecodeFinish", HO, W(R(st=RUNNING, d=WRITABLE, dep=1)), 0, 0, {"st": FINISHED, "d": NONE}),
    ("DecodeFinish", HO, W(R(st=CANCELLED, d=WRITABLE, dep=1)), 0, 0, ("disabled", None)),
    (
        "DecodeAbort",
        HO,
        W(SENDING1._replace(st=CANCELLED, d=FILLING, landed=1)),
        0,
        0,
        {"d": QUARANTINED, "net": (msg(M_NACK, 1),)},
    ),
    ("DecodeAbort", HO, W(ALL_SENT._replace(st=CANCELLED)), 0, 0, {"d": NONE}),
    (
        "DecodeAbort",
        HO,
        W(SENDING1._replace(d=FILLING, landed=1, dfl=DF_CORRUPT, net=(msg(M_CHUNK, 1, 1),))),
        0,
        0,
        {"d": NONE, "dfl": DF_CORRUPT | DF_FENCED, "net": (msg(M_NACK, 1),)},
    ),
    ("DecodeAbort", HO, W(ALL_SENT), 0, 0, ("disabled", None)),
    (  # a revocable transport: fenced (its write in flight dropped) and freed at once
        "DecodeAbortFenced",
        HO,
        W(SENDING1._replace(st=CANCELLED, d=FILLING, landed=1, net=(msg(M_CHUNK, 1, 1),))),
        0,
        0,
        {"d": NONE, "dfl": DF_FENCED, "net": (msg(M_NACK, 1),)},
    ),
    ("DecodeAbortFenced", HO, W(ALL_SENT._replace(st=CANCELLED)), 0, 0, ("disabled", None)),
    ("DecodeAbortFenced", HO, W(SENDING1._replace(d=FILLING, landed=1)), 0, 0, ("disabled", None)),
    (
        "DecodeReclaim",
        HO,
        W(R(st=CANCELLED, ep=1, dep=1, d=QUARANTINED, net=(msg(M_QUIESCED, 1),))),
        0,
        msg(M_QUIESCED, 1),
        {"d": NONE, "net": ()},
    ),
    (
        "DecodeReclaim",
        HO,
        W(R(st=CANCELLED, ep=2, dep=2, d=QUARANTINED, net=(msg(M_QUIESCED, 1),))),
        0,
        msg(M_QUIESCED, 1),
        ("refused", "Fencing"),
    ),
    ("DecodeTimeout", HO, W(SENDING1._replace(d=FILLING)), 0, 0, {"d": NONE, "dfl": DF_FENCED}),
    ("DecodeTimeout", HO, W(R(st=RUNNING, d=WRITABLE, dep=1)), 0, 0, ("disabled", None)),
    ("DecodeEvictPrefix", PFX, W(R(), R(), pfx=True), 0, 0, {}),
    (
        "DecodeEvictPrefix",
        PFX,
        W(R(st=RUNNING, d=RESERVED, hit=1, dep=1), R(), pfx=True, pfx_ref=1),
        0,
        0,
        ("refused", "CapacityRefcount"),
    ),
    ("DecodeDiscard", HO, W(R(dep=1, net=(msg(M_HANDOFF, 1),))), 0, msg(M_HANDOFF, 1), {"net": ()}),
    ("DecodeDiscard", HO, W(FROZEN), 0, msg(M_HANDOFF, 1), ("disabled", None)),
    # --- environment and client --------------------------------------------------------
    ("EnvLose", HO, W(FROZEN), 0, msg(M_HANDOFF, 1), {"net": ()}),
    ("EnvLose", HO, W(FROZEN, faults=1), 0, msg(M_HANDOFF, 1), ("disabled", None)),
    (
        "EnvDuplicate",
        HO,
        W(HELD._replace(net=(msg(M_ACK, 1),))),
        0,
        msg(M_ACK, 1),
        {"net": (msg(M_ACK, 1),) * 2},
    ),
    (
        "EnvDuplicate",
        HO,
        W(SENDING1._replace(net=(msg(M_CHUNK, 1, 0),))),
        0,
        msg(M_CHUNK, 1, 0),
        ("disabled", None),
    ),
    (
        "EnvCorrupt",
        HO,
        W(SENDING1._replace(net=(msg(M_CHUNK, 1, 0),))),
        0,
        msg(M_CHUNK, 1, 0),
        {"net": (msg(M_CHUNK_BAD, 1, 0),)},
    ),
    ("EnvCorrupt", HO, W(FROZEN), 0, msg(M_HANDOFF, 1), ("disabled", None)),
    ("EnvManifestMismatch", HO, W(FROZEN), 0, msg(M_HANDOFF, 1), {"net": (msg(M_HANDOFF_BAD, 1),)}),
    ("EnvManifestMismatch", CR, W(FROZEN), 0, msg(M_HANDOFF, 1), ("disabled", None)),
    (
        "EnvStoreFail",
        OFF,
        W(R(st=RUNNING, p=COMPLETE, h=FILLING, hl=1), R()),
        0,
        0,
        {"h": NONE, "p": WRITABLE},
    ),
    ("EnvStoreFail", HO, W(R(st=RUNNING, p=COMPLETE, h=FILLING, hl=1)), 0, 0, ("disabled", None)),
    ("EnvCrash", CR, W(RUN_P), 0, 0, {"st": FAILED, "p": NONE}),
    ("EnvCrash", CR, W(R(st=RUNNING, d=WRITABLE, dep=1)), 0, 0, {"st": RUNNING}),
    ("EnvCrash", HO, W(RUN_P), 0, 0, ("disabled", None)),  # no crash in this config
    ("ClientCancel", HO, W(RUN_P), 0, 0, {"st": CANCELLED}),
    ("ClientCancel", HO, W(R(st=FINISHED)), 0, 0, ("disabled", None)),
    # restarts (spec/behaviours/restarts.py): a crashed worker, within the restart budget
    ("EnvRestart", RS, W(RUN_P, d_up=False), 0, 1, {"st": RUNNING, "d": NONE}),
    ("EnvRestart", RS, W(RUN_P), 0, 1, ("disabled", None)),  # decode is up
    ("EnvRestart", RS, W(RUN_P, p_up=False, d_inc=1), 0, 0, ("disabled", None)),  # spent
    ("EnvRestart", CR, W(RUN_P, d_up=False), 0, 1, ("disabled", None)),  # no restarts
]


@pytest.mark.parametrize(
    "name,c,w,i,arg,expected",
    CASES,
    ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)],
)
def test_guard(name, c, w, i, arg, expected):  # type: ignore[no-untyped-def]
    check_guard(name, c, w, i, arg, expected)


def test_every_action_has_an_enabled_and_a_disabled_case() -> None:
    cases = CASES + PREFILL_CASES + DECODE_FAILURE_CASES + IRREVOCABLE_CASES
    cases += RETRACT_CASES
    cases += DECODE_RANKS_CASES
    cases += IDENTITY_CASES
    cases += ASYNC_CASES
    cases += TURNS_CASES
    cases += HOST_CACHE_CASES
    cases += STREAM_CASES
    cases += [("PrefillPruneWindow", c, w, 0, 0, e) for c, w, e in WINDOW_CASES]
    enabled = {c[0] for c in cases if isinstance(c[5], dict)}
    disabled = {c[0] for c in cases if isinstance(c[5], tuple)}
    assert set(ACTIONS) == enabled == disabled


def test_unknown_action_names_the_valid_ones() -> None:
    with pytest.raises(KeyError, match="valid actions"):
        apply(W(R()), HO, frozenset(), "PrefillFly", 0, 0)
