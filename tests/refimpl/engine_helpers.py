"""A narrated driver for the engine: every step is also taken on the spec and compared.

    d = Drive(CONFIGS["handoff_tp2to1"])
    d("PrefillAdmit", req=0)                       # engine step == spec step, then checks
    d.refused("PrefillDecodeStep", "FrozenSnapshot", req=0)   # both refuse, nothing moves
    d.msg("DecodeReserve", "Handoff", 1)           # a message action on request 0

After every accepted step: ``abstract()`` equals the spec's successor, and (``strict``)
``check_integrity()`` holds and every committed replica's bytes equal the ground truth.
"""

from __future__ import annotations

from typing import Any

import pytest

from refimpl.engine import Engine
from refimpl.errors import OwnershipError
from spec.actions import apply, decode_args
from spec.common import Refused
from spec.config import Config
from spec.mutants import MUTANTS
from spec.state import World


def step(action: str, **args: Any) -> dict[str, Any]:
    return {"action": action, "args": args}


def mstep(action: str, kind: str, epoch: int, idx: int = 0, req: int = 0) -> dict[str, Any]:
    return step(action, req=req, msg=kind, epoch=epoch, idx=idx)


class Drive:
    def __init__(
        self, config: Config, mutants: frozenset[str] = frozenset(), *, strict: bool = True
    ) -> None:
        self.c = config
        self.eng = Engine(config, mutants=mutants)
        self.m = frozenset(mutants) & frozenset(MUTANTS)
        self.strict = strict
        self.w = self.eng.abstract()
        assert self.w == config.initial()
        self.log: list[dict[str, Any]] = []

    def __call__(self, action: str, **args: Any) -> World:
        i, arg = decode_args(action, args)
        want = apply(self.w, self.c, self.m, action, i, arg)
        assert not isinstance(want, Refused), f"the spec refuses {action}{args}: {want}"
        self.eng.step(action, args)
        self.log.append(step(action, **args))
        got = self.eng.abstract()
        assert got == want, f"{action}{args}: engine {got} != spec {want}"
        self.w = got
        if self.strict:
            self.check()
        return got

    def msg(self, action: str, kind: str, epoch: int, idx: int = 0, req: int = 0) -> World:
        """A message action: ``kind`` of ``epoch`` with ``idx``, for request ``req``."""
        return self(action, req=req, msg=kind, epoch=epoch, idx=idx)

    def check(self) -> None:
        self.eng.check_integrity()
        assert self.eng.damaged() == [], self.eng.damaged()

    def refused(self, action: str, prop: str | None, **args: Any) -> OwnershipError:
        """Both the spec and the engine refuse, naming ``prop``; the engine is unchanged."""
        i, arg = decode_args(action, args)
        want = apply(self.w, self.c, self.m, action, i, arg)
        assert isinstance(want, Refused) and want.prop == prop, f"spec: {want}"
        before = self.eng.fingerprint()
        with pytest.raises(OwnershipError) as err:
            self.eng.step(action, args)
        assert err.value.prop == prop, f"engine: {err.value!r}"
        assert self.eng.fingerprint() == before, f"{action} refused but changed the engine"
        return err.value

    def run(self, steps: list[dict[str, Any]]) -> None:
        for st in steps:
            self(st["action"], **st["args"])


def assert_quiescent(e: Engine) -> None:
    """Nothing leaked: no block held but the cached prefix, nothing in flight."""
    assert e.P.alloc.num_free == e.P.alloc.capacity
    assert e.H.alloc.num_free == e.H.alloc.capacity
    assert e.D.alloc.num_free == e.D.alloc.capacity - len(e.prefix_blocks)
    assert all(not e.wire.entries(ch) for ch in e.wire.channels())
    e.check_integrity()
