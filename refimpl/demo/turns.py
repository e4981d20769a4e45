"""Two turns of one conversation, disaggregated (PPD): turn 2 is prefilled on decode.

Turn 1 runs as every demo path does: prefill on the prefill worker (TP 2), hand the KV
over the real data path (refimpl/demo/handoff.py) to the decode worker (TP 1), decode
`steps` greedy tokens there. The decode worker keeps the session's KV; its token ids are
the prompt and the tokens fed to the decode steps. Turn 2's prompt is the conversation so
far and the user's new tokens; the decode worker **appends** it onto the session's KV:

- the append starts at the longest common token-id prefix of decode's KV and the new
  prompt (``common_prefix``); a divergent tail (here: the client re-sends the assistant's
  reply with one token changed, as a re-tokenised or edited history does) is cut first:
  decode's KV is truncated to the common prefix, and the append overwrites from there;
- then decode continues with `steps` more greedy tokens.

The reference is the unbroken run: one process, one unpaged ``ContiguousKV``, the same
two turns (prefill, decode, the same cut, the same append, decode). Every logit of both
turns is compared with ``torch.equal``: bit-exact, no tolerance (the handoff and the
paging only move bytes; see refimpl/demo/paths.py).

``append_divergent_uncut`` (the spec mutant's name) skips the cut: decode appends after
its whole KV, the stale tail included, and turn 2's logits are another history's (the
repro script repro/turns/append_divergent_uncut.py shows the difference).
"""

from __future__ import annotations

import torch

from refimpl.demo.handoff import Handoff, Worker, handoff
from refimpl.demo.paths import CAPACITY, DEMO_CONFIG, HM, PROMPT_LEN, SEED, STEPS, DemoRecord
from refimpl.demo.paths import prompt_of as _prompt_of
from refimpl.engine.behaviours.turns import common_prefix
from refimpl.model import ContiguousKV, KVStore, PagedKV, TinyConfig, TinyDecoder, decode

__all__ = ["NEW_TOKENS", "TURN_PATHS", "run_turns", "turn_paths"]

NEW_TOKENS = 5  # the user's new tokens in turn 2
TURN_PATHS = ("2 turns PPD", "2 turns PPD, tail cut")


def _turn2_prompt(cfg: TinyConfig, seed: int, history: list[int], divergent: bool) -> list[int]:
    """The conversation so far and the user's new tokens; a divergent one re-sends the
    history with one token of the assistant's reply changed."""
    new = _prompt_of(cfg, seed + 2000, NEW_TOKENS).tolist()
    out = list(history)
    if divergent:
        at = len(out) - 2  # inside the reply decode holds the KV of
        out[at] = (out[at] + 1) % cfg.vocab
    return out + new


def _two_turns(
    model: TinyDecoder,
    store: KVStore,
    cut: bool,
    first: int,
    prompt: list[int],
    steps: int,
    divergent: bool,
    seed: int,
) -> tuple[list[torch.Tensor], int, int, int]:
    """Turn 1's decode and turn 2's append + decode on `store` (which holds turn 1's
    prompt). Returns (logit rows of both turns, common prefix, tokens cut, tokens appended)."""
    cfg = model.cfg
    rows1, toks1 = decode(model, first, len(prompt), steps, store)  # (N, V)
    kv_ids = prompt + list(toks1[:-1])  # the tokens whose KV the store holds
    p2 = _turn2_prompt(cfg, seed, prompt + list(toks1), divergent)
    lcp = common_prefix(tuple(kv_ids), tuple(p2))
    if cut:  # the tail the new prompt does not share goes: the append starts at lcp
        _truncate(store, lcp)
    start = _length(store)
    appended = torch.tensor(p2[start:]) if start <= len(p2) else torch.tensor([], dtype=torch.long)
    logits2 = model.forward(appended, start, store)  # (A, V): turn 2 prefilled on decode
    rows2, _ = decode(model, int(logits2[-1].argmax()), start + len(appended), steps, store)
    return [rows1, logits2, rows2], lcp, len(kv_ids) - lcp, len(appended)


def _length(store: KVStore) -> int:
    if isinstance(store, ContiguousKV):
        return int(store.k[0].shape[1])
    assert isinstance(store, PagedKV)
    return store.kv.num_tokens


def _truncate(store: KVStore, n: int) -> None:
    """Cut the session's KV to its first `n` tokens (the blocks stay allocated)."""
    if isinstance(store, ContiguousKV):
        store.k = [k[:, :n] for k in store.k]
        store.v = [v[:, :n] for v in store.v]
    else:
        assert isinstance(store, PagedKV)
        store.kv.num_tokens = min(store.kv.num_tokens, n)


def run_turns(
    divergent: bool,
    *,
    cfg: TinyConfig = DEMO_CONFIG,
    seed: int = SEED,
    prompt_len: int = PROMPT_LEN,
    steps: int = STEPS,
    mutants: frozenset[str] = frozenset(),
) -> DemoRecord:
    """Two turns: turn 1 handed off prefill -> decode, turn 2 appended on decode; compare
    every logit with the unbroken run (one process, no handoff, no paging)."""
    model = TinyDecoder(cfg, seed=seed)
    prompt = _prompt_of(cfg, seed, prompt_len)
    ids = prompt.tolist()
    ref_kv = ContiguousKV(cfg)
    ref_logits = model.prefill(prompt, ref_kv)  # (T, V)
    ref, _, _, _ = _two_turns(model, ref_kv, True, int(ref_logits[-1].argmax()), ids, steps,
                              divergent, seed)  # fmt: skip
    src = Worker(model, tp=2, block_size=4, layout=HM, capacity=CAPACITY)
    dst = Worker(TinyDecoder(cfg, seed=seed), tp=1, block_size=4, layout=HM, capacity=CAPACITY)
    logits, _ = src.prefill("req", prompt)  # (T, V)
    room = 2 * steps + NEW_TOKENS + 2  # turn 1's decode, turn 2's append and decode
    h: Handoff = handoff(src, dst, "req", ids, int(logits[-1].argmax()), decode_room=room)
    cut = "append_divergent_uncut" not in mutants
    got, lcp, cut_n, app = _two_turns(dst.model, h.store, cut, h.first_token, ids, steps,
                                      divergent, seed)  # fmt: skip
    dst.finish("req")
    pairs = list(zip([logits, *got], [ref_logits, *ref], strict=True))
    equal = all(a.shape == b.shape and torch.equal(a, b) for a, b in pairs)
    diff = max(_diff(a, b) for a, b in pairs)
    note = f"turn 2: {app} tokens appended on decode at the common prefix {lcp}"
    note += f", {cut_n} divergent tokens cut" if divergent and cut else ""
    note += ", divergent tail NOT cut (bug)" if divergent and not cut else ""
    name = TURN_PATHS[1] if divergent else TURN_PATHS[0]
    return DemoRecord(name, h.blocks_sent, h.bytes_sent, h.checksums_verified, equal, diff, note)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max()) if a.numel() else 0.0


def turn_paths(**kw: object) -> list[DemoRecord]:
    """Both two-turn paths (`kvown demo`)."""
    return [run_turns(False, **kw), run_turns(True, **kw)]  # type: ignore[arg-type]
