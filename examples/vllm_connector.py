"""A vLLM-KV-connector-shaped handoff (prefill TP 2 -> decode TP 1), layer by layer, per rank.

vLLM's v1 KV connector has a scheduler side and a worker side (one per TP rank). This
example has both, on top of the public API only, without vllm installed: the engines
around them are a few lines each, holding vLLM's packed per-layer caches
``[num_blocks, H, block_size, 2*D]`` and per-request block tables. Each worker registers
its engine's caches once (``register_kv_caches``, vLLM's ``register_kv_caches``): kvown
reads and writes the engine's blocks in place, the scheduler's block ids on both sides,
no kvown pool on either (a block-size change stages one copy during the transfer).

Scheduler side (decode instance):
  ``get_num_new_matched_tokens(req, num_computed)``  the prompt tokens the remote prefill
      will provide (those after the local prefix hit), loaded asynchronously;
  ``update_state_after_alloc(req, block_ids, n)``   the blocks vLLM allocated for them;
  ``build_connector_meta()``                       what the workers load this step.
Worker side (prefill ranks: producer; decode rank: consumer):
  ``save_kv_layer(layer, kv_layer, meta)``  the layer just computed, in the engine's own
      blocks: out, read in place (``Sender.send_layer``);
  ``get_finished()``                      once per step, every request of the worker at once
      (``refimpl.api.serve.Progress``: kvown's deadlines; what finished or failed); a
      finished send's blocks are handed back to the engine (``release``: vLLM frees them);
  ``wait_for_save()``                     until the decode side acknowledged (or failed);
  ``start_load_kv(meta)``                 ``Receiver.expect`` with the blocks vLLM allocated
      and its local prefix hit (``prefix=``: never written), watched;
  ``wait_for_layer_load(layer)``          until the layer landed in vLLM's own blocks
      (``layer_ready``); the last layer also waits for the commit. A step's output counts
      only once the attempt committed: a failed load gives back every block and the
      connector reports the request's blocks as failed (vLLM recomputes them).

The workers run in one process here, so a wait also runs the other workers' loops
(``OTHERS``); in an engine each is its own process (examples/dist_layer_handoff.py).

    python examples/vllm_connector.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from refimpl import KVGeometry, ModelIdentity, Receiver, Sender
from refimpl.api.serve import Progress
from refimpl.memory import register_kv_caches
from refimpl.transport import InProcessTransport, Transport
from spec.manifest import RopeConfig

# isort: split
import torch  # after refimpl: its import filters torch's NumPy-less warning

LAYERS, HEADS, DIM, PROMPT, PREFIX, DEADLINE_S = 3, 4, 8, 37, 16, 30.0
MODEL = ModelIdentity("example-llama", RopeConfig(10000.0, DIM))
PREFILL = KVGeometry(LAYERS, HEADS, DIM, 16, "float32", tp=2)  # the prefill side's caches
DECODE = KVGeometry(LAYERS, HEADS, DIM, 8, "float32")  # the decode side's: block size 8
LAYOUT = "flash_attn_packed_hnd"  # [num_blocks, H, block_size, 2*D], bytes in that order
OTHERS: list[Callable[[], None]] = []  # the other workers' event loops (one process here)


def others() -> None:
    for loop in OTHERS:
        loop()


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    block_ids: list[int] = field(default_factory=list)  # vLLM's, on the instance holding it


def packed_caches(blocks: int, heads: int, block_size: int) -> list[torch.Tensor]:
    return [torch.zeros(blocks, heads, block_size, 2 * DIM) for _ in range(LAYERS)]


# ---------------------------------------------------------------- the scheduler side
class DecodeScheduler:
    """The decode instance's scheduler connector."""

    def __init__(self) -> None:
        self.pending: dict[str, tuple[Request, int]] = {}  # to load: request, tokens held

    def get_num_new_matched_tokens(self, req: Request, num_computed: int) -> tuple[int, bool]:
        return len(req.prompt) - num_computed, True  # the rest comes from the prefill side

    def update_state_after_alloc(self, req: Request, block_ids: list[int], n: int) -> None:
        req.block_ids = block_ids
        self.pending[req.request_id] = (req, len(req.prompt) - n)

    def build_connector_meta(self) -> dict[str, tuple[Request, int]]:
        meta, self.pending = self.pending, {}
        return meta


