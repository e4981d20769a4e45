"""The z3 encodings agree with the explicit spec, action label by action label.

Finite encoding (BMC's): every state and edge of the tiny configs, a sample of states
of every default config and of each mutant's config. Unbounded model (the induction's):
a few states of every default config, every transition from each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_checks.symbolic.agree import (
    TINY,
    Checker,
    Report,
    check_full,
    check_sample,
    compare_states,
    random_states,
)
from model_checks.symbolic.agree_unbounded import check_unbounded
from model_checks.symbolic.bmc import SAFETY_MUTANTS
from spec.config import CONFIGS
from spec.mutants import MUTANTS
from tests.model_checks.test_z3_bmc import BMC_NIGHTLY


def _clean(rep: Report) -> None:
    assert not rep.mismatches, "\n".join(str(m) for m in rep.mismatches[:5])


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_config_every_state_and_edge(name: str) -> None:
    rep = check_full(TINY[name])
    assert rep.states > 300 and rep.edges > rep.states
    _clean(rep)


ENCODED = sorted(CONFIGS)  # every world is in the finite encoding
_PINNED = json.loads((Path(__file__).parents[2] / "spec" / "pinned.json").read_text())


@pytest.mark.by_encoding
@pytest.mark.parametrize("name", ENCODED)
def test_default_config_sample(name: str) -> None:
    rep = check_sample(CONFIGS[name], n=25)
    # 20 of the 25 sampled, or the whole world where it is smaller (async_offload: 17);
    # a world pinned nowhere (reject_retry, past the explorer's bound) is large
    whole = _PINNED["configs"].get(name) or _PINNED["deep"].get(name) or {}
    assert rep.states >= min(20, whole.get("distinct_states", 20))
    _clean(rep)


SWITCHED = sorted(n for n in MUTANTS if MUTANTS[n].configs[0] in ENCODED)
# The suite's sample of the switch agreement (about 200 CPU s for all 41 when measured): the
# mutants no suite BMC test encodes, the liveness ones and BMC_NIGHTLY's. A safety mutant
# with its BMC test in the suite runs here nightly: that test builds the same switched encoding
# (shared_encoding) and checks it against the explicit spec with the switch on, its
# violation at exactly the BFS depth by a trace that replays step by step, so a switch
# mis-encoded on the mutant's own path fails there (an extra or missing z3 step moves the
# depth or breaks the replay); what only the nightly run holds is a mis-encoding off that
# path, on the sampled states.
SWITCH_SUITE = frozenset(n for n in SWITCHED if n not in SAFETY_MUTANTS or n in BMC_NIGHTLY)


@pytest.mark.parametrize(
    "name",
    [n if n in SWITCH_SUITE else pytest.param(n, marks=pytest.mark.nightly) for n in SWITCHED],
)
def test_mutant_switches_agree(name: str) -> None:
    rep = check_sample(CONFIGS[MUTANTS[name].configs[0]], frozenset({name}), n=8)
    _clean(rep)


@pytest.mark.by_encoding("handoff_tp2to1")
def test_a_divergence_is_caught() -> None:
    """The check has teeth: the correct encoding disagrees with a mutant spec."""
    c = CONFIGS["handoff_tp2to1"]
    ck = Checker(c)  # z3 side: the correct spec
    ck.m = frozenset({"free_on_cancel_in_flight"})  # explicit side: the mutant
    worlds = random_states(c, ck.m, 60, __import__("random").Random(3))
    rep = Report(c.name, ck.m)
    compare_states(ck, worlds, rep)
    assert rep.mismatches and "DecodeAbort" in rep.mismatches[0].detail


# (the unbounded model keeps the shared host cache's, the streamed offers' and the
# restarts' fields at 0: those worlds are the finite encoding's, above; it holds the turns')
UNBOUNDED = [
    n
    for n in ENCODED
    if not (
        CONFIGS[n].identity
        or CONFIGS[n].slots
        or CONFIGS[n].host_cache
        or CONFIGS[n].layers
        or CONFIGS[n].restarts
    )
]
# The suite's sample of the unbounded agreement (about 300 CPU s for all 21 worlds): one
# world for each feature the unbounded model branches on. TP 2 -> 1 and lost messages
# (handoff_tp2to1); two requests on a decode pool that fits one (handoff_two); offload,
# reload and crashes (offload_crash); a partial prefix hit with TP 2, corruption and
# duplicates (prefix_partial_tp2); decode ranks and decode's own failure
# (pair_ranks_fail); retraction with async steps (pair_retract_async); no revoke and a
# retry (pair_unrevocable_retry); a fault budget of 2 (faults2_handoff). The other
# worlds run nightly; what only they hold: store failure with recompute and max_moves
# (offload_contend), the full prefix hit of two requests (prefix_share, prefix_crash),
# no cancel (reject_dup).
UNBOUNDED_SUITE = frozenset(
    {
        "handoff_tp2to1",
        "handoff_two",
        "offload_crash",
        "prefix_partial_tp2",
        "pair_ranks_fail",
        "pair_retract_async",
        "pair_unrevocable_retry",
        "faults2_handoff",
    }
)


@pytest.mark.parametrize(
    "name",
    [n if n in UNBOUNDED_SUITE else pytest.param(n, marks=pytest.mark.nightly) for n in UNBOUNDED],
)
def test_unbounded_model_agrees(name: str) -> None:
    rep = check_unbounded(CONFIGS[name], n=2)
    assert rep.states == 2 and rep.checks > 20
    assert not rep.mismatches, "\n".join(rep.mismatches[:3])


def test_the_unbounded_sample_is_of_the_worlds_checked() -> None:
    assert UNBOUNDED_SUITE <= set(UNBOUNDED) and len(UNBOUNDED_SUITE) < len(UNBOUNDED)


def test_every_switch_left_to_nightly_has_its_bmc_in_the_suite() -> None:
    moved = set(SWITCHED) - SWITCH_SUITE
    assert moved and moved <= set(SAFETY_MUTANTS) - set(BMC_NIGHTLY)
    assert set(BMC_NIGHTLY) <= SWITCH_SUITE  # their BMC is nightly: the agreement stays
