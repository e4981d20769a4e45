"""Each byte hashed once per side (issue #30's benchmark goals), with the checks' teeth.

A whole-block offer takes the writer's checksums (``offer(checksums=...)``, taken when
prefill wrote the blocks): the sender then reads no KV to hash it, and the receiver still
hashes every chunk before counting it (as it landed in its reserved blocks, or before
writing it), so a stale checksum fails the handoff with 0 blocks held. A streamed
offer's seal lists its chunks' checksums (no second, per-block digest): the sender
hashes each chunk as it copies it, the receiver before it counts it, and commits only
if the chunks it installed are the ones sealed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import xxhash

from refimpl import State, channels, handoff
from refimpl.api import install
from refimpl.checksum import block_checksum, bytes_checksum
from refimpl.errors import ChecksumError
from refimpl.memory import views
from refimpl.transport import Fault
from tests.library.lib_helpers import geo, held, pair, prefill

TOKENS = list(range(100, 112))  # 12 tokens: 3 blocks of 4
BIG = 512  # a hash of this many bytes or more is of KV (the others: block-table keys)


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The KV bytes hashed, however a path hashes them (one-shot or running xxh3)."""
    seen: list[int] = []
    one_shot, running = xxhash.xxh3_64_hexdigest, xxhash.xxh3_64

    def hexdigest(data: Any) -> str:
        if memoryview(data).nbytes >= BIG:
            seen.append(memoryview(data).nbytes)
        return one_shot(data)

    class Running:
        def __init__(self) -> None:
            self.h, self.n = running(), 0

        def update(self, data: Any) -> None:
            self.n += memoryview(data).nbytes
            self.h.update(data)

        def hexdigest(self) -> str:
            if self.n >= BIG:
                seen.append(self.n)
            return self.h.hexdigest()

    monkeypatch.setattr(xxhash, "xxh3_64_hexdigest", hexdigest)
    monkeypatch.setattr(xxhash, "xxh3_64", Running)
    yield seen


def _sums(p: Any, rid: str) -> list[str]:
    """What the writer would have taken: each block's xxh3 (the canonical block)."""
    return [block_checksum(p.src.pools[0].kv[b]) for b in p.src.alloc.blocks_of(rid)]


def test_the_writers_checksums_spare_the_senders_hash(hashed: list[int]) -> None:
    p = pair(geo(), geo())
    prefill(p, "r", len(TOKENS))
    sums, kv_bytes = _sums(p, "r"), 3 * p.tx.geometry.rank_pool_geometry().block_bytes
    hashed.clear()
    got = handoff(p.tx, p.rx, "r", TOKENS, checksums=sums)
    assert got.received.manifest.block_checksums == tuple(sums)
    assert sum(hashed) == kv_bytes  # the receiver's check alone (before: 2x, the freeze's)
    assert held(p.src) == {} and held(p.dst) == {"owned": 3}


def test_a_stale_writers_checksum_fails_with_nothing_held() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", len(TOKENS))
    sums = _sums(p, "r")
    p.src.pools[0].kv[p.src.alloc.blocks_of("r")[1]].add_(1.0)  # written after its checksum
    with pytest.raises(ChecksumError, match="block 1"):
        handoff(p.tx, p.rx, "r", TOKENS, checksums=sums)
    assert p.tx.state("r") is State.REFUSED or p.tx.state("r") is State.ABORTED
    assert held(p.dst) == {} and p.rx.held() == {} and p.tx.held() == {}


