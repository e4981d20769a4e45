"""The worlds the machine fuzzes: the spec's default configs plus combined ones.

Each default config (``spec.config.DEFAULT_SUITE``) switches on one or two features.
Bugs that need two features at once (a chunk sent to the wrong block after a *partial*
prefix hit, a crash while a prefix cache is held, a corrupt chunk in the second attempt)
never show there. The combined worlds below cover the feature pairs; each is also a named
regression world (``kvown fuzz --config NAME``):

    partial_prefix    prefix strictly between 0 and blocks, TP 1 -> 2, network faults
    prefix_faults     two requests, a prefix cache, crashes and duplicates
    offload_handoff   offload/reload and recompute together with the handoff, crashes
    tp_pairs          TP 2 -> 4 with a prefix hit and corrupt/duplicated chunks
    two_faults        two faults in one run, three attempts: faults in attempt 2 and 3

``TOUR_WORLDS`` are tiny worlds for the graph tour (``tour``). ``FUZZ_WORLDS`` is what
``kvown fuzz`` and ``kvown mutate --target refimpl`` run: the default suite, then the
combined worlds. ``get_world`` finds a world by name (the spec's
configs included), so a printed ``Divergence`` replays with ``replay_program``.
"""

from __future__ import annotations

from spec.config import DEFAULT_SUITE, Config, get_config

_NET = frozenset({"lose", "duplicate", "corrupt", "mismatch"})

COMBINED: dict[str, Config] = {
    c.name: c
    for c in (
        Config(
            name="partial_prefix",
            doc="one request, 3 blocks of which 1 is a cached prefix, TP 1->2, one net fault",
            blocks=3,
            src_tp=1,
            dst_tp=2,
            cap_p=3,
            cap_d=3,
            prefix=1,
            faults=1,
            fault_kinds=_NET,
        ),
        Config(
            name="prefix_faults",
            doc="two requests share a 1-block prefix of 2; a worker crash or a duplicate",
            n_reqs=2,
            blocks=2,
            cap_p=4,
            cap_d=3,
            prefix=1,
            faults=1,
            fault_kinds=frozenset({"crash", "duplicate", "lose"}),
            max_attempts=1,
        ),
        Config(
            name="offload_handoff",
            doc="offload/reload and recompute, then a handoff; a store failure, a loss or a crash",
            blocks=2,
            cap_p=2,
            cap_h=2,
            cap_d=2,
            offload=True,
            recompute=True,
            faults=1,
            fault_kinds=frozenset({"store_fail", "lose", "duplicate", "crash"}),
            max_moves=1,
        ),
        Config(
            name="tp_pairs",
            doc="TP 2->4 with a 1-block prefix hit of 2; a corrupt or duplicated chunk",
            blocks=2,
            src_tp=2,
            dst_tp=4,
            cap_p=2,
            cap_d=2,
            prefix=1,
            faults=1,
            fault_kinds=frozenset({"corrupt", "duplicate"}),
        ),
        Config(
            name="two_faults",
            doc="one request, 2 blocks, two network faults and three attempts",
            blocks=2,
            faults=2,
            fault_kinds=_NET,
            max_attempts=3,
        ),
    )
}

FUZZ_WORLDS: tuple[str, ...] = (*DEFAULT_SUITE, *COMBINED)

