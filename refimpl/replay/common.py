"""Shared machinery of the reproduction scripts (``repro/<name>.py``).

A script is a ``Repro``: it gets the model check's minimal counterexample for a mutant,
replays it on the reference engine with the bug switched on (every step checked against
the mutant spec: ``abstract()`` equals the spec's successor), measures the concrete
damage, then replays it with the bug off and shows the typed refusal, or the survival
with nothing lost. Every claim goes through ``expect``; the script behaves as documented
when all of them hold.

Damage is measured on real bytes and allocators: foreign or stale bytes in a block
(``torch.equal`` against the ground truth), a leaked block (allocator counts), a request
that never ends (``wait``: a bounded run of the engine's own enabled steps), wrong logits.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from model_checks.explicit.runner import check_mutant
from refimpl.engine import Engine
from spec.mutants import get_mutant
from spec.properties import LIVENESS
from spec.state import STATUS_NAMES

Step = dict[str, Any]
NEXT = "next-request"  # a request outside the model's config that reuses freed blocks
Out = Callable[[str], None]

# The order in which ``wait`` picks among enabled steps: deliveries first, then steps that
# finish work; timeouts only when nothing else is enabled. Steps that only generate more
# work (decode steps, offload, preemption, eviction) are never taken.
_PRIORITY = tuple(
    """DecodeValidate DecodeCommit DecodeFinish PrefillSendChunk PrefillFinish
    PrefillOffloadCopy PrefillOffloadCommit PrefillReloadBegin PrefillReloadCopy
    PrefillReloadCommit PrefillQuiesce DecodeAbort PrefillRun PrefillFreeze PrefillAdmit""".split()
)
_NEVER = frozenset(
    "PrefillDecodeStep DecodeStep PrefillPreempt PrefillOffloadBegin DecodeEvictPrefix".split()
)


def step(action: str, **args: Any) -> Step:
    return {"action": action, "args": args}


def msg(action: str, kind: str, epoch: int, idx: int = 0, req: int = 0) -> Step:
    """A message action: ``kind`` of attempt ``epoch`` with index ``idx``."""
    return step(action, req=req, msg=kind, epoch=epoch, idx=idx)


def fmt_step(st: Step) -> str:
    a = st.get("args", {})
    if "msg" in a:
        return f"{st['action']}(r{a['req']}, {a['msg']} e{a['epoch']} #{a['idx']})"
    if "req" in a:
        return f"{st['action']}(r{a['req']})"
    if "worker" in a:
        return f"{st['action']}({a['worker']})"
    return f"{st['action']}()"


_CEX: dict[str, tuple[str, str, tuple[Step, ...]]] = {}


def _check(mutant: str) -> tuple[str, str, tuple[Step, ...]]:
    res = check_mutant(mutant)
    if not res.caught or res.trace is None:
        raise RuntimeError(f"the model check does not catch mutant {mutant!r}: {res.violated}")
    return res.config, res.expected, tuple(res.trace.steps)


def counterexample(mutant: str) -> tuple[str, str, tuple[Step, ...]]:
    """(config, property, steps) of the shortest counterexample the model check finds."""
    if mutant not in _CEX:
        _CEX[mutant] = _check(mutant)
    return _CEX[mutant]


def prefetch(mutants: Iterable[str]) -> None:
    """Run the model checks of several mutants at once in forked worker processes and
    keep their counterexamples (a failed one is left for the script to redo and report).
    The liveness checks explore whole graphs, so they go first."""
    todo = sorted({m for m in mutants if m not in _CEX}, key=lambda m: (not _liveness(m), m))
    workers = min(len(todo), os.cpu_count() or 1)
    if workers < 2 or "fork" not in mp.get_all_start_methods():
        return
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
        futures = {m: pool.submit(_check, m) for m in todo}
        for m, fut in futures.items():
            if fut.exception() is None:
                _CEX[m] = fut.result()


def _liveness(mutant: str) -> bool:
    return get_mutant(mutant).expected in {p.id for p in LIVENESS}


@dataclass
class Waited:
    """What a bounded wait saw: the steps it took and whether everything ended."""

    steps: list[str]
    ended: bool  # quiescent: every request ended, no block held, nothing in flight
    stuck: str  # "" or why it stopped short
    damaged: list[str] = field(default_factory=list)  # replicas off the truth, per step


def held_blocks(e: Engine) -> dict[str, int]:
    """Blocks each pool holds, the cached prefix excepted."""
    return {
        "prefill": e.P.alloc.capacity - e.P.alloc.num_free,
        "host": e.H.alloc.capacity - e.H.alloc.num_free,
        "decode": e.D.alloc.capacity - e.D.alloc.num_free - len(e.prefix_blocks),
    }


def statuses(e: Engine) -> str:
    return ", ".join(f"r{i} {STATUS_NAMES[r.status]}" for i, r in enumerate(e.req))


def diff_elems(a: torch.Tensor | None, b: torch.Tensor | None) -> int:
    """Elements that differ (all of them when a replica is missing)."""
    if a is None or b is None:
        return -1
    return int((a != b).sum())


@dataclass
class Result:
    name: str
    property: str
    damage: str
    prevented: str
    ok: bool
    problems: list[str]
    lines: list[str]

    def skipped(self) -> bool:
        """It did not run here: its damage and prevention both say ``n/a ...`` (e.g. a
        CUDA-stream failure on CPU): neither an ok nor a failure."""
        return self.ok and self.damage == self.prevented and self.damage.startswith("n/a")

    def record(self) -> dict[str, object]:
        return {
            "name": self.name,
            "property": self.property,
            "damage": self.damage,
            "prevented": self.prevented,
            "ok": self.ok,
        }


def guarded(name: str, prop: str, run: Callable[[Out | None], Result], out: Out | None) -> Result:
    """Run a script; a crash is a reproduction that did not behave as documented."""
    try:
        return run(out)
    except Exception as exc:  # reported as a failed reproduction, not raised
        text = f"crashed: {type(exc).__name__}: {exc}"
        if out is not None:
            out(text)
        return Result(name, prop, "", "", False, [text], [text])
