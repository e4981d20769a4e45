"""Fault injection of a cluster run: kills (SIGKILL), control delays and drops, cancels.

``--kill`` forms:

- ``random``: one worker process, chosen at random (any prefill rank or any decode
  process: with ``--decode-tp`` D, any of a decode worker's D ranks), when a random
  20..80 % of the requests have ended;
- ``prefill:RANK@P%``: prefill rank RANK when P % of the requests have ended;
- ``decode@P%`` or ``decode:N@P%``: decode worker N (default 0) likewise (its rank 0);
  ``decode:N.R@P%``: its decode rank R.

Cancels are planned per request from the seed (``CancelPlan.plan``) at a point of the
request's own life, not at a wall-clock time: before it is prefilled, once it is
prefilled (before the handoff), or after K decode steps. The same seed therefore
cancels the same requests with the same outcome however the processes are scheduled.

Control drops hit decode's ``ready`` only (the spec's EnvLose of a Ready): decode's
bounded wait for the bytes ends in DecodeTimeout and a Nack, and prefill resumes and
retries with the next epoch (or, on the second loss, fails the request). Other kinds
are only delayed. A lost Ack would let prefill fail a request that decode has already
committed; this cluster does not reconcile that (the spec's one status register has no
such race), so Acks are never dropped, and prefill's own timeouts are longer than
decode's longest bounded wait (see ``prefill.py``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

DROPPABLE = frozenset({"ready"})
_KILL = re.compile(
    r"^(?:(prefill):(\d{1,3})|(decode)(?::(\d{1,3})(?:\.(\d{1,3}))?)?)@(\d{1,3}(?:\.\d{1,6})?)%$"
)


@dataclass(frozen=True)
class Kill:
    role: str  # "prefill" | "decode"
    rank: int
    at_fraction: float  # of requests ended, in [0, 1)
    drank: int = 0  # a decode worker's rank

    @property
    def proc(self) -> str:
        return f"{self.role[0]}{self.rank}" + (f"r{self.drank}" if self.drank else "")


def parse_kill(
    text: str | None, prefill_tp: int, decode_workers: int, seed: int, decode_tp: int = 1
) -> Kill | None:
    """The kill a ``--kill`` value asks for; ValueError naming the problem."""
    if text is None or text == "none":
        return None
    if text == "random":
        rng = random.Random(f"kill/{seed}")
        targets = [("prefill", r) for r in range(prefill_tp)]
        targets += [("decode", r) for r in range(decode_workers)]
        role, rank = rng.choice(targets)
        drank = rng.randrange(decode_tp) if role == "decode" and decode_tp > 1 else 0
        return Kill(role, rank, rng.uniform(0.2, 0.8), drank)
    m = _KILL.match(text)
    if m is None:
        raise ValueError(
            f"--kill {text[:40]!r}: expected random, prefill:RANK@P%, decode@P%, "
            "decode:N@P% or decode:N.R@P% (e.g. prefill:1@30%)"
        )
    pct = float(m.group(6))
    if not 0 <= pct < 100:
        raise ValueError(f"--kill {text!r}: P={pct} not in [0, 100)")
    if m.group(1):
        rank = int(m.group(2))
        if rank >= prefill_tp:
            raise ValueError(f"--kill {text!r}: prefill rank {rank} >= --prefill-tp {prefill_tp}")
        return Kill("prefill", rank, pct / 100)
    n = int(m.group(4) or 0)
    if n >= decode_workers:
        raise ValueError(f"--kill {text!r}: decode worker {n} >= --decode-workers {decode_workers}")
    dr = int(m.group(5) or 0)
    if dr >= decode_tp:
        raise ValueError(f"--kill {text!r}: decode rank {dr} >= --decode-tp {decode_tp}")
    return Kill("decode", n, pct / 100, dr)


@dataclass(frozen=True)
class CancelPlan:
    """Each request is cancelled with probability ``p``, at a planned point of its life."""

    p: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"cancel probability {self.p} not in [0, 1]")

    def plan(self, seed: int, rid: str, steps: int) -> str | None:
        """Where the client cancels request ``rid``: None, ``queued``, ``prefilled`` or
        ``decode:K`` (after K of its ``steps`` decode steps); a function of the seed."""
        rng = random.Random(f"cancel/{seed}/{rid}")
        if not (self.p and rng.random() < self.p):
            return None
        where = rng.choice(("queued", "prefilled", "decode"))
        return where if where != "decode" else f"decode:{rng.randrange(max(1, steps))}"
