"""``Progress``: one call per engine step advances every request of one end.

An engine's KV connector is asked once per model step what changed (vLLM's worker:
``get_finished()`` for the requests that finished sending and receiving, and the block
ids of failed loads); it does not poll each request in each wait (two requests waiting
on each other deadlock a caller that polls only the one it waits for). ``Progress``
wraps one end (``Sender``, ``Receiver``, or one TP rank's ``RankSender`` /
``RankReceiver``) and owns its deadlines:

    tx = Progress(Sender(...), timeout_s=30.0)
    tx.offer("req-1", token_ids, blocks=...)        # as Sender.offer, and watched
    rx = Progress(Receiver(...), timeout_s=30.0)
    rx.expect("req-1", decode_room=64)              # as Receiver.expect, and watched
    step = tx.progress()                            # every watched request, once
    step.finished_sending, step.finished_receiving, step.failed

``progress()`` polls every watched request once, in the order they were watched, then
ends each one whose deadline passed (``abort`` with a reason naming the deadline), and
reports each request exactly once when it ends: ``finished_sending`` (the receiver
acked: the source blocks may be freed or reused), ``finished_receiving`` (request id ->
the committed block ids: the request may run), ``failed`` (its reasons, named by the
end: a refusal, a cancel, a timeout, a dead peer as soon as the transport reports it,
and the block ids it held when it ended, all given back). A reported request is
forgotten by the end (``forget``), so a long-running process keeps records of live
requests only. Nothing here changes the protocol: every state change is the end's own
(``poll``, ``abort``), and ``Progress`` reads the end's state, never a copy of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from refimpl.api.ranks import RankReceiver, RankSender, sub_id
from refimpl.api.receiver import Receiver
from refimpl.api.sender import Sender
from refimpl.api.wire import State, channels, peer_failed


@dataclass(frozen=True, slots=True)
class Failed:
    """A request that ended without its handoff: why, and the blocks it gave back."""

    request_id: str
    state: State  # REFUSED (before anything was reserved or sent) or ABORTED
    reasons: tuple[str, ...]
    blocks: tuple[int, ...]  # held by the attempt when it ended (pinned or reserved)


@dataclass(frozen=True, slots=True)
class Step:
    """What ended since the last ``progress()`` (each request reported once)."""

    finished_sending: tuple[str, ...] = ()
    finished_receiving: dict[str, tuple[int, ...]] = field(default_factory=dict)
    failed: tuple[Failed, ...] = ()
    live: int = 0  # requests still watched after this step


class Progress:
    """Every request of one end, advanced by one call (see the module)."""

    def __init__(
        self,
        end: Sender | Receiver | RankSender | RankReceiver,
        *,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        forget: bool = True,
    ) -> None:
        """``timeout_s``: each watched request's deadline, from when it was watched
        (None: no deadline of kvown's; a dead peer still ends it); ``forget``: drop a
        request's records on the end once it was reported."""
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"Progress: timeout_s={timeout_s!r} must be > 0 or None")
        self.end, self.timeout_s, self.clock, self.forget = end, timeout_s, clock, forget
        # watched rids, in watch order: (deadline on the clock, its timeout) or None
        self._deadline: dict[str, tuple[float, float] | None] = {}

    # ------------------------------------------------------------ watching
    def watch(self, request_id: str, *, timeout_s: float | None = None) -> None:
        """Report ``request_id`` from now on; ``timeout_s`` overrides the endpoint's."""
        t = self.timeout_s if timeout_s is None else timeout_s
        if t is not None and not t > 0:
            raise ValueError(f"Progress.watch: timeout_s={t!r} must be > 0")
        self._deadline[request_id] = None if t is None else (self.clock() + t, t)

    def offer(self, request_id: str, *args: Any, timeout_s: float | None = None,
              **kw: Any) -> Any:  # fmt: skip
        """The Sender's ``offer``, then watched (its manifest is the return value)."""
        if not isinstance(self.end, Sender | RankSender):
            raise TypeError(f"Progress.offer: the end is a {type(self.end).__name__}")
        out = self.end.offer(request_id, *args, **kw)
        self.watch(request_id, timeout_s=timeout_s)
        return out

    def expect(self, request_id: str, *, timeout_s: float | None = None, **kw: Any) -> None:
        """The Receiver's ``expect``, then watched."""
        if not isinstance(self.end, Receiver | RankReceiver):
            raise TypeError(f"Progress.expect: the end is a {type(self.end).__name__}")
        self.end.expect(request_id, **kw)
        self.watch(request_id, timeout_s=timeout_s)

    def watched(self) -> tuple[str, ...]:
        return tuple(self._deadline)

    # ------------------------------------------------------------ the step
    def progress(self) -> Step:
        """Poll every watched request once, end the overdue, report what ended."""
        end, sending, receiving, failed = self.end, [], {}, []
        rids = list(self._deadline)
        held = self._held(rids)
        for rid in rids:
            end.poll(rid)
        now = self.clock()
        for rid in rids:
            st = end.state(rid)
            due = self._deadline[rid]
            if not st.final and due is not None and now >= due[0]:
                t = due[1]
                end.abort(rid, f"timeout: no end within {t:.3g} s (the deadline of kvown's)")
                st = end.state(rid)
                if not st.final:  # nothing began here yet (no manifest): it ends now
                    failed.append(Failed(rid, State.ABORTED, (f"timeout after {t:.3g} s "
                                  "with no manifest",), ()))  # fmt: skip
                    self._done(rid)
                    continue
            if not st.final and isinstance(end, Receiver) and st is State.WAITING:
                gone = peer_failed(end.transport, [channels(rid).to_sender])
                if gone:  # no manifest yet, and none can come: nothing was reserved
                    why = f"the sender's process is gone before its manifest: {gone}"
                    failed.append(Failed(rid, State.ABORTED, (why,), ()))
                    self._done(rid)
                    continue
            if not st.final:
                continue
            if st is State.DONE:
                if isinstance(end, Sender | RankSender):
                    sending.append(rid)
                else:
                    receiving[rid] = self._blocks(rid)
            else:
                failed.append(Failed(rid, st, tuple(self._reasons(rid)), held.get(rid, ())))
            self._done(rid)
        return Step(tuple(sending), receiving, tuple(failed), len(self._deadline))

    # ------------------------------------------------------------ reading the end
    def _done(self, rid: str) -> None:
        del self._deadline[rid]
        if self.forget:
            self.end.forget(rid)

    def _held(self, rids: list[str]) -> dict[str, tuple[int, ...]]:
        """The blocks each request holds before the step (what a failure gives back)."""
        h = self.end.held()
        if isinstance(self.end, RankReceiver):
            return {r: h[s] for r in rids if (s := sub_id(r, self.end.rank)) in h}
        return {r: h[r] for r in rids if r in h}

    def _blocks(self, rid: str) -> tuple[int, ...]:
        end = self.end
        if isinstance(end, RankReceiver):
            return end.blocks(rid)
        assert isinstance(end, Receiver)
        return end.result(rid).blocks

    def _reasons(self, rid: str) -> list[str]:
        end = self.end
        if isinstance(end, Receiver):
            err = end.error(rid)
            return [str(err)] if err is not None else []
        return end.reasons(rid)
