"""Block-table fuzz of the data path: ``copy_blocks``, ``reshard`` and the API's ``Receiver``
driven with non-contiguous, permuted block ids, each against an independent reading.

The engine's machine hands out permuted ids too (``adapter.permute_free_lists``), but
``copy_blocks``' run merging and ``reshard``'s span merging only go wrong on some
id patterns (a run that breaks on one side only, a span that jumps). Each property
draws those patterns directly:

    copy_blocks   random source and destination ids (any order, gaps, runs): every
                  destination block equals its source block, every other block is
                  untouched
    reshard       random TP/CP/block size/axis order on both sides (half the time one
                  block size on both, where whole blocks merge into spans), block tables
                  shuffled with spare blocks or adjacent ascending ids: every token of
                  every head, read back slot by slot from the destination's pools
                  through its table, equals the original (and ``unshard`` returns it)
    receiver      a handoff through ``Sender``/``Receiver`` of permuted source blocks,
                  with a chunk lost, duplicated, reordered or corrupted, into permuted
                  reserved blocks of either axis order behind a prefix held there: it
                  commits exactly when nothing was lost, with every block's source
                  bytes, else it gives back what it reserved; the transport counts the
                  fault once, under its own name; forged chunks of another attempt or
                  request change nothing
    inbox         random puts, takes, drops and fences on an ``Inbox`` (what a transport
                  between processes keeps unpolled) with small caps, against a plain
                  model: results, ``sizes()`` and the ``fenced``/``dropped_full`` counters

``run_datapath()`` runs all four (derandomised) and returns the first failure's text.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

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
from refimpl.transport import Fault, Inbox, InProcessTransport
from spec import shardmap as sm
from spec.manifest import LocalConfig, RopeConfig

EXAMPLES = 60  # per property, in run_datapath
MODES = ("runs", "reversed", "any")  # block table patterns (``_table``)
FAULT_STATS = {
    "lose": "lost",
    "duplicate": "duplicated",
    "reorder": "reordered",
    "corrupt": "corrupted",
}

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
def _layouts(draw: st.DrawFn, kv_heads: int, block_size: int | None = None) -> KVLayout:
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if kv_heads % t == 0 or t % kv_heads == 0]))
    return KVLayout(
        draw(st.sampled_from(sorted(sm.LAYOUTS))),
        layers=2,
        kv_heads=kv_heads,
        block_size=draw(st.integers(1, 4)) if block_size is None else block_size,
        head_dim=2,
        tp=tp,
        cp=draw(st.integers(1, 2)),
    )


def _table(draw: st.DrawFn, n: int, phys: int, modes: tuple[str, ...] = MODES) -> list[int]:
    """``n`` distinct ids of ``range(phys)``: in runs of adjacent ids with gaps (where
    merging goes wrong), reversed, any permutation, or (``ascending``, when ``modes``
    has it) adjacent ids from a random first one (where every whole block merges)."""
    mode = draw(st.sampled_from(modes), label="table mode")
    if mode == "ascending":
        first = draw(st.integers(0, phys - n), label="first id")
        return list(range(first, first + n))
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
    """Replace each block table by distinct physical blocks of the pool: permuted, or
    adjacent ascending ids (so that whole blocks merge into one span on both sides)."""
    for c, table in enumerate(kv.block_tables):  # type: ignore[attr-defined]
        new = _table(draw, len(table) - spare, len(table), (*MODES, "ascending"))
        kv.block_tables[c] = new  # type: ignore[attr-defined]


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
    a = draw(_layouts(heads))
    same = draw(st.booleans(), label="same block size")  # where whole blocks merge into spans
    b = draw(_layouts(heads, a.block_size if same else None))
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
    skip = min(at, max(n - first - 1, 0))
    if fault is not None:
        t.inject(ch, fault, skip=skip)
    counted = {k: t.stats[k] for k in FAULT_STATS.values()}
    for h, payload in chunks:
        t.send(ch, h, payload)
    hit = fault is not None and len(chunks) > skip  # the fault fell on one of the chunks
    got = {k: t.stats[k] - v for k, v in counted.items()}
    want = {k: int(hit and k == FAULT_STATS.get(fault or "")) for k in counted}
    assert got == want, f"fault {fault} on chunk {skip} of {len(chunks)}: counted {got}"
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


def check_inbox(caps: tuple[int, int, int, int], ops: list[tuple[Any, ...]]) -> None:
    """``Inbox`` (a transport's unpolled messages: bounded, fenced) against a plain model:
    per channel its messages in order and its newest ended epoch (the least recently
    fenced forgotten past ``max_fences``); a fenced put refused (``fenced``); past a cap
    the oldest other channels' messages go first, a put that still cannot fit is refused
    (both ``dropped_full``). After every call its result, ``sizes()`` and both counters agree."""
    max_channels, max_messages, max_bytes, max_fences = caps
    stats: Counter[str] = Counter()
    kw = dict(max_channels=max_channels, max_messages=max_messages, max_bytes=max_bytes)
    box: Inbox[int] = Inbox(stats, max_fences=max_fences, **kw)
    filed: dict[str, list[tuple[int, int | None, int]]] = {}  # (item, epoch, bytes)
    ended: dict[str, int] = {}  # channel -> fenced epoch, least recently fenced first
    dropped = fenced = 0
    for k, (kind, ch, arg, nbytes) in enumerate(ops):
        messages = sum(len(q) for q in filed.values())
        held = sum(n for q in filed.values() for _, _, n in q)
        if kind == "put":
            void = ch in ended and (arg is None or arg <= ended[ch])
            full = False
            while not void and (
                (ch not in filed and len(filed) >= max_channels)
                or messages >= max_messages
                or held + nbytes > max_bytes
            ):  # the oldest other channel gives way; one that cannot fit is dropped
                old = next((c for c in filed if c != ch), None)
                if old is None or nbytes > max_bytes:
                    full = True
                    break
                gone = filed.pop(old)
                dropped += len(gone)
                messages, held = messages - len(gone), held - sum(n for _, _, n in gone)
            fenced, dropped = fenced + void, dropped + (full and not void)
            if not (void or full):
                filed.setdefault(ch, []).append((k, arg, nbytes))
            got, want = box.put(ch, k, arg, nbytes), not (void or full)
        elif kind in ("take", "drop"):
            items = [item for item, _, _ in filed.pop(ch, [])]
            got = box.take(ch) if kind == "take" else box.drop(ch)
            want = items if kind == "take" else len(items)
        else:  # fence
            ended[ch] = max(arg, ended.pop(ch, arg))
            while len(ended) > max_fences:
                del ended[next(iter(ended))]
            was = filed.pop(ch, [])
            keep = [m for m in was if m[1] is not None and m[1] > ended[ch]]
            if keep:
                filed[ch] = keep
            fenced += len(was) - len(keep)
            got, want = box.fence(ch, arg), len(was) - len(keep)
        where = f"call {k} {(kind, ch, arg, nbytes)} with caps {caps}"
        assert got == want, f"{where}: returned {got!r}, the model {want!r}"
        sizes = {
            "channels": len(filed),
            "messages": sum(len(q) for q in filed.values()),
            "bytes": sum(n for q in filed.values() for _, _, n in q),
            "fences": len(ended),
        }
        assert box.sizes() == sizes, f"{where}: sizes {box.sizes()}, the model {sizes}"
        counters = {"dropped_full": dropped, "fenced": fenced}
        assert {c: stats[c] for c in counters} == counters, f"{where}: {stats}, not {counters}"


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


_CHANNELS = st.sampled_from("abc")
_INBOX_CALL = st.one_of(
    st.tuples(st.just("put"), _CHANNELS, st.sampled_from([None, 0, 1, 2]), st.integers(0, 5)),
    st.tuples(st.sampled_from(["take", "drop"]), _CHANNELS, st.none(), st.just(0)),
    st.tuples(st.just("fence"), _CHANNELS, st.integers(0, 2), st.just(0)),
)


@_SETTINGS
@given(
    st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(0, 15), st.integers(1, 3)),
    st.lists(_INBOX_CALL, max_size=30),
)
def inbox_agrees(caps: tuple[int, int, int, int], ops: list[tuple[Any, ...]]) -> None:
    check_inbox(caps, ops)


PROPERTIES = (copy_blocks_agrees, reshard_agrees, receiver_agrees, inbox_agrees)


def run_datapath() -> str | None:
    """Run every property (derandomised, ``EXAMPLES`` each); the first failure's text."""
    for prop in PROPERTIES:
        try:
            prop()
        except Exception as exc:  # the property's assertion (or a crash) after shrinking
            return f"{prop.__name__}: {type(exc).__name__}: {str(exc)[:300]}"
    return None
