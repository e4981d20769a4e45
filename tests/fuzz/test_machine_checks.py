"""The machine's new checks, each shown catching a planted bug the old checks miss
(``planted.py``), and passing on the correct engine:

- the ghost (``refimpl.testing.ghost``): recompute that loses the generated tokens,
  invisible to the engine's own ``damaged()``;
- the drain (``refimpl.testing.drain``, issue #16 part 6): a leak that shows only at
  quiescence;
- the refusal probes (``refimpl.testing.probes``): a forged message index accepted.
"""

from __future__ import annotations

import pytest

from refimpl.testing import Divergence, EngineAdapter, replay_program
from refimpl.testing.drain import drain, drain_path
from refimpl.testing.probes import refusal_probes
from refimpl.testing.tempo import Tempo
from spec.config import CONFIGS
from spec.properties import quiescent_terminal

try:
    from planted import FindIgnoresIndex, LeaksOnQuiesce, PlantedAdapter, RecomputeLosesTokens
except ImportError:  # pragma: no cover - another import mode
    from tests.fuzz.planted import (
        FindIgnoresIndex,
        LeaksOnQuiesce,
        PlantedAdapter,
        RecomputeLosesTokens,
    )


def st(action: str, **args: object) -> dict[str, object]:
    return {"action": action, "args": args}


RECOMPUTE = [
    st("PrefillAdmit", req=0),
    st("PrefillRun", req=0),
    st("PrefillDecodeStep", req=0),
    st("PrefillDecodeStep", req=0),
    st("PrefillPreempt", req=0),
    st("PrefillAdmit", req=0),
    st("PrefillRun", req=0),
]


def test_the_ghost_catches_recompute_that_loses_tokens_the_engine_cannot_see() -> None:
    with pytest.raises(Divergence) as err:
        replay_program(
            PlantedAdapter(engine=RecomputeLosesTokens), RECOMPUTE, config="offload_contend"
        )
    assert err.value.kind == "ghost differs" and len(err.value.program) == len(RECOMPUTE)
    e = RecomputeLosesTokens(CONFIGS["offload_contend"])
    e.replay(RECOMPUTE)
    assert e.damaged() == []  # the engine's own truth was rewritten the same wrong way


def test_the_ghost_agrees_with_the_correct_engine_through_recompute() -> None:
    h = replay_program(EngineAdapter(), RECOMPUTE, config="offload_contend")
    assert h.ghost is not None and h.ghost.tokens == [2, 0]
    assert h.ghost.problems(h.w) == []


CANCELLED = [st("PrefillAdmit", req=0), st("PrefillRun", req=0), st("ClientCancel", req=0)]


def test_the_drain_catches_a_leak_that_shows_only_at_quiescence() -> None:
    h = replay_program(PlantedAdapter(engine=LeaksOnQuiesce), CANCELLED, config="handoff_two")
    with pytest.raises(Divergence) as err:
        drain(h)
    assert err.value.kind == "drain: blocks held"
    assert any(s["action"] == "PrefillQuiesce" for s in err.value.program)


def test_the_correct_engine_drains_to_quiescence_holding_nothing() -> None:
    h = replay_program(EngineAdapter(), CANCELLED, config="handoff_two")
    assert drain(h) > 0
    assert quiescent_terminal(h.w, h.c)
    assert drain_path(h.w, h.c) == []


FROZEN = [st("PrefillAdmit", req=0), st("PrefillRun", req=0), st("PrefillFreeze", req=0)]


def test_the_probes_catch_a_forged_index_accepted() -> None:
    h = replay_program(PlantedAdapter(engine=FindIgnoresIndex), FROZEN, config="handoff_tp2to1")
    probes = refusal_probes(h)
    assert ("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 1}, None) in probes
    with pytest.raises(Divergence) as err:
        h.probe_all(probes)
    assert err.value.kind == "accepted a refused step"


def test_the_correct_engine_refuses_every_probe_and_stays_unchanged() -> None:
    h = replay_program(EngineAdapter(), FROZEN, config="handoff_tp2to1")
    probes = refusal_probes(h)
    in_flight = {a["msg"] for _, a, _ in probes if "msg" in a}
    assert {"Handoff", "Chunk", "Ack"} <= in_flight  # real and forged kinds
    assert ("PrefillDecodeStep", {"req": 0}, "FrozenSnapshot") in probes  # named refusal
    assert ("PrefillOffloadBegin", {"req": 0}, None) in probes  # not enabled
    before = h.impl.snapshot()
    h.probe_all(probes)
    assert h.impl.snapshot() == before


def test_a_swarm_subset_switches_its_actions_off() -> None:
    w = CONFIGS["handoff_tp2to1"].initial()
    t = Tempo(off=frozenset({"ClientCancel"}))
    assert not t.allows("ClientCancel", 0, w, {"req": 0})
    assert Tempo().allows("ClientCancel", 0, w, {"req": 0})
