"""The tour on the API across processes (issue #30): the decode side's ``Receiver`` in its
own OS process, over ``DistTransport`` (gloo).

    driver (group rank 0)                          decode process (group rank 1)
    harness, spec, Senders, SpecTransport  <---->  Receiver, its pools, DistTransport

The spec still schedules the network. What a Sender sends waits in the driver's
``SpecTransport`` until a spec step delivers it; delivery sends its bytes over
``DistTransport`` to the decode process and then asks that process to ``poll``. What the
Receiver sends crosses back over ``DistTransport`` and enters the flight, to wait for its
own spec step. Every other call the adapter makes on the decode side (``end``, ``abort``,
``crash``, ``state``, ``result``, ``held``, ``layer_ready``, the refinement map's reads
``on_api.views``, the pool's gather, write and free) is a request on the RPC channel of
the same transport, answered in order. One link keeps its frames in order, so a reply
arrives after every message the Receiver sent before it, and a request after every
message delivered before it: no step sees the other process half-way. No pickle: JSON
headers, tensors as bytes. What the decode process's transport does on its own (a
fenced attempt's late chunks dropped on arrival, its bounds) is what the tour checks.

Each run (one walk) gets a fresh Receiver and pools in the decode process and its own
request ids (``tag``), so nothing a transport keeps from one walk meets the next.
``RemoteDecode`` is a context manager; its ``close`` ends the decode process by its pid.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from refimpl.api import KVGeometry
from refimpl.api.wire import CHUNK, State, channels
from refimpl.checksum import byte_view, tensor_from_bytes
from refimpl.errors import OwnershipError
from refimpl.testing.on_api.views import VIEWS
from refimpl.transport_dist import DistTransport
from spec.config import Config

__all__ = ["RemoteDecode", "RemoteRefusal"]

RPC_D, RPC_P = "rpc:decode", "rpc:driver"  # requests to the decode process, its replies
DRIVER, DECODE = 0, 1


def route(channel: str) -> int:
    """Requests and a request's ``...>rx`` channel to the decode process; the rest here."""
    return DECODE if channel == RPC_D or channel.endswith(">rx") else DRIVER


class RemoteRefusal(OwnershipError):
    """The decode process refused a call (its ``OwnershipError``, named)."""


class _Received:
    def __init__(self, blocks: list[int]) -> None:
        self.blocks = tuple(blocks)


class _Alloc:
    def __init__(self, rd: RemoteDecode) -> None:
        self.rd = rd

    def blocks_of(self, rid: str) -> list[int]:
        return list(self.rd.call("view", {"name": "blocks_of", "args": [rid]})[0])

    def free(self, rid: str) -> None:
        self.rd.call("free", {"rid": rid})


class _Pools:
    """The decode pools' calls the adapter makes (gather, write, the allocator's)."""

    def __init__(self, rd: RemoteDecode) -> None:
        self.rd, self.alloc = rd, _Alloc(rd)

    def gather(self, blocks: Any) -> torch.Tensor:
        shape, data = self.rd.call("gather", {"blocks": [int(b) for b in blocks]})
        return tensor_from_bytes(data, torch.float32, tuple(shape)).clone()

    def write_full(self, rid: str, blocks: Any, kv: torch.Tensor) -> None:
        t = kv.to(torch.float32).contiguous()
        args = {"rid": rid, "blocks": [int(b) for b in blocks], "shape": list(t.shape)}
        self.rd.call("write_full", args, bytes(byte_view(t)))