# ---------------------------------------------------------------- the worker side
class ProducerWorker:
    """One prefill TP rank's worker connector: its heads' caches registered, its Sender."""

    def __init__(self, rank: int, t: Transport) -> None:
        self.rank, self.caches = rank, packed_caches(8, HEADS // 2, 16)  # vLLM's, this rank
        self.pools = register_kv_caches(PREFILL.rank_view(rank), self.caches, LAYOUT)
        self.tx = Sender(self.pools, PREFILL, t, MODEL, rank=rank)
        # kvown's deadline per request; forget=False: this example reads the ends after
        self.progress = Progress(self.tx, timeout_s=DEADLINE_S, forget=False)
        self.ended: dict[str, str] = {}  # request id -> how its send ended
        self.freed: dict[str, tuple[int, ...]] = {}  # request id -> blocks handed back

    def start_request(self, req: Request, prefix_blocks: int) -> None:  # its prefill begins
        rid = req.request_id
        self.pools.adopt(rid, req.block_ids)  # the scheduler's blocks, the prefill writes
        self.progress.offer(  # every rank offers the scheduler's attempt number as its epoch
            rid, req.prompt, blocks=req.block_ids, layers=LAYERS, epoch=1,
            prefix_blocks=prefix_blocks,  # held by the decode side already: not sent
        )  # fmt: skip

    def save_kv_layer(self, layer: int, kv_layer: torch.Tensor, meta: list[Request]) -> None:
        for req in meta:  # the engine wrote ``kv_layer`` (its cache) in its blocks: send it
            self.tx.send_layer(req.request_id, layer)
        self.get_finished()

    def get_finished(self) -> set[str]:
        """vLLM's ``get_finished()``, once per step: every request of this rank advanced by
        one ``progress()``; returns those whose send finished: their blocks go back to the
        engine (``release``; vLLM's delayed free), as do a failed send's."""
        step = self.progress.progress()
        self.ended.update({rid: "done" for rid in step.finished_sending})
        self.ended.update({f.request_id: f.state.value for f in step.failed})
        for rid in [*step.finished_sending, *(f.request_id for f in step.failed)]:
            self.freed[rid] = self.pools.release(rid)
        return set(step.finished_sending)

    def wait_for_save(self, meta: list[Request], deadline: float) -> dict[str, str]:
        while any(r.request_id not in self.ended for r in meta) and time.monotonic() < deadline:
            self.get_finished()  # kvown's deadline (Progress) ends a request that stalls
            others()
        return {req.request_id: self.ended.get(req.request_id, "sending") for req in meta}


class ConsumerWorker:
    """The decode rank's worker connector: vLLM's caches registered, its Receiver."""

    def __init__(self, t: Transport, caches: list[torch.Tensor]) -> None:
        self.pools, self.caches = register_kv_caches(DECODE, caches, LAYOUT), caches
        self.rx = Receiver(self.pools, DECODE, t, MODEL)
        self.progress = Progress(self.rx, timeout_s=DEADLINE_S, forget=False)
        self.meta: dict[str, tuple[Request, int]] = {}
        self.committed: dict[str, tuple[int, ...]] = {}  # request id -> its kvown blocks
        self.failed: set[str] = set()

    def start_load_kv(self, meta: dict[str, tuple[Request, int]]) -> None:
        self.meta = meta
        for rid, (req, held) in meta.items():
            hit = req.block_ids[: held // DECODE.block_size]  # vLLM's local prefix hit
            self.pools.adopt(f"{rid}#prefix", hit)  # valid KV here: kvown never writes it
            self.progress.expect(
                rid, prefix=hit, prefix_tokens=req.prompt[:held], blocks=req.block_ids[len(hit) :]
            )

    def get_finished(self) -> set[str]:
        """vLLM's ``get_finished()``: one ``progress()`` for every request being loaded;
        returns those whose load committed; a failed one joins ``failed`` (vLLM's
        ``get_block_ids_with_load_errors``: recompute them)."""
        step = self.progress.progress()
        self.committed.update(step.finished_receiving)
        self.failed.update(f.request_id for f in step.failed)
        return set(step.finished_receiving)

    def wait_for_layer_load(self, layer: int, deadline: float) -> None:
        last = layer == LAYERS - 1
        for rid in self.meta:
            while time.monotonic() < deadline and rid not in {*self.committed, *self.failed}:
                if self.rx.layer_ready(rid, layer) and not last:
                    break
                self.get_finished()  # kvown's deadline (Progress) ends a stalled load
                others()
            if not self.rx.layer_ready(rid, layer) or rid in self.failed:
                self.failed.add(rid)  # vLLM: these blocks failed to load; recompute
            # else: the layer is in vLLM's own blocks already (no copy out of kvown)


# ---------------------------------------------------------------- the engines around them
def prefill_kv(prompt: list[int]) -> torch.Tensor:
    """The prefill model's K/V, [layers, 2, H, T, D] (a stand-in for attention)."""
    g = torch.Generator().manual_seed(sum(prompt))
    return torch.randn((LAYERS, 2, HEADS, len(prompt), DIM), generator=g)


def run(*, corrupt: bool = False) -> dict[str, object]:
    t = InProcessTransport()
    req = Request("req-1", [(7 * i) % 101 for i in range(PROMPT)])
    kv = prefill_kv(req.prompt)
    if corrupt:  # rank 1's layer-1 chunk flipped in transit (a chunk per rank and layer)
        from refimpl.transport import Fault

        t.inject("kv:req-1>rx", Fault.CORRUPT, skip=1 + 2 + 1)
    # decode instance: a local prefix hit of PREFIX tokens, already in vLLM's cache
    dec_caches = packed_caches(16, HEADS, 8)
    sched, consumer = DecodeScheduler(), ConsumerWorker(t, dec_caches)
    dreq = Request(req.request_id, req.prompt)
    n, _ = sched.get_num_new_matched_tokens(dreq, PREFIX)
    sched.update_state_after_alloc(dreq, [9, 3, 12, 0, 5], n)  # vLLM's block table, bs 8
    prefix_kv = _write_prefix(dec_caches, dreq.block_ids, kv[:, :, :, :PREFIX])
    consumer.start_load_kv(sched.build_connector_meta())
    # prefill instance, TP 2: each rank's vLLM caches hold its 2 heads, block size 16
    h = HEADS // 2
    producers = [ProducerWorker(r, t) for r in range(2)]
    pre_tables = [[4, 1, 6], [0, 2, 5]]
    OTHERS[:] = [lambda: [p.get_finished() for p in producers]]
    OTHERS.append(consumer.get_finished)
    for r, p in enumerate(producers):
        p.start_request(Request(req.request_id, req.prompt, pre_tables[r]), PREFIX // 16)
    deadline = time.monotonic() + 30
    for layer in range(LAYERS):  # the prefill forward, one layer at a time, on both ranks
        for r, p in enumerate(producers):
            cache = p.caches[layer]  # the engine writes the layer into its own blocks
            _write_tokens(cache, pre_tables[r], kv[layer, :, r * h : (r + 1) * h])
            p.save_kv_layer(layer, cache, [Request(req.request_id, req.prompt, pre_tables[r])])
        consumer.wait_for_layer_load(layer, deadline)  # the decode side's forward, overlapped
    saved = [p.wait_for_save([req], deadline) for p in producers]
    got = torch.stack([_read_tokens(c, dreq.block_ids, PROMPT) for c in dec_caches])
    return {
        "decode_state": consumer.rx.state(req.request_id).value,
        "saved": [s[req.request_id] for s in saved],
        "kv_equal": bool(torch.equal(got[:, :, :, PREFIX:], kv[:, :, :, PREFIX:])),
        "prefix_untouched": bool(torch.equal(got[:, :, :, :PREFIX], prefix_kv)),
        "failed": sorted(consumer.failed),
        "kvown_blocks": [_held(consumer.pools.alloc), *(_held(p.pools.alloc) for p in producers)],
        "freeable": list(consumer.pools.freeable(req.request_id)),  # the request's, to vLLM
        "released": [list(p.freed.get(req.request_id, ())) for p in producers],
    }


def _held(alloc: object) -> dict[str, int]:
    """The engine's blocks kvown records, per status but free (decode side first, then
    each prefill rank)."""
    return {k: v for k, v in alloc.counts().items() if k != "free" and v}  # type: ignore[attr-defined]


def _write_tokens(cache: torch.Tensor, table: list[int], kv: torch.Tensor) -> None:
    """Tokens [0, T) of kv [2, H, T, D] into a packed cache at ``table``."""
    bs = cache.shape[2]
    pos = torch.arange(kv.shape[2])
    phys, slot = torch.tensor(table)[pos // bs], pos % bs
    cache[phys, :, slot] = torch.cat([kv[0], kv[1]], dim=-1).permute(1, 0, 2)


def _read_tokens(cache: torch.Tensor, table: list[int], n: int) -> torch.Tensor:
    bs = cache.shape[2]
    pos = torch.arange(n)
    tok = cache[torch.tensor(table)[pos // bs], :, pos % bs]  # [T, H, 2D]
    return torch.stack([tok[..., :DIM], tok[..., DIM:]]).permute(0, 2, 1, 3)  # [2, H, T, D]


def _write_prefix(caches: list[torch.Tensor], table: list[int], kv: torch.Tensor) -> torch.Tensor:
    for layer, c in enumerate(caches):
        _write_tokens(c, table, kv[layer])
    return kv


def main() -> int:
    ok = run()
    bad = run(corrupt=True)
    print("handoff:", ok)
    print("a corrupt chunk:", bad)
    good = ok["kv_equal"] and ok["prefix_untouched"] and ok["saved"] == ["done", "done"]
    refused = bad["decode_state"] == "aborted" and bad["failed"] == ["req-1"]
    print("OK" if good and refused else "FAILED")
    return 0 if good and refused else 1


if __name__ == "__main__":
    sys.exit(main())
