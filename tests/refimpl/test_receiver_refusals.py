"""ChunkReceiver against a peer it must not trust and installs that can fail: destination
blocks are checked before anything is installed, a failed install can be retried (it
never counts as a duplicate), and an aborted receiver installs and commits nothing."""

from __future__ import annotations

import pytest
import torch

from refimpl.blocks import BlockStatus
from refimpl.chunks import ChunkReceiver
from refimpl.errors import CancelledError, ChunkError, InUseError, StaleError
from tests.refimpl.test_transport_chunks import World, offer, world


def _untouched(w: World) -> None:
    assert torch.count_nonzero(w.dst.kv) == 0
    w.dst.allocator.check_integrity()


def test_destination_blocks_that_do_not_match_the_sent_blocks_are_refused() -> None:
    w = world()
    _, m = offer(w)
    dest = w.dst.allocator.reserve("r", 3, epoch=1)
    for bad in (dest[:2], [dest[0], dest[1], dest[0]], [*dest, dest[2]]):  # short, twice, long
        with pytest.raises(ChunkError, match="destination blocks"):
            ChunkReceiver(w.dst, m, bad)
    assert [w.dst.allocator.status(b) for b in dest] == [BlockStatus.RESERVED] * 3
    _untouched(w)


def test_destination_blocks_not_reserved_for_this_attempt_are_refused() -> None:
    w = world()
    _, m = offer(w)
    alloc = w.dst.allocator
    theirs = alloc.reserve("q", 3, epoch=1)  # another request's reservation, same epoch
    with pytest.raises(InUseError, match="not reserved for 'r'"):
        ChunkReceiver(w.dst, m, theirs)
    free = [b for b in range(w.dst.capacity) if b not in theirs]
    with pytest.raises(InUseError, match="free"):
        ChunkReceiver(w.dst, m, free)  # never reserved at all
    stale = alloc.reserve("r", 3, epoch=2)  # this request, another attempt
    with pytest.raises(StaleError, match="epoch 2"):
        ChunkReceiver(w.dst, m, stale)
    _untouched(w)


@pytest.mark.parametrize("way", ["receive", "pump", "pump overlapped"])
def test_a_failed_install_can_be_retried(way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    w = world()
    _, m = offer(w)
    dest = w.dst.allocator.reserve("r", 3, epoch=1)
    rx = ChunkReceiver(w.dst, m, dest)
    chunks = w.t.poll("data")
    real = w.dst.write_block_bytes
    fails = [dest[1]]

    def flaky(holder, b, data, src_geometry=None):  # type: ignore[no-untyped-def]
        if b in fails:
            fails.remove(b)
            raise RuntimeError("device copy failed")
        real(holder, b, data, src_geometry)

    monkeypatch.setattr(w.dst, "write_block_bytes", flaky)
    for attempt in (1, 2):  # the second time, the same chunks again: block 1 installs
        if way == "receive":
            for header, payload in chunks:
                try:
                    assert rx.receive(header, payload) is (
                        attempt == 1 or header["block_index"] == 1
                    )
                except RuntimeError:
                    assert attempt == 1 and header["block_index"] == 1
        else:
            for header, payload in chunks:
                w.t.send("data", header, payload)
            try:
                report = rx.pump(w.t, "data", overlap=way == "pump overlapped")
            except RuntimeError:
                assert attempt == 1
            else:
                # unoverlapped, the failure stopped the poll before block 2; overlapped, 2 went in
                again = [1] if way == "pump overlapped" else [1, 2]
                assert attempt == 2 and sorted(report.installed) == again
                assert report.duplicates == 3 - len(again)
        assert rx.complete is (attempt == 2)
    assert rx.missing() == [] and sorted(rx.commit()) == sorted(dest)


@pytest.mark.parametrize("overlap", [True, False])
def test_pump_reports_what_it_installed(overlap: bool) -> None:
    w = world()
    _, m = offer(w)
    rx = ChunkReceiver(w.dst, m, w.dst.allocator.reserve("r", 3, epoch=1))
    report = rx.pump(w.t, "data", overlap=overlap)
    assert sorted(report.installed) == [0, 1, 2] and rx.complete
    assert report.duplicates == report.stale == report.malformed == 0


def test_an_aborted_receiver_installs_and_commits_nothing() -> None:
    w = world()
    _, m = offer(w)
    dest = w.dst.allocator.reserve("r", 3, epoch=1)
    rx = ChunkReceiver(w.dst, m, dest)
    [(header, payload), *_] = w.t.poll("data")
    assert sorted(rx.abort()) == sorted(dest)
    assert rx.cancelled
    with pytest.raises(CancelledError):
        rx.receive(header, payload)
    with pytest.raises(CancelledError):
        rx.commit()
    assert w.dst.allocator.counts()["free"] == w.dst.capacity
    _untouched(w)
