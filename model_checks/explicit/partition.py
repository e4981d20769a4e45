"""The worker side of ``parallel``: one partition of the visited set, its process.

A worker owns the canonical states ``s`` with ``owner(s) == k``: it interns them to local
ids, runs the safety predicates on them (``verdicts.Verdicts``, as the serial explorer),
expands them with the serial explorer's ``successor_fn``, runs the transition
predicates on their edges and batches the successors it does not own for their owners.
Labels travel as int codes (``label_code``). See ``parallel`` for the protocol.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import queue
import traceback
from array import array
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from model_checks.explicit.explore import EdgePred, Label, successor_fn
from model_checks.explicit.verdicts import Verdicts, key_of, state_preds
from spec.actions import ACTIONS
from spec.common import Mutants
from spec.config import Config
from spec.state import World, canonical
from spec.steps import check_step, step_plain

NAMES = tuple(ACTIONS)  # label codes: ((arg * 8 + slot) * 256 + the action's index)
_ACT = {n: k for k, n in enumerate(NAMES)}


def label_code(lb: Label) -> int:
    return (lb[2] * 8 + lb[1]) * 256 + _ACT[lb[0]]


def label_of(code: int) -> Label:
    rest, act = divmod(code, 256)
    arg, i = divmod(rest, 8)
    return (NAMES[act], i, arg)


def owner(w: World, workers: int) -> int:
    """The worker that owns (interns, checks and expands) canonical state ``w``."""
    return hash(w) % workers


class _Part:
    """One worker's partition of the visited set and of the edges into it."""

    def __init__(
        self,
        k: int,
        n: int,
        c: Config,
        mutants: Mutants,
        symmetry: bool,
        stop_on: str | None,
        edge_props: Sequence[tuple[str, EdgePred]],
    ) -> None:
        self.k, self.n, self.c, self.stop_on = k, n, c, stop_on
        self.successors = successor_fn(c, mutants)
        self.canon = canonical if symmetry and c.n_reqs > 1 else None
        self.edge_props = tuple(edge_props)
        self.plan = Verdicts(c, state_preds(c)).plan
        self.index: dict[World, int] = {}
        self.states: list[World] = []
        self.outdeg = array("q")
        # the edges into this partition, by the source's worker: flat 4-tuples of the
        # source's local id, its position among the source's successors, the label code
        # and the target's local id here
        self.into: list[array[int]] = [array("q") for _ in range(n)]
        # violations found at the first level each property is violated at (by worker):
        # states (local ids), steps and edge properties ((source local id, position))
        self.sv: dict[str, list[int]] = {}
        self.tv: dict[str, list[tuple[int, int]]] = {}
        self.ev: dict[str, list[tuple[int, int]]] = {}
        self.level_of: dict[str, int] = {}  # "s:"/"t:"/"e:" + pid -> its first level
        self.skip: set[str] = set()  # properties violated by a state of an earlier level
        self.level = 0
        self.stopped = False
        self.sent: list[dict[World, int]] = [{} for _ in range(n)]  # per owner: index
        self.got: list[list[int]] = [[] for _ in range(n)]  # per sender: index -> local id

    def _note(self, kind: str, pid: str, found: dict[str, Any], item: Any) -> None:
        key = kind + pid
        lv = self.level_of.setdefault(key, self.level)
        if lv == self.level:
            found.setdefault(pid, []).append(item)
            if pid == self.stop_on or self.stop_on == "*":
                self.stopped = True

    def intern(self, s: World) -> int:
        tid = self.index.get(s)
        if tid is None:
            tid = len(self.states)
            self.index[s] = tid
            self.states.append(s)
            skip = self.skip
            for pid, pred, verdict in self.plan(key_of(s)):
                if pid in skip:
                    continue
                if not (pred(s, self.c) if verdict is None else verdict):
                    self._note("s:", pid, self.sv, tid)
        return tid

    def expand(self, lo: int, hi: int) -> list[tuple[list[World], array[int]]]:
        """Expand local states ``lo..hi-1``; return the batch for each peer."""
        n, k, c, canon = self.n, self.k, self.c, self.canon
        batches: list[tuple[list[World], array[int]]] = [([], array("q")) for _ in range(n)]
        states, sent, intern = self.states, self.sent, self.intern
        own, outdeg, successors = self.into[k], self.outdeg, self.successors
        for j in range(lo, hi):
            w = states[j]
            out = successors(w)
            outdeg.append(len(out))
            for seq, (name, i, arg, s0) in enumerate(out):
                if not step_plain(w, name, i, arg, s0, c):
                    for pid in check_step(w, name, i, arg, s0, c):
                        self._note("t:", pid, self.tv, (j, seq))
                for pid, epred in self.edge_props:
                    if not epred(w, name, i, arg, s0, c):
                        self._note("e:", pid, self.ev, (j, seq))
                s = s0 if canon is None else canon(s0)
                lab = (arg * 8 + i) * 256 + _ACT[name]
                o = hash(s) % n
                if o == k:
                    own.extend((j, seq, lab, intern(s)))
                    continue
                to = sent[o]
                idx = to.get(s)
                if idx is None:
                    idx = to[s] = len(to)
                    batches[o][0].append(s)
                batches[o][1].extend((j, seq, lab, idx))
        return batches

    def receive(self, sender: int, news: list[World], edges: array[int]) -> None:
        got, intern = self.got[sender], self.intern
        for s in news:
            got.append(intern(s))
        into = self.into[sender]
        into.extend(edges)
        base = len(into) - len(edges)
        into[base + 3 :: 4] = array("q", [got[x] for x in edges[3::4]])

    def out_edges(self, owner: int, edges: array[int]) -> None:
        """Place the edges of this worker's states that ``owner`` holds (flat 4-tuples as
        in ``into``) at their slots: ``to`` (target key: local id * n + owner), ``lab``."""
        off, to, lab, n = self.off, self.to, self.lab, self.n
        for x in range(0, len(edges), 4):
            p = off[edges[x]] + edges[x + 1]
            to[p] = edges[x + 3] * n + owner
            lab[p] = edges[x + 2]

    def result(self, peers: list[array[int]]) -> dict[str, Any]:
        """What the coordinator replays: states, and per expanded state its out-edges in
        successor order (from ``off[j]``: target keys ``to``, label codes ``lab``)."""
        self.off = array("q", accumulate(self.outdeg, initial=0))
        self.to = array("q", bytes(8 * self.off[-1]))
        self.lab = array("q", bytes(8 * self.off[-1]))
        for o, edges in enumerate(peers):
            self.out_edges(o, self.into[o] if o == self.k else edges)
        return {
            "states": self.states,
            "off": self.off,
            "to": self.to,
            "lab": self.lab,
            "sv": self.sv,
            "tv": self.tv,
            "ev": self.ev,
        }


