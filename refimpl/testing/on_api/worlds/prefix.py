"""A decode-side prefix on the API (``Config.prefix``): a mixin of ``ApiSubject``.

The prefix cache is the decode engine's, not the API's: at start it holds the shared
prefix (the first ``prefix`` blocks of every prompt, the model's KV of them) in blocks
of the decode pools under its own reference (``PREFIX_CACHE``). What the API does with
it is the engine author's part, and what is checked here:

    PrefillFreeze      the router asks the decode side for its prefix hit (vLLM's
                       ``get_num_new_matched_tokens``): the cached blocks, while the
                       cache holds them (else none). Decode's scheduler lends them to
                       the request, ``Receiver.expect(rid, prefix=..., prefix_tokens=...)``,
                       and every prefill rank's ``offer(..., prefix_blocks=hit)`` sends
                       the blocks after them only
    DecodeReserve      the Receiver takes the manifest: it checks the prefix against the
                       tokens and takes its own reference on the lent blocks
                       (``Receiver.held``/``result`` name them first: the spec's ``hit``);
                       its end (commit, abort, ``DecodeFinish``'s free) drops it
    DecodeEvictPrefix  the cache drops its reference: refused ``CapacityRefcount`` while a
                       request references the blocks (read from the allocator's
                       refcounts), not enabled while a manifest that counted on them is
                       in flight (the scheduler's lease: it told the router it holds
                       them; the spec's eviction there is ``tour.declined``)
    EnvCrash (decode)  the decode process's memory is gone: the cache too (spec ``pfx``)

The refinement map reads ``pfx`` and ``pfx_ref`` from the allocator
(``refimpl.api.abstract.prefix_part``), ``hit`` and ``phit`` from the Receiver's and the
Senders' attempts (``receiver_part``, ``sender_part``), and the messages' hit from their
manifest (``SpecTransport.hit_of``).
"""

from __future__ import annotations

from typing import Any

from refimpl.api.abstract import prefix_part
from refimpl.api.wire import MANIFEST
from refimpl.errors import RefcountError
from refimpl.testing.on_api.actions import BLOCK
from refimpl.testing.on_api.views import view
from refimpl.testing.on_api.wire import SpecTransport
from spec.config import Config

__all__ = ["PREFIX_CACHE", "PrefixActions"]

PREFIX_CACHE = "prefix-cache"  # the decode engine's own reference to the cached prefix


class PrefixActions:
    """The prefix cache's registers and its eviction; the state is ``ApiSubject``'s."""

    c: Config
    dp: Any
    gd: Any
    rx: Any
    net: SpecTransport
    model: Any
    d_up: bool
    rid: Any
    _need: Any
    token_ids: Any
    from_source: Any

    def prefix_init(self) -> None:
        """The cache holds the prefix at start (an earlier request left it); the Senders'
        offers' hits by (request, epoch), from the manifests they built."""
        self.pfx_blocks: tuple[int, ...] = ()
        self.offered: dict[tuple[str, int], int] = {}
        self.net.hit_of = lambda rid, epoch: self.offered.get((rid, epoch), 0)
        if not self.c.prefix:
            return
        tokens = self.c.prefix * BLOCK
        if tokens % self.gd.block_size:
            raise ValueError(
                f"{self.c.name}: a prefix of {tokens} tokens is not whole decode blocks of "
                f"{self.gd.block_size}"
            )
        n = tokens // self.gd.block_size
        blocks = self.dp.alloc.allocate(PREFIX_CACHE, n)
        kv = self.from_source(self.model.content(0, 0))[:n]  # the shared prefix's KV
        self.dp.write_full(PREFIX_CACHE, blocks, kv)
        self.pfx_blocks = tuple(blocks)

    def prefix_hit(self, i: int) -> int:
        """The router's ask at the freeze: the prefix blocks decode holds (source blocks)."""
        return self.c.prefix if self.d_up and self.pfx_blocks else 0

    def lend_prefix(self, i: int, hit: int) -> None:
        """Decode's scheduler lends the request its cached prefix (``hit`` blocks)."""
        if not self.c.prefix or not self.d_up:
            return
        tokens = self.token_ids()[: hit * BLOCK]
        held = self.pfx_blocks[: len(tokens) // self.gd.block_size]
        self.rx.expect(self.rid(i), prefix=held, prefix_tokens=tokens)

    def leased(self) -> bool:
        """A manifest that counted on the cached prefix is in flight, not taken yet."""
        for lm in self.net.flight:
            h = lm.header
            if h.get("type") == MANIFEST and self.offered.get((lm.rid, int(h["epoch"]))):
                if int(h["epoch"]) > int(view(self.rx, "part", lm.rid, self.c.blocks)["dep"]):
                    return True
        return False

    def _DecodeEvictPrefix(self, i: int, arg: int) -> None:
        self._need(self.d_up and bool(self.pfx_blocks), "no prefix cached")
        refs = self.prefix_world()["pfx_ref"]
        if refs:
            raise RefcountError(f"the prefix blocks are referenced by {refs} requests")
        self._need(not self.leased(), "lent to a manifest in flight")
        self.dp.alloc.decref(PREFIX_CACHE, list(self.pfx_blocks))
        self.pfx_blocks = ()

    def prefix_world(self) -> dict[str, Any]:
        """The spec's ``pfx`` and ``pfx_ref`` (none in a world without a prefix)."""
        if not self.c.prefix:
            return {}
        if not self.d_up:
            return {"pfx": False, "pfx_ref": 0}
        return prefix_part(self.dp.alloc, self.pfx_blocks)

    def crash_prefix(self) -> None:
        """The decode process is gone, its prefix cache with it."""
        self.pfx_blocks = ()
