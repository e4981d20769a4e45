"""A streamed offer's sender side: each layer copied at ``send_layer``, sent on ready.

``Sender.send_layer(rid, layer)`` copies that layer of every sent block of every source
rank held here (and hashes it into its block's seal digest, layer order) at once: what
leaves is the bytes at ``send_layer``, so the request may free or reuse its blocks as
soon as it returned (FrozenSnapshot / NoReuseUnderIO for a streamed offer, whose blocks
are not pinned). Copies of layers computed before the receiver's ready wait here (one
layer's bytes per rank and block, at most all of them) and are dropped when the attempt
ends. After the last layer, one ``seal`` per rank carries its blocks' digests.

The ``stream_reads_at_ready`` switch (``refimpl.api.switches``) is the bug this fixes: a
layer's bytes are read when they are sent, not when ``send_layer`` was called.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from refimpl.api.wire import CHUNK, SEAL
from refimpl.checksum import byte_view, bytes_checksum
from refimpl.engine.data import RankPools
from refimpl.transport import Transport


@dataclass
class Stream:
    """Layers computed, layers sent, each (rank, block)'s digest, the copies to send."""

    layers: int
    blocks: tuple[int, ...]  # the sent blocks' ids here
    computed: int = 0  # layers [0, computed) are written and may be sent
    sent: int = 0  # layers [0, sent) are on the wire
    copied: int = 0  # layers whose bytes were copied here (at send_layer, or by the bug later)
    digests: dict[tuple[int, int], Any] = field(default_factory=dict)  # (rank, j) -> xxh3
    sealed: bool = False
    copies: deque[tuple[int, int, int, bytes]] = field(default_factory=deque)  # to send:
    # (layer, rank, j, the bytes at send_layer), oldest first

    def copy_layer(self, pools: RankPools, ranks: Sequence[tuple[int, int]], layer: int) -> None:
        """Copy layer ``layer`` of every sent block of each (source rank, pool index)."""
        for r, pool in ranks:
            kv = pools.pools[pool].kv
            for j, b in enumerate(self.blocks):
                t = kv[b][layer]
                payload = bytes(byte_view(t if t.device.type == "cpu" else t.cpu()))
                self.digests.setdefault((r, j), xxhash.xxh3_64()).update(payload)
                self.copies.append((layer, r, j, payload))
        self.copied += 1

    def flush(
        self,
        transport: Transport,
        channel: str,
        head: dict[str, Any],
        first_block: int,
        ranks: Sequence[int],
        read_now: Any = None,
    ) -> tuple[int, int]:
        """Send every computed layer not sent yet, then the seals once all are out;
        returns (chunks, payload bytes) sent. ``read_now(layer)``: the bug switch's read
        of a layer at this point (None: the copies taken at send_layer)."""
        n = nbytes = 0
        while self.sent < self.computed:
            if read_now is not None:
                read_now(self.sent)
            while self.copies and self.copies[0][0] == self.sent:
                layer, r, j, payload = self.copies.popleft()
                header = {
                    **head,
                    "type": CHUNK,
                    "block_index": first_block + j,
                    "rank": r,
                    "layer": layer,
                    "checksum": bytes_checksum(payload),
                }
                transport.send(channel, header, payload)
                n, nbytes = n + 1, nbytes + len(payload)
            self.sent += 1
        if self.sent == self.layers and not self.sealed:
            self.sealed = True
            for r in ranks:
                digests = [self.digests[(r, j)].hexdigest() for j in range(len(self.blocks))]
                transport.send(channel, {**head, "type": SEAL, "rank": r, "digests": digests})
        return n, nbytes
