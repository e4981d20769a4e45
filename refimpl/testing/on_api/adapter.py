"""``ApiAdapter``: ``refimpl.api`` under the harness, and what it cannot run.

``UNEXPRESSED`` names every config feature whose spec actions the API cannot run, with
the reason; ``ApiAdapter.build`` refuses a world that switches one on, so nothing is
silently skipped (``kvown fuzz --tour --impl api`` lists them). Recompute preemption is
not one: the scheduler's ``PrefillPreempt`` runs around the API, refused while a store's
Sender pins the blocks (``on_api/worlds/recompute.py``; with async steps the world is
refused for those). Nor is a decode-side prefix (in one process, one Receiver): the
decode engine's prefix cache is lent to the Receiver (``Receiver.expect(prefix=...)``)
and the offers send the blocks after it (``on_api/worlds/prefix.py``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from refimpl.errors import OwnershipError
from refimpl.testing.on_api.actions import LAYERS, ApiRefusal
from refimpl.testing.on_api.subject import ApiSubject
from refimpl.testing.on_api.worlds.ranks import RankSubject
from spec.config import Config

__all__ = ["UNEXPRESSED", "ApiAdapter", "unexpressed"]

UNEXPRESSED: dict[str, str] = {
    "offload": "offload/reload are mapped for prefill TP 1 only: to host pools "
    "(refimpl.api.offload.begin_offload/begin_reload: on_api/worlds/offload.py) or to a "
    "DiskTier (ApiAdapter(offload_to='disk'): offload_async/reload_async, their I/O "
    "threads stepped, on_api/worlds/disk_offload.py); a DiskTier store from TP > 1 "
    "device pools is not toured",
    "prefix": "a decode-side prefix (Receiver.expect(prefix=...), offer(prefix_blocks=): "
    "on_api/worlds/prefix.py) is mapped in one process with one Receiver; across processes "
    "the prefix cache's blocks and refcounts are in the decode process and not read "
    "through the remote views yet, and with decode ranks each RankReceiver's share of it "
    "is not mapped",
    "async_steps": "dispatched/completed model steps are the engine's scheduler",
    "retract": "DecodeRetract: the API has no retract of a committed copy",
    "decode_ranks": "decode ranks (one RankSender per prefill rank, one RankReceiver per "
    "decode rank, on_api/worlds/ranks.py) are mapped in one process (whole-request and "
    "streamed offers, restarts); not across processes",
    "identity": "PrefillStage/DecodeRecyclePrefix: content identity is the engine's cache",
    "slots": "decode metadata slots are the engine's",
    "turns": "multi-turn append is the engine's",
    "layers": "a streamed world's layers must be the API tour's (on_api.actions.LAYERS)",
    "window": "sliding-window pruning (PrefillPruneWindow) is the engine's block table",
}


def unexpressed(c: Config, remote: bool = False) -> list[str]:
    """The features of ``c`` the API cannot run (keys of ``UNEXPRESSED``)."""
    on = {
        "offload": c.offload and c.src_tp != 1,
        "prefix": c.prefix > 0 and (remote or c.decode_ranks),
        "async_steps": c.async_steps,
        "retract": c.retract,
        "decode_ranks": remote and c.decode_ranks,  # in process: mapped
        "identity": c.identity,
        "slots": c.slots,
        "turns": c.turns,
        "layers": c.layers not in (0, LAYERS),
        "window": c.window,
    }
    return [k for k, v in on.items() if v]


@dataclass
class ApiAdapter:
    """``refimpl.api`` under the harness; ``dst_block``: decode's block size (another
    than prefill's 2: the Receiver stages and reshards); ``stage``: it stages anyway."""

    name: str = "refimpl.api"
    refusals: tuple[type[BaseException], ...] = (ApiRefusal, OwnershipError)
    randoms: tuple[random.Random, ...] = ()
    stage: bool = False
    dst_block: int = 2
    remote: Any = None  # an on_api.remote.RemoteDecode: the Receiver in its own process
    offload_to: str = "pools"  # "disk": offload worlds to a DiskTier (worlds/disk_offload.py)

    def build(self, config: Config, mutants: frozenset[str], seed: int) -> ApiSubject:
        if bad := unexpressed(config, self.remote is not None):
            why = "; ".join(f"{b}: {UNEXPRESSED[b]}" for b in bad)
            raise ValueError(f"{config.name}: the API cannot run it ({why})")
        known = self.switches()
        if unknown := set(mutants) - set(known):
            raise ValueError(f"unknown API switches {sorted(unknown)}; known: {sorted(known)}")
        if self.offload_to not in ("pools", "disk"):
            raise ValueError(f"offload_to={self.offload_to!r}: 'pools' or 'disk'")
        cls = RankSubject if config.decode_ranks else ApiSubject
        disk = {"disk": True} if self.offload_to == "disk" else {}
        return cls(
            config,
            seed,
            stage=self.stage,
            dst_block=self.dst_block,
            mutants=frozenset(mutants),
            remote=self.remote,
            **disk,
        )

    def switches(self) -> dict[str, bool]:
        """The API's bug switches (``refimpl.api.switches``, where the API has them)."""
        try:
            from refimpl.api import switches as sw  # type: ignore[attr-defined,unused-ignore]
        except ImportError:  # an API without switches
            return {}
        return dict.fromkeys(sorted(sw.API_SWITCHES), True)