# Tiny worlds for the graph tour (``tour``): each reaches, in a few hundred states, a
# behaviour the default configs reach only in a large world (so a tour of it fits the
# suite). Not fuzzed by default; ``get_world`` finds them.
TOUR_WORLDS: dict[str, Config] = {
    c.name: c
    for c in (
        Config(
            name="mismatch_one",
            doc="one request, 1 block, one attempt, one fault: a mismatched manifest",
            blocks=1,
            faults=1,
            fault_kinds=frozenset({"mismatch"}),
            max_attempts=1,
        ),
        Config(
            name="net_one",
            doc="one request, 1 block, one attempt, one fault: a duplicated or corrupt message",
            blocks=1,
            faults=1,
            fault_kinds=frozenset({"duplicate", "corrupt"}),
            max_attempts=1,
        ),
        Config(
            name="retract_fail_one",
            doc="one request, 1 block, two attempts; decode may fail an attempt or retract",
            blocks=1,
            decode_failure=True,
            retract=True,
        ),
        Config(
            name="unrevocable_one",
            doc="one request, 2 blocks, one attempt, a transport with no revoke",
            blocks=2,
            revocable=False,
            max_attempts=1,
        ),
        Config(
            name="unrevocable_tp2_one",
            doc="one request, 1 block, one attempt, prefill TP 2 -> decode TP 1, no revoke",
            blocks=1,
            src_tp=2,
            cap_p=1,
            cap_d=1,
            revocable=False,
            max_attempts=1,
        ),
        Config(
            name="slots_one",
            doc="two requests, 1 block each, one attempt, one decode metadata slot, no cancel",
            n_reqs=2,
            blocks=1,
            slots=True,
            max_attempts=1,
            cancel=False,
        ),
        Config(
            name="full_hit_one",
            doc="one request, 1 block, all of it a cached prefix: a zero-block handoff",
            blocks=1,
            prefix=1,
            cap_d=2,
            max_attempts=1,
        ),
        Config(
            name="tp2_one",
            doc="one request, 1 block, one attempt, prefill TP 2 -> decode TP 1, a lost message",
            blocks=1,
            src_tp=2,
            cap_p=1,
            cap_d=1,
            faults=1,
            fault_kinds=frozenset({"lose"}),
            max_attempts=1,
        ),
        Config(
            name="ranks_one",
            doc="one request, 1 block, one attempt, decode TP 2: each rank installs its shard",
            blocks=1,
            dst_tp=2,
            decode_ranks=True,
            max_attempts=1,
        ),
        Config(
            name="ranks_tp2_one",
            doc="one request, 1 block, one attempt, prefill TP 2 -> decode TP 2: each decode"
            " rank installs the heads of its prefill rank; one corrupt chunk",
            blocks=1,
            src_tp=2,
            dst_tp=2,
            cap_p=1,
            cap_d=1,
            faults=1,
            fault_kinds=frozenset({"corrupt"}),
            decode_ranks=True,
            max_attempts=1,
        ),
        Config(
            name="ranks_faults_one",
            doc="one request, 1 block, one attempt, prefill TP 2 -> decode TP 2 with decode"
            " ranks; a worker (every rank of its side) crashes or the manifest mismatches",
            blocks=1,
            src_tp=2,
            dst_tp=2,
            cap_p=1,
            cap_d=1,
            faults=1,
            fault_kinds=frozenset({"crash", "mismatch"}),
            decode_ranks=True,
            max_attempts=1,
        ),
        Config(
            name="offload_restart",
            doc="offload_crash with one restart: a prefill (or decode) crash, then the"
            " worker back as a new incarnation (a disk tier's copies outlive the crash)",
            blocks=2,
            cap_p=2,
            cap_d=2,
            cap_h=2,
            offload=True,
            faults=1,
            fault_kinds=frozenset({"crash"}),
            max_attempts=1,
            restarts=1,
        ),
        Config(
            name="ranks_restart_one",
            doc="one request, 1 block, one attempt, decode TP 2 with decode ranks; a worker"
            " (every rank of its side) crashes once and comes back as a new incarnation",
            blocks=1,
            dst_tp=2,
            cap_p=1,
            cap_d=1,
            faults=1,
            fault_kinds=frozenset({"crash"}),
            decode_ranks=True,
            max_attempts=1,
            restarts=1,
        ),
        Config(
            name="ranks_stream_one",
            doc="one request, 1 block, one attempt, decode TP 2 with decode ranks, streamed"
            " layer by layer: every prefill rank's send_layer, each decode rank's layers",
            blocks=1,
            dst_tp=2,
            cap_p=1,
            cap_d=1,
            decode_ranks=True,
            layers=2,
            max_attempts=1,
        ),
    )
}


def get_world(name: str) -> Config:
    """A combined world or a spec config by name (KeyError naming the valid ones)."""
    if name in COMBINED:
        return COMBINED[name]
    if name in TOUR_WORLDS:
        return TOUR_WORLDS[name]
    try:
        return get_config(name)
    except KeyError:
        raise KeyError(f"unknown world {name!r}; valid worlds: {', '.join(FUZZ_WORLDS)}") from None