BAD = {
    "too few": (lambda s: s[:2], "2 for 3 blocks"),
    "one string": (lambda s: "".join(s), "a string for 3 blocks"),
    "not hex": (lambda s: [*s[:2], "z" * 16], r"checksums\[2\]"),
    "upper case": (lambda s: [*s[:2], s[2].upper()], r"checksums\[2\]"),
    "not a str": (lambda s: [*s[:2], 7], r"checksums\[2\] = 7"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_writers_checksums_are_refused_by_name(case: str) -> None:
    p = pair(geo(), geo())
    prefill(p, "r", len(TOKENS))
    bad, says = BAD[case]
    with pytest.raises(ValueError, match=says):
        p.tx.offer("r", TOKENS, checksums=bad(_sums(p, "r")))
    assert p.tx.held() == {} and p.tx.records() == 0 and held(p.src) == {"owned": 3}
    assert p.t.in_flight(channels("r").to_receiver) == 0  # no manifest left


@pytest.mark.parametrize("where", ["streamed", "tp2"])
def test_writers_checksums_where_they_cannot_stand_for_the_manifests(where: str) -> None:
    p = pair(geo(tp=2) if where == "tp2" else geo(), geo())
    prefill(p, "r", len(TOKENS))
    sums = ["0" * 16] * 3
    says = "streamed one hashes" if where == "streamed" else "needs canonical blocks"
    with pytest.raises(ValueError, match=says):
        p.tx.offer("r", TOKENS, checksums=sums, layers=2 if where == "streamed" else None)
    assert p.tx.held() == {} and p.tx.records() == 0


def test_a_streamed_offer_hashes_each_byte_once_per_side(hashed: list[int]) -> None:
    p = pair(geo(), geo())
    prefill(p, "r", len(TOKENS))
    kv_bytes = 3 * p.tx.geometry.rank_pool_geometry().block_bytes
    hashed.clear()
    handoff(p.tx, p.rx, "r", TOKENS, layered=True)
    assert sum(hashed) == 2 * kv_bytes  # before: 4x (a per-block seal digest on each side)
    assert held(p.dst) == {"owned": 3}


class Forger:
    """A transport in the middle that rewrites one layer chunk and its header's checksum
    consistently: the chunk's own check passes; only the seal can tell."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.done = inner, False

    def send(self, channel: str, header: Any, payload: Any = b"") -> None:
        if header.get("type") == "chunk" and header.get("layer") == 1 and not self.done:
            self.done, payload = True, bytes(len(payload))  # zeros instead of the KV
            header = {**header, "checksum": xxhash.xxh3_64_hexdigest(payload)}
        self.inner.send(channel, header, payload)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_consistently_forged_chunk_is_caught_by_its_seal_with_nothing_held() -> None:
    p = pair(geo(), geo())
    p.tx.transport = Forger(p.t)  # the sender's messages pass through the forger
    prefill(p, "r", len(TOKENS))
    with pytest.raises(ChecksumError, match=r"layer 1 \(rank 0\) of blocks 0\+3"):
        handoff(p.tx, p.rx, "r", TOKENS, layered=True)
    assert p.rx.state("r") is State.ABORTED and p.tx.state("r") is State.ABORTED
    assert held(p.dst) == {} and p.rx.held() == {} and p.tx.held() == {}


# ------------------------------------------------ a chunk hashed as it landed (one read)
@pytest.mark.parametrize("landed", [True, False], ids=["as-landed", "hash-first"])
@pytest.mark.parametrize("layered", [False, True], ids=["whole", "layers"])
def test_a_corrupt_chunk_is_never_counted_and_everything_goes_back(
    monkeypatch: pytest.MonkeyPatch, landed: bool, layered: bool
) -> None:
    """Either order (copied into the reserved blocks then hashed there, or hashed then
    copied): a corrupt chunk ends the attempt with its reason and 0 blocks on both sides,
    and the engine never saw a ready layer of it."""
    monkeypatch.setattr(install, "HASH_AS_LANDED", landed)
    p = pair(geo(), geo())
    prefill(p, "r", len(TOKENS))
    p.t.inject(channels("r").to_receiver, Fault.CORRUPT, skip=2)  # the second chunk
    ready: list[int] = []
    real = p.rx.poll

    def poll(rid: str) -> int:
        n = real(rid)
        layers = range(p.rx.geometry.num_layers if layered else 0)
        ready.append(sum(p.rx.layer_ready(rid, ly) for ly in layers))
        return n

    monkeypatch.setattr(p.rx, "poll", poll)
    says = "as they landed" if landed else "do not hash to the header"
    with pytest.raises(ChecksumError, match=says):
        handoff(p.tx, p.rx, "r", TOKENS, layered=layered)
    assert max(ready) <= 1  # layer 0 may have been ready; layer 1 (corrupt) never was
    assert p.rx.state("r") is State.ABORTED
    assert held(p.dst) == {} and p.rx.held() == {} and p.tx.held() == {}


@pytest.mark.parametrize("piece", [7, 64, 1 << 19])
def test_copy_hashed_lands_each_piece_in_its_block_and_hashes_them_in_block_order(
    monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    monkeypatch.setattr(views, "PIECE", piece)
    pool = torch.zeros(6, 2, 24, dtype=torch.uint8)  # 6 blocks; layer view [6, 24]
    lv = pool.select(1, 1)
    payload = bytes(range(3 * 24))  # three blocks' pieces, in block order
    span = views.landing(lv)
    assert span is not None
    assert views.copy_hashed(span, [4, 0, 2], payload) == bytes_checksum(payload)
    for j, b in enumerate([4, 0, 2]):
        assert bytes(lv[b].numpy()) == payload[j * 24 : (j + 1) * 24]
    assert not pool.select(1, 0).any() and not lv[[1, 3, 5]].any()  # nothing else written
    assert views.landing(lv.t()) is None  # pieces not contiguous: hashed, then written
    with pytest.raises(ValueError, match=r"not in \[0, 6\)"):
        views.copy_hashed(span, [6], payload[:24])
    for bad in ([True], [-1], []):  # a bool is not a block id; nothing is written
        with pytest.raises(ValueError, match="not in"):
            views.copy_hashed(span, bad, payload[:24])
    assert not lv[[1, 3, 5]].any()


def test_gather_into_copies_each_blocks_piece_in_block_order() -> None:
    """send_layer's copy of a layer (``Stream.copy_layer``): each block's piece, in the
    order asked, into one contiguous buffer; a bad id is refused before any byte moves."""
    pool = torch.arange(6 * 2 * 24, dtype=torch.int32).to(torch.uint8).view(6, 2, 24)
    lv = pool.select(1, 1)  # pieces 48 bytes apart
    span = views.landing(lv)
    assert span is not None
    out = bytearray(3 * 24)
    views.gather_into(span, [4, 0, 2], memoryview(out))
    assert bytes(out) == b"".join(bytes(lv[b].numpy()) for b in (4, 0, 2))
    for bad in ([6], [True], [-1], []):
        spare = bytearray(24)
        with pytest.raises(ValueError, match=r"not in \[0, 6\)"):
            views.gather_into(span, bad, memoryview(spare))
        assert spare == bytearray(24)
