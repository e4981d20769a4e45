"""The router: starts the workers, feeds the workload, injects the faults, watches for
dead peers, restarts them, collects every request's outcome, then checks the run.

It hosts the control store (a TCPStore), starts one process per prefill TP rank and one
per decode worker (the data plane is one gloo group per prefill rank and decode worker
pair: ``pairs.py``), and then loops, never blocking without a deadline:

- admits requests (to every prefill rank, naming a live decode worker, round robin) up
  to ``max_inflight`` at a time; fires the planned kill (SIGKILL by pid);
- declares a worker dead when its process has exited or its heartbeat has not moved
  for ``timeout_s`` (times ``control.load_factor()`` on a loaded machine); it reads
  what the dead process had sent, logs ``EnvCrash`` after everything the crashed worker
  logged (see ``on_death``), gives the attempts it held
  their fate, and restarts it (``restarts`` in all) as a new incarnation: a new process
  (and, for the prefill worker, its surviving ranks) with empty pools, the old
  incarnation's mailboxes and pair groups fenced (``EnvRestart``);
- an attempt that failed (the spec's fail closed: a crash, a timeout, decode's refusal)
  is retried as a new attempt ``rid~k`` (up to ``retries``) on a decode worker that is
  up: the retry recomputes the prefill (the spec's "the router may retry it");
- ends when every request has an outcome, or at ``deadline_s`` (the rest are "lost").
Then ``finish`` measures the raw baseline, shuts the workers down and checks the run."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

from refimpl.cluster import eventlog
from refimpl.cluster.control import Channel, Message, heartbeats, serve_store
from refimpl.cluster.faults import DROPPABLE, CancelPlan, Kill, parse_kill
from refimpl.cluster.procs import Boot, Procs, WorkerStartError, nominal_s
from refimpl.cluster.report import ClusterReport
from refimpl.cluster.worker import (
    ROUTER,
    WorkerArgs,
    decode_names,
    decode_procs,
    parse_proc,
    prefill_names,
    proc_name,
    worker_of,
)
from refimpl.cluster.workload import CLUSTER_MUTANTS, ClusterConfig, Request, make_requests

HOST = "127.0.0.1"
PREFILL = "prefill"  # the prefill worker: every prefill rank together


Progress = Callable[[int, int, dict[str, int]], None]


class Router:
    def __init__(self, cfg: ClusterConfig, progress: Progress | None = None) -> None:
        self.cfg, self.progress = cfg, progress
        self.t0 = time.time()
        self.dir = eventlog.fresh_log_dir(cfg.log_dir)  # deletes nothing of the user's
        self.reqs = make_requests(cfg.requests, cfg.model, seed=cfg.seed, steps=cfg.steps)
        self.by_id = {r.rid: r for r in self.reqs}
        self.kill: Kill | None = parse_kill(
            cfg.kill, cfg.prefill_tp, cfg.decode_workers, cfg.seed, cfg.decode_tp
        )
        self.cancels = CancelPlan(cfg.cancel_p)
        self.prefills = prefill_names(cfg.prefill_tp)
        self.decodes = decode_names(cfg.decode_workers)  # the decode workers (their leaders)
        self.workers = self.prefills + decode_procs(cfg.decode_workers, cfg.decode_tp)
        self.rep = ClusterReport(cfg.requests, backend=cfg.backend, log_dir=str(self.dir))
        self.log = eventlog.ProcLog(self.dir, ROUTER, self.t0)
        self.store = serve_store(HOST, cfg.timeout_s)
        self.ch = Channel(self.store, ROUTER, tuple(self.workers), self.log.clock)
        self.procs = Procs()
        self.boot = Boot(nominal_s(len(self.workers)))  # the starts not heard from yet
        self.backlog: list[Message] = []
        self.queue: list[tuple[str, Request]] = [(r.rid, r) for r in self.reqs]  # attempts
        self.base: dict[str, str] = {}  # attempt -> request
        self.tries: dict[str, int] = {r.rid: 0 for r in self.reqs}
        self.admitted: dict[str, str] = {}  # attempt -> its decode worker
        self.committed: dict[str, str] = {}  # attempt -> the decode worker that holds it
        self.done: set[str] = set()  # attempts with their word
        self.inc: dict[str, int] = {w: 0 for w in self.workers}
        self.down: set[str] = set()  # PREFILL and decode names: crashed, not back yet
        self.booting: dict[str, float] = {}  # restarted process -> started at (no hello yet)
        self.restarting: dict[str, tuple[list[str], list[str], int]] = {}  # group -> ...
        self.rr = 0
        self.restarts = 0
        self.stats: dict[str, dict[str, float]] = {}
        self.beats: dict[str, tuple[int, float]] = {}
        self.byes: dict[str, Message] = {}
        self.finished_tokens: dict[str, tuple[int, ...]] = {}

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> ClusterReport:
        from refimpl.cluster.finish import finish

        t_start = time.monotonic()
        try:
            self.start()
            self.serve()
            finish(self)
        finally:
            self.procs.close()
            self.log.close()
        self.rep.wall_s = time.monotonic() - t_start
        from refimpl.cluster.finish import check

        check(self)
        return self.rep

    def worker_args(self, name: str, incs: dict[str, int], lc0: int = 0) -> WorkerArgs:
        c = self.cfg
        faults = {"delay_p": c.delay_p, "delay_s": c.delay_s, "drop_p": c.drop_p,
                  "droppable": sorted(DROPPABLE), "seed": c.seed}  # fmt: skip
        role, rank, drank = parse_proc(name)
        return WorkerArgs(
            role, rank, c.prefill_tp, c.decode_tp, HOST, self.store.port, c.backend,
            str(self.dir), self.t0, c.timeout_s, asdict(c.model), c.capacity,
            c.timeout_s * (2 * c.max_inflight + 1), c.mutant, faults, c.decode_workers,
            incs[name], incs, lc0, drank, c.frames,
        )  # fmt: skip

    def start(self) -> None:
        """Start every worker and wait for each one's hello, judged by its pid (``procs.Boot``):
        one that died or hung is named at once, a slow one on a loaded machine is waited
        for while it makes progress, up to ``procs.HELLO_MAX_S``."""
        for w in self.workers:
            self.procs.start(self.worker_args(w, self.inc))
            self.boot.add(w, time.monotonic())
        while waiting := self.boot.waiting():
            for m in self.ch.poll():
                if m["kind"] == "hello" and m["src"] in waiting:
                    self.boot.forget(m["src"])
                else:
                    self.backlog.append(m)
            now = time.monotonic()
            left = sorted(self.boot.waiting())
            why = [self.boot.verdict(w, self.procs.procs[w], now) for w in left]
            if any(why):
                names = "; ".join(y for y in why if y)
                raise WorkerStartError(f"workers did not start: {names}; see {self.dir}/*.out")
            time.sleep(0.01)

    def await_kind(self, kind: str, who: set[str], timeout_s: float) -> set[str]:
        """Wait (bounded) for ``kind`` from each of ``who``; other messages are kept."""
        got: set[str] = set()
        deadline = time.monotonic() + timeout_s
        last = False
        while got < who and time.monotonic() < deadline and not last:
            last = all(not self.procs.alive(w) for w in who - got)  # one more poll, then stop
            for m in self.ch.poll():
                if m["kind"] == kind and m["src"] in who:
                    got.add(m["src"])
                    if kind == "bye":
                        self.byes[m["src"]] = m
                else:
                    self.backlog.append(m)
            time.sleep(0.002)
        return got

    # ------------------------------------------------------------------ the loop
    def serve(self) -> None:
        c = self.cfg
        deadline = time.monotonic() + c.deadline_s
        while len(self.rep.outcomes) < c.requests and time.monotonic() < deadline:
            now = time.monotonic()
            inflight = sum(1 for a in self.admitted if a not in self.done)
            while self.queue and inflight < c.max_inflight and self.can_admit():
                self.admit(*self.queue.pop(0))
                inflight += 1
            if not self.can_admit() and not self.booting and not self.can_restart():
                for _aid, r in self.queue:
                    self.end(r.rid, "failed", "not admitted: a worker is down, no restart left")
                self.queue = []
            msgs, self.backlog = self.backlog + self.ch.poll(), []
            for m in msgs:
                self.on_message(m)
            self.maybe_kill()
            self.watch(now)
            if self.progress is not None:
                self.progress(len(self.rep.outcomes), c.requests, self.rep.counts())
            if not msgs:
                time.sleep(0.002)
        if len(self.rep.outcomes) < c.requests:  # the deadline: leave evidence behind
            self.procs.dump_stacks()

    def live_decodes(self) -> list[str]:
        up = [d for d in self.decodes if d not in self.down]
        return [d for d in up if not any(n in self.booting for n in self.members(d))]

    def can_admit(self) -> bool:
        return PREFILL not in self.down and bool(self.live_decodes()) and not self.booting

    def can_restart(self) -> bool:
        return self.restarts < self.cfg.restarts  # workers restarted (all their processes)

    def admit(self, aid: str, r: Request) -> None:
        live = self.live_decodes()
        d = live[self.rr % len(live)]
        self.rr += 1
        cancel = self.cancels.plan(self.cfg.seed, r.rid, r.steps)
        for p in self.prefills:
            self.ch.send(p, "admit", rid=aid, prompt=list(r.prompt), steps=r.steps, decode=d,
                         cancel=cancel)  # fmt: skip
        self.base[aid] = r.rid
        self.admitted[aid] = d

    def end(self, rid: str, outcome: str, reason: str = "") -> None:
        if rid not in self.rep.outcomes:  # the first word on a request stands
            self.rep.outcomes[rid] = outcome
            if reason:
                self.rep.reasons[rid] = reason

    def attempt_ended(self, aid: str, outcome: str, reason: str = "") -> None:
        """An attempt's first word stands; a failed one is retried while tries are left."""
        if aid in self.done or aid not in self.base:
            return
        self.done.add(aid)
        rid = self.base[aid]
        if outcome == "failed" and self.tries[rid] < self.cfg.retries:
            self.tries[rid] += 1
            self.rep.retried += 1
            self.rep.retry_reasons[reason] = self.rep.retry_reasons.get(reason, 0) + 1
            self.queue.insert(0, (f"{rid}~{self.tries[rid]}", self.by_id[rid]))
            return
        self.end(rid, outcome, reason)

    def on_message(self, m: Message) -> None:
        kind = m["kind"]
        if kind == "outcome":
            aid = m["rid"]
            if m["outcome"] == "finished" and aid not in self.done and aid in self.base:
                self.finished_tokens[self.base[aid]] = tuple(m["tokens"])
            self.attempt_ended(aid, m["outcome"], m.get("reason", ""))
        elif kind == "committed":
            self.committed[m["rid"]] = m["src"]
            self.stats[m["rid"]] = m["stats"]
        elif kind == "hello" and m["src"] in self.booting:
            self.on_back(m["src"])
        elif kind == "stalled" and self.group(m["src"]) not in self.down:
            self.on_death(m["src"])  # a decode rank did not answer its leader: a crash

    # ------------------------------------------------------------------ faults
    def maybe_kill(self) -> None:
        k = self.kill
        if k is None or len(self.rep.outcomes) < k.at_fraction * self.cfg.requests:
            return
        if (
            self.booting
            or self.group(k.proc) in self.down
            or PREFILL in self.down
            and k.role == PREFILL
        ):
            return  # wait for the worker to be up
        self.kill = None
        if self.procs.alive(k.proc):
            self.procs.kill(k.proc)
            self.rep.faults["kills"] = self.rep.faults.get("kills", 0) + 1

    def watch(self, now: float) -> None:
        """A worker whose process exited, or whose heartbeat stood still, is dead."""
        for w in list(self.booting):
            why = self.boot.verdict(w, self.procs.procs[w], now)
            if why is not None:  # it never came up: dead, hung or past the outer bound
                del self.booting[w]
                self.boot.forget(w)
                self.rep.crashed.append(f"{w}.{self.inc[w] + 1} (restart did not start: {why})")
                if self.procs.alive(w):
                    self.procs.kill(w, injected=False)
                if self.can_restart():
                    self.restart(self.group(w))
        live = [w for w in self.workers if self.group(w) not in self.down]
        live = [w for w in live if w not in self.booting]
        counts = heartbeats(self.store, live)
        from refimpl.cluster.control import load_factor  # a loaded machine's beats are late

        patience = self.cfg.timeout_s * load_factor()
        for w in live:
            if self.group(w) in self.down:
                continue  # its worker died in this turn (a decode rank's sibling)
            n = counts[w]
            last = self.beats.get(w)
            if last is None or last[0] != n:
                self.beats[w] = (n, now)
            stale = now - self.beats[w][1] > patience
            if not self.procs.alive(w) or stale:
                self.on_death(w)

    def group(self, w: str) -> str:
        return PREFILL if w.startswith("p") else worker_of(w)

    def members(self, g: str) -> list[str]:
        """A worker's processes: every prefill rank, or every rank of a decode worker."""
        if g == PREFILL:
            return self.prefills
        return [proc_name("decode", int(g[1:]), j) for j in range(self.cfg.decode_tp)]

    def log_name(self, w: str) -> str:
        return w if self.inc[w] == 0 else f"{w}.{self.inc[w]}"

    def on_death(self, w: str) -> None:
        """Read what the dead process sent, log EnvCrash after everything the crashed
        worker logged, give its attempts their fate, then restart it."""
        for m in self.ch.poll([w], limit=1 << 30):  # its last words still count
            self.on_message(m)
        if self.procs.alive(w):
            self.procs.kill(w, injected=False)  # silent but running: make sure
        self.rep.declared_dead.append(self.log_name(w))
        g = self.group(w)
        self.down.add(g)
        victims = self.members(g)
        for v in victims:  # a decode worker's crash is every one of its ranks' crash
            if g != PREFILL and v != w and self.procs.alive(v):
                self.procs.kill(v, injected=False)
                for m in self.ch.poll([v], limit=1 << 30):  # its last words count too
                    self.on_message(m)
        lcs = [eventlog.last_clock(self.dir / f"{self.log_name(w)}.jsonl")]
        if g != PREFILL:
            lcs += [eventlog.last_clock(self.dir / f"{self.log_name(v)}.jsonl") for v in victims]
        if g == PREFILL:
            others = {p for p in self.prefills if p != w and self.procs.alive(p)}
            for p in others:
                self.ch.send(p, "dead", who=w)
            self.await_kind("stopped", others, self.cfg.timeout_s)
            lcs += [eventlog.last_clock(self.dir / f"{self.log_name(p)}.jsonl") for p in others]
        self.log.clock(max(lcs))
        names = [self.log_name(v) for v in victims]
        crash = self.log.seq + 1  # the crash's id: the "dead" notices after it carry it
        self.log.event("EnvCrash", None, time.time(), worker=g if g == PREFILL else "decode",
                       victims=names)  # fmt: skip
        if g == PREFILL:
            live = {n for d in self.live_decodes() for n in self.members(d)}
            for d in live:
                self.ch.send(d, "dead", who=w, crash=crash)
            self.await_kind("settled", live, 2 * self.cfg.timeout_s)
            for aid in list(self.admitted):
                if aid not in self.committed:
                    self.attempt_ended(aid, "failed", "prefill worker crashed before commit")
        else:
            for p in self.prefills:
                if PREFILL not in self.down:
                    self.ch.send(p, "dead", who=g, crash=crash)
            for aid, d in list(self.committed.items()):
                if d == g:
                    self.attempt_ended(aid, "failed", f"decode worker {w} crashed holding it")
        if self.can_restart():
            self.restart(g)

    def restart(self, g: str) -> None:
        """The crashed worker comes back as incarnation inc + 1 (spec EnvRestart)."""
        names = self.members(g)
        self.restarts += 1
        inc = self.inc[names[0]] + 1
        self.log.event("EnvRestart", None, time.time(), worker=g if g == PREFILL else "decode",
                       inc=inc)  # fmt: skip
        incs = {**self.inc, **{n: inc for n in names}}  # peers learn it at its hello
        spawned = [n for n in names if not self.procs.alive(n)]
        for n in spawned:
            self.procs.start(self.worker_args(n, incs, lc0=self.log.lc))
            self.booting[n] = time.monotonic()
            self.boot.add(n, self.booting[n])
        for n in names:  # the router reads the new incarnation's mailboxes from now on
            self.ch.set_inc(n, inc)
        self.rep.restarted += [f"{n}.{inc}" for n in names]
        self.restarting[g] = (names, spawned, inc)  # two workers may restart at once

    def running_inc(self, w: str) -> int:
        """The incarnation process ``w`` runs as (a booting one: its new incarnation)."""
        return self.restarting[self.group(w)][2] if w in self.booting else self.inc[w]

    def on_back(self, w: str) -> None:
        """The restarted process said hello: every live process learns the incarnation."""
        del self.booting[w]
        self.boot.forget(w)
        g = self.group(w)
        names, spawned, inc = self.restarting[g]
        if any(n in self.booting for n in names):
            return
        for peer in self.workers:  # a survivor of the worker hears it at its old incarnation
            if self.procs.alive(peer) and peer not in spawned:
                to = inc - 1 if peer in names else self.running_inc(peer)
                self.ch.send(peer, "restarted", who=names, inc=inc, to_inc=to)
        for n in names:
            self.inc[n] = inc
            self.beats.pop(n, None)
        self.down.discard(g)


def run_cluster(cfg: ClusterConfig, progress: Progress | None = None) -> ClusterReport:
    return Router(cfg, progress).run()


__all__ = ["CLUSTER_MUTANTS", "ClusterConfig", "Router", "run_cluster"]
