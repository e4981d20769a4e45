"""Storage tiers below host memory: crash-safe files for a disk tier.

``files``: one safetensors file per published entry, written under a unique temp name per
writer, flushed (fsync), published by an atomic rename (and an fsync of the directory);
a reader validates the whole header against the file's size before it allocates, and a
restart removes the temp files of writers that are gone. The KV meaning of a file (model
identity, geometry, token ids, per-block checksums) is ``refimpl.api.disk``'s.
"""

from refimpl.tiers.files import (
    PUBLISHED_SUFFIX,
    TEMP_SUFFIX,
    Entry,
    Header,
    TornFileError,
    published_names,
    read_header,
    read_into,
    sweep_orphans,
    write_published,
)

__all__ = [
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
