"""Content identity: a block is used only when its content is the one its hash names.

The Handoff lists the attempt's blocks and a hash of each block's content (the
prefix-cache key: vLLM's block-hash chain, SGLang's radix / HiCache page hashes, the
chunk hashes of Dynamo and LMCache). A block's content can differ from its identity in
two ways, and each has its guard:

- **a foreign prefix block.** Decode's cached prefix blocks were evicted and reused for
  another request's KV while an index that lags (a router's view built from KV events,
  a lookup by block id or slot instead of by hash) still lists them
  (``DecodeRecyclePrefix``: ``World.pfx_ok`` becomes False). Decode counts a prefix
  hit only when the cached blocks' own hash (set when written, reset on reuse) equals
  the hash the manifest lists; otherwise it is a miss and the blocks are sent;
- **a block the sender never staged.** The sender stages its frozen blocks in order
  (``PrefillStage``: computed and copied into its send buffer; ``Req.stg`` counts
  them) and sends a block's chunk only once it is staged. The hash it advertises is
  the tokens'; the bytes of an unstaged block are whatever the buffer held, and decode
  cannot tell them from good ones. The guard is the sender's, and a breach is the
  sender's fault, not the network's (``ChunkUnstaged`` never spends the fault budget).

Gated by ``Config.identity``; the property is ``ContentIdentity``.
"""

from __future__ import annotations

from spec.common import NOT_ENABLED, Mutants, Result, put, refuse, sent_blocks
from spec.config import Config
from spec.state import (
    AWAIT_READY,
    CHUNKS,
    COMPLETE,
    DF_UNSTAGED,
    M_CHUNK_UNSTAGED,
    RUNNING,
    SENDING,
    WRITABLE,
    World,
    msg_idx,
    msg_kind,
)

_HELD = (COMPLETE, WRITABLE)


def prefix_hit(w: World, c: Config, m: Mutants) -> int:
    """Prefix blocks decode counts as held for a new attempt: the cached prefix, when its
    blocks' hash matches the manifest's (``prefix_hash_unchecked`` skips the compare)."""
    if not w.pfx:
        return 0
    if not w.pfx_ok and "prefix_hash_unchecked" not in m:
        return 0  # a stale index entry: the blocks hold other KV now, a miss
    return c.prefix


def staged(c: Config, stg: int, phit: int, pos: int) -> bool:
    """Is the block of the ``pos``-th chunk a source rank sends (after ``phit`` prefix
    blocks decode holds) staged? Always, in a world without staging."""
    return not c.identity or phit + pos < stg


def PrefillStage(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Stage the next block of the frozen snapshot (compute done, copied to the send
    buffer): only a staged block's chunk may be sent."""
    r = w.reqs[i]
    if not c.identity or not w.p_up or r.st != RUNNING or r.p != COMPLETE:
        return NOT_ENABLED
    if r.ps not in (AWAIT_READY, SENDING) or r.stg >= c.blocks:
        return NOT_ENABLED
    return put(w, i, r._replace(stg=r.stg + 1))


def DecodeRecyclePrefix(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The cached prefix blocks, unreferenced, are reused for another request's KV; an
    index that lags still lists them (the hash kept with each block is reset)."""
    if not c.identity or not w.d_up or not w.pfx or not w.pfx_ok:
        return NOT_ENABLED
    if w.pfx_ref > 0:
        return refuse("CapacityRefcount")
    return w._replace(pfx_ok=False)


def content_identity(w: World, c: Config) -> bool:
    """ContentIdentity, on the state: no validated or committed replica holds a chunk the
    sender never staged, or counts prefix blocks whose content is another request's; and
    no chunk of a block its sender never staged is on the wire (the sender's half)."""
    for r in w.reqs:
        if r.d in _HELD and (r.dfl & DF_UNSTAGED or (r.hit and not w.pfx_ok)):
            return False
        if c.identity and any(msg_kind(x) == M_CHUNK_UNSTAGED for x in r.net):
            return False
    return True


def sent_staged(pre: World, name: str, i: int, arg: int, post: World, c: Config) -> bool:
    """ContentIdentity, on a step: every chunk the sender puts on the wire is of a block
    it has staged (read from the chunk's index and the sender's staging count)."""
    if not c.identity or name != "PrefillSendChunk":
        return True
    a, b = pre.reqs[i], post.reqs[i]
    per_rank = sent_blocks(c, a.phit)
    new = list(b.net)
    for code in a.net:
        if code in new:
            new.remove(code)
    for code in new:
        if msg_kind(code) in CHUNKS and per_rank:
            if not staged(c, a.stg, a.phit, msg_idx(code) % per_rank):
                return False
    return True


__all__ = [
    "DecodeRecyclePrefix",
    "PrefillStage",
    "content_identity",
    "prefix_hit",
    "sent_staged",
    "staged",
]
