"""Multi-turn append on decode (spec ``spec/behaviours/turns.py``): the session's KV stays
on decode between turns, keyed by the token ids it holds; the next turn's prompt is
compared with them token by token (the longest common prefix), a divergent tail is cut
before the append, and the session's blocks are pinned from the routing decision until
the append commits. The abstract fields: ``tn`` (routed 1 / appending 2), ``ti`` (the
turn ended), ``tdv`` (decode's token ids have a tail the prompt does not share), ``tc``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from refimpl.engine.base import RX_COMMITTED
from refimpl.engine.env import EnvActions
from refimpl.engine.wire import channel
from refimpl.errors import IdentityError, OwnerError, OwnershipError
from spec.state import PREEMPTED, RUNNING

__all__ = ["TurnActions", "TurnState", "common_prefix"]

ROUTED, APPENDING = 1, 2


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The length of the longest common token-id prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(slots=True)
class TurnState:
    tn: int = 0  # 1: routed to decode (pinned); 2: the append writes
    ti: int = 0  # 1: the turn ended; the session waits for its next prompt
    tc: int = 0  # turns started after the first
    kv: tuple[int, ...] = ()  # the token ids whose KV decode holds for the session
    prompt: tuple[int, ...] | None = None  # the next turn's prompt (None: none yet)

    def divergent(self) -> bool:
        """Do decode's token ids have a tail the prompt does not share?"""
        return self.prompt is not None and common_prefix(self.kv, self.prompt) < len(self.kv)


