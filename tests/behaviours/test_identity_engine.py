"""The reference engine's content identity and metadata slot (refimpl/engine/identity.py):
each refusal names the spec's property and changes nothing; abstract() follows the spec."""

from __future__ import annotations

import pytest
import torch

from refimpl.engine import Engine
from refimpl.errors import CapacityError, IdentityError, RefcountError
from spec.config import CONFIGS
from spec.properties import violated_safety

ID, SL = CONFIGS["identity_prefix"], CONFIGS["slots_two"]


def _frozen(e: Engine, i: int = 0) -> None:
    e.PrefillAdmit(i)
    e.PrefillRun(i)
    e.PrefillFreeze(i)


def test_an_unstaged_block_is_not_sent() -> None:
    e = Engine(ID)
    _frozen(e)
    e.step("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0})
    e.step("PrefillRecvReady", {"req": 0, "msg": "Ready", "epoch": 1, "idx": 1})
    e.PrefillStage(0)  # block 0 only: block 1 (the one to send) is not staged
    before = e.fingerprint()
    with pytest.raises(IdentityError) as err:
        e.PrefillSendChunk(0)
    assert err.value.prop == "ContentIdentity" and e.fingerprint() == before
    e.PrefillStage(0)
    e.PrefillSendChunk(0)
    assert e.abstract().reqs[0].sent == 1


def test_a_recycled_prefix_is_a_miss_and_its_bytes_are_gone() -> None:
    e = Engine(ID)
    cached = e.D.gather(list(e.prefix_blocks))
    e.DecodeRecyclePrefix()
    assert not torch.equal(e.D.gather(list(e.prefix_blocks)), cached)
    assert e.abstract().pfx_ok is False and e.abstract().pfx
    _frozen(e)
    e.step("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0})
    assert e.hit(0) == 0 and violated_safety(e.abstract(), ID) == []


def test_the_bug_counts_the_recycled_prefix() -> None:
    e = Engine(ID, mutants=frozenset({"prefix_hash_unchecked"}))
    e.DecodeRecyclePrefix()
    _frozen(e)
    e.step("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0})
    assert e.hit(0) == 1


def test_a_referenced_prefix_is_not_recycled() -> None:
    e = Engine(ID)
    _frozen(e)
    e.step("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0})
    with pytest.raises(RefcountError):
        e.DecodeRecyclePrefix()


def test_one_metadata_slot() -> None:
    e = Engine(SL)
    _frozen(e, 0)
    _frozen(e, 1)
    e.step("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0})
    assert [r.sl for r in e.abstract().reqs] == [1, 0]
    before = e.fingerprint()
    with pytest.raises(CapacityError):
        e.step("DecodeReserve", {"req": 1, "msg": "Handoff", "epoch": 1, "idx": 0})
    assert e.fingerprint() == before
    e.step("DecodeReject", {"req": 1, "msg": "Handoff", "epoch": 1, "idx": 0})
    assert e.abstract().reqs[1].dep == 1
