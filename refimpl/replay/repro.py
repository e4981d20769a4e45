"""``Repro``: one reproduction script's narration, checks, and replays on the engine
(with the bug switched on, then off). See ``refimpl.replay`` for the whole story."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from model_checks.explicit.trace import TraceError, replay
from refimpl.engine import Engine
from refimpl.engine.data import gen
from refimpl.errors import OwnershipError
from refimpl.rankpools import RankPools
from refimpl.replay.common import (
    _NEVER,
    _PRIORITY,
    NEXT,
    Out,
    Result,
    Step,
    Waited,
    counterexample,
    fmt_step,
    held_blocks,
    statuses,
    step,
)
from spec.actions import ACTIONS, apply, decode_args, encode_args, successors
from spec.config import Config, get_config
from spec.properties import quiescent_terminal, violated_safety
from spec.state import World


class Repro:
    """One reproduction: narration, checks, and the replays on the engine."""

    def __init__(self, name: str, prop: str, mutant: str | None, out: Out | None) -> None:
        self.name, self.prop, self.mutant = name, prop, mutant
        self.out = out
        self.lines: list[str] = []
        self.problems: list[str] = []
        self.damage = ""
        self.prevented = ""
        self.config: Config | None = None
        self.steps: list[Step] = []

    # ------------------------------------------------------------ narration and checks
    def say(self, text: str = "") -> None:
        self.lines.append(text)
        if self.out is not None:
            self.out(text)

    def expect(self, cond: bool, what: str) -> bool:
        self.say(f"    {'ok  ' if cond else 'FAIL'} {what}")
        if not cond:
            self.problems.append(what)
        return cond

    def say_steps(self, label: str, steps: list[str]) -> None:
        """``label``, then the steps, wrapped."""
        line = f"    {label}:"
        for k, text in enumerate(steps):
            piece = f" {text}" + ("," if k < len(steps) - 1 else "")
            if len(line) + len(piece) > 96:
                self.say(line)
                line = "       "
            line += piece
        self.say(line if steps else line + " (none)")

    def result(self) -> Result:
        ok = not self.problems
        self.say(f"damage:    {self.damage or '(none shown)'}")
        self.say(f"prevented: {self.prevented or '(not shown)'}")
        na = self.damage == self.prevented and self.damage.startswith("n/a")  # Result.skipped()
        verdict = "behaves as documented" if ok else "NOT as documented"
        if ok and na:
            verdict = f"skipped, not run here ({self.damage})"
        self.say("verdict:   " + verdict)
        if not self.damage or not self.prevented:
            ok = False
            self.problems.append("damage or prevention not recorded")
        return Result(
            self.name, self.prop, self.damage, self.prevented, ok, self.problems, self.lines
        )

    # ------------------------------------------------------------ the model check
    def model_check(self) -> tuple[Config, list[Step]]:
        """Run the model check on the mutant; print its minimal counterexample."""
        assert self.mutant is not None
        cname, expected, steps = counterexample(self.mutant)
        self.config, self.steps = get_config(cname), list(steps)
        self.say(f"model check: mutant {self.mutant} on config {cname}")
        self.expect(expected == self.prop, f"the mutant breaks {self.prop} (spec: {expected})")
        self.say(f"  minimal counterexample, {len(steps)} steps:")
        for k, st in enumerate(steps, 1):
            self.say(f"    {k:2d}. {fmt_step(st)}")
        return self.config, self.steps

    # ------------------------------------------------------------ replays
    def engine(self, bug: bool) -> Engine:
        assert self.config is not None
        return Engine(self.config, mutants=frozenset({self.mutant} if bug and self.mutant else ()))

    def apply(self, e: Engine, st: Step) -> None:
        """One step on the engine and on the spec (same mutants); they must agree."""
        c = e.config
        want = replay_one(e.abstract(), c, e.m, st)
        e.step(st["action"], st.get("args", {}))
        if e.abstract() != want:
            self.expect(False, f"engine and spec agree after {fmt_step(st)}")

    def run_steps(self, e: Engine, steps: Iterable[Step]) -> None:
        for st in steps:
            self.apply(e, st)

    def replay_with_bug(self, safety: bool = True) -> Engine:
        """The counterexample on the engine with the bug on; it must follow the mutant spec
        step by step and (for a safety property) end in a state that breaks it."""
        assert self.config is not None
        self.say(f"with the bug ({self.mutant}) on the reference engine:")
        c, m = self.config, frozenset({self.mutant} if self.mutant else ())
        worlds = replay(c, m, self.steps)
        e = self.engine(bug=True)
        for k, st in enumerate(self.steps):
            e.step(st["action"], st.get("args", {}))
            if e.abstract() != worlds[k + 1]:
                self.expect(False, f"engine follows the mutant spec at step {k + 1}")
                break
        else:
            self.expect(True, f"the engine follows the mutant spec through all {len(worlds) - 1}")
        if safety:
            broken = violated_safety(e.abstract(), c)
            self.expect(self.prop in broken, f"the engine's state breaks {self.prop} {broken}")
        return e

    def replay_without_bug(self, refused_by: str | None) -> tuple[Engine, OwnershipError | None]:
        """The counterexample on the correct engine. ``refused_by``: the property the
        correct protocol's refusal names (the engine must refuse the spec's first forbidden
        step with it and change nothing), or None when every step is legal there (the
        correct protocol survives: no property broken, integrity and bytes hold)."""
        assert self.config is not None
        c = self.config
        self.say("without the bug (the correct engine):")
        try:
            replay(c, frozenset(), self.steps)
            first, prop = len(self.steps), None
        except TraceError as err:
            first, prop = err.index, err.prop
        e = self.engine(bug=False)
        self.run_steps(e, self.steps[:first])
        if first == len(self.steps):
            self.expect(refused_by is None, "every step of the counterexample is legal")
            self.expect(violated_safety(e.abstract(), c) == [], "no property is broken")
            self.expect_sound(e)
            return e, None
        st = self.steps[first]
        before = e.fingerprint()
        try:
            e.step(st["action"], st.get("args", {}))
        except OwnershipError as exc:
            self.expect(
                exc.prop == prop == refused_by,
                f"step {first + 1} {fmt_step(st)} refused: {type(exc).__name__}({exc})",
            )
            self.expect(e.fingerprint() == before, "the refusal changed nothing")
            self.expect_sound(e)
            return e, exc
        self.expect(False, f"step {first + 1} {fmt_step(st)} is refused ({prop})")
        return e, None

    def expect_sound(self, e: Engine) -> None:
        try:
            e.check_integrity()
            integrity = ""
        except OwnershipError as exc:
            integrity = str(exc)
        self.expect(
            not integrity, "allocators and records agree" + (f": {integrity}" if integrity else "")
        )
        self.expect(e.damaged() == [], f"every live replica equals the truth {e.damaged()}")

    # ------------------------------------------------------------ bounded waits
    def wait(
        self,
        e: Engine,
        *,
        actors: tuple[str, ...] = ("P", "D"),
        timeouts: bool = True,
        max_steps: int = 60,
    ) -> Waited:
        """Step the engine with its own enabled steps (no faults, no cancel) until every
        request has ended with nothing held, or ``max_steps``. ``actors`` limits who moves
        (("D",) models a stalled or lost peer); timeouts fire only when nothing else can."""
        c, taken, damaged = e.config, list[str](), list[str]()
        for _ in range(max_steps):
            w = e.abstract()
            if quiescent_terminal(w, c):
                return Waited(taken, True, "", damaged)
            pick = choose(w, c, e.m, actors, timeouts)
            if pick is None:
                return Waited(
                    taken, False, f"stuck: nothing enabled after {len(taken)} steps", damaged
                )
            st, want = pick
            e.step(st["action"], st["args"])
            taken.append(fmt_step(st))
            if e.abstract() != want:
                self.expect(False, f"engine and spec agree after {fmt_step(st)}")
            if e.damaged():
                damaged.append(f"{e.damaged()} after {fmt_step(st)}")
        return Waited(taken, quiescent_terminal(e.abstract(), c), f"{max_steps} steps", damaged)

    def survives(self, e: Engine, **kw: Any) -> Waited:
        """The correct engine runs on to the end: every request ends, nothing is held or
        damaged on the way, integrity holds."""
        res = self.wait(e, **kw)
        self.say_steps("the correct engine runs on", res.steps)
        self.expect(
            not res.damaged, "no damage on the way" + "".join(f"; {p}" for p in res.damaged)
        )
        self.expect(
            res.ended,
            f"every request ends, nothing held, in {len(res.steps)} steps ({statuses(e)}; "
            f"held {held_blocks(e)})",
        )
        self.expect_sound(e)
        return res


def replay_one(w: World, c: Config, m: frozenset[str], st: Step) -> World:
    i, arg = decode_args(st["action"], st.get("args", {}))
    nxt = apply(w, c, m, st["action"], i, arg)
    if not isinstance(nxt, World):
        raise TraceError(0, st, nxt.prop, f"the spec refuses {fmt_step(st)}")
    return nxt


def choose(
    w: World, c: Config, m: frozenset[str], actors: tuple[str, ...], timeouts: bool
) -> tuple[Step, World] | None:
    best: tuple[int, Step, World] | None = None
    for name, i, arg, s in successors(w, c, m):
        a = ACTIONS[name]
        if a.actor not in actors or a.kind in ("fault", "client") or name in _NEVER:
            continue
        if a.kind == "recv":
            rank = 0
        elif a.kind == "timeout":  # decode's first: its Nack lets the source retry
            if not timeouts:
                continue
            rank = 100 if a.actor == "D" else 101
        else:
            rank = 1 + _PRIORITY.index(name) if name in _PRIORITY else 50
        if best is None or rank < best[0]:
            best = (rank, {"action": name, "args": encode_args(name, i, arg)}, s)
    return None if best is None else (best[1], best[2])


def next_request_writes(e: Engine, pools: RankPools, n: int) -> tuple[list[int], torch.Tensor]:
    """Another request (outside the model's config) asks the same allocator for ``n``
    blocks and writes its own KV there: what a free block is for. Returns the blocks it
    got and the bytes it wrote ([n, layers, 2, H, bs, D])."""
    blocks = pools.alloc.allocate(NEXT, n)
    kv = gen((n, *e.block_shape_full), e.dtype, e.seed, NEXT)
    pools.write_full(NEXT, blocks, kv)
    return blocks, kv


def late_step_damage(r: Repro, freed: str, prevented: str) -> None:
    """The async-step repros' shared path: with the bug, r0's blocks go back to the pool
    under its dispatched step (``freed`` says how), the next request is admitted into
    them and writes its KV, and the step's completion overwrites it; without it, the
    free waits for the step (refused with NoReuseUnderIO) and ``prevented`` says what
    follows. Fills ``r.damage`` and ``r.prevented``."""
    e = r.engine(bug=True)
    r.run_steps(e, r.steps[:-1])
    src = e.P.alloc.blocks_of("r0")  # the block table the dispatched step writes through
    e = r.replay_with_bug()
    mine, kv = next_request_writes(e, e.P, len(src))
    reused = [b for b in src if b in mine]
    r.expect(bool(reused), f"the next request got block(s) {reused} that r0's step still writes")
    r.apply(e, step("PrefillStepComplete", req=0))
    now = e.P.gather(mine)
    r.expect(not torch.equal(now, kv), "the step's late write overwrote the next request's KV")
    r.damage = (
        f"r0's blocks {list(src)} were {freed} under its dispatched step; the next request "
        f"wrote block(s) {reused}, and the step's completion overwrote them with r0's KV"
    )
    e, err = r.replay_without_bug("NoReuseUnderIO")
    waited = r.survives(e)
    r.prevented = (
        f"the {'free' if freed == 'freed' else 'preemption'} under the step is refused"
        f" ({type(err).__name__}, NoReuseUnderIO); {prevented}"
        f" ({len(waited.steps)} steps, nothing held)"
    )


def late_write_quarantined(r: Repro, late: Step, attempt: str) -> None:
    """The correct decode's half of the late-write repros: the ``attempt``'s blocks stay
    quarantined (two, not free), the next request is refused them (CapacityRefcount),
    the ``late`` write lands in quarantine harming nobody, and the blocks are freed once
    prefill quiesces. Fills ``r.prevented``."""
    e, _ = r.replay_without_bug(None)
    q = e.D.alloc.quarantined("r0")
    r.expect(len(q) == 2, f"the {attempt}'s blocks {q} are quarantined, not free")
    try:
        next_request_writes(e, e.D, 1)
        r.expect(False, "a quarantined block cannot be reallocated")
    except OwnershipError as exc:
        r.expect(exc.prop == "CapacityRefcount", f"the next request is refused: {exc}")
    r.apply(e, late)
    r.expect(e.damaged() == [], "r0's late write lands in quarantine, harming nobody")
    waited = r.survives(e)
    r.prevented = (
        f"the {attempt}'s blocks {list(q)} stay quarantined (not reallocatable) until "
        f"prefill, its writes done, says Quiesced; then freed ({len(waited.steps)} steps, "
        "nothing held)"
    )
