"""Per-process event logs (spec/EVENTLOG.md JSONL), merged by causality and checked.

Every process appends its own events to ``<dir>/<proc>.jsonl``, one line each, flushed
at once (a SIGKILLed process keeps every line it wrote). An event carries, besides the
spec's ``action`` and ``args``:

- ``rid``: the cluster's request id (``args.req`` is that request's slot in its own
  per-request log, always 0: see below);
- ``lc``: the process's Lamport clock. Every control message carries the sender's clock
  and the receiver moves past it, so if event a happened before event b (same process,
  or through a chain of messages) then ``lc(a) < lc(b)``.

``merge`` sorts all processes' events by ``(lc, proc, seq)``: a total order that
extends causality, with no wall clock involved. Wall times (``t``) are kept only for
the reader.

Checking. The spec's finite configs hold at most four requests, and a slot lives one
lifecycle, so a run of N requests is checked as N logs: one per request, holding that
request's events plus the global ones (``EnvCrash``), in merged order, against the
one-request config ``cluster_tp{T}_b{B}`` (``spec/config.py``, T prefill ranks, B
blocks). Requests share capacity only through the pools' own checks, which the
per-request configs do not model (each has exactly its own blocks).
"""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the checker is the router's, at the end: a worker never imports it
    from model_checks.conformance import Verdict

GLOBAL_ACTIONS = frozenset({"EnvCrash"})


def fresh_log_dir(path: str) -> Path:
    """The folder a run writes its logs in, and nothing else's: ``path`` itself when it is
    new or empty, else a new ``run-<n>`` folder inside it (created here, so two runs never
    share one); "" a new temporary folder. A file already in ``path`` is never touched
    (the run used to delete every ``*.jsonl`` there)."""
    if not path:
        return Path(tempfile.mkdtemp(prefix="kvown-cluster-"))
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    if not any(p.iterdir()):
        return p
    for n in itertools.count(1):
        q = p / f"run-{n}"
        try:
            q.mkdir()
        except FileExistsError:
            continue
        return q
    raise AssertionError("unreachable")


class ProcLog:
    """One process's log and Lamport clock."""

    def __init__(self, directory: str | Path, proc: str, t0: float) -> None:
        self.proc, self.t0, self.lc, self.seq = proc, t0, 0, 0
        self.path = Path(directory) / f"{proc}.jsonl"
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close)

    def clock(self, received: int) -> int:
        """Merge a received clock (0: none) and tick; returns the new local clock."""
        self.lc = max(self.lc, received) + 1
        return self.lc

    def event(
        self,
        action: str,
        rid: str | None,
        now: float,
        observed: dict[str, str] | None = None,
        victims: list[str] | None = None,
        **args: Any,
    ) -> None:
        self.seq += 1
        rec: dict[str, Any] = {"action": action, "args": dict(args)}
        if victims is not None:
            rec["victims"] = list(victims)  # the processes a crash took down
            rec["crash"] = self.seq  # its id: the crash notices name it (CrashSeen)
        if rid is not None:
            rec["args"]["req"] = 0
            rec["rid"] = rid
        if observed:
            rec["observed"] = observed
        rec.update(lc=self.clock(0), proc=self.proc, seq=self.seq, t=round(now - self.t0, 6))
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _records(path: str | Path) -> list[dict[str, Any]]:
    """The well-formed event records of one process's log, each line read by the one strict
    reader under the event-log format's limits (``loads_line``): a torn last line of a
    killed process, a line that is not strict JSON or too long, and a record whose
    ``action``, ``proc``, ``lc`` or ``seq`` is missing or of the wrong type are skipped
    (``merge`` sorts on them). An unreadable file has none."""
    from model_checks.conformance.jsonline import LogError, loads_line

    try:
        text = Path(path).read_bytes()
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            rec = loads_line(n, line)
        except LogError:
            continue
        if isinstance(rec, dict) and all(type(rec.get(k)) is t for k, t in _FIELDS):
            out.append(rec)
    return out


_FIELDS = (("action", str), ("proc", str), ("lc", int), ("seq", int))


def last_clock(path: str | Path) -> int:
    """The largest ``lc`` in a (possibly dead) process's log; 0 if none."""
    return max((int(r["lc"]) for r in _records(path)), default=0)


