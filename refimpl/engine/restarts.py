"""Restarts on the engine (spec/behaviours/restarts.py): incarnations and their fence.

A worker that crashed and came back (``EnvRestart``) is a new incarnation: its pools were
re-created empty at the crash and its memory registered afresh. A control message carries
its sender's incarnation (``send`` stamps the header's ``inc``), a one-sided write the
incarnation of the decode registration it targets (the ``inc`` of the ``Ready`` that
opened the attempt, ``rinc``). A receiver fences what belongs to an older incarnation:
the stale control message is refused (``StaleError``) and then discarded; the stale write
fails at the invalid registration and lands nowhere.
"""

from __future__ import annotations

from typing import Any

from refimpl.engine.base import KIND_TO_DECODE, EngineBase, NotEnabled
from refimpl.engine.wire import parse
from refimpl.transport import Payload
from spec.manifest import Manifest

__all__ = ["RestartBase"]


class RestartBase(EngineBase):
    """The engine's state plus the incarnations: ``p_inc``/``d_inc`` per worker, ``rinc``
    and the frozen manifest per request (prefill's), and ``step_inc``: the incarnation
    of the message the current step names."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.p_inc, self.d_inc, self.step_inc = 0, 0, 0
        self.rinc = [0] * self.config.n_reqs
        self.frozen_manifest: list[Manifest | None] = [None] * self.config.n_reqs

    def send(
        self, i: int, kind: str, epoch: int, idx: int = 0, payload: Payload = b"", **extra: object
    ) -> None:
        """Stamp the incarnation (a write's is given: its target's), then queue it."""
        to_d = KIND_TO_DECODE[kind]
        inc = extra.pop("inc", self.p_inc if to_d else self.d_inc)
        if inc:
            extra["inc"] = inc
        super().send(i, kind, epoch, idx, payload, **extra)

    def find(self, i: int, msg: str, epoch: int, idx: int) -> tuple[str, int]:
        """As ``EngineBase.find``, and the message must be of the incarnation named."""
        ch, k = super().find(i, msg, epoch, idx)
        if parse(self.wire.entries(ch)[k][0]).get("inc", 0) != self.step_inc:
            raise NotEnabled(f"no {msg}(e={epoch},i={idx},inc={self.step_inc}) of r{i} in flight")
        return ch, k

    def fenced(self, msg: str) -> bool:
        """Is the message the current step names of an older incarnation than its peer's
        (a write: than the decode pool it targets)? Then it changes nothing. The two
        restart mutants drop the check for control messages / for writes."""
        if not self.config.restarts:
            return False
        write = msg in ("Chunk", "ChunkCorrupt")
        now = self.d_inc if write or not KIND_TO_DECODE[msg] else self.p_inc
        if self.step_inc >= now:
            return False
        return ("restart_keeps_pool" if write else "stale_incarnation_accepted") not in self.m
