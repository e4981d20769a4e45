"""Model-based fuzzing of a KV-ownership implementation against the spec, with Hypothesis.

    from refimpl.testing import EngineAdapter, make_machine
    TestHandoff = make_machine(EngineAdapter(), CONFIGS["handoff_tp2to1"]).TestCase

System: the machine drives one implementation instance, built by an ``Adapter`` (the torch
reference engine here: ``EngineAdapter``; yours elsewhere), in lockstep with the correct
spec (``testing_harness.Harness``). The spec is the oracle and never carries a mutant; the
implementation may (its bug switches).

Rules mirror the spec one to one: one rule per action of ``spec.actions.ACTIONS``, named
after it (the environment's faults and the client's cancel included). A rule runs when
the spec enables its action for some argument (or, on probe steps, refuses it naming a
property) and draws among those arguments, now and then one the spec does not enable.
``arbitrary_step`` draws any action with any arguments (messages not in flight, stale
epochs, other kinds): mostly steps the spec does not enable. Which groups of rules may run
when (faults, quits, endings, chores) follows a schedule drawn per example
(``testing_tempo``), so that runs get deep and faults land inside protocol windows.

Every step is checked the same way: the implementation accepts exactly what the spec
enables and reaches the spec's successor (``abstract()``), and refuses the rest with a
typed error that names the spec's property and changes nothing. After every step the
invariants run: one per safety property (by its ID) on the implementation's state;
``guards_agree`` (every step the spec refuses here naming a property, the implementation
refuses the same way); ``integrity`` (its ``check_integrity()``) and ``data_integrity``
(every complete or writable replica holds the ground truth's bytes). Each step is
``note()``d with the compact state; a failure raises ``Divergence`` with the program in
the trace format, which ``replay_program`` reruns. Coverage goes to ``hypothesis.event()``
(each action with its outcome, each property on the states where it is non-trivial:
``testing_harness.NONTRIVIAL``) and to a ``Coverage`` object.

Randomness: the implementation's seed is drawn by Hypothesis (``build``) and also seeds
torch's global generator; an adapter's own ``random.Random`` instances go in its
``randoms`` and are registered with ``register_random``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from hypothesis import event, note, register_random
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from refimpl.testing.drain import drain
from refimpl.testing.harness import (
    PREDS,
    Adapter,
    Coverage,
    Divergence,
    Harness,
    Step,
    Subject,
    compact,
    replay_program,
)
from refimpl.testing.probes import refusal_probes
from refimpl.testing.tempo import GATED, HELD_BACK, INJECTABLE, Tempo, ended, tempos
from spec.actions import ACTIONS, WORKERS, encode_args
from spec.common import Refused
from spec.config import Config
from spec.state import MSG_NAMES, World, msg

__all__ = [
    "Adapter",
    "Coverage",
    "Divergence",
    "SpecMachine",
    "Subject",
    "Tally",
    "make_machine",
    "replay_program",
]


# --------------------------------------------------------------------- the machine
@dataclass
class Tally:
    """Counts over one run of a machine class (all its examples)."""

    examples: int = 0  # machine instances started
    steps: int = 0  # steps taken (rules run after initialize)
    failures: int = 0  # examples that failed (generation, shrinking and the final replay)
    first_failure: int | None = None  # examples started when the first failure happened
    last: Divergence | None = None  # the last failure: the shrunk one once Hypothesis is done

    def failed(self, err: Divergence) -> None:
        self.failures += 1
        self.last = err
        if self.first_failure is None:
            self.first_failure = self.examples


Cand = tuple[dict[str, Any], World | Refused]  # trace-form args, the spec's verdict


def _candidates(w: World, c: Config, name: str) -> list[tuple[int, int]]:
    a = ACTIONS[name]
    if a.arg == "req":
        return [(i, 0) for i in range(len(w.reqs))]
    if a.arg == "msg":
        return [(i, code) for i, r in enumerate(w.reqs) for code in sorted(set(r.net))]
    if a.arg == "global":
        return [(0, 0)]
    return [(0, wk) for wk in range(len(WORKERS))]


MAX_IDLE_TICKS = 100


class _EveryRule:
    def is_enabled(self, name: object) -> bool:
        return True


class SpecMachine(RuleBasedStateMachine):
    """Base class; ``make_machine`` binds an adapter, a config and the bug switches."""

    adapter: ClassVar[Adapter]
    config: ClassVar[Config]
    mutants: ClassVar[frozenset[str]] = frozenset()
    tally: ClassVar[Tally]
    coverage: ClassVar[Coverage | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.h: Harness | None = None
        self._menu: dict[str, tuple[list[Cand], list[Cand], list[Cand]]] | None = None
        self.tempo = Tempo()
        self._gates: bool | None = None
        self._inject: bool | None = None
        self._opts: dict[str, tuple[list[Cand], list[Cand], list[Cand]]] = {}
        self.clock = 0  # the schedule's time: steps taken plus idle ticks skipped
        self.failed = False  # a check failed: no drain at the end
        self.tally.examples += 1
        # Hypothesis's swarm testing switches random subsets of rules off per example; a
        # protocol needs every step of a chain, so the tempo draws of ``build`` take its
        # place: its ``off`` set is the swarm subset (quits, token steps, preemption),
        # never a step a handoff or a cleanup needs (``tempo.SWARMABLE``).
        strategy = getattr(self, "_rules_strategy", None)
        if hasattr(strategy, "enabled_rules_strategy"):
            setattr(strategy, "enabled_rules_strategy", st.just(_EveryRule()))  # noqa: B010

    # ---------------------------------------------------------------- plumbing
    def _guard(self, fn: Callable[[], object]) -> Any:
        try:
            return fn()
        except Divergence as err:
            self.tally.failed(err)
            self.failed = True
            raise

    @property
    def harness(self) -> Harness:
        assert self.h is not None, "initialize runs first"
        return self.h

    def menu(self, name: str) -> tuple[list[Cand], list[Cand], list[Cand]]:
        """The arguments of ``name`` the spec enables, refuses naming a property, and
        does not enable, on the current state."""
        if self._menu is None:
            h = self.harness
            self._menu = {}
            for n in ACTIONS:
                tiers: tuple[list[Cand], list[Cand], list[Cand]] = ([], [], [])
                for i, arg in _candidates(h.w, h.c, n):
                    v = h.verdict(n, i, arg)
                    k = 2 if isinstance(v, Refused) and not v.prop else int(type(v) is Refused)
                    tiers[k].append((encode_args(n, i, arg), v))
                self._menu[n] = tiers
        return self._menu[name]

    def _due(self, every: int) -> bool:
        return self.tempo.due(every, self.clock, 4)

    def options(self, name: str) -> tuple[list[Cand], list[Cand], list[Cand]]:
        """What the rule for ``name`` may draw now: the enabled arguments whose turn it is
        (``testing_tempo``), and on probe steps the refused ones (naming a property, then
        not enabled)."""
        got = self._opts.get(name)
        if got is None and self._injecting() and not self.tempo.injects(name):
            got = self._opts[name] = ([], [], [])
        if got is None:
            enabled, named, dull = self.menu(name)
            w, k = self.harness.w, self.clock
            if name in HELD_BACK or (name in GATED and self._held()):
                enabled = [c for c in enabled if self.tempo.allows(name, k, w, c[0])]
            elif name in self.tempo.off:  # swarm: this example never takes it
                enabled = [c for c in enabled if ended(w, c[0])]
            got = (enabled, named, dull) if self._due(self.tempo.probe_every) else (enabled, [], [])
            self._opts[name] = got
        return got

    def _injecting(self) -> bool:
        """Is a phase-tied fault or quit due (``Tempo.injects``)?"""
        if self._inject is None:
            w, k, t = self.harness.w, self.clock, self.tempo
            self._inject = any(
                t.injects(n) and not ended(w, a) and t.allows(n, k, w, a)
                for n in INJECTABLE
                for a, _ in self.menu(n)[0]
            )
        return self._inject

    def _held(self) -> bool:
        """Validation and chores wait for their turn only while some step outside the
        gated groups is enabled (``HELD_BACK`` ones always wait for theirs)."""
        if self._gates is None:
            self._gates = any(n not in GATED and self.menu(n)[0] for n in ACTIONS)
        return self._gates

    def eligible(self, name: str) -> bool:
        """The rule's precondition (see ``options``)."""
        enabled, named, _ = self.options(name)
        return bool(enabled or named)

    def _do(self, name: str, args: dict[str, Any]) -> None:
        h = self.harness
        injected = self._injecting() and self.tempo.injects(name)
        outcome = self._guard(lambda: h.step(name, args))
        if injected:  # once per example: the group keeps to the clock from now on
            self.tempo = self.tempo.injected(name)
        self._menu = self._gates = self._inject = None
        self._tick()
        self.tally.steps += 1
        event(f"action {name}", outcome)
        for pid in h.hot:
            event(f"property {pid}", "non-trivial")
        note(f"{len(h.program):3d} {name}({_fmt(args)}) -> {outcome}  | {compact(h.w)}")

    def _act(self, data: st.DataObject, name: str) -> None:
        enabled, named, dull = self.options(name)
        tier = data.draw(st.integers(0, 5), label="tier") if named or dull else 0
        pool = enabled
        if not pool or (tier == 4 and named) or (tier == 5 and not dull):
            pool = named or enabled
        elif tier == 5:
            pool = dull
        args = data.draw(st.sampled_from([a for a, _ in pool]), label=name)
        self._do(name, args)

    def _any_eligible(self) -> bool:
        return any(self.eligible(n) for n in ACTIONS)

    def _tick(self) -> None:
        """Advance the schedule's clock one tick, then skip the ticks on which no rule
        would be eligible, while waiting can help (some enabled or refused action waits
        for the clock): waiting costs no steps, and the groups race at their rates."""
        self.clock += 1
        self._opts = {}
        waits = any((self.menu(n)[0] and self.tempo.clocked(n)) or self.menu(n)[1] for n in ACTIONS)
        for _ in range(MAX_IDLE_TICKS if waits else 0):
            if self._any_eligible():
                return
            self.clock += 1
            self._opts = {}

    # ---------------------------------------------------------------- init and probes
    @initialize(seed=st.integers(0, 2**16 - 1), data=st.data())
    def build(self, seed: int, data: st.DataObject) -> None:
        """Build the implementation (``seed``: its data) and draw the schedule
        (``testing_tempo``)."""
        self.tempo = data.draw(tempos(self.config), label="tempo")
        torch.manual_seed(seed)
        self.h = self._guard(
            lambda: Harness(self.adapter, self.config, self.mutants, seed, self.coverage)
        )
        self._guard(self.harness.check_state)
        note(f"  0 init seed={seed} {self.config.name} {self.tempo}  | {compact(self.harness.w)}")

    @precondition(lambda self: self._due(self.tempo.probe_every) or not self._any_eligible())
    @rule(data=st.data())
    def arbitrary_step(self, data: st.DataObject) -> None:
        """Any action, any arguments: mostly steps the spec does not enable."""
        c = self.config
        name = data.draw(st.sampled_from(sorted(ACTIONS)), label="action")
        a = ACTIONS[name]
        req = data.draw(st.integers(0, c.n_reqs - 1), label="req")
        if a.arg == "msg":
            kind = data.draw(st.sampled_from(sorted(MSG_NAMES)), label="kind")
            epoch = data.draw(st.integers(0, c.max_attempts + 1), label="epoch")
            idx = data.draw(st.integers(0, c.src_tp * c.blocks), label="idx")
            args = encode_args(name, req, msg(kind, epoch, idx))
        elif a.arg == "worker":
            args = encode_args(name, 0, data.draw(st.integers(0, 1), label="worker"))
        else:
            args = encode_args(name, req, 0)
        self._do(name, args)

    # ---------------------------------------------------------------- invariants
    @invariant()
    def guards_agree(self) -> None:
        """Every action the spec refuses here naming a property (its guards: capacity,
        frozen source, fencing, partial data, sticky end, ...), the implementation
        refuses with the same property, changing nothing."""
        for name in ACTIONS:
            for args, why in self.menu(name)[1]:
                assert isinstance(why, Refused)
                self._probe(name, args, why.prop)

    def _probe(self, name: str, args: dict[str, Any], prop: str | None) -> None:
        self._guard(lambda: self.harness.probe(name, args, prop))

    @invariant()
    def refusals_agree(self) -> None:
        """Every message in flight, offered to every action that takes a message and is
        not enabled for it, and forged ones (``probes``): refused as the spec refuses,
        nothing changed."""
        h = self.harness
        self._guard(lambda: h.probe_all(refusal_probes(h)))

    def teardown(self) -> None:
        """Every example ends drained to quiescence, holding no block (``drain``)."""
        if self.h is not None and not self.failed:
            self._guard(lambda: drain(self.harness))

    @invariant()
    def integrity(self) -> None:
        self._guard(self.harness.check_integrity)

    @invariant()
    def data_integrity(self) -> None:
        self._guard(self.harness.check_data)


