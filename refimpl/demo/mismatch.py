"""Item 5 of `kvown demo`: KV installed under the wrong RoPE base or the wrong adapter.

The prefill worker computes the request's KV with one RoPE base (or LoRA adapter); the
decode worker runs another.  The manifest says which, so `check_compatible` refuses it:
nothing is reserved or written on the decode side and the sender's pins are released.
With the check switched off (`mismatch_installed`, the spec mutant that breaks
ManifestGate) the KV is installed and decoded, and the logits differ visibly from
decoding the request in one process with no handoff.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace

import torch

from refimpl.demo.handoff import Worker, handoff
from refimpl.demo.paths import DEMO_CONFIG, PROMPT_LEN, SEED, STEPS, prompt_of
from refimpl.engine.data import seed_of
from refimpl.errors import ManifestError
from refimpl.model import RopeConfig, TinyDecoder, decode, generate

SWITCH = "mismatch_installed"  # the spec mutant this switch re-introduces
WRONG_THETA = 500000.0
KINDS = ("rope", "adapter")


def with_adapter(model: TinyDecoder, adapter_id: str, rank: int = 2) -> TinyDecoder:
    """`model` plus a seeded low-rank delta on wq, wk and wv (a LoRA adapter)."""
    out = copy.copy(model)  # shares the base tensors; blocks are replaced, never mutated
    cfg, blocks = model.cfg, []
    for i, w in enumerate(model.blocks):
        g = torch.Generator().manual_seed(seed_of(adapter_id, i))
        deltas = []
        for base in (w.wq, w.wk, w.wv):
            a = torch.randn(base.shape[0], rank, generator=g) * base.shape[0] ** -0.5
            b = torch.randn(rank, base.shape[1], generator=g) * 0.5
            deltas.append(base + (a @ b).to(cfg.torch_dtype))  # (C, out)
        blocks.append(w._replace(wq=deltas[0], wk=deltas[1], wv=deltas[2]))
    out.blocks = blocks
    return out


@dataclass(frozen=True, slots=True)
class MismatchRecord:
    name: str  # "rope" or "adapter"
    check: bool  # the manifest check is on (False: the mismatch_installed switch)
    installed: bool
    reasons: tuple[str, ...]  # why the manifest is incompatible (refusal or ignored)
    max_abs_diff: float | None  # decode logits vs the no-handoff run; None if refused
    dst_unchanged: bool  # the decode worker's pools hold the same bytes as before
    leaked_blocks: int  # blocks still held on either side after the request ended

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        return d


def _models(kind: str, seed: int) -> tuple[TinyDecoder, TinyDecoder, str | None, str | None]:
    """(prefill model, decode model, prefill adapter id, decode adapter id)."""
    base = TinyDecoder(DEMO_CONFIG, seed=seed)
    if kind == "rope":
        wrong = replace(DEMO_CONFIG, rope=RopeConfig(WRONG_THETA, DEMO_CONFIG.rope.rotary_dim))
        return base, TinyDecoder(wrong, seed=seed), None, None  # same weights, other base
    if kind == "adapter":
        return with_adapter(base, "lora-a"), with_adapter(base, "lora-b"), "lora-a", "lora-b"
    raise ValueError(f"unknown mismatch {kind!r}; known: {KINDS}")


def mismatch(kind: str, *, check: bool, seed: int = SEED, steps: int = STEPS) -> MismatchRecord:
    """TP=2 -> TP=1 handoff between workers that disagree on `kind`."""
    src_model, dst_model, src_adapter, dst_adapter = _models(kind, seed)
    prompt = prompt_of(DEMO_CONFIG, seed, PROMPT_LEN)
    ref = generate(src_model, prompt, steps)  # what the request should produce
    src = Worker(
        src_model, tp=2, block_size=4, layout="heads_major", capacity=16, adapter_id=src_adapter
    )
    dst = Worker(
        dst_model, tp=1, block_size=4, layout="heads_major", capacity=16, adapter_id=dst_adapter
    )
    before = dst.pool_bytes()
    logits, _ = src.prefill("req", prompt)
    first = int(logits[-1].argmax())
    try:
        h = handoff(
            src, dst, "req", prompt.tolist(), first, decode_room=steps, mismatch_installed=not check
        )
    except ManifestError as e:
        src.rp.alloc.free("req")  # the request fails over (re-prefill elsewhere)
        same = _same(before, dst)
        return MismatchRecord(kind, check, False, tuple(e.reasons), None, same, _held(src, dst))
    rows, _ = decode(dst.model, h.first_token, PROMPT_LEN, steps, h.store)  # (N, V)
    dst.finish("req")
    diff = float((rows - ref.decode_logits).abs().max())
    same = _same(before, dst)
    return MismatchRecord(kind, check, True, h.verdict.reasons, diff, same, _held(src, dst))


def _same(before: list[torch.Tensor], w: Worker) -> bool:
    return all(torch.equal(a, p.kv) for a, p in zip(before, w.rp.pools, strict=True))


def _held(*workers: Worker) -> int:
    held = 0
    for w in workers:
        w.rp.alloc.check_integrity()
        held += w.rp.alloc.capacity - w.rp.alloc.num_free
    return held


def run_all(seed: int = SEED, steps: int = STEPS) -> list[MismatchRecord]:
    return [mismatch(k, check=c, seed=seed, steps=steps) for k in KINDS for c in (False, True)]
