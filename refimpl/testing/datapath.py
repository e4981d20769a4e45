"""Block-table fuzz of the data path: ``copy_blocks``, ``reshard`` and the API's ``Receiver``
driven with non-contiguous, permuted block ids, each against an independent reading.

The engine's machine hands out permuted ids too (``adapter.permute_free_lists``), but
``copy_blocks``' run merging and ``reshard``'s span merging only go wrong on some
id patterns (a run that breaks on one side only, a span that jumps). Each property
draws those patterns directly:

    copy_blocks   random source and destination ids (any order, gaps, runs): every
                  destination block equals its source block, every other block is
                  untouched
    reshard       random TP/CP/block size/axis order on both sides, block tables
                  shuffled with spare blocks: every token of every head, read back
                  slot by slot from the destination's pools through its table, equals
                  the original (and ``unshard`` returns it)
    receiver      a handoff through ``Sender``/``Receiver`` of permuted source blocks,
                  with a chunk lost, duplicated, reordered or corrupted, into permuted
                  reserved blocks of either axis order behind a prefix held there: it
                  commits exactly when nothing was lost, with every block's source
                  bytes, else it gives back what it reserved; forged chunks of another
                  attempt or request change nothing

``run_datapath()`` runs all three (derandomised) and returns the first failure's text.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refimpl.api import (
    KVGeometry,
    ModelIdentity,
    Receiver,
    Sender,
    State,
    channels,
    read_kv,
    write_kv,
)
from refimpl.blocks import BlockStatus
from refimpl.pool import KVPool, PoolGeometry, copy_blocks
from refimpl.reshard import KVLayout, allocate, reshard, unshard
from refimpl.transport import Fault, InProcessTransport
from spec import shardmap as sm
from spec.manifest import LocalConfig, RopeConfig

EXAMPLES = 60  # per property, in run_datapath

LOCAL = LocalConfig(
    model_id="tiny",
    adapter_id=None,
    dtype="float16",
    quantization="none",
    num_layers=2,
    kv_heads=2,
    head_dim=4,
    block_size=2,
    layout="heads_major",
    rope=RopeConfig(10000.0, 4),
    tp=1,
    cp=1,
)
GEO = PoolGeometry.of_local(LOCAL)
IDENTITY = ModelIdentity(LOCAL.model_id, LOCAL.rope)


def _fill(pool: KVPool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=g).to(pool.kv.dtype))


@st.composite
def _pairs(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    cap = draw(st.integers(2, 9), label="capacity")
    n = draw(st.integers(1, cap), label="blocks")
    return cap, _table(draw, n, cap), _table(draw, n, cap)


def check_copy_blocks(cap: int, src_ids: list[int], dst_ids: list[int], seed: int) -> None:
    src, dst = KVPool(cap, GEO), KVPool(cap, GEO)
    _fill(src, seed)
    dst.allocator.allocate("r", cap)
    before = dst.kv.clone()
    copy_blocks(src, src_ids, dst, dst_ids, "r")
    for s, d in zip(src_ids, dst_ids, strict=True):
        assert torch.equal(dst.kv[d], src.kv[s]), f"block {s} -> {d} of {src_ids} -> {dst_ids}"
    for b in set(range(cap)) - set(dst_ids):
        assert torch.equal(dst.kv[b], before[b]), f"block {b} written, not in {dst_ids}"


@st.composite
def _layouts(draw: st.DrawFn, kv_heads: int) -> KVLayout:
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if kv_heads % t == 0 or t % kv_heads == 0]))
    return KVLayout(
        draw(st.sampled_from(sorted(sm.LAYOUTS))),
        layers=2,
        kv_heads=kv_heads,
        block_size=draw(st.integers(1, 4)),
        head_dim=2,
        tp=tp,
        cp=draw(st.integers(1, 2)),
    )


def _table(draw: st.DrawFn, n: int, phys: int) -> list[int]:
    """``n`` distinct ids of ``range(phys)``: in runs of adjacent ids with gaps (where
    merging goes wrong), reversed, or any permutation."""
    mode = draw(st.sampled_from(["runs", "reversed", "any"]), label="table mode")
    if mode == "any":
        return list(draw(st.permutations(range(phys)), label="table"))[:n]
    if mode == "reversed":
        return list(range(phys))[::-1][:n]
    starts = list(draw(st.permutations(range(phys)), label="run starts"))
    out: list[int] = []
    for b in starts:
        run = draw(st.integers(1, 3), label="run")
        out.extend(x for x in range(b, min(b + run, phys)) if x not in out)
        if len(out) >= n:
            break
    rest = [x for x in range(phys) if x not in out]
    return (out + rest)[:n]


def _shuffled(kv: object, draw: st.DrawFn, spare: int) -> None:
    """Replace each block table by distinct physical blocks of the pool, not in order."""
    for c, table in enumerate(kv.block_tables):  # type: ignore[attr-defined]
        kv.block_tables[c] = _table(draw, len(table) - spare, len(table))  # type: ignore[attr-defined]


def read_back(kv: object) -> torch.Tensor:
    """(layers, 2, kv_heads, T, head_dim) read token by token through the block tables
    (primary TP replica of each head), without reshard's span logic."""
    d, total = kv.decl, kv.num_tokens  # type: ignore[attr-defined]
    out = torch.empty((d.layers, 2, d.kv_heads, total, d.head_dim))
    to_hm = sm.layout_permutation(d.layout, "heads_major")
    for c in range(d.cp):
        c0, c1 = sm.cp_tokens(total, d.cp, c)
        for t in range(c0, c1):
            b = kv.block_tables[c][(t - c0) // d.block_size]  # type: ignore[attr-defined]
            slot = (t - c0) % d.block_size
            for h in range(d.kv_heads):
                rank = next(r for r in range(d.tp) if h in sm.tp_heads(d.kv_heads, d.tp, r))
                local = sm.tp_heads(d.kv_heads, d.tp, rank).index(h)
                blk = kv.pools[rank][c][b].permute(to_hm)  # type: ignore[attr-defined]
                out[:, :, h, t] = blk[:, :, local, slot]
    return out


@st.composite
def _reshard_case(draw: st.DrawFn) -> tuple[KVLayout, KVLayout, int, int]:
    heads = draw(st.sampled_from([1, 2, 4]), label="kv_heads")
    a, b = draw(_layouts(heads)), draw(_layouts(heads))
    tokens = draw(st.integers(1, 12), label="tokens")
    return a, b, tokens, draw(st.integers(0, 3), label="spare")


def check_reshard(a: KVLayout, b: KVLayout, tokens: int, spare: int, data: st.DataObject) -> None:
    g = torch.Generator().manual_seed(tokens * 31 + spare)
    full = torch.randn((2, 2, a.kv_heads, tokens, 2), generator=g)
    src = allocate(a, tokens, spare_blocks=spare)
    _shuffled(src, data.draw, spare)
    src.num_tokens = tokens
    from refimpl.reshard import _flat  # the unsharded view, as shard() builds it

    reshard(_flat(full.contiguous(), tokens), src)
    assert torch.equal(read_back(src), full), f"shard into {a} with tables {src.block_tables}"
    dst = allocate(b, tokens, spare_blocks=spare)
    _shuffled(dst, data.draw, spare)
    start = data.draw(st.integers(0, tokens - 1), label="suffix start")
    if start and b.cp == 1:  # the destination holds a prefix: send the rest only
        reshard(src, dst, 0, start)
        reshard(src, dst, start)
    else:
        reshard(src, dst)
    assert torch.equal(read_back(dst), full), f"{a} -> {b} from {start}, {dst.block_tables}"
    assert torch.equal(unshard(dst), full), f"unshard of {b}, tables {dst.block_tables}"


def check_receiver(
    cap: int, n: int, first: int, fault: str | None, at: int, data: st.DataObject
) -> None:
    """One handoff through the public API (``Sender``/``Receiver``, the one receive path)
    from permuted source blocks into permuted reserved blocks of either axis order, the
    receiver holding the first ``first`` blocks as its prefix, with a chunk lost,
    duplicated, reordered or corrupted: it commits exactly when nothing was lost, then
    every block it owns holds its source bytes; else it gives back every block it
    reserved. Forged chunks of another attempt or request change nothing."""
    layout = data.draw(st.sampled_from(["heads_major", "tokens_major"]), label="dst layout")
    src_g = KVGeometry.from_local_config(LOCAL)
    dst_g = src_g.with_(layout=layout)
    t = InProcessTransport()
    ps, pd = src_g.make_pools(cap), dst_g.make_pools(cap + first)
    for alloc in (ps.alloc, pd.alloc):
        order = data.draw(st.permutations(range(alloc.capacity)), label="free order")
        alloc._free.clear()  # noqa: SLF001 - a permuted allocation order
        alloc._free.extend(order)  # noqa: SLF001
    blocks = ps.alloc.allocate("r", n)
    _fill(ps.pools[0], n * 7 + first)
    bs, tokens = src_g.block_size, n * src_g.block_size
    kv = read_kv(ps, blocks, tokens)
    prefix = pd.alloc.allocate("cache", first)
    if first:
        write_kv(pd, "cache", prefix, [list(x[:, :, : first * bs]) for x in kv])
    tx, rx = Sender(ps, src_g, t, IDENTITY), Receiver(pd, dst_g, t, IDENTITY)
    rx.expect("r", prefix=prefix, prefix_tokens=range(first * bs))
    tx.offer("r", range(tokens), blocks=blocks, prefix_blocks=first)
    rx.poll("r")
    tx.poll("r")
    ch = channels("r").to_receiver
    chunks = t.poll(ch)
    target = pd.alloc.blocks_of("r")
    before = [p.kv.clone() for p in pd.pools]
    for h, payload in chunks[:1]:  # another attempt's, another request's: fenced
        for forged in ({**h, "epoch": h["epoch"] + 1}, {**h, "request_id": "other"}):
            t.send(ch, forged, payload)
        rx.poll("r")
        assert rx.state("r") is State.RECEIVING, rx.error("r")
        assert all(torch.equal(p.kv, b) for p, b in zip(pd.pools, before, strict=True))
    if fault is not None:
        t.inject(ch, fault, skip=min(at, max(n - first - 1, 0)))
    for h, payload in chunks:
        t.send(ch, h, payload)
    idle = 0
    while not (rx.state("r").final and tx.state("r").final) and idle < 3:
        idle = 0 if rx.poll("r") + tx.poll("r") else idle + 1
    if not rx.state("r").final:  # a chunk was lost: both ends time out
        rx.abort("r", "timeout")
        tx.abort("r", "timeout")
    lost = fault in ("lose", "corrupt") and n > first
    done = rx.state("r") is State.DONE
    assert done == (not lost), f"state {rx.state('r')} after fault {fault}: {rx.error('r')}"
    if done:
        got = rx.result("r")
        assert torch.equal(read_kv(pd, got.blocks, tokens), kv), f"{layout}, {got.blocks}"
        assert all(pd.alloc.status(b) is BlockStatus.OWNED for b in target)
    else:
        assert set(pd.alloc.holders()) <= {"cache"}, pd.alloc.holders()
    pd.alloc.check_integrity()


_SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)


