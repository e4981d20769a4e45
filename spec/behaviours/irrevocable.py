"""Writes that cannot be taken back: a transport with no revoke (``Config.revocable``).

A one-sided RDMA write, or a NIXL / Mooncake transfer batch, is posted by the sender
and executed by the NICs. On a *revocable* transport decode can fence an attempt
(close the connection, revoke the registration): its later writes fail
(``DF_FENCED``), and a sender that gives up can flush its own posted writes. On an
*unrevocable* one (``revocable=False``) neither can: a posted write lands or fails on
its own, within the transport's bound on a write's lifetime (RDMA's retry timeout,
NIXL's ``xferStallTimeout``, Mooncake's transfer timeout). So:

- a sender that gives up (``PrefillTimeout``) must first see every task of its batch
  finish (``writes_drained``), and only then free its source and say ``Quiesced``;
  NIXL's cancellation "does not make its buffers immediately reusable";
- decode that gives up an attempt (``DecodeTimeout``, ``DecodeAbort`` of an invalid
  attempt) keeps its blocks ``quarantined`` while a write may still land
  (``may_fence`` is False), and frees them on ``Quiesced`` (``DecodeReclaim``) or once
  its quarantine has outlived the writer (``quarantine_over``: a second, longer
  timeout, which the model lets fire only when the sender can post no more writes of
  the attempt and none is in flight, the way a clock past the sender's timeout and the
  transport's write lifetime would). Decode's bounded exit therefore waits for the
  writer's own: ``BoundedExit`` counts the sender's timeouts and the transport's
  completions (a write landing) as exits on such a transport.

Mutants: ``free_fenced_unrevocable`` (decode frees on its timeout as if a fence had
stopped the writes) and ``batch_status_subset`` (the sender takes its batch as done
from the status of its first task only: Mooncake TENT #2055, a batch reported
finished while other tasks were still pending). Both break ``NoReuseUnderIO``.
"""

from __future__ import annotations

from spec.common import Mutants, chunks_in_flight, drop_chunks
from spec.config import Config
from spec.state import AWAIT_READY, SENDING, Req

__all__ = ["fence", "may_fence", "quarantine_over", "writes_drained"]


def may_fence(c: Config, m: Mutants) -> bool:
    """Can decode stop an attempt's writes by itself? Only on a revocable transport
    (the mutant believes it can on any)."""
    return c.revocable or "free_fenced_unrevocable" in m


def fence(c: Config, net: tuple[int, ...], epoch: int) -> tuple[int, ...]:
    """Decode fences ``epoch``: its writes in flight fail, if the transport can revoke
    them; on an unrevocable one they stay in flight."""
    return drop_chunks(net, epoch) if c.revocable else net


def writes_drained(r: Req, epoch: int, m: Mutants) -> bool:
    """The sender's own batch status: no write of ``epoch`` in flight, read from every
    task. ``batch_status_subset`` reads only the first task (chunk 0)."""
    return not chunks_in_flight(r, epoch, 0 if "batch_status_subset" in m else None)


def quarantine_over(r: Req) -> bool:
    """Decode's quarantine of attempt ``dep`` has outlived its writer: the sender can
    post no more writes of the attempt (it is not, or no longer, sending it) and none is
    in flight. The model's stand-in for a quarantine timer set longer than the sender's
    own timeout plus the transport's bound on a write's lifetime."""
    sending = r.ep == r.dep and r.ps in (AWAIT_READY, SENDING)
    return not sending and not chunks_in_flight(r, r.dep)
