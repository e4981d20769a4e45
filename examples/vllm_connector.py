"""A vLLM-KV-connector-shaped handoff, layer by layer, per TP rank, on the engines' own caches.

vLLM's v1 KV connector has a scheduler side and a worker side (one per TP rank). This
example has both, on top of the public API only, without vllm installed: the engines
around them are a few lines each, holding vLLM's per-layer caches (FlashAttention
``[2, blocks, bs, H, D]``, FlashInfer ``[blocks, 2, bs, H, D]``, packed HND
``[blocks, H, bs, 2*D]``) or one cross-layer tensor ``[blocks, layers, 2, bs, H, D]``,
and per-request block tables. Each worker registers its engine's caches once
(``register_kv_caches``, vLLM's ``register_kv_caches``): kvown reads and writes the
engine's blocks in place, the scheduler's block ids on both sides, no kvown pool on
either (a block-size change stages one copy during the transfer; a prefill rank sends a
narrower decode rank its heads through a view of its caches). Every rank is a
``RankSender`` / ``RankReceiver`` (``refimpl.api.ranks``): prefill TP 2 -> decode TP 1
or 1 -> 2, block size 16 -> 32.

Chunked prefill: the prompt is prefilled in two chunks; each chunk is its own attempt
(``f"{rid}/c{k}"``, opened by the scheduler) whose offer names the earlier chunks' blocks
as a prefix (``prefix_blocks=``: not sent) and sends the new blocks' layers as the
chunk's forward computes them; the decode side expects it with the blocks it already
holds as its prefix (its local prefix hit, then the first chunk's committed blocks). A
chunk boundary is a multiple of both block sizes: a prefix is whole blocks on both sides.

Scheduler side (decode instance): ``get_num_new_matched_tokens`` (the tokens after the
local prefix hit come from the prefill side), ``update_state_after_alloc`` (vLLM's
blocks), ``build_connector_meta``. Worker side: ``save_kv_layer`` (``send_layer``: the
layer just computed, read in place), ``get_finished()`` once per step (one
``Progress.progress()`` for every request of the worker: what finished sending or
receiving, what failed; a finished send's blocks go back to the engine at the end of
the request: ``release``, vLLM's delayed free), ``wait_for_save``, ``start_load_kv``
(``expect`` with vLLM's blocks and its prefix), ``wait_for_layer_load`` (``layer_ready``;
a failed load reports the request: vLLM recomputes it).

The workers run in one process here, so a wait also runs the other workers' loops
(``OTHERS``); in an engine each is its own process (examples/dist_layer_handoff.py).

    python examples/vllm_connector.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from refimpl import KVGeometry, ModelIdentity
from refimpl.api.ranks import Epochs, RankReceiver, RankSender, sub_id
from refimpl.api.serve import Progress
from refimpl.memory import register_kv_caches
from refimpl.transport import Fault, InProcessTransport, Transport
from spec.manifest import RopeConfig

# isort: split
import torch  # after refimpl: its import filters torch's NumPy-less warning

LAYERS, HEADS, DIM, DEADLINE_S = 3, 4, 8, 30.0
PROMPT, PREFIX, CHUNK = 90, 32, 64  # decode's local hit [0, 32); chunks [0, 64), [64, 90)
SRC_BS, DST_BS = 16, 32
MODEL = ModelIdentity("example-llama", RopeConfig(10000.0, DIM))
PRE_TABLE = [4, 1, 6, 0, 2, 5]  # the prefill scheduler's blocks (every rank's, bs 16)
DEC_TABLE = [9, 3, 12]  # the decode scheduler's (every rank's, bs 32)
OTHERS: list[Callable[[], None]] = []  # the other workers' event loops (one process here)
# the engines' caches: (vLLM's layout name, cross-layer, make(blocks, bs, heads),
# a layer as [blocks, bs, 2, H, D] by plain views of the engine's tensors)
CACHES: dict[str, tuple[str, bool, Callable[..., object], Callable[..., torch.Tensor]]] = {
    "flash_attn": (
        "flash_attn", False,
        lambda n, bs, h: [torch.zeros(2, n, bs, h, DIM) for _ in range(LAYERS)],
        lambda c, li: c[li].permute(1, 2, 0, 3, 4),
    ),
    "flashinfer": (
        "flashinfer", False,
        lambda n, bs, h: [torch.zeros(n, 2, bs, h, DIM) for _ in range(LAYERS)],
        lambda c, li: c[li].permute(0, 2, 1, 3, 4),
    ),
    "flash_attn_packed_hnd": (
        "flash_attn_packed_hnd", False,
        lambda n, bs, h: [torch.zeros(n, h, bs, 2 * DIM) for _ in range(LAYERS)],
        lambda c, li: c[li].unflatten(-1, (2, DIM)).permute(0, 2, 3, 1, 4),
    ),
    "cross_layer": (
        "flash_attn", True,
        lambda n, bs, h: torch.zeros(n, LAYERS, 2, bs, h, DIM),
        lambda c, li: c[:, li].permute(0, 2, 1, 3, 4),
    ),
}  # fmt: skip


def others() -> None:
    for loop in OTHERS:
        loop()


def chunk_id(rid: str, k: int) -> str:
    return f"{rid}/c{k}"  # chunk k's attempt


def write_tokens(slots: torch.Tensor, table: list[int], lo: int, kv: torch.Tensor) -> None:
    """Tokens [lo, lo + T) of a layer, ``kv`` [2, H, T, D], into ``slots`` at ``table``."""
    pos = torch.arange(lo, lo + kv.shape[2])
    bs = slots.shape[1]
    slots[torch.tensor(table)[pos // bs], pos % bs] = kv.permute(2, 0, 1, 3)


def read_tokens(slots: torch.Tensor, table: list[int], lo: int, hi: int) -> torch.Tensor:
    pos = torch.arange(lo, hi)
    bs = slots.shape[1]
    return slots[torch.tensor(table)[pos // bs], pos % bs].permute(1, 2, 0, 3)  # [2, H, T, D]


# ---------------------------------------------------------------- the scheduler side
class DecodeScheduler:
    """The decode instance's scheduler connector (one block table for its TP ranks)."""

    def get_num_new_matched_tokens(self, prompt: list[int], num_computed: int) -> int:
        return len(prompt) - num_computed  # the rest comes from the prefill side

    def build_connector_meta(self, rid: str, k: int, prompt: list[int]) -> dict[str, object]:
        """What the decode workers load for chunk k: its tokens, the blocks already held
        (the local hit, then earlier chunks') and vLLM's new blocks for it."""
        end = CHUNK if k == 0 else PROMPT
        held = PREFIX if k == 0 else CHUNK
        n_held, n_all = held // DST_BS, -(-end // DST_BS)
        return {"rid": chunk_id(rid, k), "tokens": prompt[:end], "held": n_held,
                "prefix": DEC_TABLE[:n_held], "blocks": DEC_TABLE[n_held:n_all]}  # fmt: skip