def _fmt(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in args.items())


def _action_rule(name: str) -> Any:
    def body(self: SpecMachine, data: st.DataObject) -> None:
        self._act(data, name)

    body.__name__ = body.__qualname__ = name
    body.__doc__ = f"spec action {name} ({ACTIONS[name].actor}, {ACTIONS[name].kind})"
    return precondition(lambda self: self.eligible(name))(rule(data=st.data())(body))


def _property_invariant(pid: str) -> Any:
    def body(self: SpecMachine) -> None:
        self._guard(lambda: self.harness.check_property(pid))

    body.__name__ = body.__qualname__ = pid
    body.__doc__ = f"safety property {pid}"
    return invariant()(body)


for _name in ACTIONS:
    setattr(SpecMachine, _name, _action_rule(_name))
for _pid in PREDS:
    setattr(SpecMachine, _pid, _property_invariant(_pid))


def make_machine(
    adapter: Adapter,
    config: Config,
    mutants: Sequence[str] = (),
    *,
    coverage: Coverage | None = None,
    tally: Tally | None = None,
) -> type[SpecMachine]:
    """A machine class for ``adapter`` on ``config`` with the bug switches ``mutants`` on.

    ``tally`` and ``coverage`` collect counts over every example the class runs.
    """
    unknown = set(mutants) - set(adapter.switches())
    if unknown:
        raise ValueError(f"unknown switches {sorted(unknown)}; known: {sorted(adapter.switches())}")
    for r in getattr(adapter, "randoms", ()):
        register_random(r)
    suffix = "".join(part.title() for part in config.name.split("_"))
    attrs = {
        "adapter": adapter,
        "config": config,
        "mutants": frozenset(mutants),
        "tally": tally if tally is not None else Tally(),
        "coverage": coverage,
        "__module__": __name__,
    }
    return type(f"Spec{suffix}", (SpecMachine,), attrs)


def program_trace(program: Sequence[Step]) -> list[Step]:
    """The accepted steps of a program: a spec trace (``Engine.replay``, ``kvown``)."""
    return [{"action": s["action"], "args": s["args"]} for s in program if s["expect"] == "ok"]
