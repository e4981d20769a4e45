"""Decode failure on the API (``Config.decode_failure``): a mixin of ``ApiSubject``.

``DecodeFail`` is the engine telling the Receiver that the attempt it receives failed on
the decode side (``Receiver.fail``: its load or step failed); the API gives it up in the
same call (the spec's eager ``DecodeAbort`` of an invalid attempt: fenced, freed, the
sender nacked), and the refinement map reads ``DF_FAILED`` from the attempt's
``DecodeFailedError`` (``refimpl.api.abstract``).
"""

from __future__ import annotations

from typing import Any

from refimpl.api.wire import State
from spec.config import Config

__all__ = ["FailureActions"]

FAIL_REASON = "the engine's load of the request failed"


class FailureActions:
    """The decode-failure action; ``rid`` and ``_need`` are ``ApiActions``'s."""

    c: Config
    rx: Any
    d_up: bool
    rid: Any
    _need: Any

    def _DecodeFail(self, i: int, arg: int) -> None:
        rid = self.rid(i)
        ok = self.c.decode_failure and self.d_up and self.rx.state(rid) is State.RECEIVING
        self._need(ok, "no attempt being received")
        self.rx.fail(rid, FAIL_REASON)
