"""Fault hooks (spec ``actions_env``) and the client's cancel, on the real engine.

Each fault is within the config's budget and kinds, acts on one real thing and counts:

    EnvLose              a message in flight is dropped by the wire
    EnvDuplicate         a control message arrives twice (a data write is never repeated)
    EnvCorrupt           one byte of a chunk's payload is flipped; decode's checksum sees it
    EnvManifestMismatch  the Handoff's manifest is swapped for one decode cannot accept
                         (another RoPE theta); ``check_compatible`` names the reason
    EnvStoreFail         an offload to host fails: its copy is dropped, never published
    EnvCrash             a worker dies: its pools, its in-flight writes and the messages
                         to it are gone; requests that lose their last copy fail
    EnvRestart           a crashed worker comes back as a new incarnation, pools empty;
                         what its old incarnation sent or registered is fenced
"""

from __future__ import annotations

import json

from refimpl.engine.base import RX_NONE, NotEnabled
from refimpl.engine.identity import IdentityActions
from refimpl.engine.wire import channel, dumps
from refimpl.transport import Payload
from spec.state import (
    CANCELLED,
    COMPLETE,
    FAILED,
    FILLING,
    G_END_CANCELLED,
    G_END_FAILED,
    IDLE,
    PREEMPTED,
    PREFILLING,
    QUEUED,
    RUNNING,
    WRITABLE,
)

LIVE = (QUEUED, PREFILLING, RUNNING, PREEMPTED)
WORKER_NAMES = ("prefill", "decode")


