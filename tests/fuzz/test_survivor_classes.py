"""Each class of survivor of issue #18 now has a check that catches its kind: the machine
(ci profile, derandomised) kills a planted bug of that class on the world built for it,
and the data-path fuzz kills broken run/span merging on permuted block tables.

    single-feature worlds   a decode step through the wrong block order (partial
                            prefix), a crash that keeps the prefix cache (crash+prefix)
    not probed              a forged message index accepted
    not independent         recompute losing the generated tokens (the ghost)
    never driven            copy_blocks / reshard merging over non-contiguous tables;
                            (issue #33) a merge of whole adjacent blocks, a fault's
                            counter, ``Inbox``'s accounting
"""

from __future__ import annotations

import pytest

import refimpl.pool
import refimpl.reshard
import refimpl.transport
from refimpl.engine import Engine
from refimpl.testing import Divergence
from refimpl.testing.datapath import (
    copy_blocks_agrees,
    inbox_agrees,
    receiver_agrees,
    reshard_agrees,
)
from refimpl.testing.run import hunt
from refimpl.testing.worlds import get_world

try:
    import planted as P
except ImportError:  # pragma: no cover - another import mode
    import tests.fuzz.planted as P

EXAMPLES = 150  # a cap: each is killed well before it (the first failure stops the hunt)

CASES = [
    (P.DecodeStepWrongOrder, "partial_prefix"),
    (P.CrashKeepsPrefix, "prefix_faults"),
    (P.FindIgnoresIndex, "handoff_tp2to1"),
    (P.RecomputeLosesTokens, "offload_contend"),
]


@pytest.mark.parametrize(("engine", "world"), CASES, ids=[c[0].__name__ for c in CASES])
def test_the_machine_kills_the_planted_bug(engine: type[Engine], world: str) -> None:
    res = hunt(P.PlantedAdapter(engine=engine), get_world(world), examples=EXAMPLES)
    assert isinstance(res.failure, Divergence), f"{engine.__name__} survived {res.examples}"


def test_copy_blocks_fuzz_kills_a_run_merged_on_one_side(monkeypatch: pytest.MonkeyPatch) -> None:
    def runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
        out: list[tuple[int, int, int]] = []
        for s, d in zip(src, dst, strict=True):
            if out and out[-1][0] + out[-1][2] == s:  # the destination's side not checked
                out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
            else:
                out.append((s, d, 1))
        return out

    monkeypatch.setattr(refimpl.pool, "_runs", runs)
    with pytest.raises((AssertionError, RuntimeError)):  # wrong bytes, or a shape clash
        copy_blocks_agrees()


def test_reshard_fuzz_kills_a_span_merged_over_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    real = refimpl.reshard._spans

    def spans(pieces, src_table, dst_table, src_bs, dst_bs):  # type: ignore[no-untyped-def]
        out = real(pieces, src_table, dst_table, src_bs, dst_bs)
        merged: list[refimpl.reshard._Span] = []
        for sp in out:  # also merge whole blocks that are adjacent on the source only
            last = merged[-1] if merged else None
            if last and sp.n == 1 and last.src + last.n == sp.src and sp.length == src_bs:
                if last.src_slot == last.dst_slot == sp.src_slot == sp.dst_slot == 0:
                    merged[-1] = refimpl.reshard._Span(
                        last.src, last.dst, last.n + 1, 0, 0, last.length
                    )
                    continue
            merged.append(sp)
        return merged

    monkeypatch.setattr(refimpl.reshard, "_spans", spans)
    with pytest.raises((AssertionError, RuntimeError)):  # wrong bytes, or a shape clash
        reshard_agrees()


def test_reshard_fuzz_kills_a_merge_written_over_the_span_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = refimpl.reshard._spans

    def spans(pieces, src_table, dst_table, src_bs, dst_bs):  # type: ignore[no-untyped-def]
        out: list[refimpl.reshard._Span] = []
        for p in pieces:  # the mutant spans[-2] = ... of issue #33, on the real pieces
            got = real([p], src_table, dst_table, src_bs, dst_bs)[0]
            last = out[-1] if out else None
            whole = got.length == src_bs == dst_bs and got.src_slot == got.dst_slot == 0
            if whole and last and last.n == 1 and last.length == got.length:
                if (last.src + 1, last.dst + 1) == (got.src, got.dst):
                    out[-2] = refimpl.reshard._Span(last.src, last.dst, 2, 0, 0, got.length)
                    continue
            out.append(got)
        return out

    monkeypatch.setattr(refimpl.reshard, "_spans", spans)
    with pytest.raises((AssertionError, IndexError)):  # wrong bytes, or no span before
        reshard_agrees()


def test_receiver_fuzz_kills_a_reorder_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    real = refimpl.transport.InProcessTransport.send

    def send(self, channel, header, payload=b""):  # type: ignore[no-untyped-def]
        before = self.stats["reordered"]
        real(self, channel, header, payload)
        self.stats["reordered"] = before  # the counter's line dropped

    monkeypatch.setattr(refimpl.transport.InProcessTransport, "send", send)
    with pytest.raises(AssertionError, match="reorder"):
        receiver_agrees()


def test_inbox_fuzz_kills_counts_that_start_at_one(monkeypatch: pytest.MonkeyPatch) -> None:
    real = refimpl.transport.Inbox.__init__

    def init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        real(self, *args, **kwargs)
        self.messages = self.bytes = 1

    monkeypatch.setattr(refimpl.transport.Inbox, "__init__", init)
    with pytest.raises(AssertionError):
        inbox_agrees()