def read_events(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every complete event record of the given logs (``_records``)."""
    return [rec for p in paths for rec in _records(p)]


def merge(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The causal total order: Lamport clock, then process name, then its own order."""
    return sorted(events, key=lambda e: (e["lc"], e["proc"], e["seq"]))


def per_request(merged: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each request's events with the global ones that come after its first event.

    A crash that names its ``victims`` (the processes of the crashed worker's
    incarnation) goes only into the logs of the requests one of them had logged for:
    with several decode workers, decode d1's crash is not an event of a request d0
    serves, and a request admitted after a restart never saw the dead incarnation (the
    per-request configs have no restarts: ``EnvRestart`` stays in the router's log)."""
    seen: dict[int, dict[str, int]] = {}  # crash -> process -> seq of its CrashSeen
    for e in merged:
        if e["action"] == "CrashSeen":
            seen.setdefault(int(e["args"]["crash"]), {})[e["proc"]] = int(e["seq"])
    logs: dict[str, list[dict[str, Any]]] = {}
    touched: dict[str, set[str]] = {}
    pending: dict[str, list[dict[str, Any]]] = {}  # crashes not yet placed in a log
    for e in merged:
        if e["action"] in GLOBAL_ACTIONS:
            victims = e.get("victims")
            for rid in logs:
                if victims is None:
                    logs[rid] += [*pending.pop(rid, []), e]
                elif touched[rid] & set(victims):
                    pending.setdefault(rid, []).append(e)
        elif e.get("rid") is not None:
            rid = e["rid"]
            waiting = pending.get(rid, [])
            while waiting and _follows(e, waiting[0], seen):
                logs[rid].append(waiting.pop(0))
            logs.setdefault(rid, []).append(e)
            touched.setdefault(rid, set()).add(e.get("proc", ""))
    for rid, waiting in pending.items():
        logs[rid] += waiting
    return logs


def _follows(e: dict[str, Any], crash: dict[str, Any], seen: dict[int, dict[str, int]]) -> bool:
    """Does event ``e`` causally follow ``crash``? Its process had heard of the crash
    (a ``CrashSeen`` before it), or, for a process that never heard (a new incarnation,
    started after it), by Lamport clock. An event concurrent with the crash may be
    placed before it: that order is one the processes could have run in."""
    proc = e.get("proc", "")
    heard = seen.get(int(crash.get("crash", -1)), {})
    if proc in heard:
        return int(e["seq"]) > heard[proc]
    if proc in crash.get("victims", ()):
        return False
    return int(e["lc"]) > int(crash["lc"])


def config_name(prefill_tp: int, blocks: int) -> str:
    return f"cluster_tp{prefill_tp}_b{blocks}"


def dumps(e: dict[str, Any]) -> str:
    return json.dumps(e, separators=(",", ":")) + "\n"


def owner(proc: str) -> str:
    """The worker whose clock a cluster process keeps (``p<r>``, ``d<k>``, ``d0.1``: an
    incarnation, ``router``)."""
    return {"p": "prefill", "d": "decode"}.get(proc[:1], "env")


def render(config: str, events: Sequence[dict[str, Any]]) -> str:
    """The per-request log: the header declares each process clock that stamps a line."""
    clocks = {e["proc"]: owner(e["proc"]) for e in events if "proc" in e}
    header = {"format": "kvown-eventlog", "version": 1, "config": config, "clocks": clocks}
    return json.dumps(header) + "\n" + "".join(dumps(e) for e in events)


@dataclass(frozen=True)
class RequestVerdict:
    rid: str
    config: str
    verdict: Verdict
    text: str  # the per-request log, as checked (kvown check-trace reads it as is)


def check_requests(
    merged: Sequence[dict[str, Any]], prefill_tp: int, blocks_of: dict[str, int]
) -> list[RequestVerdict]:
    """Check every request's log; ``blocks_of``: each request's block count."""
    from model_checks.conformance import check_text

    out = []
    for rid, evs in per_request(merged).items():
        cfg = config_name(prefill_tp, blocks_of[rid])
        text = render(cfg, evs)
        out.append(RequestVerdict(rid, cfg, check_text(text), text))
    return out
