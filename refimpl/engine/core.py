"""The reference engine: the spec's protocol on real (tiny) KV tensors.

    eng = Engine(CONFIGS["handoff_tp2to1"], seed=0)          # mutants=frozenset({...})
    eng.PrefillAdmit(0); eng.PrefillRun(0); eng.PrefillFreeze(0)
    eng.step("DecodeReserve", {"req": 0, "msg": "Handoff", "epoch": 1, "idx": 0})
    eng.abstract()              # the spec World this engine is in (the refinement map)
    eng.check_integrity(); eng.committed_bytes_ok()

One method per spec action, with the spec's name (``spec.actions.ACTIONS``); ``step``
takes the trace form of the arguments, so a model-check counterexample replays here.
Every action decides on the engine's own bookkeeping (allocators, receiver records, the
wire's contents), never by calling the spec. A refused action raises an
``OwnershipError`` whose ``prop`` names the property the spec's refusal names, or
``NotEnabled`` (``prop`` None), and changes nothing.

Where the pieces live:

    engine_base      state, records, derived replica statuses, messages
    engine_data      deterministic KV, TP rank pools, views, reshards
    engine_wire      the transport with selective delivery and fault hooks
    engine_prefill   scheduler / prefill actions (admit, run, offload, reload, send)
    engine_decode    decode actions (reserve, receive, validate, commit, abort, reclaim)
    engine_env       faults and the client's cancel
    engine_abstract  abstract(), check_integrity(), committed_bytes_ok()

Mutants: every name in ``spec.mutants.MUTANTS`` re-introduces that bug here (off by
default), plus ``reload_on_critical_stream``, which runs reload copies on the compute
stream; it only means something on CUDA (``stream_switch_applicable``).
"""

from __future__ import annotations

from typing import Any

import torch

from refimpl.engine.abstract import AbstractMap
from refimpl.engine.base import (
    STREAM_SWITCH,
    LoadStoreError,
    NotEnabled,
    RankError,
    UnpublishedError,
)
from refimpl.engine.env import WORKER_NAMES
from spec.actions import ACTIONS, decode_args
from spec.state import MSG_NAMES, msg_epoch, msg_idx, msg_inc, msg_kind

__all__ = [
    "STREAM_SWITCH",
    "Engine",
    "LoadStoreError",
    "NotEnabled",
    "RankError",
    "UnpublishedError",
]


class Engine(AbstractMap):
    """Prefill (TP ``src_tp``) + host tier + decode (TP ``dst_tp``) for ``config.n_reqs``
    requests, sized by a ``spec.config.Config``. See the module docstring."""

    @property
    def stream_switch_applicable(self) -> bool:
        """The reload-on-critical-stream bug needs CUDA streams; on CPU it is a no-op."""
        return self.P.device.type == "cuda" and torch.cuda.is_available()

    def step(self, name: str, args: dict[str, Any]) -> None:
        """Apply one action given in the trace format ``{"action", "args"}``.

        Raises ValueError for a malformed step (unknown action, bad argument) and an
        ``OwnershipError`` when the engine refuses it.
        """
        i, arg = decode_args(name, args)
        a = ACTIONS[name]
        fn = getattr(self, name)
        if a.arg == "worker":
            fn(WORKER_NAMES[arg])
        elif a.arg == "global":
            fn()
        else:
            if not 0 <= i < len(self.req):
                raise ValueError(f"{name}: request {i} out of range 0..{len(self.req) - 1}")
            if a.arg == "msg":
                self.step_inc = msg_inc(arg)
                fn(i, MSG_NAMES[msg_kind(arg)], msg_epoch(arg), msg_idx(arg))
            else:
                fn(i)

    def replay(self, steps: list[dict[str, Any]]) -> None:
        """Apply a trace's steps in order (stops at the first refusal, which it raises)."""
        for st in steps:
            self.step(st["action"], st.get("args", {}))
