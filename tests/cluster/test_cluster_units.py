"""The cluster's parts without processes: kill specs, configs, the control channel on a
real TCPStore, the Lamport merge and per-request checks, and the KV data path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from refimpl.api import State, channels
from refimpl.api.ranks import Epochs, sub_id
from refimpl.cluster import eventlog
from refimpl.cluster.control import Channel, ControlFaults, serve_store
from refimpl.cluster.ends import (
    LAYOUT,
    SplitKV,
    decode_end,
    held,
    pack,
    prefill_end,
    rank_kv,
    serve_attend,
)
from refimpl.cluster.faults import Kill, parse_kill
from refimpl.cluster.router import ClusterConfig
from refimpl.cluster.workload import ModelSpec, make_requests, reference_tokens
from refimpl.model import decode
from refimpl.transport import Fault, InProcessTransport


def test_kill_specs() -> None:
    assert parse_kill("prefill:1@30%", 2, 1, 0) == Kill("prefill", 1, 0.3)
    assert parse_kill("decode@0%", 2, 1, 0) == Kill("decode", 0, 0.0)
    k = parse_kill("random", 2, 1, 7)
    assert k is not None and k.proc in ("p0", "p1", "d0") and 0.2 <= k.at_fraction <= 0.8
    assert parse_kill(None, 2, 1, 0) is None
    with pytest.raises(ValueError, match="prefill rank 2 >= --prefill-tp 2"):
        parse_kill("prefill:2@10%", 2, 1, 0)
    with pytest.raises(ValueError, match="expected random"):
        parse_kill("p1@10", 2, 1, 0)
    assert parse_kill("decode:1.1@20%", 2, 2, 0, 2) == Kill("decode", 1, 0.2, 1)
    assert parse_kill("decode:1.1@20%", 2, 2, 0, 2).proc == "d1r1"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="decode rank 1 >= --decode-tp 1"):
        parse_kill("decode:0.1@20%", 2, 1, 0)
    picks = {parse_kill("random", 2, 1, s, 2).proc for s in range(40)}  # type: ignore[union-attr]
    assert picks == {"p0", "p1", "d0", "d0r1"}  # any process, a decode rank's too


def test_config_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="mutant 'mismatch_installed' .a spec mutant. has no"):
        ClusterConfig(mutant="mismatch_installed")
    with pytest.raises(ValueError, match="not a spec mutant"):
        ClusterConfig(mutant="nope")
    assert ClusterConfig(decode_tp=2).decode_tp == 2  # each decode rank its own process
    with pytest.raises(ValueError, match="decode_tp=3 does not divide the model's 2 KV heads"):
        ClusterConfig(decode_tp=3)
    with pytest.raises(ValueError, match=r"decode_tp=8 not in \[1, 4\]"):
        ClusterConfig(decode_tp=8)
    with pytest.raises(ValueError, match="drop_p=2"):
        ClusterConfig(drop_p=2.0)
    with pytest.raises(ValueError, match="backend 'nccl': only gloo"):
        ClusterConfig(backend="nccl")


def test_channel_is_fifo_under_delays_and_merges_clocks() -> None:
    store = serve_store("127.0.0.1", 5.0)
    clocks = {"a": 0, "b": 0}

    def clock(name: str):  # type: ignore[no-untyped-def]
        def tick(received: int) -> int:
            clocks[name] = max(clocks[name], received) + 1
            return clocks[name]

        return tick

    slow = ControlFaults(delay_p=0.5, delay_s=0.05, seed=1)
    a = Channel(store, "a", ("b",), clock("a"), slow)
    b = Channel(store, "b", ("a",), clock("b"))
    for k in range(20):
        a.send("b", "m", k=k)
    a.drain(2.0)
    got = b.poll(limit=100)
    assert [m["k"] for m in got] == list(range(20))
    assert a.delayed > 0
    assert clocks["b"] > clocks["a"] - 1  # b moved past every stamp it read
    assert b.poll() == []  # read keys are gone; nothing twice


def test_merge_orders_by_clock_and_projects_requests() -> None:
    evs = [
        {"action": "DecodeStep", "rid": "r0", "lc": 9, "proc": "d0", "seq": 1},
        {"action": "PrefillAdmit", "rid": "r0", "lc": 2, "proc": "p0", "seq": 1},
        {"action": "EnvCrash", "args": {"worker": "prefill"}, "lc": 5, "proc": "router", "seq": 1},
        {"action": "PrefillAdmit", "rid": "r1", "lc": 7, "proc": "p0", "seq": 2},
    ]
    merged = eventlog.merge(evs)
    assert [e["lc"] for e in merged] == [2, 5, 7, 9]
    per = eventlog.per_request(merged)
    assert [e["action"] for e in per["r0"]] == ["PrefillAdmit", "EnvCrash", "DecodeStep"]
    assert [e["action"] for e in per["r1"]] == ["PrefillAdmit"]  # the crash came before it


def _handoff(flip_a_bit: bool, dst_tp: int) -> tuple[bool, int, int]:
    """The cluster's two ends (``refimpl.cluster.ends``: one ``RankSender`` per prefill
    rank process, one ``RankReceiver`` per decode rank process) over an in-process
    transport; the decode leader's ``SplitKV`` asks the other rank's ``serve_attend``
    directly (in the cluster, a message to that rank's process)."""
    spec = ModelSpec()
    model = spec.model()
    req = make_requests(1, spec, seed=5)[0]
    t = InProcessTransport(copy_payload=True)
    epochs = Epochs()
    ends = [prefill_end(model, 2, r, spec.block_size, 8, t, dst_tp=dst_tp, epochs=epochs, inc=0)
            for r in range(2)]  # fmt: skip
    decs = [decode_end(model, spec.block_size, 16, t, tp=dst_tp, rank=d, src_tp=2, inc=0)
            for d in range(dst_tp)]  # fmt: skip
    firsts = [int(w.prefill(req.rid, torch.tensor(req.prompt))[0][-1].argmax()) for w, _ in ends]
    for _, rx, _ in decs:
        rx.expect(req.rid, decode_room=req.steps + 1)
    if flip_a_bit:  # the first chunk decode rank 0 gets
        t.inject(channels(sub_id(req.rid, 0)).to_receiver, Fault.CORRUPT, skip=1)
    epochs.open(req.rid)
    for w, tx in ends:
        tx.offer(req.rid, req.prompt, blocks=w.rp.alloc.blocks_of(req.rid))
        for layer in range(spec.layers):
            tx.send_layer(req.rid, layer)
    for _ in range(12):
        for _, rx, _ in decs:
            rx.poll(req.rid)
        for _, tx in ends:
            tx.poll(req.rid)
    states = {*(rx.state(req.rid) for _, rx, _ in decs), *(tx.state(req.rid) for _, tx in ends)}
    for w, _ in ends:
        w.rp.alloc.free(req.rid)
    if flip_a_bit:
        assert states == {State.ABORTED}, states
        assert any("checksum" in r.lower() for r in decs[0][1].reasons(req.rid))
        return False, sum(held(own.alloc) for _, _, own in decs), held(ends[0][0].rp.alloc)
    assert states == {State.DONE}, states
    n = len(req.prompt)
    stores = [rank_kv(model.cfg, LAYOUT, spec.block_size, dst_tp, own.pools[0].kv,
                      rx.blocks(req.rid), n) for _, rx, own in decs]  # fmt: skip

    def call(rank: int, layer: int, start: int, *qkv: torch.Tensor) -> torch.Tensor:
        m = {"layer": layer, "start": start, **dict(zip("qkv", map(pack, qkv), strict=True))}
        return serve_attend(model.cfg, stores[rank], dst_tp, rank, m)

    first = firsts[0]
    kv = SplitKV(model.cfg, stores[0], dst_tp, call)
    toks = (first, *decode(model, first, n, req.steps, kv)[1][1:])
    for d, (_, _, own) in enumerate(decs):
        assert held(own.alloc) == len(stores[d].kv.block_tables[0])  # its heads' blocks only
        own.alloc.free(sub_id(req.rid, d))
        own.alloc.check_integrity()
    left = sum(held(own.alloc) for _, _, own in decs)
    return toks == reference_tokens(model, req), left, held(ends[0][0].rp.alloc)


@pytest.mark.parametrize("dst_tp", [1, 2])
def test_data_path_tokens_equal_reference_and_nothing_held(dst_tp: int) -> None:
    assert _handoff(False, dst_tp) == (True, 0, 0)


@pytest.mark.parametrize("dst_tp", [1, 2])
def test_data_path_refuses_a_flipped_bit(dst_tp: int) -> None:
    assert _handoff(True, dst_tp) == (False, 0, 0)


def test_attend_refuses_what_does_not_fit() -> None:
    """A peer's attend is read against what the rank expects: a clear error, nothing written."""
    from refimpl.cluster.ends import unpack

    with pytest.raises(ValueError, match="shape"):
        unpack({"shape": [1, 2], "b64": ""}, torch.float32, 3)
    with pytest.raises(ValueError, match="4 bytes for shape"):
        unpack({"shape": [1, 1, 2], "b64": "AAAAAA=="}, torch.float32, 3)
    with pytest.raises(ValueError, match="not an object"):
        unpack([1], torch.float32, 3)


def test_cluster_configs_exist_for_every_request_shape() -> None:
    from spec.config import get_config

    for t in (1, 2, 3, 4):
        for b in (1, 2, 3):
            c = get_config(eventlog.config_name(t, b))
            assert (c.n_reqs, c.src_tp, c.blocks, c.dst_tp) == (1, t, b, 1)


def test_a_crash_goes_only_into_the_logs_it_touched_and_before_what_follows_it() -> None:
    crash = {"action": "EnvCrash", "args": {"worker": "decode"}, "victims": ["d0"],
             "crash": 1, "lc": 10, "proc": "router", "seq": 1}  # fmt: skip
    evs = [
        {"action": "DecodeReserve", "rid": "r0", "lc": 3, "proc": "d0", "seq": 1},
        {"action": "PrefillFreeze", "rid": "r1", "lc": 4, "proc": "p0", "seq": 1},
        crash,
        # p0 heard of the crash at its seq 3: its seq 2 is concurrent (may come first),
        # its seq 4 follows the crash, whatever the clocks say
        {"action": "PrefillTimeout", "rid": "r0", "lc": 12, "proc": "p0", "seq": 2},
        {"action": "CrashSeen", "args": {"crash": 1}, "lc": 13, "proc": "p0", "seq": 3},
        {"action": "PrefillTimeout", "rid": "r1", "lc": 14, "proc": "p0", "seq": 4},
        {"action": "DecodeReserve", "rid": "r2", "lc": 15, "proc": "d0.1", "seq": 1},
    ]
    per = eventlog.per_request(eventlog.merge(evs))
    assert [e["action"] for e in per["r0"]] == ["DecodeReserve", "PrefillTimeout", "EnvCrash"]
    assert [e["action"] for e in per["r1"]] == ["PrefillFreeze", "PrefillTimeout"]  # untouched
    assert [e["action"] for e in per["r2"]] == ["DecodeReserve"]  # after the restart
    evs[3]["seq"], evs[4]["seq"] = 3, 2  # p0 heard of it first: the timeout follows it
    per = eventlog.per_request(eventlog.merge(evs))
    assert [e["action"] for e in per["r0"]] == ["DecodeReserve", "EnvCrash", "PrefillTimeout"]


def test_a_restarted_peer_is_a_new_mailbox_and_the_old_one_is_fenced() -> None:
    store = serve_store("127.0.0.1", 5.0)
    tick = iter(range(1, 1 << 20))

    def clock(received: int) -> int:
        return next(tick)

    d_old = Channel(store, "d0", ("p0",), clock)
    p0 = Channel(store, "p0", ("d0",), clock)
    d_old.send("p0", "ack", rid="r1", epoch=1)  # sent by incarnation 0, never read
    d_new = Channel(store, "d0", ("p0",), clock, inc=1)
    d_new.send("p0", "ready", rid="r2", epoch=1, to_inc=0)
    p0.set_inc("d0", 1)  # told of the restart: the old mailbox is discarded unread
    assert p0.fenced == 1
    got = p0.poll()
    assert [(m["kind"], m["inc"]) for m in got] == [("ready", 1)]
    p0.send("d0", "go", rid="r2")  # to the new incarnation only
    assert [m["kind"] for m in d_new.poll()] == ["go"] and d_old.poll() == []


def test_cancels_and_drops_are_functions_of_the_seed_not_of_the_order() -> None:
    from refimpl.cluster.faults import CancelPlan

    plan = CancelPlan(0.5)
    rids = [f"r{k}" for k in range(200)]
    first = {rid: plan.plan(7, rid, 4) for rid in rids}
    assert first == {rid: plan.plan(7, rid, 4) for rid in reversed(rids)}
    kinds = {str(v).split(":")[0] for v in first.values()}
    assert kinds == {"None", "queued", "prefilled", "decode"}
    assert first != {rid: plan.plan(8, rid, 4) for rid in rids}
    f = ControlFaults(drop_p=0.3, droppable=frozenset({"ready"}), seed=7)
    drops = [f.drops("ready", {"rid": r, "epoch": 1}) for r in rids]
    assert drops == [f.drops("ready", {"rid": r, "epoch": 1}) for r in rids]
    assert 20 < sum(drops) < 100
    assert not any(f.drops("ack", {"rid": r, "epoch": 1}) for r in rids)  # never an Ack


def test_a_log_dir_with_files_gets_a_new_run_folder_and_keeps_them(tmp_path: Path) -> None:
    """``kvown cluster --log-dir DIR`` deleted every ``*.jsonl`` already in DIR (issue #34)."""
    mine = tmp_path / "notes.jsonl"
    mine.write_text('{"mine": 1}\n')
    first = eventlog.fresh_log_dir(str(tmp_path))
    second = eventlog.fresh_log_dir(str(tmp_path))
    assert first == tmp_path / "run-1" and second == tmp_path / "run-2"
    assert mine.read_text() == '{"mine": 1}\n'
    new = tmp_path / "new" / "logs"
    assert eventlog.fresh_log_dir(str(new)) == new and new.is_dir()  # new or empty: itself
    assert eventlog.fresh_log_dir(str(new)) == new
    temp = eventlog.fresh_log_dir("")
    assert temp.is_dir() and not any(temp.iterdir())
    temp.rmdir()


def test_the_heartbeat_timeout_scales_with_the_machines_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On 2 busy cores a live worker's beat thread waited for a CPU past ``--timeout`` and
    the worker was declared dead (issue #34): the router scales the timeout by the load."""
    from refimpl.cluster import control

    monkeypatch.setattr(control.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(control, "runnable_now", lambda: 0)
    for load, factor in ((0.5, 1.0), (2.0, 1.0), (12.0, 6.0), (1000.0, control.MAX_LOAD_FACTOR)):
        monkeypatch.setattr(control.os, "getloadavg", lambda v=load: (v, v, v))
        assert control.load_factor() == factor
    # a load that began seconds ago: the average still says 0.5, 12 threads are runnable
    monkeypatch.setattr(control.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    monkeypatch.setattr(control, "runnable_now", lambda: 12)
    assert control.load_factor() == 6.0
    monkeypatch.undo()  # the real count reads /proc
    assert isinstance(control.runnable_now(), int) and control.runnable_now() >= 0
    monkeypatch.setattr(control.os, "cpu_count", lambda: 2)

    def unknown() -> tuple[float, float, float]:
        raise OSError("no load average")

    monkeypatch.setattr(control.os, "getloadavg", unknown)
    assert control.load_factor() == 1.0


def test_await_reply_keeps_what_came_behind_the_reply() -> None:
    """The decode leader waits for a rank's ``attended`` by polling that rank's mailbox;
    a message the rank sent right after its answer (its "installed" of the next request)
    comes in the same poll. It was dropped with the rest of the batch: the leader never
    heard the rank installed, and the request died by its timer (``kvown cluster
    --decode-tp 2``: ``test_decode_tp_two_each_decode_rank_a_process`` failed 1 run in 10,
    "waiting on decode rank 1's install at epoch 1")."""
    from refimpl.cluster.ends import await_reply

    before, after = {"kind": "kv", "n": 1}, {"kind": "kv", "n": 2}
    batches = [[before, {"kind": "attended", "seq": 7, "ok": True}, after]]
    kept: list[dict[str, object]] = []
    got = await_reply(lambda: batches.pop(0) if batches else [], kept.append, 7, 5.0)
    assert got["seq"] == 7 and kept == [before, after]