# ---------------------------------------------------------------- the worker side
class ProducerWorker:
    """One prefill TP rank's worker connector: its heads' caches registered, its ranks."""

    def __init__(self, rank: int, geo: KVGeometry, dst_tp: int, kind: str, t: Transport,
                 epochs: Epochs) -> None:  # fmt: skip
        name, cross, make, self.slots = CACHES[kind]
        self.caches = make(8, SRC_BS, geo.kv_heads_per_rank)  # vLLM's, this rank
        self.pools = register_kv_caches(geo.rank_view(rank), self.caches, name, cross_layer=cross)
        self.tx = RankSender(self.pools, geo, t, MODEL, rank=rank, dst_tp=dst_tp, epochs=epochs)
        self.progress = Progress(self.tx, timeout_s=DEADLINE_S, forget=False)  # kvown's deadline
        self.ended: dict[str, str] = {}  # chunk attempt -> how its send ended

    def start_chunk(self, rid: str, k: int, prompt: list[int]) -> None:  # a chunk's prefill
        end = CHUNK if k == 0 else PROMPT
        first = 0 if k == 0 else CHUNK // SRC_BS
        self.pools.adopt(rid, PRE_TABLE[first : -(-end // SRC_BS)])  # the chunk's new blocks
        sent_from = PREFIX // SRC_BS if k == 0 else CHUNK // SRC_BS  # held there already
        blocks = PRE_TABLE[: -(-end // SRC_BS)]  # every block of the chunk's tokens
        self.progress.offer(chunk_id(rid, k), prompt[:end], blocks=blocks, prefix_blocks=sent_from)

    def save_kv_layer(self, layer: int, attempt: str) -> None:
        self.tx.send_layer(attempt, layer)  # the engine wrote the layer in its blocks: out
        self.get_finished()

    def get_finished(self) -> set[str]:
        """vLLM's ``get_finished()``, once per step: every chunk of this rank advanced
        by one ``progress()``; returns those whose send finished."""
        step = self.progress.progress()
        self.ended.update({rid: "done" for rid in step.finished_sending})
        self.ended.update({f.request_id: f.state.value for f in step.failed})
        return set(step.finished_sending)

    def wait_for_save(self, attempt: str, deadline: float) -> str:
        while attempt not in self.ended and time.monotonic() < deadline:
            self.get_finished()  # kvown's deadline (Progress) ends a send that stalls
            others()
        return self.ended.get(attempt, "sending")


class ConsumerWorker:
    """One decode rank's worker connector: vLLM's caches registered, its RankReceiver."""

    def __init__(self, rank: int, geo: KVGeometry, src_tp: int, kind: str,
                 t: Transport) -> None:  # fmt: skip
        name, cross, make, self.slots = CACHES[kind]
        self.caches = make(16, DST_BS, geo.kv_heads_per_rank)
        self.pools = register_kv_caches(geo.rank_view(rank), self.caches, name, cross_layer=cross)
        self.rx = RankReceiver(self.pools, geo, t, MODEL, rank=rank, src_tp=src_tp)
        self.progress = Progress(self.rx, timeout_s=DEADLINE_S, forget=False)
        self.committed: dict[str, tuple[int, ...]] = {}  # chunk attempt -> its blocks
        self.failed: set[str] = set()

    def start_load_kv(self, meta: dict[str, object]) -> None:
        self.progress.expect(str(meta["rid"]), prefix=meta["prefix"], blocks=meta["blocks"],
                             prefix_tokens=list(meta["tokens"])[: int(meta["held"]) * DST_BS])  # type: ignore[call-overload]  # fmt: skip

    def get_finished(self) -> set[str]:
        """vLLM's ``get_finished()``: returns the loads that committed; a failed one
        joins ``failed`` (vLLM's ``get_block_ids_with_load_errors``: recompute)."""
        step = self.progress.progress()
        self.committed.update(step.finished_receiving)
        self.failed.update(f.request_id for f in step.failed)
        return set(step.finished_receiving)

    def wait_for_layer_load(self, attempt: str, layer: int, deadline: float) -> None:
        last = layer == LAYERS - 1  # the last layer also waits for every rank's commit
        while time.monotonic() < deadline and attempt not in {*self.committed, *self.failed}:
            if self.rx.layer_ready(attempt, layer) and not last:
                return  # the layer is in vLLM's own blocks already (no copy out of kvown)
            self.get_finished()
            others()
        if attempt not in self.committed:
            self.failed.add(attempt)  # vLLM: these blocks failed to load; recompute


# ---------------------------------------------------------------- the engines around them
def prefill_kv(prompt: list[int]) -> torch.Tensor:
    """The prefill model's K/V, [layers, 2, H, T, D] (a stand-in for attention)."""
    g = torch.Generator().manual_seed(sum(prompt))
    return torch.randn((LAYERS, 2, HEADS, len(prompt), DIM), generator=g)


def run(kind: str = "flash_attn_packed_hnd", src_tp: int = 2, dst_tp: int = 1, *,
        corrupt: bool = False) -> dict[str, object]:  # fmt: skip
    t, epochs, rid = InProcessTransport(), Epochs(), "req-1"
    prompt = [(7 * i) % 101 for i in range(PROMPT)]
    kv = prefill_kv(prompt)
    if corrupt:  # a chunk of chunk 0's layer 1 flipped in transit to decode rank 0
        t.inject(f"kv:{chunk_id(rid, 0)}@0>rx", Fault.CORRUPT, skip=3)
    pre = KVGeometry(LAYERS, HEADS, DIM, SRC_BS, "float32", tp=src_tp)
    dec = KVGeometry(LAYERS, HEADS, DIM, DST_BS, "float32", tp=dst_tp)
    if CACHES[kind][0] in ("flash_attn", "flashinfer"):  # NHD: slots before heads
        pre, dec = pre.with_(layout="tokens_major"), dec.with_(layout="tokens_major")
    sched = DecodeScheduler()
    consumers = [ConsumerWorker(d, dec, src_tp, kind, t) for d in range(dst_tp)]
    producers = [ProducerWorker(r, pre, dst_tp, kind, t, epochs) for r in range(src_tp)]
    OTHERS[:] = [lambda: [p.get_finished() for p in producers]]
    OTHERS.extend(c.get_finished for c in consumers)
    hd, hp = HEADS // dst_tp, HEADS // src_tp
    for d, c in enumerate(consumers):  # decode's local prefix hit, already in vLLM's cache
        for li in range(LAYERS):
            write_tokens(
                c.slots(c.caches, li), DEC_TABLE, 0, kv[li, :, d * hd : (d + 1) * hd, :PREFIX]
            )
        c.pools.adopt(f"{rid}#prefix", DEC_TABLE[: PREFIX // DST_BS])  # kvown never writes it
    assert sched.get_num_new_matched_tokens(prompt, PREFIX) == PROMPT - PREFIX
    deadline, saved, states = time.monotonic() + DEADLINE_S, [], []
    for k, (lo, hi) in enumerate([(0, CHUNK), (CHUNK, PROMPT)]):
        attempt = chunk_id(rid, k)
        if any(chunk_id(rid, 0) in c.failed for c in consumers):
            break  # chunk 0 failed to load: vLLM recomputes; nothing more is sent
        for c in consumers:
            c.start_load_kv(sched.build_connector_meta(rid, k, prompt))
        epochs.open(attempt)  # the scheduler opens the chunk's attempt: every rank offers it
        for p in producers:
            p.start_chunk(rid, k, prompt)
        for layer in range(LAYERS):  # the chunk's forward, one layer at a time, every rank
            for r, p in enumerate(producers):
                write_tokens(
                    p.slots(p.caches, layer),
                    PRE_TABLE,
                    lo,
                    kv[layer, :, r * hp : (r + 1) * hp, lo:hi],
                )
                p.save_kv_layer(layer, attempt)
            for c in consumers:
                c.wait_for_layer_load(attempt, layer, deadline)  # decode's forward, overlapped
        saved.append([p.wait_for_save(attempt, deadline) for p in producers])
        states.append([c.rx.state(attempt).value for c in consumers])
    workers = [*consumers, *producers]
    per_layer = [[read_tokens(c.slots(c.caches, li), DEC_TABLE, 0, PROMPT) for c in consumers]
                 for li in range(LAYERS)]  # fmt: skip
    got = torch.stack([torch.cat(layer, dim=1) for layer in per_layer])  # every head
    held = [_held(w.pools.alloc) for w in workers]  # decode ranks, then prefill ranks
    # the request ended: vLLM frees its blocks on both sides (kvown says which it may)
    ends = [[sub_id(chunk_id(rid, k), d) for k in (1, 0)] for d in range(dst_tp)]
    freeable = [[list(c.pools.freeable(e)) for e in ends[d]] for d, c in enumerate(consumers)]
    dec_freed = [[list(c.pools.release(e)) for e in [*ends[d], f"{rid}#prefix"]]
                 for d, c in enumerate(consumers)]  # fmt: skip
    return {
        "decode_states": states,  # per chunk, per decode rank
        "saved": saved,  # per chunk, per prefill rank
        "kv_equal": bool(torch.equal(got[:, :, :, PREFIX:], kv[:, :, :, PREFIX:])),
        "prefix_untouched": bool(torch.equal(got[:, :, :, :PREFIX], kv[:, :, :, :PREFIX])),
        "failed": sorted({a for c in consumers for a in c.failed}),
        "kvown_blocks": held,
        "freeable": freeable,  # per decode rank: chunk 1's, chunk 0's (a prefix: pinned)
        "decode_released": dec_freed,  # per decode rank: chunk 1, chunk 0, the local hit
        "released": [list(p.pools.release(rid)) for p in producers],  # per prefill rank
        "left": [_held(w.pools.alloc) for w in workers],
        "memory": sorted({type(m).__name__ for w in workers for m in w.pools.pools}),
    }


def _held(alloc: object) -> dict[str, int]:
    """The engine's blocks kvown records, per status but free."""
    return {k: v for k, v in alloc.counts().items() if k != "free" and v}  # type: ignore[attr-defined]


SCENARIOS = [(kind, s, d) for kind in CACHES for s, d in ((2, 1), (1, 2))]


def main() -> int:
    good = True
    for kind, s, d in SCENARIOS:
        ok = run(kind, s, d)
        print(f"{kind}, TP {s} -> {d}:", ok)
        good = good and ok["kv_equal"] and ok["prefix_untouched"] and ok["failed"] == []
    bad = run(corrupt=True)
    print("a corrupt chunk:", bad)
    refused = bad["failed"] == [chunk_id("req-1", 0)] and not bad["kv_equal"]
    print("OK" if good and refused else "FAILED")
    return 0 if good and refused else 1


if __name__ == "__main__":
    sys.exit(main())