@_SETTINGS
@given(_pairs(), st.integers(0, 2**16))
def copy_blocks_agrees(case: tuple[int, list[int], list[int]], seed: int) -> None:
    check_copy_blocks(*case, seed)


@_SETTINGS
@given(_reshard_case(), st.data())
def reshard_agrees(case: tuple[KVLayout, KVLayout, int, int], data: st.DataObject) -> None:
    check_reshard(*case, data)


@st.composite
def _receiver_case(draw: st.DrawFn) -> tuple[int, int, int, str | None, int]:
    cap = draw(st.integers(2, 6))
    n = draw(st.integers(1, cap))
    first = draw(st.integers(0, n))
    fault = draw(st.sampled_from([None, *(f.value for f in Fault)]))
    return cap, n, first, fault, draw(st.integers(0, 5))


@_SETTINGS
@given(_receiver_case(), st.data())
def receiver_agrees(case: tuple[int, int, int, str | None, int], data: st.DataObject) -> None:
    check_receiver(*case, data)


PROPERTIES = (copy_blocks_agrees, reshard_agrees, receiver_agrees)


def run_datapath() -> str | None:
    """Run every property (derandomised, ``EXAMPLES`` each); the first failure's text."""
    for prop in PROPERTIES:
        try:
            prop()
        except Exception as exc:  # the property's assertion (or a crash) after shrinking
            return f"{prop.__name__}: {type(exc).__name__}: {str(exc)[:300]}"
    return None