class _Receiver:
    """The Receiver's calls the adapter makes, each answered by the decode process."""

    def __init__(self, rd: RemoteDecode, gd: KVGeometry, model: Any) -> None:
        self.rd, self.pools = rd, _Pools(rd)
        self.local = gd.to_local_config(model)

    def poll(self, rid: str) -> None:
        ch = channels(rid).to_receiver
        for header, payload in self.rd.net.poll(ch):  # what the spec delivered, in order
            self.rd.t.send(ch, header, payload)
        self.rd.call("poll", {"rid": rid})

    def end(self, rid: str, reason: str) -> None:
        self.rd.call("end", {"rid": rid, "reason": reason})

    def abort(self, rid: str, reason: str = "cancelled") -> None:
        self.rd.call("abort", {"rid": rid, "reason": reason})

    def fail(self, rid: str, reason: str) -> None:
        self.rd.call("fail", {"rid": rid, "reason": reason})

    def crash(self) -> None:
        self.rd.call("crash", {})

    def restarted(self, inc: int) -> None:
        """The decode process restarted: a new Receiver there, incarnation ``inc``."""
        self.rd.call("restart", {"inc": inc})

    def peer_restarted(self, inc: int) -> None:
        self.rd.call("peer_restarted", {"inc": inc})

    def state(self, rid: str) -> State:
        return State(self.rd.call("state", {"rid": rid})[0])

    def result(self, rid: str) -> _Received:
        return _Received(self.rd.call("result", {"rid": rid})[0])

    def held(self) -> dict[str, tuple[int, ...]]:
        got = self.rd.call("held", {})[0]
        return {k: tuple(v) for k, v in got.items()}

    def layer_ready(self, rid: str, layer: int) -> bool:
        return bool(self.rd.call("layer_ready", {"rid": rid, "layer": layer})[0])

    def remote_view(self, name: str, args: list[Any]) -> Any:
        return self.rd.call("view", {"name": name, "args": args})[0]


class RemoteDecode:
    """The decode process, and the driver's end of the link to it."""

    def __init__(self, timeout_s: float = 120.0) -> None:
        if dist.is_initialized():
            raise RuntimeError("RemoteDecode needs a process without a process group")
        self.timeout_s, self.runs = timeout_s, 0
        port = _free_port()
        cmd = [sys.executable, "-m", "refimpl.testing.on_api.remote", "--port", str(port)]
        cmd += ["--timeout", str(timeout_s)]
        self.proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            _join(port, DRIVER, timeout_s)
            self.t = DistTransport(route)
        except BaseException:
            self._kill()
            raise
        self.net: Any = None
        self.watched: list[str] = []

    def __enter__(self) -> RemoteDecode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ one run
    def decode(
        self, c: Config, net: Any, stage: bool, dst_block: int, rx_kw: dict[str, Any]
    ) -> tuple[str, KVGeometry, _Pools, _Receiver]:
        """A fresh decode end for one run of world ``c``: (request id prefix, geometry,
        pools and Receiver proxies); ``net``: the run's SpecTransport."""
        from refimpl.testing.on_api.subject import MODEL, decode_geometry

        self.runs += 1
        tag = f"w{self.runs}."
        mutants = sorted(rx_kw.get("mutants", ()))
        args = {"config": c.name, "stage": stage, "dst_block": dst_block, "mutants": mutants}
        self.call("reset", args)
        self.net = net
        self.watched = [f"{tag}r{i}" for i in range(c.n_reqs)]
        self.src_tp = c.src_tp
        gd = decode_geometry(c, dst_block)  # the decode process builds the same end
        return tag, gd, _Pools(self), _Receiver(self, gd, MODEL)

    def call(self, op: str, args: dict[str, Any], payload: bytes = b"") -> tuple[Any, bytes]:
        """One request to the decode process and its reply; then what the Receiver sent
        on the way enters the flight (it arrived before the reply)."""
        self.t.send(RPC_D, {"op": op, "a": args}, payload)
        end = time.monotonic() + self.timeout_s
        while not (got := self.t.poll(RPC_P)):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the decode process ended (rc {self.proc.returncode})")
            if (why := self.t.failed(RPC_P)) or time.monotonic() > end:
                raise RuntimeError(f"no reply to {op}: {why or 'timeout'}")
            time.sleep(0.0002)
        [(header, data)] = got
        self._pull()
        for ch, epoch in header.get("fenced", ()):
            self._void(ch, epoch)
        if "error" in header:
            kind, text = header["kind"], header["error"]
            if header.get("refusal"):
                raise RemoteRefusal(f"{kind}: {text}")
            raise RuntimeError(f"the decode process raised {kind}: {text}")
        return header["ok"], bytes(data)

    def _pull(self) -> None:
        if self.net is None:
            return
        for rid in self.watched:
            ch = channels(rid)
            for name in (ch.to_sender, *(ch.to_rank(r) for r in range(self.src_tp))):
                for header, payload in self.t.poll(name):
                    self.net.send(name, header, payload)

    def _void(self, channel: str, epoch: int) -> None:
        """The decode process fenced ``channel`` up to ``epoch``: the writes of those
        attempts still in the flight go now, and its transport drops them on arrival
        (a revocable transport: they fail, as the spec's fence says)."""
        for lm in [m for m in self.net.flight if m.group[0] == CHUNK]:
            if lm.copies[0][0] == channel and int(lm.group[1]) <= epoch:
                self.net.flight.remove(lm)
                for ch, text, data in lm.copies:
                    self.t.send(ch, json.loads(text), data)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call("bye", {})
            self.t.close(timeout_s=10.0)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            self._kill()

    def _kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, 9)
                self.proc.wait()


