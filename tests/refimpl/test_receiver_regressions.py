"""Regression tests of the three receiver bugs of issue #13, each on the documented path
(the public API's ``Receiver``, the one receive path since ``ChunkReceiver`` is gone).

1. Zero-filled blocks committed: the receiver marked a block installed before the
   install ran; a failed install still let the commit succeed, with the block's zeros.
2. A corrupt chunk hid (``tests/library/test_api.py``: the corrupt chunk names its block
   and the attempt gives everything back).
3. A full receiver leaked the source: the demo's ``handoff`` let ``CapacityError`` escape
   without a nack, and the source's pins stayed after the request was freed.
"""

from __future__ import annotations

import pytest
import torch

import refimpl.api.install as install
from refimpl.api import State, read_kv
from refimpl.demo.handoff import Worker, handoff
from refimpl.errors import CapacityError
from refimpl.model import TinyConfig, TinyDecoder
from refimpl.transport import InProcessTransport
from tests.library.lib_helpers import held
from tests.refimpl.test_transport_chunks import deliver, sent


def test_1_a_failed_install_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Block 1's install fails once: it is not counted, so nothing commits with its zeros;
    the same chunks again install it (it is no duplicate) and the commit has its bytes."""
    p, chunks = sent(12)
    real, target = install.land_shard, p.dst.alloc.blocks_of("r")[1]
    fails = [target]

    def flaky(dst, pieces, geometry, payload, b):  # type: ignore[no-untyped-def]
        if b in fails:
            fails.remove(b)
            raise RuntimeError("device copy failed")
        real(dst, pieces, geometry, payload, b)

    real_copy = install.copy_hashed

    def flaky_copy(span, blocks, payload):  # type: ignore[no-untyped-def]
        if blocks[0] in fails:  # the same failure where a chunk lands as it is
            fails.remove(blocks[0])
            raise RuntimeError("device copy failed")
        return real_copy(span, blocks, payload)

    monkeypatch.setattr(install, "land_shard", flaky)
    monkeypatch.setattr(install, "copy_hashed", flaky_copy)
    try:
        deliver(p, chunks)
    except RuntimeError:
        pass  # the install's own failure (not the peer's) may reach the caller
    assert p.rx.state("r") is not State.DONE
    assert torch.count_nonzero(p.dst.pools[0].kv[target]) == 0  # nothing landed there
    if p.rx.state("r") is State.RECEIVING:  # not ended: the chunks again complete it
        deliver(p, chunks)
        assert p.rx.state("r") is State.DONE, p.rx.error("r")
        got = p.rx.result("r")
        want = read_kv(p.src, p.src.alloc.blocks_of("r"), 12)
        assert torch.equal(read_kv(p.dst, got.blocks, 12), want)
    else:  # ended on it: everything given back
        assert p.rx.state("r") is State.ABORTED and held(p.dst) == {}


def test_3_full_receiver_nacks_and_the_source_keeps_no_pin() -> None:
    cfg = TinyConfig(dtype="float32")
    model = TinyDecoder(cfg, seed=0)
    src = Worker(model, tp=2, block_size=4, layout="heads_major", capacity=8)
    dst = Worker(model, tp=1, block_size=4, layout="heads_major", capacity=2)
    prompt = torch.arange(13) % cfg.vocab
    src.prefill("r", prompt)
    t = InProcessTransport(copy_payload=True)
    with pytest.raises(CapacityError, match="asks for 4 blocks, 2 free"):
        handoff(src, dst, "r", prompt.tolist(), first_token=0, transport=t)
    assert t.stats["sent"] > 0 and src.rp.alloc.holders() == ("r",)  # no pin left
    src.finish("r")
    assert src.rp.alloc.counts()["owned"] == 0 and dst.rp.alloc.counts()["free"] == 2
    src.rp.alloc.check_integrity()
    dst.rp.alloc.check_integrity()
