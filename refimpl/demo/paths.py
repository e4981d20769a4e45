"""The paths of `kvown demo`: prefill on one mesh, hand off, decode on another, compare.

Each path prefills a prompt with the TinyDecoder on the source worker's paged pools,
hands the KV to the decode worker through the real data path (refimpl/demo/handoff.py:
manifest from the real tensors as JSON, `check_compatible` before anything is reserved,
xxh3 per chunk and per block before install, refimpl/reshard.py for TP, block size and
layout), decodes `steps` greedy tokens there, and compares every logit with decoding in
one process with no handoff (`generate`, unpaged `ContiguousKV`) by `torch.equal`.

Bit-exactness holds on every path (no tolerance is needed): the handoff only moves bytes,
and the model computes each head's attention with the same operations on the same
contiguous (S, head_dim) K and V whichever rank or pool served them (see refimpl/model.py).
The one place where bits could differ, a prefix computed by an earlier request, is set up
so they do not: that request has the same length, so every GEMM and softmax row below the
shared prefix runs the same kernels on the same values (masked columns add exact zeros).

The model runs in float32: the manifest names the storage dtype and has no float64.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from refimpl.api import offload, reload
from refimpl.demo.handoff import Handoff, Worker, handoff
from refimpl.demo.tiers import disk_round_trip
from refimpl.model import Generation, TinyConfig, TinyDecoder, decode, generate
from spec import shardmap as sm

HM, TM = "heads_major", "tokens_major"
DEMO_CONFIG = TinyConfig(kv_heads=4, dtype="float32")  # 8 q heads over 4 KV heads (GQA)
PROMPT_LEN, STEPS, SEED = 13, 6, 0
CAPACITY = 32  # blocks per pool


@dataclass(frozen=True, slots=True)
class DemoRecord:
    name: str
    blocks_moved: int  # logical blocks (sender's block size) carried by the handoff
    bytes_moved: int  # chunk payload bytes over the transport
    checksums_verified: int  # xxh3 comparisons that passed (chunks, blocks, round trip)
    logits_equal: bool  # prefill and decode logits torch.equal to the no-handoff run
    max_abs_diff: float  # max |logits - reference| over prefill and decode
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class PathSpec:
    name: str
    src: tuple[int, int, str]  # prefill (tp, block_size, layout)
    dst: tuple[int, int, str]  # decode (tp, block_size, layout)
    prefix_tokens: int = 0  # tokens the decode side already holds from an earlier request
    offload: bool = False  # decode side: device -> host -> device before decoding
    disk: bool = False  # decode side: device -> a published file -> device before decoding


SPECS = {
    s.name: s
    for s in (
        PathSpec("tp2->tp1", (2, 4, HM), (1, 4, HM)),
        PathSpec("tp1->tp2", (1, 4, HM), (2, 4, HM)),
        PathSpec("tp4->tp2", (4, 4, HM), (2, 4, HM)),
        PathSpec("tp2->tp1 +prefix", (2, 4, HM), (1, 4, HM), prefix_tokens=8),
        PathSpec("tp2->tp1 +offload", (2, 4, HM), (1, 4, HM), offload=True),
        PathSpec("bs4->6 +layout", (2, 4, TM), (2, 6, HM)),
        PathSpec("tp2->tp1 +disk", (2, 4, HM), (1, 4, TM), disk=True),
    )
}


def prompt_of(cfg: TinyConfig, seed: int, n: int = PROMPT_LEN) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (n,), generator=g)  # (T,)


def _worker(model: TinyDecoder, side: tuple[int, int, str]) -> Worker:
    tp, bs, layout = side
    return Worker(model, tp=tp, block_size=bs, layout=layout, capacity=CAPACITY)


def _warm_prefix(dst: Worker, prompt: torch.Tensor, n: int, seed: int) -> None:
    """An earlier request, served on the decode worker itself, whose first `n` tokens are
    the prompt's (same length, see the module docstring); its full blocks stay cached."""
    other = prompt_of(dst.model.cfg, seed + 1000, prompt.shape[0])
    warm = torch.cat((prompt[:n], other[n:]))  # (T,)
    dst.prefill("warm", warm)
    dst.cache_prefix("warm", warm.tolist())
    dst.finish("warm")


def offload_reload(w: Worker, rid: str, num_tokens: int, room: int) -> tuple[list[int], int, int]:
    """Move `rid`'s blocks device -> host -> device (new block ids) with the API's verified
    ``offload``/``reload``. Returns (the new block table, checksums verified, bytes
    copied each way)."""
    g = w.geometry
    host = g.make_pools(sm.blocks_needed(num_tokens, w.block_size), device=None, host=True)
    tokens = list(range(num_tokens))  # the ids only label the manifest of a tier move
    off = offload(w.rp, g, host, g, rid, tokens, free_device=True)
    back = reload(host, g, w.rp, g, rid, tokens, decode_room=room)
    return list(back.received.blocks), off.checks + back.checks, off.bytes_sent