def _join(port: int, rank: int, timeout_s: float) -> None:
    """Join the two-process gloo group of the tour (driver 0, decode process 1)."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=timeout_s),
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- the decode process
def _answer(end: Any, op: str, a: dict[str, Any], payload: bytes, t: Any) -> tuple[Any, bytes]:
    from refimpl.testing.on_api.subject import decode_end
    from refimpl.testing.worlds import get_world

    if op == "reset":
        rx_kw = {"mutants": frozenset(a["mutants"])} if a["mutants"] else {}
        c = get_world(a["config"])
        t.revocable = c.revocable  # the world's transport: DistTransport(revocable=...)
        _, dp, rx = decode_end(c, t, a["stage"], a["dst_block"], rx_kw)
        return (dp, rx), b""
    dp, rx = end
    if op == "restart":  # the same pools (reset at the crash), the next incarnation
        kw = {"stage": rx.stage, "mutants": rx.mutants, "incarnation": a["inc"]}
        return (dp, type(rx)(dp, rx.geometry, t, rx.model, **kw)), b""
    out: Any = None
    if op == "poll":
        rx.poll(a["rid"])
    elif op in ("end", "abort", "fail"):
        getattr(rx, op)(a["rid"], a["reason"])
    elif op == "crash":
        rx.crash()
    elif op == "peer_restarted":
        rx.peer_restarted(a["inc"])
    elif op == "state":
        out = rx.state(a["rid"]).value
    elif op == "result":
        out = list(rx.result(a["rid"]).blocks)
    elif op == "held":
        out = {k: list(v) for k, v in rx.held().items()}
    elif op == "layer_ready":
        out = rx.layer_ready(a["rid"], a["layer"])
    elif op == "view":
        out = VIEWS[a["name"]](rx, *a["args"])
    elif op == "free":
        dp.alloc.free(a["rid"])
    elif op == "gather":
        g = dp.gather(a["blocks"]).to(torch.float32).contiguous()
        return list(g.shape), bytes(byte_view(g))
    elif op == "write_full":
        kv = tensor_from_bytes(payload, torch.float32, tuple(a["shape"])).clone()
        dp.write_full(a["rid"], a["blocks"], kv)
    else:
        raise ValueError(f"unknown request {op!r}")
    return out, b""


class _Fencing(DistTransport):
    """The decode process's transport, noting each fence for the driver's flight."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.fenced: list[list[Any]] = []

    def fence(self, channel: str, epoch: int) -> int:
        self.fenced.append([channel, epoch])
        return super().fence(channel, epoch)


def serve(port: int, timeout_s: float) -> None:
    """The decode process: answer the driver's requests until it says bye."""
    torch.set_num_threads(1)
    _join(port, DECODE, timeout_s)
    t = _Fencing(route)
    end: Any = None
    try:
        while True:
            got = t.poll(RPC_D)
            if not got:
                if t.failed(RPC_P):
                    return  # the driver is gone
                time.sleep(0.0002)
                continue
            for header, payload in got:
                op, a = header["op"], header["a"]
                if op == "bye":
                    t.send(RPC_P, {"ok": None})
                    return
                try:
                    out, data = _answer(end, op, a, bytes(payload), t)
                    if op in ("reset", "restart"):
                        end, out = out, None
                    reply: dict[str, Any] = {"ok": out}
                except Exception as e:  # named to the driver, which raises it
                    reply = {"error": str(e), "kind": type(e).__name__}
                    reply["refusal"] = isinstance(e, OwnershipError)
                    data = b""
                reply["fenced"], t.fenced = t.fenced, []
                json.dumps(reply)  # a reply that cannot be JSON fails here, not in the link
                t.send(RPC_P, reply, data)
    finally:
        t.close(timeout_s=10.0)
        dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=120.0)
    ns = ap.parse_args()
    serve(ns.port, ns.timeout)
