"""The lockstep harness: an implementation under test, stepped beside the spec (the oracle).

``Harness`` holds one implementation (built by an ``Adapter``) and the spec state it must
be in. ``step(name, args)`` asks the spec first (``spec.actions.apply`` on the correct
spec: no mutant, ever), then the implementation:

- the spec enables it: the implementation must accept, and ``abstract()`` must equal the
  spec's successor;
- the spec refuses it: the implementation must raise one of the adapter's refusal types,
  naming in ``prop`` the property the spec names (None for "not enabled"), and leave its
  ``snapshot()`` unchanged.

``check_state()`` then checks every spec safety property on the state, the implementation's
``check_integrity()`` and its data check (``data_problems()``: replicas whose bytes are
not the ground truth). Any failure raises ``Divergence``, whose message carries the whole
program in the trace format, so that ``replay_program`` (or ``kvown fuzz --replay``)
reruns it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn, Protocol

from model_checks.explicit.trace import describe, diff
from refimpl.testing.coverage import NONTRIVIAL, PREDS, Coverage
from refimpl.testing.ghost import Ghost
from spec.actions import apply, decode_args
from spec.common import Refused
from spec.config import Config
from spec.state import (
    World,
)

__all__ = [
    "NONTRIVIAL",
    "PREDS",
    "Adapter",
    "Coverage",
    "Divergence",
    "Harness",
    "Step",
    "Subject",
    "compact",
    "replay_program",
]

Step = dict[str, Any]
NO_MUTANTS: frozenset[str] = frozenset()


class Subject(Protocol):
    """One instance of the implementation under test."""

    def step(self, name: str, args: dict[str, Any]) -> None:
        """Apply a spec action given in the trace form of its arguments; raise a refusal."""

    def abstract(self) -> World:
        """The refinement map: the spec state this instance is in."""
        ...

    def check_integrity(self) -> None:
        """Raise if the implementation's own bookkeeping is inconsistent."""

    def data_problems(self) -> list[str]:
        """Replicas whose bytes differ from the ground truth (empty when all is well)."""
        ...

    def snapshot(self) -> object:
        """Everything a step may change, comparable with ``==`` (for "refused: unchanged")."""
        ...


class Adapter(Protocol):
    """Builds instances of an implementation; ``refusals`` are its typed refusal errors
    (each with a ``prop`` attribute: a property ID, or None for "not enabled")."""

    name: str
    refusals: tuple[type[BaseException], ...]

    def build(self, config: Config, mutants: frozenset[str], seed: int) -> Subject: ...

    def switches(self) -> dict[str, bool]:
        """Every bug switch the implementation knows, and whether it applies here."""
        ...


class Divergence(AssertionError):
    """The implementation left the spec. ``program`` replays it (``replay_program``)."""

    def __init__(
        self, message: str, program: list[Step], where: dict[str, Any], kind: str = ""
    ) -> None:
        super().__init__(message)
        self.program, self.where, self.kind = program, where, kind


# --------------------------------------------------------------------- the harness
def compact(w: World) -> str:
    """One line per state: every request, then the globals that are not at rest."""
    reqs = " | ".join(f"r{i}: {describe(r)}" for i, r in enumerate(w.reqs))
    extra = [f"faults={w.faults}"] if w.faults else []
    extra += [k for k, up in (("prefill down", w.p_up), ("decode down", w.d_up)) if not up]
    extra += [f"pfx={int(w.pfx)}/{w.pfx_ref}"] if w.pfx or w.pfx_ref else []
    return reqs + ("; " + ", ".join(extra) if extra else "")


