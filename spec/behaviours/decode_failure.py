"""Decode-side failure: decode fails an attempt on its own error (``Config.decode_failure``).

Decode's own transfer error (a checksum that does not match, a load that timed out, a
peer that died) gives the attempt a terminal *failed* status on decode
(``DF_FAILED`` in ``dfl``, which belongs to decode's attempt ``dep``: a new attempt's
``DecodeReserve`` starts with clean flags). ``DecodeFail`` records it; the blocks are
then given up by ``DecodeAbort`` (fenced and freed, or quarantined on an unrevocable
transport) with a ``Nack``, so the router may still start a new attempt. A later
validate, commit (install) or step of the failed attempt on decode is a breach of
``StickyEnd``: vLLM's NIXL connector marking a request's blocks invalid on a load
error and still scheduling it, SGLang's decode going on after ``KVPoll.Failed``.

Mutant: ``validate_after_decode_failure`` (the install path, validate, commit and step,
does not read the attempt's failed status).
"""

from __future__ import annotations

from spec.common import NOT_ENABLED, Mutants, Result, put
from spec.config import Config
from spec.state import (
    COMPLETE,
    DF_FAILED,
    FILLING,
    NONE,
    RESERVED,
    WRITABLE,
    Req,
    World,
)

__all__ = ["DecodeFail", "attempt_failed", "nothing_after_decode_failure"]

_HELD = (COMPLETE, WRITABLE)


def attempt_failed(c: Config, r: Req) -> bool:
    """Has decode failed its current attempt (``dep``)?"""
    return c.decode_failure and bool(r.dfl & DF_FAILED)


def DecodeFail(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Decode's own transfer error on the attempt it is waiting for: the attempt is
    failed on decode (terminal for that attempt; the blocks go by DecodeAbort)."""
    r = w.reqs[i]
    if not c.decode_failure or not w.d_up or r.d not in (RESERVED, FILLING):
        return NOT_ENABLED
    if r.dfl & DF_FAILED:
        return NOT_ENABLED
    return put(w, i, r._replace(dfl=r.dfl | DF_FAILED))


def nothing_after_decode_failure(
    pre: World, name: str, i: int, arg: int, post: World, c: Config
) -> bool:
    """StickyEnd, per attempt on decode: an attempt decode failed is never validated
    (its replica becomes complete), committed (writable) or stepped."""
    if name == "DecodeStep" and pre.reqs[i].dfl & DF_FAILED and pre.reqs[i].d != NONE:
        return False
    for a, b in zip(pre.reqs, post.reqs, strict=True):
        if a is b or not a.dfl & DF_FAILED or b.dep != a.dep:
            continue
        if b.d in _HELD and a.d not in _HELD:
            return False
        if b.d == WRITABLE and a.d != WRITABLE:
            return False
    return True
