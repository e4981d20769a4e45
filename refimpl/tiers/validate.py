"""Whether a chunk file is the one a ``DiskTier`` asked for: the manifest parsed with the
spec's strict parser, then every reason it is not (another model or geometry than the
reader's, not canonical blocks, other tokens or another position than the chunk's, another
chunk before it, a tensor other than the manifest's). ``refimpl.api.disk`` calls these
before it allocates anything; an empty list of reasons is a whole, matching chunk."""

from __future__ import annotations

from collections.abc import Sequence

from refimpl.api.geometry import KVGeometry
from refimpl.tiers.chunks import FORMAT
from refimpl.tiers.files import Header, TornFileError
from refimpl.tiers.kvio import TENSOR
from refimpl.tiers.records import HEADS_MAJOR
from spec.manifest import LocalConfig, Manifest, check_compatible
from spec.manifest import from_json as manifest_from_json

FORMAT_KEY, MANIFEST_KEY, PARENT_KEY = "kvown.format", "kvown.manifest", "kvown.parent"

__all__ = [
    "FORMAT_KEY", "MANIFEST_KEY", "PARENT_KEY", "TENSOR",
    "chunk_reasons", "manifest_reasons", "parse_manifest",
]  # fmt: skip


def parse_manifest(header: Header) -> Manifest:
    """The chunk's manifest (``ManifestError`` if it does not parse, ``TornFileError``
    if the metadata is not a tier file's)."""
    meta = header.metadata
    if meta.get(FORMAT_KEY) != FORMAT or MANIFEST_KEY not in meta:
        raise TornFileError(f"metadata: not a {FORMAT} file")
    return manifest_from_json(meta[MANIFEST_KEY])


def chunk_reasons(
    header: Header,
    m: Manifest,
    local: LocalConfig,
    token_ids: Sequence[int],
    span: tuple[int, int],
    parent: str,
    chunk_tokens: int,
) -> list[str]:
    """Why the file is not tokens ``span`` of ``token_ids`` after the chunk ``parent``."""
    meta = header.metadata
    geo = KVGeometry.from_manifest_source(m)
    reasons = manifest_reasons(m, local, token_ids, span)
    if meta.get(PARENT_KEY) != parent:
        reasons.append(f"parent: the file follows {meta.get(PARENT_KEY)!r}, not {parent!r}")
    if chunk_tokens % m.block_size:
        reasons.append(f"block size {m.block_size} does not divide {chunk_tokens}")
    e = header.entries.get(TENSOR)
    want = (m.num_blocks, *geo.rank_pool_geometry().block_shape)
    if set(header.entries) != {TENSOR} or e is None:
        reasons.append(f"tensors {sorted(header.entries)}; a file holds {TENSOR!r} alone")
    elif e.dtype != geo.torch_dtype or e.shape != want:
        reasons.append(f"tensor {TENSOR!r} is {e.dtype}{e.shape}, the manifest says {want}")
    return reasons


def manifest_reasons(
    m: Manifest, local: LocalConfig, token_ids: Sequence[int], span: tuple[int, int]
) -> list[str]:
    """Why ``m`` is not a file of tokens ``span`` of ``token_ids`` for ``local``."""
    out = list(check_compatible(m, local).reasons)
    canon = (m.layout, m.src_tp, m.src_cp, m.dst_tp, m.dst_cp, m.prefix_blocks)
    if canon != (HEADS_MAJOR, 1, 1, 1, 1, 0):
        out.append(f"not canonical blocks (layout, tp, cp, prefix): {canon}")
    if len(m.block_checksums) != m.num_blocks:
        out.append(f"{len(m.block_checksums)} checksums for {m.num_blocks} blocks")
    s, e = span
    if m.start_pos != s or m.token_ids != tuple(token_ids[s:e]):
        out.append(f"token_ids: the file's are not tokens [{s}, {e}) of the ones asked for")
    return out