class Harness:
    """One implementation instance in lockstep with the correct spec."""

    def __init__(
        self,
        adapter: Adapter,
        config: Config,
        mutants: frozenset[str] = NO_MUTANTS,
        seed: int = 0,
        coverage: Coverage | None = None,
    ) -> None:
        self.adapter, self.c, self.mutants, self.seed = adapter, config, frozenset(mutants), seed
        self.coverage = coverage
        self.program: list[Step] = []
        self.w = config.initial()  # the spec's state: the oracle
        self.impl = adapter.build(config, self.mutants, seed)
        make_ghost = getattr(self.impl, "ghost", None)  # the harness's content oracle
        self.ghost: Ghost | None = make_ghost() if make_ghost is not None else None
        self.abs = self.w
        self.check_refinement("the initial state")
        self.hot = coverage.visit(self.abs, config) if coverage is not None else []

    # ---------------------------------------------------------------- steps
    def verdict(self, name: str, i: int, arg: int) -> World | Refused:
        return apply(self.w, self.c, NO_MUTANTS, name, i, arg)

    def step(self, name: str, args: dict[str, Any]) -> str:
        """Take one step on both sides; returns "ok", "refused" or "refused:<prop>"."""
        i, arg = decode_args(name, args)
        want = self.verdict(name, i, arg)
        why = want.prop if isinstance(want, Refused) else None
        refused = not isinstance(want, World)
        expect = "ok" if not refused else "refused" + (f":{why}" if why else "")
        self.program.append({"action": name, "args": dict(args), "expect": expect})
        before = self.impl.snapshot() if refused else None
        try:
            self.impl.step(name, dict(args))
        except self.adapter.refusals as exc:
            prop = getattr(exc, "prop", None)
            if not refused:
                self.fail(
                    "refused an enabled step",
                    f"refused an action the spec enables: {type(exc).__name__}: {exc}",
                )
            if prop != why:
                self.fail(
                    "named another property",
                    f"refused naming {prop!r}, the spec names {why!r}: {exc}",
                )
            if self.impl.snapshot() != before:
                self.fail("changed on a refusal", "refused, but its state changed")
        except Exception as exc:  # an untyped error: a crash, not a refusal
            self.fail("crashed", f"raised {type(exc).__name__}: {exc}", exc)
        else:
            if not isinstance(want, World):
                reason = f"it would break {why}" if why else "it is not enabled"
                self.fail(
                    "accepted a refused step", f"accepted an action the spec refuses ({reason})"
                )
            if self.coverage is not None:
                self.coverage.took(self.w, name, i, arg)
            self.w = want
            if self.ghost is not None:
                self.ghost.observe(name, i, want)
        self.check_refinement(f"{name}")
        if self.coverage is not None:
            self.coverage.step(name, expect)
            self.hot = self.coverage.visit(self.abs, self.c) if not refused else self.hot
        return expect

    def probe(self, name: str, args: dict[str, Any], prop: str | None) -> None:
        """A step the spec refuses naming ``prop``: the implementation must refuse it the
        same way and change nothing. Kept out of the program unless it fails."""
        before = self.impl.snapshot()
        try:
            self.impl.step(name, dict(args))
        except self.adapter.refusals as exc:
            got = getattr(exc, "prop", None)
            if got == prop and self.impl.snapshot() == before:
                if self.coverage is not None:
                    self.coverage.step(name, "refused" + (f":{prop}" if prop else ""))
                return
            self._probed(name, args, prop)
            if got != prop:
                self.fail(
                    "named another property",
                    f"refused naming {got!r}, the spec names {prop!r}: {exc}",
                )
            self.fail("changed on a refusal", "refused, but its state changed")
        except Exception as exc:
            self._probed(name, args, prop)
            self.fail("crashed", f"raised {type(exc).__name__}: {exc}", exc)
        self._probed(name, args, prop)
        why = f"it would break {prop}" if prop else "it is not enabled"
        self.fail("accepted a refused step", f"accepted an action the spec refuses ({why})")

    def probe_all(self, probes: Sequence[tuple[str, dict[str, Any], str | None]]) -> None:
        """Steps the spec refuses (``probes.refusal_probes``): each must be refused naming
        the spec's property; the implementation must be unchanged after the whole round
        (one snapshot for the round: else the round's probes join the program)."""
        before = self.impl.snapshot()
        for name, args, prop in probes:
            try:
                self.impl.step(name, dict(args))
            except self.adapter.refusals as exc:
                got = getattr(exc, "prop", None)
                if got != prop:
                    self._probed(name, args, prop)
                    self.fail(
                        "named another property",
                        f"refused naming {got!r}, the spec names {prop!r}: {exc}",
                    )
                continue
            except Exception as exc:
                self._probed(name, args, prop)
                self.fail("crashed", f"raised {type(exc).__name__}: {exc}", exc)
            self._probed(name, args, prop)
            why = f"it would break {prop}" if prop else "it is not enabled"
            self.fail("accepted a refused step", f"accepted an action the spec refuses ({why})")
        if self.impl.snapshot() != before:
            for name, args, prop in probes:
                self._probed(name, args, prop)
            self.fail("changed on a refusal", "refused every probe, but its state changed")
        if self.coverage is not None:
            for name, _, prop in probes:
                self.coverage.step(name, "refused" + (f":{prop}" if prop else ""))

    def _probed(self, name: str, args: dict[str, Any], prop: str | None) -> None:
        expect = "refused" + (f":{prop}" if prop else "")
        self.program.append({"action": name, "args": dict(args), "expect": expect})

    # ---------------------------------------------------------------- checks
    def check_refinement(self, after: str) -> None:
        try:
            got = self.impl.abstract()
        except Exception as exc:
            self.fail("crashed", f"abstract() raised {type(exc).__name__}: {exc}", exc)
        if got != self.w:
            changes = "; ".join(diff(self.w, got)) if len(got.reqs) == len(self.w.reqs) else ""
            self.fail(
                "state differs",
                f"after {after}, abstract() is not the spec's state: spec -> impl {changes}",
            )
        self.abs = got

    def check_property(self, pid: str) -> None:
        pred = PREDS[pid]
        if not pred(self.abs, self.c):
            self.fail(f"violates {pid}", f"{pid} is violated on the implementation's state")

    def check_integrity(self) -> None:
        try:
            self.impl.check_integrity()
        except Exception as exc:
            self.fail("integrity", f"check_integrity(): {type(exc).__name__}: {exc}", exc)

    def check_data(self) -> None:
        bad = self.impl.data_problems()
        if bad:
            self.fail("bytes differ", f"replicas differ from the ground truth: {', '.join(bad)}")
        bad = self.ghost.problems(self.w) if self.ghost is not None else []
        if bad:
            self.fail("ghost differs", f"replicas differ from the harness's ghost: {bad}")

    def check_state(self) -> None:
        for pid in PREDS:
            self.check_property(pid)
        self.check_integrity()
        self.check_data()

    # ---------------------------------------------------------------- failure
    def where(self) -> dict[str, Any]:
        return {
            "impl": self.adapter.name,
            "config": self.c.name,
            "mutants": sorted(self.mutants),
            "seed": self.seed,
        }

    def fail(self, kind: str, what: str, cause: BaseException | None = None) -> NoReturn:
        """Raise ``Divergence``: ``kind`` says which check caught it, ``what`` the detail."""
        k = len(self.program)
        at = f"step {k} {self.program[-1]['action']}" if k else "init"
        lines = [
            f"{self.adapter.name} diverges from the spec at {at}: {what}",
            f"  spec state: {compact(self.w)}",
            "replay: refimpl.testing.replay_program(adapter, program, **where) with",
            f"  where = {json.dumps(self.where())}",
            "  program = [",
            *(f"    {json.dumps(s)}," for s in self.program),
            "  ]",
        ]
        raise Divergence("\n".join(lines), list(self.program), self.where(), kind) from cause


def replay_program(
    adapter: Adapter,
    program: Sequence[Step],
    *,
    config: str | Config,
    mutants: Sequence[str] = (),
    seed: int = 0,
    impl: str | None = None,
) -> Harness:
    """Rerun a printed program with every check; raises the same ``Divergence``.

    ``impl`` (the adapter's name, as printed in ``where``) is accepted and ignored.
    """
    from refimpl.testing.worlds import get_world

    c = get_world(config) if isinstance(config, str) else config
    h = Harness(adapter, c, frozenset(mutants), seed)
    h.check_state()
    for st in program:
        h.step(st["action"], st.get("args", {}))
        h.check_state()
    return h