def run_worker(
    k: int, n: int, args: tuple[Any, ...], inbox: list[Any], ctrl: Any, report: Any
) -> None:
    """A worker process: expand its frontier per level when told, until told to finish."""
    gc.disable()  # the partition is acyclic tuples: the collector would only rescan them
    try:
        part = _Part(k, n, *args)
        c, symmetry = args[0], args[2]
        init = canonical(c.initial()) if symmetry else c.initial()
        lo = 0
        if owner(init, n) == k:
            part.intern(init)
        report.put(("level", k, len(part.states), part.stopped))
        while True:
            cmd = ctrl.get()
            if cmd == "finish":  # send each peer the edges of its states held here
                for o in range(n):
                    if o != k:
                        inbox[o].put((k, part.into[o]))
                peers = [part.into[k]] * n
                for _ in range(n - 1):
                    sender, edges = inbox[k].get()
                    peers[sender] = edges
                report.put(("result", k, part.result(peers)))
                return
            part.level += 1
            part.skip = {key[2:] for key in part.level_of if key[0] == "s"}
            hi = len(part.states)
            batches = part.expand(lo, hi)
            for o in range(n):
                if o != k:
                    inbox[o].put((k, batches[o][0], batches[o][1]))
            for _ in range(n - 1):
                sender, news, edges = inbox[k].get()
                part.receive(sender, news, edges)
            lo = hi
            report.put(("level", k, len(part.states) - hi, part.stopped))
    except BaseException:  # the coordinator raises it (a worker has no terminal)
        report.put(("error", k, traceback.format_exc()))


def wait_for(report: Any, procs: list[Any]) -> tuple[Any, ...]:
    while True:
        try:
            msg: tuple[Any, ...] = report.get(timeout=1.0)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"explorer worker died (exit code {dead[0].exitcode})") from None
            continue
        if msg[0] == "error":
            raise RuntimeError(f"explorer worker {msg[1]} failed:\n{msg[2]}")
        return msg


def start_method() -> str:
    """fork where the platform has it (no re-import: the workers start at once), else spawn."""
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


__all__ = ["NAMES", "label_code", "label_of", "owner", "run_worker", "start_method", "wait_for"]