def run_path(
    spec: PathSpec,
    *,
    cfg: TinyConfig = DEMO_CONFIG,
    seed: int = SEED,
    prompt_len: int = PROMPT_LEN,
    steps: int = STEPS,
) -> DemoRecord:
    """Prefill on spec.src, hand off, decode `steps` tokens on spec.dst; compare."""
    model = TinyDecoder(cfg, seed=seed)
    prompt = prompt_of(cfg, seed, prompt_len)
    ref = generate(model, prompt, steps)  # one process, no handoff, no paging
    src = _worker(model, spec.src)
    dst = _worker(TinyDecoder(cfg, seed=seed), spec.dst)  # its own copy of the weights
    if spec.prefix_tokens:
        _warm_prefix(dst, prompt, spec.prefix_tokens, seed)
    logits, _ = src.prefill("req", prompt)  # (T, V)
    h = handoff(src, dst, "req", prompt.tolist(), int(logits[-1].argmax()), decode_room=steps)
    store, checks, note = h.store, h.checksums_verified, _conversions(h, dst)
    if spec.offload:
        table, n, moved = offload_reload(dst, "req", prompt_len, steps)
        store, checks = dst.store(table, prompt_len), checks + n
        note = f"{note}; offload+reload {moved} B"
    if spec.disk:
        with tempfile.TemporaryDirectory(prefix="kvown-demo-disk-") as d:
            table, n, nbytes = disk_round_trip(dst, "req", prompt.tolist(), steps, Path(d))
        store, checks = dst.store(table, prompt_len), checks + n
        note = f"{note}; disk: {nbytes} B file published, read back verified"
    if spec.prefix_tokens:
        note = f"{note}; {h.manifest.prefix_blocks} blocks cached"
    rows, tokens = decode(dst.model, h.first_token, prompt_len, steps, store)  # (N, V)
    dst.finish("req")
    _check_no_leak(src, dst)
    return _record(spec.name, h, checks, (logits, rows), ref, tokens, note.strip("; "))


def _conversions(h: Handoff, dst: Worker) -> str:
    """What the receiver converted, short: "tp 2->1, bs 4->6, tokens->heads"."""
    m, d = h.manifest, dst.local
    out = [f"tp {m.src_tp}->{m.dst_tp}"] if m.src_tp != m.dst_tp else []
    out += [f"bs {m.block_size}->{d.block_size}"] if m.block_size != d.block_size else []
    if m.layout != d.layout:
        out.append(f"{m.layout.split('_')[0]}->{d.layout.split('_')[0]} major")
    return ", ".join(out)


def _record(
    name: str,
    h: Handoff,
    checks: int,
    got: tuple[torch.Tensor, torch.Tensor],
    ref: Generation,
    tokens: tuple[int, ...],
    note: str,
) -> DemoRecord:
    want = (ref.prefill_logits, ref.decode_logits)
    equal = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    equal = equal and tokens == ref.tokens
    diff = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
    return DemoRecord(name, h.blocks_sent, h.bytes_sent, checks, equal, diff, note)


def _check_no_leak(*workers: Worker) -> None:
    """Every block is free again except the decode side's prefix cache."""
    for w in workers:
        w.rp.alloc.check_integrity()
        if w.rp.alloc.num_free != w.rp.alloc.capacity - len(w.cache):
            raise AssertionError(f"blocks leaked: {w.rp.alloc.counts()}")


def _path(name: str) -> Callable[..., DemoRecord]:
    def run(**kw: object) -> DemoRecord:
        return run_path(SPECS[name], **kw)  # type: ignore[arg-type]

    run.__doc__ = f"The {name!r} demo path."
    return run


tp2_to_tp1 = _path("tp2->tp1")
tp1_to_tp2 = _path("tp1->tp2")
tp4_to_tp2 = _path("tp4->tp2")
prefix_cached = _path("tp2->tp1 +prefix")
offload_round_trip = _path("tp2->tp1 +offload")
block_size_change = _path("bs4->6 +layout")
disk_tier_round_trip = _path("tp2->tp1 +disk")
PATHS: tuple[Callable[..., DemoRecord], ...] = (
    tp2_to_tp1,
    tp1_to_tp2,
    tp4_to_tp2,
    prefix_cached,
    offload_round_trip,
    block_size_change,
    disk_tier_round_trip,
)


def run_all(**kw: object) -> list[DemoRecord]:
    return [path(**kw) for path in PATHS]