def flip_a_byte(data: Payload) -> bytes:
    """A corrupted copy of a payload: its middle byte inverted (the source is untouched)."""
    buf = bytearray(data)
    buf[len(buf) // 2] ^= 0xFF
    return bytes(buf)


class EnvActions(IdentityActions):
    def _fault_ok(self, kind: str) -> bool:
        c = self.config
        return kind in c.fault_kinds and self.faults < c.faults

    def EnvLose(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        ch, k = self.find(req, msg, epoch, idx)
        if not self._fault_ok("lose"):
            raise NotEnabled("EnvLose: no 'lose' fault left")
        self.wire.lose(ch, k)
        self.faults += 1

    def EnvDuplicate(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        ch, k = self.find(req, msg, epoch, idx)
        if not self._fault_ok("duplicate") or msg in ("Chunk", "ChunkCorrupt"):
            raise NotEnabled("EnvDuplicate: no 'duplicate' fault left, or a data write")
        self.wire.duplicate(ch, k)
        self.faults += 1

    def EnvCorrupt(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        ch, k = self.find(req, msg, epoch, idx)
        if not self._fault_ok("corrupt") or msg != "Chunk":
            raise NotEnabled("EnvCorrupt: no 'corrupt' fault left, or not a sound chunk")
        self.wire.replace(ch, k, data=flip_a_byte(self.wire.entries(ch)[k][1]))
        self.faults += 1

    def EnvManifestMismatch(self, req: int, msg: str, epoch: int, idx: int = 0) -> None:
        ch, k = self.find(req, msg, epoch, idx)
        if not self._fault_ok("mismatch") or msg != "Handoff":
            raise NotEnabled("EnvManifestMismatch: no 'mismatch' fault left, or not a Handoff")
        header = json.loads(self.wire.entries(ch)[k][0])
        header["manifest"]["rope"]["theta"] = header["manifest"]["rope"]["theta"] * 50.0
        self.wire.replace(ch, k, text=dumps(header))
        self.faults += 1

    def EnvStoreFail(self, req: int) -> None:
        """A store to host fails: its copy must never become visible; the GPU copy thaws."""
        i, r = req, self.req[req]
        if not self._fault_ok("store_fail") or self.h_status(i) != FILLING:
            raise NotEnabled(f"EnvStoreFail(req={i}): no store in flight or no fault left")
        if self.p_status(i) != COMPLETE:
            raise NotEnabled(f"EnvStoreFail(req={i}): no store in flight")
        rid = self.rid(i)
        if "failed_store_visible" in self.m:
            self.H.alloc.commit(rid, 0)  # the bug: the partial copy is published
            self.P.alloc.free(rid + "@store")
            self.P.alloc.free(rid)
        else:
            self.release_all(self.H, rid)  # the copy is dropped, never published
            self.P.alloc.free(rid + "@store")  # the GPU copy thaws
            r.stored = 0
        self.faults += 1

    def EnvCrash(self, worker: str | int) -> None:
        """Crash ``worker`` ("prefill" or "decode", or 0/1) for good."""
        wk = WORKER_NAMES.index(worker) if isinstance(worker, str) else worker
        if not self._fault_ok("crash"):
            raise NotEnabled("EnvCrash: no 'crash' fault left")
        if wk == 0 and self.p_up:
            self._crash_prefill()
        elif wk == 1 and self.d_up:
            self._crash_decode()
        else:
            raise NotEnabled(f"EnvCrash({WORKER_NAMES[wk]}): already down")
        self.faults += 1

    def _crash_prefill(self) -> None:
        for i, r in enumerate(self.req):
            r.phase, r.stored, r.loaded, r.reloading = IDLE, 0, 0, False
            r.sent, r.phit = 0, 0
            r.payloads, r.checksums = [], []
            self.wire.abort(channel(i, False))  # messages to prefill are gone
            self.wire.drop_where(channel(i, True), lambda h: h["kind"] == "Chunk")  # its writes
        self.P.reset()
        self.H.reset()
        self.p_up = False
        for i, r in enumerate(self.req):  # live requests without a validated copy fail
            if r.status in LIVE and self.d_status(i) not in (COMPLETE, WRITABLE):
                r.status, r.ghost = FAILED, r.ghost | G_END_FAILED

    def _crash_decode(self) -> None:
        before = [self.d_status(i) for i in range(len(self.req))]
        for i, x in enumerate(self.rx):
            x.phase, x.own, x.landed, x.rmask, x.rcnt = RX_NONE, (), 0, 0, 0
            x.manifest, x.mismatch, x.corrupt, x.fenced, x.failed = None, (), False, False, False
            self.wire.abort(channel(i, True))  # messages and writes to decode are gone
        self.D.reset()
        self.prefix_blocks, self.prefix_chain = (), []
        self.d_up = False
        for i, r in enumerate(self.req):  # decode owned it, or a running one lost its copy
            if r.status not in LIVE:
                continue
            p, h = self.p_status(i), self.h_status(i)
            alone = r.status == RUNNING and p not in (COMPLETE, WRITABLE) and h != COMPLETE
            if before[i] == WRITABLE or alone:
                r.status, r.ghost = FAILED, r.ghost | G_END_FAILED

    def EnvRestart(self, worker: str | int) -> None:
        """A crashed ``worker`` comes back as a new incarnation: its pools were re-created
        empty at the crash, its new registrations carry the new incarnation, and every
        message or write of the old one is fenced (``fenced``)."""
        wk = WORKER_NAMES.index(worker) if isinstance(worker, str) else worker
        if self.p_inc + self.d_inc >= self.config.restarts:
            raise NotEnabled("EnvRestart: no restart left")
        if wk == 0 and not self.p_up:
            self.p_up, self.p_inc = True, self.p_inc + 1
        elif wk == 1 and not self.d_up:
            self.d_up, self.d_inc = True, self.d_inc + 1
        else:
            raise NotEnabled(f"EnvRestart({WORKER_NAMES[wk]}): it is up")

    def ClientCancel(self, req: int) -> None:
        i, r = req, self.req[req]
        if not self.config.cancel or r.status not in LIVE:
            raise self._ne("ClientCancel", i)
        r.status, r.ghost = CANCELLED, r.ghost | G_END_CANCELLED
