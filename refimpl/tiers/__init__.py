"""Storage tiers below host memory: the parts of the disk tier (``refimpl.api.disk``).

``files``: one safetensors file per published entry, written under a unique temp name per
writer, flushed (fsync), published by an atomic rename (and an fsync of the directory;
``write_batch``: several files flushed, then renamed in order); a reader validates the
whole header against the file's size before it allocates, and a restart removes the temp
files of writers that are gone. ``chunks``: fixed-size token chunks keyed by a chained
hash (a longer prompt hits a shorter one's chunks). ``kvio``: the bytes between a
worker's pools and chunk files (direct where the layout allows, else one reused staging
buffer), hashed once. ``records``: what a tier hands out. ``moves``: offload and reload
as ``transfer.Transfer``s (asynchronous, cancellable, block ownership on the caller's
thread). ``host``: ``HostTier``, the host's prefix cache on the same chunk keys (in the
API as ``refimpl.api.HostTier``).
"""

from refimpl.tiers.chunks import CHUNK_TOKENS, chain_keys, chunk_spans
from refimpl.tiers.files import (
    PUBLISHED_SUFFIX,
    TEMP_SUFFIX,
    Entry,
    Header,
    TornFileError,
    published_names,
    read_header,
    sweep_orphans,
    write_batch,
    write_published,
)
from refimpl.tiers.kvio import read_into
from refimpl.tiers.transfer import Cancelled, Transfer

__all__ = [
    "CHUNK_TOKENS",
    "Cancelled",
    "Transfer",
    "chain_keys",
    "chunk_spans",
    "write_batch",
    "PUBLISHED_SUFFIX",
    "TEMP_SUFFIX",
    "Entry",
    "Header",
    "TornFileError",
    "published_names",
    "read_header",
    "read_into",
    "sweep_orphans",
    "write_published",
]
