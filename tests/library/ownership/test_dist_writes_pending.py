"""``DistTransport.writes_pending(channel, epoch)`` across two OS processes (gloo): the
Sender's batch status on an unrevocable transport (``refimpl.api.unrevocable.ends``: it says
Quiesced only once this is 0). A write counts from ``send`` until its batch was handed
to the peer (``dist.send`` returned, which gloo does only once the peer receives), per
channel and attempt, control messages not at all; a link that fails ends every pending
write at once (they will never land). The peer process holds off receiving (it builds
its transport only when told) so that the writes are pending for a while."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.library.lib_helpers import Procs

TIMEOUT = 60.0
CH, OTHER = "kv:a>rx", "kv:b>rx"
MIB = 1 << 20


def _route(channel: str) -> int:
    return 1  # every channel here goes to the peer (rank 1), in both processes


def _wait(cond: Any, timeout_s: float = TIMEOUT) -> bool:
    end = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < end:
        time.sleep(0.002)
    return bool(cond())


def _post(t: Any) -> dict[str, int]:
    """Three writes of attempt 1 on CH (8 MiB each), one of attempt 1 on OTHER, and a
    control message of attempt 1 and a write of attempt 2 on CH; the counts at once."""
    for i in range(3):
        t.send(CH, {"type": "chunk", "epoch": 1, "i": i}, bytes([i]) * (8 * MIB))
    t.send(CH, {"type": "seal", "epoch": 1})  # no payload: not a write
    t.send(CH, {"type": "chunk", "epoch": 2}, b"x" * MIB)
    t.send(OTHER, {"type": "chunk", "epoch": 1}, b"y" * MIB)
    return {"a1": t.writes_pending(CH, 1), "a2": t.writes_pending(CH, 2),
            "b1": t.writes_pending(OTHER, 1), "a3": t.writes_pending(CH, 3)}  # fmt: skip


def _body(go: Path, kill: bool) -> Any:
    def body(rank: int, conn: Any) -> dict[str, Any]:
        import torch.distributed as dist

        from refimpl.transport_dist import DistTransport

        if rank == 1:  # the peer: receives only once told (or is killed before)
            assert _wait(go.exists)
            t = DistTransport(_route, revocable=False)
            got: list[Any] = []
            _wait(lambda: got.extend(t.poll(CH) + t.poll(OTHER)) or len(got) >= 6)
            t.close(timeout_s=TIMEOUT)
            dist.destroy_process_group()
            return {"got": len(got)}
        t = DistTransport(_route, revocable=False)
        out: dict[str, Any] = {"at_send": _post(t)}
        time.sleep(1.0)  # the peer receives nothing yet: every write still pending
        out["after_1s"] = t.writes_pending(CH, 1)
        conn.send(f"pending {out['after_1s']}")  # the test kills the peer, or lets it go
        if not kill:
            go.touch()
        seen = {t.writes_pending(CH, 1)}
        _wait(lambda: seen.add(t.writes_pending(CH, 1)) or 0 in seen)
        out["seen"] = sorted(seen)
        out["end"] = [t.writes_pending(CH, 1), t.writes_pending(CH, 2), t.writes_pending(OTHER, 1)]
        _wait(lambda: t.failed(CH), 10.0 if kill else 0.0)  # its receive thread's word
        out["failed"] = t.failed(CH)
        if not kill:
            t.close(timeout_s=TIMEOUT)
            dist.destroy_process_group()
        return out

    return body


def test_a_write_counts_from_send_until_the_peer_took_it(tmp_path: Path) -> None:
    with Procs(2, _body(tmp_path / "go", kill=False), TIMEOUT) as procs:
        assert procs.recv(0, TIMEOUT) == "pending 3"
        tx, rx = procs.report(0, TIMEOUT + 30), procs.report(1, TIMEOUT + 30)
    assert tx["at_send"] == {"a1": 3, "a2": 1, "b1": 1, "a3": 0}, tx
    assert tx["after_1s"] == 3 and tx["end"] == [0, 0, 0] and tx["failed"] == "", tx
    assert rx["got"] == 6


def test_a_failed_link_ends_every_pending_write_at_once(tmp_path: Path) -> None:
    with Procs(2, _body(tmp_path / "go", kill=True), TIMEOUT) as procs:
        assert procs.recv(0, TIMEOUT) == "pending 3"
        procs.kill(1)  # the peer's process dies, its writes never taken
        tx = procs.report(0, TIMEOUT + 30)
    assert tx["after_1s"] == 3 and tx["seen"] == [0, 3], tx  # 3, then 0: never between
    assert tx["end"] == [0, 0, 0] and tx["failed"].startswith("peer 1 failed"), tx
