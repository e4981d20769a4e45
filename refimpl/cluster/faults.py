"""Fault injection of a cluster run: kills (SIGKILL), control delays and drops, cancels.

``--kill`` forms:

- ``random``: one worker process, chosen at random (any prefill rank or the decode
  worker), when a random 20..80 % of the requests have ended;
- ``prefill:RANK@P%``: prefill rank RANK when P % of the requests have ended;
- ``decode@P%``: the decode worker likewise (the decode worker is rank 0).

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
_KILL = re.compile(r"^(?:(prefill):(\d+)|(decode))@(\d+(?:\.\d+)?)%$")


@dataclass(frozen=True)
class Kill:
    role: str  # "prefill" | "decode"
    rank: int
    at_fraction: float  # of requests ended, in [0, 1)

    @property
    def proc(self) -> str:
        return f"{self.role[0]}{self.rank}"


def parse_kill(text: str | None, prefill_tp: int, decode_tp: int, seed: int) -> Kill | None:
    """The kill a ``--kill`` value asks for; ValueError naming the problem."""
    if text is None or text == "none":
        return None
    if text == "random":
        rng = random.Random(f"kill/{seed}")
        targets = [("prefill", r) for r in range(prefill_tp)]
        targets += [("decode", r) for r in range(decode_tp)]
        role, rank = rng.choice(targets)
        return Kill(role, rank, rng.uniform(0.2, 0.8))
    m = _KILL.match(text)
    if m is None:
        raise ValueError(
            f"--kill {text!r}: expected random, prefill:RANK@P% or decode@P% (e.g. prefill:1@30%)"
        )
    pct = float(m.group(4))
    if not 0 <= pct < 100:
        raise ValueError(f"--kill {text!r}: P={pct} not in [0, 100)")
    if m.group(1):
        rank = int(m.group(2))
        if rank >= prefill_tp:
            raise ValueError(f"--kill {text!r}: prefill rank {rank} >= --prefill-tp {prefill_tp}")
        return Kill("prefill", rank, pct / 100)
    return Kill("decode", 0, pct / 100)


@dataclass(frozen=True)
class CancelPlan:
    """Each request is cancelled with probability ``p``, ``0..window_s`` after admission."""

    p: float = 0.0
    window_s: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"cancel probability {self.p} not in [0, 1]")
        if self.window_s < 0:
            raise ValueError(f"cancel window {self.window_s} < 0")

    def draw(self, rng: random.Random) -> float | None:
        """Seconds after admission at which to cancel, or None."""
        if self.p and rng.random() < self.p:
            return rng.uniform(0.0, self.window_s)
        return None
