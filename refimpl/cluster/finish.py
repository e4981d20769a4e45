"""The end of a cluster run: the raw baseline, the shutdown, and the checks.

``finish`` runs while the workers are up: it measures the raw send/recv baseline (the
same bytes between the same pairs, when a prefill worker and a decode worker are up:
after a restart they are) and shuts the workers down (each reports its allocator's
integrity and the blocks it still holds). ``check`` runs after every process has ended:
it merges the logs of every process and incarnation by Lamport clock, checks them
request by request (attempt by attempt: ``eventlog.check_requests``), and compares every
finished request's tokens with a single-process reference decode.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from refimpl.cluster import eventlog
from refimpl.cluster.procs import HELLO_MAX_S
from refimpl.cluster.worker import CLOSE_WAIT
from refimpl.cluster.workload import reference_tokens
from spec.mutants import MUTANTS

if TYPE_CHECKING:
    from refimpl.cluster.router import Router


def finish(r: Router) -> None:
    await_restarts(r)
    raw_baseline(r)
    shutdown(r)


def await_restarts(r: Router, timeout_s: float = HELLO_MAX_S) -> None:
    """A restart still booting when the last request ended comes up first (bounded), so
    that it reports at the shutdown like every live worker."""
    deadline = time.monotonic() + timeout_s
    while r.booting and time.monotonic() < deadline:
        for m in r.ch.poll():
            r.on_message(m)
        r.watch(time.monotonic())
        time.sleep(0.01)


def raw_baseline(r: Router) -> None:
    rep = r.rep
    if not r.cfg.raw_baseline:
        rep.raw_skipped = "--no-raw"
        return
    live = r.live_decodes()
    if r.cfg.decode_tp > 1:
        rep.raw_skipped = "decode TP > 1: the raw baseline is measured at decode TP 1"
        return
    if not r.stats:
        rep.raw_skipped = "no handoff committed"
        return
    if "prefill" in r.down or not live:
        rep.raw_skipped = "no prefill or decode worker up at the end (no restart left)"
        return
    tp, to = r.cfg.prefill_tp, live[0]
    sizes = [[int(s["bytes"]) // tp] * tp for s in r.stats.values()]
    for p in r.prefills:
        r.ch.send(p, "raw", sizes=sizes, to=to)
    r.ch.send(to, "raw", sizes=sizes)
    deadline = time.monotonic() + 4 * r.cfg.timeout_s + 10
    while time.monotonic() < deadline:
        for m in r.ch.poll():
            if m["kind"] == "raw_done" and m.get("ok"):
                rep.raw_bytes, rep.raw_s = int(m["bytes"]), float(m["seconds"])
                return
            if m["kind"] != "raw_done":
                r.backlog.append(m)
        time.sleep(0.002)
    rep.raw_skipped = "the raw transfer did not complete"


def shutdown(r: Router) -> None:
    """Every live worker says bye; a decode worker's other ranks last, after its leader
    (whose bye goes out after its last word to them: their blocks to give back)."""
    live = {w for w in r.workers if r.procs.alive(w)}
    got: set[str] = set()
    # Phase 1: the prefill ranks drain what is in flight before their bye (at most
    # CLOSE_WAIT timeouts: ``Base.begin_close``), the decode leaders say bye at once.
    # Phase 2: the decode leaders' other ranks, which also say bye at once.
    for other_ranks, waits in ((False, CLOSE_WAIT + 1), (True, 2)):
        now = {w for w in live if ("r" in w[1:]) == other_ranks}
        for w in now:
            r.ch.send(w, "shutdown")
        got |= r.await_kind("bye", now, waits * r.cfg.timeout_s + 5)
    r.rep.unreported = sorted(live - got)


def check(r: Router) -> None:
    rep = r.rep
    rep.killed = list(r.procs.killed)
    rep.pids = [p.pid for p in [*r.procs.retired, *r.procs.procs.values()]]
    rep.crashed += sorted(
        n for n, rc in r.procs.exit_codes().items() if rc != 0 and n not in r.procs.killed
    )
    for w, m in r.byes.items():
        rep.leaked_blocks += int(m["held"])
        rep.held_by[w] = int(m["held"])
        for k in ("delayed", "dropped", "fenced"):
            rep.faults[f"control_{k}"] = rep.faults.get(f"control_{k}", 0) + int(m.get(k, 0))
        if m.get("integrity"):
            rep.integrity_errors.append(f"{w}: {m['integrity']}")
    ok_handoffs = [s for s in r.stats.values() if "commit" in s]
    rep.handoff_ms = [1000 * s["commit"] for s in ok_handoffs]
    rep.handoff_s = sum(s["commit"] for s in ok_handoffs)
    rep.handoff_bytes = int(sum(s["bytes"] for s in ok_handoffs))
    if ok_handoffs:
        keys = ("rankdone", "data", "verified", "commit")
        rep.phases_ms = {k: 1000 * sum(s[k] for s in ok_handoffs) / len(ok_handoffs) for k in keys}
    model = r.cfg.model.model()
    for rid, toks in sorted(r.finished_tokens.items()):
        if toks != reference_tokens(model, r.by_id[rid]):
            rep.mismatched.append(rid)
    logs = sorted(p for p in r.dir.glob("*.jsonl") if p.name != "merged.jsonl")
    merged = eventlog.merge(eventlog.read_events(logs))
    bs = r.cfg.model.block_size
    blocks = {aid: r.by_id[rid].blocks(bs) for aid, rid in r.base.items()}
    verdicts = eventlog.check_requests(merged, r.cfg.prefill_tp, blocks)
    (r.dir / "merged.jsonl").write_text("".join(eventlog.dumps(e) for e in merged))
    per_req = r.dir / "requests"
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
    if r.cfg.mutant is not None:
        expected = MUTANTS[r.cfg.mutant].expected
        flagged = sorted({p for v in rep.violations for p in v["properties"] or []})
        rep.mutant = {"name": r.cfg.mutant, "expected": expected, "flagged": flagged,
                      "caught": expected in flagged}  # fmt: skip
    rep.faults.setdefault("kills", 0)
    rep.faults["cancels"] = sum(
        1 for rid in r.by_id if r.cancels.plan(r.cfg.seed, rid, r.by_id[rid].steps) is not None
    )