class TurnActions(EnvActions):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.turns = [TurnState() for _ in range(self.config.n_reqs)]

    def _session_held(self, i: int) -> bool:
        return self.rx[i].phase == RX_COMMITTED and self.req[i].status == RUNNING

    def _turn_tokens(self, i: int) -> tuple[int, ...]:
        """Turn 1's token ids (the prompt decode's KV was handed off for)."""
        return tuple(100 * i + k for k in range(self.n * 2))

    # ------------------------------------------------------------ the turn's actions
    def TurnEnd(self, req: int) -> None:
        i, t = req, self.turns[req]
        if not self.config.turns or not self.d_up or not self._session_held(i):
            raise self._ne("TurnEnd", i)
        busy_step = (i, "d") in getattr(self, "inflight", {})
        if t.ti or t.tn or t.tc >= self.config.max_turns or busy_step:
            raise self._ne("TurnEnd", i)
        busy = any(self.wire.entries(channel(i, to_d)) for to_d in (True, False))
        if self.p_status(i) or busy:  # the handoff is over: source freed, nothing in flight
            raise self._ne("TurnEnd", i)
        t.ti, t.kv = 1, self._turn_tokens(i)
        t.prompt = t.kv + (7000 + i,)  # the client's next prompt extends the conversation

    def TurnEdit(self, req: int) -> None:
        i, t = req, self.turns[req]
        if not self.config.turns or t.ti != 1 or t.tn or t.divergent():
            raise self._ne("TurnEdit", i)
        if not self._session_held(i):
            raise self._ne("TurnEdit", i)
        keep = len(t.kv) // 2  # an edited history: the prompt diverges after half of it
        t.prompt = t.kv[:keep] + (9000 + i,) + t.kv[keep + 1 :] + (7000 + i,)

    def TurnRoute(self, req: int) -> None:
        i, t, m = req, self.turns[req], self.m
        if not self.config.turns or not self.d_up or t.tn or t.tc >= self.config.max_turns:
            raise self._ne("TurnRoute", i)
        held = self._session_held(i)
        if t.ti != 1 and not held:
            raise self._ne("TurnRoute", i)
        if t.ti != 1 and "two_writers_on_session" not in m:  # the turn still decodes
            raise OwnerError(f"r{i}: the session's turn still decodes (one writer)")
        if not held and "append_after_evict" not in m:  # decode no longer holds the KV
            raise OwnershipError(f"r{i}: decode no longer holds the session", prop="NothingLost")
        if t.prompt is None:  # the mutant's route of a turn that has not ended
            t.kv = self._turn_tokens(i)
            t.prompt = t.kv + (7000 + i,)
        t.tn, t.tc = ROUTED, t.tc + 1

    def TurnPrefill(self, req: int) -> None:
        i, t, r = req, self.turns[req], self.req[req]
        if not self.config.turns or t.ti != 1 or t.tn or t.tc >= self.config.max_turns:
            raise self._ne("TurnPrefill", i)
        held = self.rx[i].phase == RX_COMMITTED
        if r.status not in (RUNNING, PREEMPTED) or (held and not t.divergent()):
            raise self._ne("TurnPrefill", i)
        if held and not self.d_up:
            raise self._ne("TurnPrefill", i)
        if held:
            self._free_rx(i)
        r.status = PREEMPTED  # the whole conversation is prefilled again
        t.ti, t.tc, t.kv, t.prompt = 0, t.tc + 1, (), None

    def DecodeTurnCut(self, req: int) -> None:
        i, t = req, self.turns[req]
        if not self.config.turns or not self.d_up or t.tn != ROUTED or not t.divergent():
            raise self._ne("DecodeTurnCut", i)
        if self.rx[i].phase != RX_COMMITTED:
            raise self._ne("DecodeTurnCut", i)
        assert t.prompt is not None
        t.kv = t.kv[: common_prefix(t.kv, t.prompt)]  # the append starts at the common prefix

    def DecodeAppend(self, req: int) -> None:
        i, t = req, self.turns[req]
        if not self.config.turns or not self.d_up or t.tn != ROUTED:
            raise self._ne("DecodeAppend", i)
        if self.req[i].status != RUNNING:  # the request ended: the turn is dropped, unpinned
            t.tn, t.ti = 0, 0
            return
        if t.divergent() and "append_divergent_uncut" not in self.m:
            raise IdentityError(f"r{i}: decode's KV has a tail the prompt does not share")
        if self.rx[i].phase != RX_COMMITTED:
            raise OwnershipError(f"r{i}: decode holds no KV for the session", prop="NothingLost")
        t.tn = APPENDING

    def DecodeAppendCommit(self, req: int) -> None:
        i, t = req, self.turns[req]
        if not self.config.turns or not self.d_up or t.tn != APPENDING:
            raise self._ne("DecodeAppendCommit", i)
        if t.prompt is not None:  # the new tokens land after what decode holds
            t.kv = t.kv + t.prompt[len(t.kv) :]
        t.tn, t.ti = 0, 0

    def SessionEvict(self, req: int) -> None:
        i, t = req, self.turns[req]
        if not self.config.turns or not self.d_up or t.ti != 1 or not self._session_held(i):
            raise self._ne("SessionEvict", i)
        if t.tn and "evict_pinned_session" not in self.m:
            raise OwnershipError(f"r{i}: the session is pinned for its turn", prop="NothingLost")
        self._free_rx(i)
        self.req[i].status = PREEMPTED
        t.kv, t.prompt = (), None

    # ------------------------------------------------------------ the pin, elsewhere
    def _pinned(self, name: str, i: int) -> None:
        if self.turns[i].tn:
            raise self._ne(name, i)

    def DecodeFinish(self, req: int) -> None:
        self._pinned("DecodeFinish", req)
        super().DecodeFinish(req)

    def DecodeAbort(self, req: int) -> None:
        self._pinned("DecodeAbort", req)
        super().DecodeAbort(req)

    def DecodeAbortFenced(self, req: int) -> None:
        self._pinned("DecodeAbortFenced", req)
        super().DecodeAbortFenced(req)

    def DecodeRetract(self, req: int) -> None:
        self._pinned("DecodeRetract", req)
        super().DecodeRetract(req)  # type: ignore[misc]  # RetractActions, after this in the MRO

    def DecodeStepDispatch(self, req: int) -> None:
        t = self.turns[req]
        if t.ti or t.tn:  # nothing decodes between turns
            raise self._ne("DecodeStepDispatch", req)
        super().DecodeStepDispatch(req)  # type: ignore[misc]  # AsyncStepActions

    def DecodeStep(self, req: int) -> None:
        t = self.turns[req]
        if self.rx[req].phase == RX_COMMITTED and (t.ti or t.tn):  # nothing decodes now
            raise self._ne("DecodeStep", req)
        super().DecodeStep(req)

    def PrefillAdmit(self, req: int) -> None:
        if self.turns[req].ti:  # an evicted session: its next turn decides (TurnPrefill)
            raise self._ne("PrefillAdmit", req)
        super().PrefillAdmit(req)

    def EnvCrash(self, worker: str | int) -> None:
        super().EnvCrash(worker)
        if not self.d_up:
            for t in self.turns:
                t.tn, t.ti, t.kv, t.prompt = 0, 0, (), None
