"""Regressions of the public API's protocol bugs found by trying it (issue #23, item 7):
a decode-side prefix holding other tokens, a retry at the old epoch, ``state()`` before
the manifest, a forged manifest that allocates before it is checked, a forged nack, and
an epoch of ``true`` or ``1.0``. Each test failed before its fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from refimpl import KVGeometry, State, channels, handoff, read_kv, write_kv
from refimpl.checksum import bytes_checksum
from refimpl.errors import CancelledError, ManifestError
from refimpl.transport import Fault, InProcessTransport, Payload
from tests.library.lib_helpers import Pair, geo, held, pair, prefill


def _answers(p: Pair, rid: str = "r") -> list[dict[str, Any]]:
    return [h for h, _ in p.t.poll(channels(rid).to_sender)]


# ---------------------------------------------------------------- a prefix of other tokens
def _decode_prefix(p: Pair, kv: torch.Tensor, tokens: int) -> list[int]:
    """A block the decode side holds (its own request), filled with ``kv``'s first tokens."""
    blocks = p.dst.alloc.allocate("cached", tokens // p.rx.geometry.block_size)
    write_kv(p.dst, "cached", blocks, [[f[:, :tokens] for f in layer] for layer in kv])
    return blocks


def test_a_prefix_block_holding_other_tokens_is_refused_by_name() -> None:
    p = pair(geo(), geo())
    kv = prefill(p, "r", 10)
    prefix = _decode_prefix(p, kv, 4)
    other = [7, 7, 7, 7]  # the block holds the KV of tokens 7 7 7 7, not of 0 1 2 3
    with pytest.raises(ManifestError, match="prefix_tokens"):
        handoff(p.tx, p.rx, "r", list(range(10)), prefix=prefix, prefix_tokens=other)
    assert held(p.dst) == {"owned": 1}  # only the cached block; no reference taken
    assert p.dst.alloc.refcount(prefix[0]) == 1
    assert held(p.src) == {"owned": 3}  # pins released


def test_a_prefix_without_its_token_ids_is_refused() -> None:
    p = pair(geo(), geo())
    kv = prefill(p, "r", 10)
    prefix = _decode_prefix(p, kv, 4)
    with pytest.raises(ValueError, match="prefix_tokens"):
        handoff(p.tx, p.rx, "r", list(range(10)), prefix=prefix)
    with pytest.raises(ValueError, match="prefix_tokens: 3 token ids for 1 blocks of 4"):
        p.rx.expect("r", prefix=prefix, prefix_tokens=[0, 1, 2])
    assert held(p.dst) == {"owned": 1} and held(p.src) == {"owned": 3}


def test_a_prefix_holding_the_manifests_tokens_is_used() -> None:
    p = pair(geo(), geo())
    kv = prefill(p, "r", 10)
    prefix = _decode_prefix(p, kv, 4)
    res = handoff(p.tx, p.rx, "r", list(range(10)), prefix=prefix, prefix_tokens=range(4))
    assert res.received.blocks[0] == prefix[0] and res.chunks == 2
    assert torch.equal(read_kv(p.dst, res.received.blocks, 10), kv)


# ---------------------------------------------------------------- a retry's epoch
class _LateChunk(InProcessTransport):
    """Delivers ``late`` (an old attempt's chunk, still in the network) right after the
    next manifest, as a transport across processes may."""

    def __init__(self) -> None:
        super().__init__()
        self.late: list[tuple[dict[str, Any], Payload]] = []

    def send(self, channel: str, header: Any, payload: Payload = b"") -> None:
        super().send(channel, header, payload)
        if header.get("type") == "manifest":
            while self.late:
                super().send(channel, *self.late.pop())


def test_a_retry_uses_a_new_epoch_and_fences_the_old_attempts_late_chunk() -> None:
    p = pair(geo(), geo())
    p.t = p.tx.transport = p.rx.transport = _LateChunk()
    kv = prefill(p, "r", 10)
    p.t.inject(channels("r").to_receiver, Fault.LOSE, skip=1)  # attempt 1 loses a chunk
    with pytest.raises(CancelledError, match="timeout"):
        handoff(p.tx, p.rx, "r", list(range(10)), free_source=False)
    first = p.rx.error("r")
    assert first is not None and held(p.dst) == {}
    stale = bytes(p.rx.geometry.rank_pool_geometry().block_bytes)  # attempt 1's old bytes
    header = {"type": "chunk", "request_id": "r", "epoch": 1, "block_index": 0, "rank": 0,
              "checksum": bytes_checksum(stale)}  # fmt: skip
    p.t.late.append((header, stale))
    res = handoff(p.tx, p.rx, "r", list(range(10)))  # the retry, default epoch
    assert res.received.manifest.epoch == 2
    assert torch.equal(read_kv(p.dst, res.received.blocks, 10), kv)
    with pytest.raises(ValueError, match="epoch 2 is not after"):
        p.tx.offer("r", list(range(10)), epoch=2)  # an explicit epoch must be new too


# ---------------------------------------------------------------- state() before a manifest
def test_state_before_the_manifest_is_waiting_and_not_final() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    assert p.rx.state("r") is State.WAITING and not p.rx.state("r").final
    rounds = 0
    while not p.rx.state("r").final:  # the receive loop of another process, as documented
        p.rx.poll("r")
        rounds += 1
        if rounds == 3:  # the manifest arrives only now
            p.tx.offer("r", list(range(10)))
        p.tx.poll("r")
    assert p.rx.state("r") is State.DONE and rounds == 5


# ---------------------------------------------------------------- a forged manifest
def _forged(p: Pair, **changes: Any) -> dict[str, Any]:
    m = p.tx.offer("r", list(range(10))).to_json_dict()
    p.t.poll(channels("r").to_receiver)  # the real manifest, dropped
    return {"type": "manifest", "manifest": {**m, **changes}}


def test_a_forged_block_size_is_refused_before_any_staging(monkeypatch: pytest.MonkeyPatch) -> None:
    p = pair(geo(), geo())  # 16 blocks of 2 KiB here: 32 KiB
    prefill(p, "r", 10)
    staged: list[int] = []
    real = KVGeometry.make_pools
    monkeypatch.setattr(
        KVGeometry, "make_pools", lambda g, n, **kw: staged.append(n) or real(g, n, **kw)
    )
    forged = _forged(p, block_size=4096)  # one block of 4096 tokens: 2 MiB of staging
    forged["manifest"]["block_checksums"] = forged["manifest"]["block_checksums"][:1]
    p.t.send(channels("r").to_receiver, forged)
    p.rx.poll("r")
    assert p.rx.state("r") is State.REFUSED and staged == []
    (nack,) = _answers(p)
    assert nack["type"] == "nack" and "> the pool's 32768" in nack["reasons"][0]
    assert held(p.dst) == {}


def test_a_failed_staging_allocation_is_a_nack_not_an_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = pair(geo(block_size=2), geo())  # a block-size change: staging is needed
    prefill(p, "r", 10)

    def no_memory(*_: object, **__: object) -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(KVGeometry, "make_pools", no_memory)
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")  # must not raise
    assert p.rx.state("r") is State.REFUSED
    (nack,) = _answers(p)
    assert any("can't allocate memory" in r for r in nack["reasons"]), nack
    assert held(p.dst) == {}


# ---------------------------------------------------------------- a forged nack
@pytest.mark.parametrize("reasons", [5, None, {"a": 1}, "one string", [["nested"]]])
def test_a_malformed_nack_ends_the_attempt_and_gives_back_its_blocks(reasons: object) -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.t.send(channels("r").to_sender, {"type": "nack", "epoch": 1, "reasons": reasons})
    p.tx.poll("r")  # must not raise
    assert p.tx.state("r") is State.REFUSED and p.tx.held() == {}
    assert held(p.src) == {"owned": 3}
    assert len(p.tx.reasons("r")) == 1 and all(isinstance(r, str) for r in p.tx.reasons("r"))


def test_a_header_that_is_not_an_object_is_ignored() -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.t.send(channels("r").to_sender, ["nack"])  # type: ignore[arg-type]
    p.t.send(channels("r").to_receiver, ["chunk"])  # type: ignore[arg-type]
    p.tx.poll("r")
    p.rx.poll("r")
    assert p.tx.state("r") is State.OFFERED and p.rx.state("r") is State.RECEIVING


# ---------------------------------------------------------------- an epoch of true or 1.0
@pytest.mark.parametrize("epoch", [True, 1.0])
def test_an_epoch_that_is_not_an_int_is_fenced_everywhere(epoch: object) -> None:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.rx.poll("r")
    (ready,) = _answers(p)
    p.t.send(channels("r").to_sender, {**ready, "epoch": epoch})
    p.tx.poll("r")
    assert p.tx.state("r") is State.OFFERED  # the sender sent nothing on a forged ready
    p.t.send(channels("r").to_sender, ready)
    p.tx.poll("r")
    ch = channels("r").to_receiver
    chunks = p.t.poll(ch)
    for h, payload in chunks:
        p.t.send(ch, {**h, "epoch": epoch}, payload)
    p.t.send(ch, {"type": "abort", "epoch": epoch, "reasons": ["forged"]})
    p.rx.poll("r")
    assert p.rx.state("r") is State.RECEIVING and held(p.dst) == {"reserved": 3}
    for h, payload in chunks:
        p.t.send(ch, h, payload)
    p.rx.poll("r")
    assert p.rx.state("r") is State.DONE
