"""Each incident of incidents.md as a trace on the spec.

On the correct spec the buggy step is refused, and the refusal names the property
(or, where the correct protocol takes a different safe step, that step keeps the
property). With the matching mutant on, the same trace replays into a state that
breaks the property.
"""

from __future__ import annotations

from typing import Any

import pytest

from model_checks.explicit.runner import check_mutant
from model_checks.explicit.trace import TraceError, replay
from spec.config import CONFIGS
from spec.properties import violated_safety
from spec.state import NONE, QUARANTINED


def s(action: str, **args: Any) -> dict[str, Any]:
    return {"action": action, "args": args}


def m(action: str, kind: str, epoch: int, idx: int = 0) -> dict[str, Any]:
    return s(action, req=0, msg=kind, epoch=epoch, idx=idx)


HANDOFF_START = [
    s("PrefillAdmit", req=0),
    s("PrefillRun", req=0),
    s("PrefillFreeze", req=0),
    m("DecodeReserve", "Handoff", 1),
    m("PrefillRecvReady", "Ready", 1),
    s("PrefillSendChunk", req=0),  # chunk 0 of rank 0 is in flight
]
OFFLOAD_START = [
    s("PrefillAdmit", req=0),
    s("PrefillRun", req=0),
    s("PrefillOffloadBegin", req=0),
    s("PrefillOffloadCopy", req=0),  # 1 of 2 blocks stored
]

# name: (config, steps, mutant, property)
INCIDENTS = {
    # vllm #32255: an abort frees blocks under an in-flight write
    "vllm_32255": (
        "handoff_tp2to1",
        [*HANDOFF_START, s("ClientCancel", req=0), s("DecodeAbort", req=0)],
        "free_on_cancel_in_flight",
        "NoReuseUnderIO",
    ),
    # sglang #30233: a truncated transfer reported as success
    "sglang_30233": (
        "handoff_tp2to1",
        [
            *HANDOFF_START,
            s("PrefillSendChunk", req=0),
            s("PrefillSendChunk", req=0),
            s("PrefillSendChunk", req=0),
            s("PrefillSendChunk", req=0),
            s("PrefillSendChunk", req=0),
            m("EnvLose", "Chunk", 1, 1),  # truncated: block 1 of rank 0 never arrives
            m("DecodeReceiveChunk", "Chunk", 1, 0),
            m("DecodeReceiveChunk", "Chunk", 1, 2),
            m("DecodeReceiveChunk", "Chunk", 1, 3),
            m("DecodeReceiveDone", "RankDone", 1, 0),
            m("DecodeReceiveDone", "RankDone", 1, 1),
            s("DecodeValidate", req=0),
        ],
        "partial_as_complete",
        "NoPartialUse",
    ),
    # TensorRT-LLM #6507: a layout mismatch installed silently
    "trtllm_6507": (
        "handoff_tp2to1",
        [
            s("PrefillAdmit", req=0),
            s("PrefillRun", req=0),
            s("PrefillFreeze", req=0),
            m("EnvManifestMismatch", "Handoff", 1),
            m("DecodeReserve", "HandoffBadManifest", 1),
            m("PrefillRecvReady", "Ready", 1),
            *[s("PrefillSendChunk", req=0)] * 6,
            *[m("DecodeReceiveChunk", "Chunk", 1, k) for k in range(4)],
            m("DecodeReceiveDone", "RankDone", 1, 0),
            m("DecodeReceiveDone", "RankDone", 1, 1),
            s("DecodeValidate", req=0),
        ],
        "mismatch_installed",
        "ManifestGate",
    ),
    # vllm #46240: a load and a store in flight for one request
    "vllm_46240": (
        "offload_contend",
        [*OFFLOAD_START, s("PrefillReloadBegin", req=0)],
        "reload_during_store",
        "LoadXorStore",
    ),
    # LMCache #4991: a failed store stays visible
    "lmcache_4991": (
        "offload_contend",
        [*OFFLOAD_START, s("EnvStoreFail", req=0)],
        "failed_store_visible",
        "PublishAfterCommit",
    ),
    # vllm #29870: a deferred store reads blocks that were reused
    "vllm_29870": (
        "offload_contend",
        [*OFFLOAD_START, s("PrefillPreempt", req=0)],
        "preempt_during_store",
        "NoReuseUnderIO",
    ),
}


@pytest.mark.parametrize("name", list(INCIDENTS))
def test_incident_breaks_its_property_only_with_the_bug(name: str) -> None:
    cname, steps, mutant, prop = INCIDENTS[name]
    c = CONFIGS[cname]
    worlds = replay(c, frozenset({mutant}), steps)
    assert prop in violated_safety(worlds[-1], c)
    try:
        good = replay(c, frozenset(), steps)
    except TraceError as exc:  # the correct spec refuses the buggy step
        assert exc.index == len(steps) - 1
        assert exc.prop in (prop, None)
        if name != "lmcache_4991":
            assert exc.prop == prop
    else:  # the correct spec takes a safe step instead
        assert violated_safety(good[-1], c) == []


def test_vllm_32255_correct_spec_quarantines_until_the_writer_quiesces() -> None:
    cname, steps, _, _ = INCIDENTS["vllm_32255"]
    c = CONFIGS[cname]
    w = replay(c, frozenset(), steps)[-1]
    assert w.reqs[0].d == QUARANTINED
    later = replay(
        c,
        frozenset(),
        [
            *steps,
            m("DecodeReceiveChunk", "Chunk", 1, 0),
            s("PrefillQuiesce", req=0),
            m("DecodeReclaim", "Quiesced", 1),
        ],
    )
    assert later[-1].reqs[0].d == NONE
    assert all(violated_safety(x, c) == [] for x in later)


def test_lmcache_4991_failed_store_never_visible() -> None:
    cname, steps, _, _ = INCIDENTS["lmcache_4991"]
    c = CONFIGS[cname]
    w = replay(c, frozenset(), steps)[-1]
    assert w.reqs[0].h == NONE  # never published
    with pytest.raises(TraceError):
        replay(c, frozenset(), [*steps, s("PrefillReloadBegin", req=0)])


def test_sglang_31800_no_timeout_while_transferring_is_a_liveness_bug() -> None:
    # sglang #31800: the timeout is checked only before the first chunk lands.
    steps = [*HANDOFF_START, m("DecodeReceiveChunk", "Chunk", 1, 0), s("DecodeTimeout", req=0)]
    c = CONFIGS["handoff_tp2to1"]
    assert replay(c, frozenset(), steps)[-1].reqs[0].d == NONE  # the bounded exit
    with pytest.raises(TraceError):
        replay(c, frozenset({"no_timeout_while_filling"}), steps)
    r = check_mutant("no_timeout_while_filling")
    assert r.caught and r.expected == "BoundedExit"
