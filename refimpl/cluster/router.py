"""The router: starts the workers, feeds the workload, injects the faults, watches for
dead peers, collects every request's outcome, then checks the run.

It hosts the control store (a TCPStore), starts one process per prefill TP rank and
one decode process (they form one torch.distributed world through a TCP init method),
and then loops, never blocking without a deadline:

- admits requests (to every prefill rank) up to ``max_inflight`` at a time;
- sends the planned cancels (to the prefill leader, which routes them on);
- fires the planned kill (SIGKILL by pid) once enough requests have ended;
- declares a worker dead when its process has exited or its heartbeat has not moved
  for ``timeout_s``; it then logs ``EnvCrash`` after everything the dead process and
  the rest of the crashed worker logged (see ``on_death``), and fails the requests
  that worker held, each with its reason;
- ends when every request has an outcome, or at ``deadline_s`` (the rest are "lost").

Then it measures the raw baseline (if asked and nobody died), shuts the workers down
(each reports its allocator's integrity and the blocks it still holds), merges the
logs and checks them request by request (``eventlog.check_requests``), and compares
every finished request's tokens with a single-process reference decode.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from refimpl.cluster import eventlog
from refimpl.cluster.control import Channel, ControlFaults, Message, heartbeats, serve_store
from refimpl.cluster.faults import DROPPABLE, CancelPlan, Kill, parse_kill
from refimpl.cluster.procs import Procs, free_port
from refimpl.cluster.report import ClusterReport
from refimpl.cluster.worker import ROUTER, WorkerArgs
from refimpl.cluster.workload import ModelSpec, Request, make_requests, reference_tokens
from spec.mutants import MUTANTS

CLUSTER_MUTANTS = ("release_before_install", "cancel_ignored")
HOST = "127.0.0.1"


@dataclass(frozen=True)
class ClusterConfig:
    requests: int = 20
    prefill_tp: int = 2
    decode_tp: int = 1
    seed: int = 0
    kill: str | None = None
    cancel_p: float = 0.0
    delay_p: float = 0.0
    delay_s: float = 0.02
    drop_p: float = 0.0
    timeout_s: float = 3.0
    deadline_s: float = 120.0
    mutant: str | None = None
    model: ModelSpec = field(default_factory=ModelSpec)
    steps: int = 4
    capacity: int = 64
    max_inflight: int = 4
    raw_baseline: bool = True
    backend: str = "gloo"
    log_dir: str = "kvown-cluster-logs"

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.prefill_tp <= 4:
            problems.append(f"prefill_tp={self.prefill_tp} not in 1..4")
        if self.decode_tp != 1:
            problems.append(f"decode_tp={self.decode_tp}: only 1 is supported")
        if self.requests < 1:
            problems.append(f"requests={self.requests} < 1")
        if self.timeout_s <= 0 or self.deadline_s <= 0:
            problems.append("timeout_s and deadline_s must be > 0")
        if self.mutant is not None and self.mutant not in CLUSTER_MUTANTS:
            known = "a spec mutant" if self.mutant in MUTANTS else "not a spec mutant"
            problems.append(
                f"mutant {self.mutant!r} ({known}) has no switch in the cluster workers; "
                f"valid: {', '.join(CLUSTER_MUTANTS)}"
            )
        if self.backend != "gloo":
            problems.append(
                f"backend {self.backend!r}: only gloo (the workers send CPU tensors; an NCCL "
                "path would stage them on the GPU and needs one GPU per rank)"
            )
        if self.max_inflight < 1 or self.capacity < 4:
            problems.append("max_inflight >= 1 and capacity >= 4")
        if problems:
            raise ValueError("; ".join(problems))
        parse_kill(self.kill, self.prefill_tp, self.decode_tp, self.seed)
        CancelPlan(self.cancel_p)
        ControlFaults(self.delay_p, self.delay_s, self.drop_p)


Progress = Callable[[int, int, dict[str, int]], None]


class Router:
    def __init__(self, cfg: ClusterConfig, progress: Progress | None = None) -> None:
        self.cfg, self.progress = cfg, progress
        self.t0 = time.time()
        self.dir = Path(cfg.log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("*.jsonl"):
            old.unlink()
        self.reqs = make_requests(cfg.requests, cfg.model, seed=cfg.seed, steps=cfg.steps)
        self.by_id = {r.rid: r for r in self.reqs}
        self.rng = random.Random(f"router/{cfg.seed}")
        self.kill: Kill | None = parse_kill(cfg.kill, cfg.prefill_tp, cfg.decode_tp, cfg.seed)
        self.cancels = CancelPlan(cfg.cancel_p)
        self.workers = [f"p{r}" for r in range(cfg.prefill_tp)] + ["d0"]
        self.rep = ClusterReport(cfg.requests, backend=cfg.backend, log_dir=str(self.dir))
        self.log = eventlog.ProcLog(self.dir, ROUTER, self.t0)
        self.store = serve_store(HOST, cfg.timeout_s)
        self.ch = Channel(self.store, ROUTER, tuple(self.workers), self.log.clock)
        self.procs = Procs()
        self.backlog: list[Message] = []
        self.admitted: dict[str, float] = {}
        self.committed: set[str] = set()
        self.cancel_at: dict[str, float] = {}
        self.dead: set[str] = set()
        self.prefill_down = self.decode_down = False
        self.stats: dict[str, dict[str, float]] = {}
        self.beats: dict[str, tuple[int, float]] = {}
        self.byes: dict[str, Message] = {}
        self.finished_tokens: dict[str, tuple[int, ...]] = {}

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> ClusterReport:
        t_start = time.monotonic()
        try:
            self.start()
            self.serve()
            self.raw_baseline()
            self.shutdown()
        finally:
            self.procs.close()
            self.log.close()
        self.rep.wall_s = time.monotonic() - t_start
        self.rep.killed = list(self.procs.killed)
        self.rep.declared_dead = sorted(self.dead)
        self.rep.crashed = sorted(
            n for n, rc in self.procs.exit_codes().items() if rc != 0 and n not in self.procs.killed
        )
        self.finalize()
        return self.rep

    def start(self) -> None:
        c = self.cfg
        faults = {"delay_p": c.delay_p, "delay_s": c.delay_s, "drop_p": c.drop_p,
                  "droppable": sorted(DROPPABLE), "seed": c.seed}  # fmt: skip
        init = f"tcp://{HOST}:{free_port(HOST)}"
        for role, n in (("prefill", c.prefill_tp), ("decode", c.decode_tp)):
            for r in range(n):
                a = WorkerArgs(
                    role, r, c.prefill_tp, c.decode_tp, HOST, self.store.port, init,
                    c.backend, str(self.dir), self.t0, c.timeout_s, asdict(c.model),
                    c.capacity, c.timeout_s * (2 * c.max_inflight + 1), c.mutant, faults,
                )  # fmt: skip
                self.procs.start(a)
        hello = self.await_kind("hello", set(self.workers), 60.0 + 10 * len(self.workers))
        missing = set(self.workers) - hello
        if missing:
            raise RuntimeError(f"workers {sorted(missing)} did not start; see {self.dir}/*.out")

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
        queue = list(self.reqs)
        while len(self.rep.outcomes) < c.requests and time.monotonic() < deadline:
            now = time.monotonic()
            inflight = len(self.admitted) - sum(1 for r in self.admitted if r in self.rep.outcomes)
            while (
                queue and inflight < c.max_inflight and not (self.prefill_down or self.decode_down)
            ):
                self.admit(queue.pop(0), now)
                inflight += 1
            if self.prefill_down or self.decode_down:
                for r in queue:
                    self.end(r.rid, "failed", "not admitted: a worker is down")
                queue = []
            msgs, self.backlog = self.backlog + self.ch.poll(), []
            for m in msgs:
                self.on_message(m)
            for rid, at in list(self.cancel_at.items()):
                if now >= at:
                    del self.cancel_at[rid]
                    if rid not in self.rep.outcomes and "p0" not in self.dead:
                        self.ch.send("p0", "cancel", rid=rid)
                        self.rep.faults["cancels"] = self.rep.faults.get("cancels", 0) + 1
            self.maybe_kill()
            self.watch(now)
            if self.progress is not None:
                self.progress(len(self.rep.outcomes), c.requests, self.rep.counts())
            if not msgs:
                time.sleep(0.002)
        if len(self.rep.outcomes) < c.requests:  # the deadline: leave evidence behind
            self.procs.dump_stacks()

    def admit(self, r: Request, now: float) -> None:
        for p in range(self.cfg.prefill_tp):
            self.ch.send(f"p{p}", "admit", rid=r.rid, prompt=list(r.prompt), steps=r.steps)
        self.admitted[r.rid] = now
        delay = self.cancels.draw(self.rng)
        if delay is not None:
            self.cancel_at[r.rid] = now + delay

    def end(self, rid: str, outcome: str, reason: str = "") -> None:
        if rid not in self.rep.outcomes:  # the first word on a request stands
            self.rep.outcomes[rid] = outcome
            if reason:
                self.rep.reasons[rid] = reason

    def on_message(self, m: Message) -> None:
        kind = m["kind"]
        if kind == "outcome":
            self.end(m["rid"], m["outcome"], m.get("reason", ""))
            if m["outcome"] == "finished":
                self.finished_tokens[m["rid"]] = tuple(m["tokens"])
        elif kind == "committed":
            self.committed.add(m["rid"])
            self.stats[m["rid"]] = m["stats"]

    # ------------------------------------------------------------------ faults
    def maybe_kill(self) -> None:
        k = self.kill
        if k is None or len(self.rep.outcomes) < k.at_fraction * self.cfg.requests:
            return
        self.kill = None
        if self.procs.alive(k.proc):
            self.procs.kill(k.proc)
            self.rep.faults["kills"] = self.rep.faults.get("kills", 0) + 1

    def watch(self, now: float) -> None:
        """A worker whose process exited, or whose heartbeat stood still, is dead."""
        live = [w for w in self.workers if w not in self.dead]
        counts = heartbeats(self.store, live)
        for w in live:
            n = counts[w]
            last = self.beats.get(w)
            if last is None or last[0] != n:
                self.beats[w] = (n, now)
            stale = now - self.beats[w][1] > self.cfg.timeout_s
            if not self.procs.alive(w) or stale:
                self.on_death(w)

    def on_death(self, w: str) -> None:
        """Log EnvCrash after everything the crashed worker logged, then fail its work."""
        self.dead.add(w)
        if self.procs.alive(w):
            self.procs.kill(w, injected=False)  # silent but running: make sure
        lcs = [eventlog.last_clock(self.dir / f"{w}.jsonl")]
        if w.startswith("p"):
            if self.prefill_down:
                return
            self.prefill_down = True
            others = {p for p in self.workers if p.startswith("p") and p not in self.dead}
            for p in others:
                self.ch.send(p, "dead", who=w)
            self.await_kind("stopped", others, self.cfg.timeout_s)
            lcs += [eventlog.last_clock(self.dir / f"{p}.jsonl") for p in others]
            self.log.clock(max(lcs))
            self.log.event("EnvCrash", None, time.time(), worker="prefill")
            if "d0" not in self.dead:
                self.ch.send("d0", "dead", who=w)
                self.await_kind("settled", {"d0"}, 2 * self.cfg.timeout_s)
            for rid in self.admitted:
                if rid not in self.committed:
                    self.end(rid, "failed", f"prefill rank {w} died before decode committed")
        else:
            self.decode_down = True
            self.log.clock(max(lcs))
            self.log.event("EnvCrash", None, time.time(), worker="decode")
            for p in self.workers:
                if p.startswith("p") and p not in self.dead:
                    self.ch.send(p, "dead", who=w)
            for rid in self.committed:
                self.end(rid, "failed", f"decode worker {w} died holding it")

    # ------------------------------------------------------------------ the end
    def raw_baseline(self) -> None:
        if not self.cfg.raw_baseline or self.dead or not self.stats:
            return
        tp = self.cfg.prefill_tp
        sizes = [[int(s["bytes"]) // tp] * tp for s in self.stats.values()]
        for p in range(tp):
            self.ch.send(f"p{p}", "raw", sizes=sizes)
        self.ch.send("d0", "raw", sizes=sizes)
        deadline = time.monotonic() + 4 * self.cfg.timeout_s + 10
        while time.monotonic() < deadline:
            for m in self.ch.poll():
                if m["kind"] == "raw_done" and m.get("ok"):
                    self.rep.raw_bytes, self.rep.raw_s = int(m["bytes"]), float(m["seconds"])
                    return
                if m["kind"] != "raw_done":
                    self.backlog.append(m)
            time.sleep(0.002)

    def shutdown(self) -> None:
        live = {w for w in self.workers if w not in self.dead and self.procs.alive(w)}
        for w in live:
            self.ch.send(w, "shutdown")
        got = self.await_kind("bye", live, 2 * self.cfg.timeout_s + 5)
        self.rep.unreported = sorted(live - got)

    def finalize(self) -> None:
        rep = self.rep
        for w, m in self.byes.items():
            rep.leaked_blocks += int(m["held"])
            rep.held_by[w] = int(m["held"])
            for k in ("delayed", "dropped"):
                rep.faults[f"control_{k}"] = rep.faults.get(f"control_{k}", 0) + int(m[k])
            if m.get("integrity"):
                rep.integrity_errors.append(f"{w}: {m['integrity']}")
        ok_handoffs = [s for s in self.stats.values() if "commit" in s]
        rep.handoff_ms = [1000 * s["commit"] for s in ok_handoffs]
        rep.handoff_s = sum(s["commit"] for s in ok_handoffs)
        rep.handoff_bytes = int(sum(s["bytes"] for s in ok_handoffs))
        if ok_handoffs:
            keys = ("data", "rankdone", "verified", "commit")
            rep.phases_ms = {
                k: 1000 * sum(s[k] for s in ok_handoffs) / len(ok_handoffs) for k in keys
            }
        model = self.cfg.model.model()
        for rid, toks in sorted(self.finished_tokens.items()):
            if toks != reference_tokens(model, self.by_id[rid]):
                rep.mismatched.append(rid)
        names = [ROUTER, *self.workers]
        merged = eventlog.merge(eventlog.read_events(self.dir / f"{n}.jsonl" for n in names))
        blocks = {r.rid: r.blocks(self.cfg.model.block_size) for r in self.reqs}
        verdicts = eventlog.check_requests(merged, self.cfg.prefill_tp, blocks)
        (self.dir / "merged.jsonl").write_text("".join(eventlog.dumps(e) for e in merged))
        per_req = self.dir / "requests"
        per_req.mkdir(exist_ok=True)
        rep.checked_requests = len(verdicts)
        for v in verdicts:
            (per_req / f"{v.rid}.jsonl").write_text(v.text)
            if not v.verdict.conforms:
                path = per_req / f"{v.rid}.jsonl"
                rep.violations.append(
                    {"rid": v.rid, "config": v.config, "line": v.verdict.line,
                     "violated": v.verdict.violated, "reason": v.verdict.reason,
                     "properties": v.verdict.properties, "log": str(path)}
                )  # fmt: skip
        rep.conforms = not rep.violations
        rep.faults.setdefault("kills", 0)
        rep.faults.setdefault("cancels", 0)


def run_cluster(cfg: ClusterConfig, progress: Progress | None = None) -> ClusterReport:
    return Router(cfg, progress).run()


def describe(cfg: ClusterConfig) -> dict[str, Any]:
    return {**asdict(cfg), "model": asdict(cfg.model)}
