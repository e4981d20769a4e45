"""What a cluster run ends with: outcomes, leaks, tokens against the reference, the
merged log's verdict, handoff figures. ``ClusterReport.to_json`` is ``--json``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def percentile(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no samples."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(1, math.ceil(q / 100 * len(s)))
    return s[k - 1]


REASONS = 50  # reasons listed one by one in --json (reason_counts has them all)
VIOLATIONS = 5  # flagged request logs listed in --json (violations_total counts all)


def _rid_key(rid: str) -> tuple[int, str]:
    digits = rid[1:].split("~")[0]
    return (int(digits), rid) if digits.isdigit() else (1 << 62, rid)


@dataclass
class ClusterReport:
    n: int
    outcomes: dict[str, str] = field(default_factory=dict)  # rid -> outcome
    reasons: dict[str, str] = field(default_factory=dict)  # rid -> why (failed, cancelled)
    leaked_blocks: int = 0  # blocks still held by live workers at exit
    integrity_errors: list[str] = field(default_factory=list)
    unreported: list[str] = field(default_factory=list)  # live workers that never said bye
    killed: list[str] = field(default_factory=list)  # SIGKILLed by the fault injection
    declared_dead: list[str] = field(default_factory=list)  # exited or silent, all causes
    crashed: list[str] = field(default_factory=list)  # exited non-zero, not by a kill
    held_by: dict[str, int] = field(default_factory=dict)  # blocks held at exit, per worker
    mismatched: list[str] = field(default_factory=list)  # finished, tokens != reference
    conforms: bool | None = None
    violations: list[dict[str, Any]] = field(default_factory=list)
    checked_requests: int = 0
    handoff_ms: list[float] = field(default_factory=list)
    handoff_bytes: int = 0
    handoff_s: float = 0.0
    phases_ms: dict[str, float] = field(default_factory=dict)  # mean per phase
    raw_bytes: int = 0
    raw_s: float | None = None
    faults: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    backend: str = "gloo"
    log_dir: str = ""
    raw_skipped: str | None = None  # why there is no raw baseline (None: measured)
    restarted: list[str] = field(default_factory=list)  # new incarnations, e.g. d0.1
    retried: int = 0  # new attempts of failed requests
    retry_reasons: dict[str, int] = field(default_factory=dict)
    mutant: dict[str, Any] | None = None  # the switch, its spec property, and whether caught
    pids: list[int] = field(default_factory=list)  # every worker process started (not JSON)

    def counts(self) -> dict[str, int]:
        c = {"finished": 0, "cancelled": 0, "failed": 0, "lost": 0}
        for o in self.outcomes.values():
            c[o] += 1
        c["lost"] += self.n - len(self.outcomes)
        return c

    @property
    def tokens_match_reference(self) -> bool:
        return not self.mismatched

    @property
    def handoff_gib_s(self) -> float | None:
        return self.handoff_bytes / self.handoff_s / 2**30 if self.handoff_s else None

    @property
    def raw_gib_s(self) -> float | None:
        return self.raw_bytes / self.raw_s / 2**30 if self.raw_s else None

    @property
    def handoff_over_raw(self) -> float | None:
        h, r = self.handoff_gib_s, self.raw_gib_s
        return h / r if h and r else None

    @property
    def ok(self) -> bool:
        """Nothing lost, no leak, intact allocators, tokens equal, a conforming log."""
        return (
            self.counts()["lost"] == 0
            and self.leaked_blocks == 0
            and not self.integrity_errors
            and not self.unreported
            and not self.crashed
            and self.tokens_match_reference
            and self.conforms is True
        )

    def reason_counts(self) -> dict[str, int]:
        """Every reason given, with how many requests gave it (full, never cut)."""
        out: dict[str, int] = {}
        for why in self.reasons.values():
            out[why] = out.get(why, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def to_json(self) -> dict[str, Any]:
        """``--json``. The lists that may be long are cut (``reasons`` at REASONS,
        ``violations`` at VIOLATIONS) and say so: ``*_total`` is the full count, and
        ``reason_counts`` counts every reason."""
        p50, p99 = percentile(self.handoff_ms, 50), percentile(self.handoff_ms, 99)
        reasons = sorted(self.reasons.items(), key=lambda kv: _rid_key(kv[0]))
        return {
            "requests": self.counts(),
            "leaked_blocks": self.leaked_blocks,
            "killed": list(self.killed),
            "declared_dead": list(self.declared_dead),
            "held_by": dict(self.held_by),
            "crashed": list(self.crashed),
            "tokens_match_reference": self.tokens_match_reference,
            "conforms": self.conforms,
            "handoff_over_raw": self.handoff_over_raw,
            "p50_ms": p50,
            "p99_ms": p99,
            "requests_per_s": self.n / self.wall_s if self.wall_s else None,
            "handoff_gib_s": self.handoff_gib_s,
            "raw_gib_s": self.raw_gib_s,
            "handoff_phases_ms": self.phases_ms,
            "faults": self.faults,
            "integrity_errors": self.integrity_errors,
            "unreported_workers": self.unreported,
            "mismatched": self.mismatched,
            "violations": self.violations[:VIOLATIONS],
            "violations_total": len(self.violations),
            "checked_requests": self.checked_requests,
            "reasons": dict(reasons[:REASONS]),
            "reasons_total": len(reasons),
            "reason_counts": self.reason_counts(),
            "raw_skipped": self.raw_skipped,
            "restarted": list(self.restarted),
            "retried": self.retried,
            "retry_reasons": dict(self.retry_reasons),
            "mutant": self.mutant,
            "ok": self.ok,
            "backend": self.backend,
            "wall_s": self.wall_s,
            "log_dir": self.log_dir,
        }
