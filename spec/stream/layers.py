"""Streamed offers: a handoff sent layer by layer (``Config.layers`` > 0; issue #30 item 2).

A streamed offer (``Sender.offer(..., layers=L)`` then ``send_layer`` per layer) is the
spec's handoff with two more points on each side:

- **each layer has its own snapshot point.** ``PrefillSendLayer`` hands the next layer
  to the sender (``Req.lay``), which copies that layer's bytes at once (``Req.cpy``):
  what leaves for that layer is the bytes at ``send_layer``, whenever the chunk is
  actually sent (at the receiver's Ready for a layer given before it). A chunk is sent
  only once every layer was given (``PrefillSendChunk``: ``lay == layers``);
- **the source may be freed early.** The offer's blocks are not pinned: the engine may
  give them back once every layer was given (``PrefillFreeSource``: ``Req.fs``), and
  another request may reuse them at once (``used_p`` no longer counts them). The
  replica ``p`` stays ``complete``: it is the sender's copies now. A Nack then finds no
  source to thaw: the request fails closed (``stream_resume``);
- **a layer is ready only in the blocks the engine reads.** Decode lands chunks in its
  staging copy (a block-size change, or ``stage=True``); ``DecodeInstallLayer`` copies
  the next layer into the blocks the engine reads (``Req.inl``), and only then may
  ``DecodeLayerReady`` report it (``Req.rdy``: ``Receiver.layer_ready``); decode
  validates the replica only once every layer is installed (``layers_installed``).

Properties (state predicates, in ``spec/properties.py``): NoReuseUnderIO, a freed
source with a layer whose bytes have not left as a copy (``stream_bytes_held``: the
bytes still to send are in blocks another request may hold now); NoPartialUse, a layer
reported ready that is not in the target blocks (``stream_ready_installed``).

Mutants: ``stream_reads_at_ready`` (send_layer takes no copy: the layer is read when
sent), ``layer_ready_on_staging`` (a layer reported ready once in staging). Each
streamed world has one attempt (``Config``): the layer registers are the attempt's.
"""

from __future__ import annotations

from spec.common import NOT_ENABLED, Mutants, Result, full_chunks, put, refuse
from spec.config import Config
from spec.state import (
    AWAIT_READY,
    CHUNKS,
    COMPLETE,
    DF_CORRUPT,
    FAILED,
    FILLING,
    G_END_FAILED,
    IDLE,
    NONE,
    RESERVED,
    RUNNING,
    SENDING,
    WRITABLE,
    Req,
    World,
    msg_kind,
)

__all__ = [
    "DecodeInstallLayer",
    "DecodeLayerReady",
    "PrefillFreeSource",
    "PrefillSendLayer",
    "layers_given",
    "layers_installed",
    "stream_bytes_held",
    "stream_ready_installed",
    "stream_sent_given",
    "stream_resume",
]

# decode holds the attempt's chunks (staging); reserved: a zero-block attempt (a whole
# prefix hit) has every layer in the prefix blocks the engine reads, nothing to land
_LANDING = (RESERVED, FILLING, COMPLETE, WRITABLE)


def layers_given(c: Config, r: Req) -> bool:
    """May a chunk of ``r`` be sent? Always without layers; else once every layer was
    given to the sender (its bytes are known)."""
    return not c.layers or r.lay >= c.layers


def PrefillSendLayer(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """``send_layer``: the next layer is computed; the sender copies its bytes now."""
    r, layers = w.reqs[i], c.layers
    if not layers or not w.p_up or r.st != RUNNING or r.p != COMPLETE:
        return NOT_ENABLED
    if r.ps not in (AWAIT_READY, SENDING) or r.lay >= layers:
        return NOT_ENABLED
    if "stream_reads_at_ready" in m:  # the bug: no copy, the layer is read when sent
        return put(w, i, r._replace(lay=r.lay + 1))
    return put(w, i, r._replace(lay=r.lay + 1, cpy=r.cpy + 1))


def PrefillFreeSource(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The engine gives a streamed offer's source blocks back once every layer was given
    (the offer's contract); another request may reuse them at once."""
    r, layers = w.reqs[i], c.layers
    if not layers or not w.p_up or r.st != RUNNING or r.p != COMPLETE or r.ps == IDLE:
        return NOT_ENABLED
    if r.fs or r.lay < layers:
        return NOT_ENABLED
    return put(w, i, r._replace(fs=1))


def layers_installed(c: Config, r: Req) -> bool:
    """May decode validate ``r``'s replica? Always without layers; else once every layer
    is in the blocks the engine reads (``DecodeInstallLayer``), not only in staging."""
    return not c.layers or r.inl >= c.layers


def stream_resume(w: World, i: int, net: tuple[int, ...]) -> World:
    """A Nack to a streamed offer whose source was freed: nothing to thaw, so the
    request fails closed (its KV must be computed again)."""
    r = w.reqs[i]
    g = r.g | G_END_FAILED
    return put(w, i, r._replace(st=FAILED, g=g, p=NONE, ps=IDLE, sent=0, phit=0, net=net))


def _staged(c: Config, r: Req) -> int:
    """Layers in decode's staging copy: all of them once every chunk landed intact."""
    if r.d not in _LANDING or r.dfl & DF_CORRUPT:
        return 0
    return c.layers if r.landed == full_chunks(c, r.hit) else 0


def DecodeInstallLayer(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Copy the next layer from staging into the blocks the engine reads."""
    r = w.reqs[i]
    if not c.layers or not w.d_up or r.inl >= _staged(c, r):
        return NOT_ENABLED
    return put(w, i, r._replace(inl=r.inl + 1))


def DecodeLayerReady(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """``layer_ready``: report the next layer to the engine, which reads it from the
    blocks it was given; only a layer installed there is ready."""
    r = w.reqs[i]
    if not c.layers or not w.d_up or r.rdy >= _staged(c, r):
        return NOT_ENABLED
    if r.rdy >= r.inl and "layer_ready_on_staging" not in m:
        return refuse("NoPartialUse")
    return put(w, i, r._replace(rdy=r.rdy + 1))


def stream_bytes_held(w: World, c: Config) -> bool:
    """NoReuseUnderIO: a request that gave its source blocks back has copied every
    layer (the bytes still to send are not read from blocks another may hold)."""
    return not c.layers or all(not r.fs or r.cpy >= c.layers for r in w.reqs)


def stream_sent_given(w: World, c: Config) -> bool:
    """FrozenSnapshot: no chunk of a streamed offer is in flight before every layer was
    given to the sender (a chunk carries the block with every layer: sent earlier, it
    would leave while the engine still computes the layers not given, into the blocks
    the snapshot is read from)."""
    if not c.layers:
        return True
    for r in w.reqs:
        if r.lay < c.layers:
            for code in r.net:
                if msg_kind(code) in CHUNKS:
                    return False
    return True


def stream_ready_installed(w: World, c: Config) -> bool:
    """NoPartialUse: every layer reported ready is in the blocks the engine reads."""
    return not c.layers or all(r.rdy <= r.inl for r in w.reqs)
