"""Chunked prefix keys: a request's tokens cut into fixed-size chunks, each keyed by a
chained hash of every token up to and including it (the idea of LMCache's chunked token
database; no code of it).

    root = root_key(["my-model", "bfloat16", 32, 8, 128, ["k", "v"]], chunk_tokens=256)
    spans = chunk_spans(len(token_ids), 256)     # [(0, 256), (256, 512), (512, 600)]
    keys = chain_keys(root, token_ids, spans)     # keys[i] names tokens [0, spans[i][1])

``root_key`` digests the identity the caller gives (model, the KV's meaning) with the
chunk size and this format, so different models, geometries or chunkings never share a
key. ``chain_keys``: ``h_0 = root``, ``h_{i+1} = xxh3(h_i ":" tokens of chunk i as int64,
native order)`` (a host of the other byte order computes other keys: it misses, never
mis-hits), the project's one checksum (``refimpl.checksum.bytes_checksum``); a
chunk's key therefore depends on every token before it, so a hit on chunk ``i`` means the
whole prefix ``[0, end_i)`` is the one asked for (up to a 64-bit collision of the chain).

Chunks are ``chunk_tokens`` long (default 256) except the last, which is the tail
``[k * chunk_tokens, n)`` when ``n`` is not a multiple: the partial trailing chunk is
stored under its own key (its length is in the hashed bytes, so it never equals a full
chunk's key). It is hit by a prompt with exactly that tail at that place (the same prompt
again); a longer prompt's chunk at that place is longer, keyed differently, and the lookup
stops before it: the longer prompt hits the full chunks in front of it.
"""

from __future__ import annotations

import array
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from refimpl.checksum import bytes_checksum

if TYPE_CHECKING:
    from refimpl.api.geometry import KVGeometry, ModelIdentity

CHUNK_TOKENS = 256
KEY_PREFIX = "kv-"
FORMAT = "kvown-disk-kv/2"

__all__ = [
    "CHUNK_TOKENS", "FORMAT", "KEY_PREFIX", "chain_keys", "chunk_spans", "prefix_keys",
    "root_key",
]  # fmt: skip


def root_key(identity: Sequence[object], chunk_tokens: int) -> str:
    """The chain's start: a digest of ``identity`` (JSON-able), the chunk size, the format."""
    text = json.dumps([FORMAT, int(chunk_tokens), *identity], separators=(",", ":"))
    return bytes_checksum(text.encode())


def chunk_spans(num_tokens: int, chunk_tokens: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each chunk of ``num_tokens`` tokens; the last may be partial."""
    if type(chunk_tokens) is not int or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens!r} must be an int >= 1")
    return [(s, min(s + chunk_tokens, num_tokens)) for s in range(0, num_tokens, chunk_tokens)]


def _token_bytes(tokens: Sequence[int]) -> bytes:
    try:
        return array.array("q", tokens).tobytes()  # int64, this machine's order
    except (OverflowError, TypeError) as e:
        raise ValueError(f"token ids must be ints in int64: {e}") from None


def chain_keys(root: str, token_ids: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[str]:
    """The key of each span: the chained hash of every token up to the span's end."""
    data = _token_bytes(token_ids)
    if array.array("q").itemsize != 8:  # pragma: no cover - every platform torch runs on
        raise RuntimeError("int64 array items are not 8 bytes here")
    h, out = root, []
    for s, e in spans:
        h = bytes_checksum(h.encode() + b":" + data[8 * s : 8 * e])
        out.append(KEY_PREFIX + h)
    return out


def prefix_keys(
    model: ModelIdentity, geometry: KVGeometry, token_ids: Sequence[int], chunk_tokens: int
) -> list[str]:
    """The key of each chunk of ``token_ids`` for ``model`` (a ``ModelIdentity``) and the
    KV ``geometry`` means (a ``KVGeometry``): the one key scheme of every tier (disk and
    host). Block size, layout and TP are not in it: a chunk holds canonical blocks."""
    g, mi = geometry, model
    ident: list[object] = [
        mi.model_id, mi.adapter_id, mi.quantization, mi.rope.to_json_dict(),
        g.dtype, g.num_layers, g.kv_heads, g.head_dim, list(g.cache_fields),
    ]  # fmt: skip
    if mi.kv_scales is not None:  # a quantized cache's scales: other scales, other KV
        ident.append(list(mi.kv_scales))
    root = root_key(ident, chunk_tokens)
    return chain_keys(root, token_ids, chunk_spans(len(token_ids), chunk_tokens))
