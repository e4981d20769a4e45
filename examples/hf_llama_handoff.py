"""A transformers Llama (random weights, no hub) hands its prefill cache to a decode side.

Each variant prefills a prompt, writes the HF cache into the prefill side's kvown blocks,
hands it off with ``refimpl.handoff`` to a decode side of another geometry, rebuilds a
``DynamicCache`` from the decode side's blocks and decodes greedily. The reference decodes
from the prefill cache itself. Tokens must be identical and the logits equal.

Variants: the same layout; TP 2 -> 1; block size 16 -> 8 (and heads_major -> tokens_major);
an offload round trip (decode side -> host tier -> decode side) before decoding; and a
sliding-window model (Mistral, ``sliding_window`` 16 < the 37-token prompt). Its own
cache keeps only the last tokens, which ``cache_to_blocks`` refuses by name (a refusal
below); the way through is to prefill into a plain ``DynamicCache()`` (every token kept),
hand that off, and rebuild with ``blocks_to_cache(..., config=cfg)``, whose sliding layers
keep their window again: the same tokens and logits as the model's own sliding cache.
Refusals: a corrupt chunk, a manifest mismatch (another RoPE base), a full receiver; each
must be refused with 0 blocks left held on either side once the request is freed.

    python examples/hf_llama_handoff.py [--json]     (needs the [hf] extra: transformers)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from refimpl import KVGeometry, ModelIdentity, Receiver, Sender, channels, handoff, offload, reload
from refimpl.adapters.hf import blocks_to_cache, cache_to_blocks, identity_from_hf_config
from refimpl.errors import OwnershipError
from refimpl.transport import Fault, InProcessTransport

# isort: split
import torch  # after refimpl: its import filters torch's NumPy-less warning

PROMPT, STEPS, SEED = 37, 12, 0


def build_model() -> tuple[Any, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(SEED)
    return cfg, LlamaForCausalLM(cfg).eval()


def build_mistral() -> tuple[Any, Any]:
    """A sliding-window model whose window (16) is shorter than the prompt."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        sliding_window=16,
    )
    torch.manual_seed(SEED)
    return cfg, MistralForCausalLM(cfg).eval()


def greedy(model: Any, first_logits: torch.Tensor, cache: Any) -> tuple[list[int], torch.Tensor]:
    """STEPS greedy tokens from ``cache``; returns them and the logits of every step."""
    tokens, rows, logits = [], [], first_logits
    with torch.no_grad():
        for _ in range(STEPS):
            tok = int(logits.argmax())
            tokens.append(tok)
            out = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
            cache, logits = out.cache, out.logits[0, -1]
            rows.append(logits)
    return tokens, torch.stack(rows)


def run(name: str, cfg: Any, model: Any, *, src: dict[str, Any], dst: dict[str, Any],
        fault: str | None = None, dst_model: ModelIdentity | None = None,
        dst_capacity: int = 64, round_trip: bool = False,
        full_cache: bool = False) -> dict[str, Any]:  # fmt: skip
    """One variant or refusal; the kvown glue an engine needs is the body of this function.

    ``full_cache``: prefill into a plain ``DynamicCache()`` (a sliding-window model's way
    through) and rebuild the decode side's cache with the model's config."""
    from transformers import DynamicCache

    prompt = torch.randint(
        0, cfg.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        own = model(input_ids=prompt, use_cache=True)  # the model's own cache: the reference
        out = model(input_ids=prompt, cache=DynamicCache(), use_cache=True) if full_cache else own
    ident = identity_from_hf_config(cfg, "hf-llama-random-seed0")
    g_src = KVGeometry.from_hf_config(cfg, **{"block_size": 16, **src})
    g_dst = KVGeometry.from_hf_config(cfg, **{"block_size": 16, **dst})
    p_src, p_dst = g_src.make_pools(64), g_dst.make_pools(dst_capacity)
    rid, t = "req-0", InProcessTransport()
    blocks = p_src.alloc.allocate(rid, g_src.blocks_for(PROMPT + STEPS))  # room for decode
    try:
        n = cache_to_blocks(out.cache, p_src, rid, blocks)  # HF cache -> kvown
    except ValueError as e:  # a cache kvown cannot take (a sliding window that dropped tokens)
        p_src.alloc.free(rid)
        leaked = sum(p.alloc.counts()[s] for p in (p_src, p_dst)
                     for s in ("reserved", "owned", "quarantined"))  # fmt: skip
        return {"name": name, "refused": True, "leaked_blocks": leaked, "error": str(e)[:160]}
    if fault == "corrupt":
        t.inject(channels(rid).to_receiver, Fault.CORRUPT, skip=2)
    tx, rx = Sender(p_src, g_src, t, ident), Receiver(p_dst, g_dst, t, dst_model or ident)
    try:
        got = handoff(tx, rx, rid, prompt[0].tolist(), blocks=blocks[: g_src.blocks_for(n)],
                      decode_room=STEPS).received  # fmt: skip
    except OwnershipError as e:
        p_src.alloc.free(rid)  # the request is dropped; nothing may stay held anywhere
        leaked = sum(p.alloc.counts()[s] for p in (p_src, p_dst)
                     for s in ("reserved", "owned", "quarantined"))  # fmt: skip
        return {"name": name, "refused": True, "leaked_blocks": leaked, "error": str(e)[:160]}
    dst_blocks = got.blocks
    if round_trip:  # offload to a host tier of another block size, free, reload
        g_host = g_dst.with_(block_size=8, layout="tokens_major")
        host = g_host.make_pools(64)
        offload(p_dst, g_dst, host, g_host, rid, prompt[0].tolist(), free_device=True)
        dst_blocks = reload(host, g_host, p_dst, g_dst, rid, prompt[0].tolist(),
                            decode_room=STEPS).received.blocks  # fmt: skip
    config = cfg if full_cache else None  # sliding layers keep their window again
    cache = blocks_to_cache(p_dst, dst_blocks, n, config=config)  # kvown -> HF cache
    first = out.logits[0, -1]
    ref_tokens, ref_logits = greedy(model, first, own.cache)
    tokens, logits = greedy(model, first, cache)
    return {
        "name": name,
        "tokens_identical": tokens == ref_tokens,
        "max_abs_dlogits": float((logits - ref_logits).abs().max()),
        "tokens": tokens,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print(
            "error: this example needs transformers, the [hf] extra:"
            " pip install -e '.[hf]' (or pip install 'transformers>=5.0')",
            file=sys.stderr,
        )
        return 2
    cfg, model = build_model()
    m_cfg, mistral = build_mistral()
    other_rope = identity_from_hf_config(cfg, "hf-llama-random-seed0")
    other_rope = replace(other_rope, rope=replace(other_rope.rope, theta=500000.0))
    variants = [
        run("same_layout", cfg, model, src={}, dst={}),
        run("tp2_to_tp1", cfg, model, src={"tp": 2}, dst={}),
        run("block16_to_block8_tokens_major", cfg, model, src={},
            dst={"block_size": 8, "layout": "tokens_major"}),
        run("offload_round_trip_on_decode", cfg, model, src={"tp": 2}, dst={}, round_trip=True),
        run("mistral_sliding_window_full_prefill_tp2_to_tp1", m_cfg, mistral, src={"tp": 2},
            dst={}, full_cache=True),
    ]  # fmt: skip
    refusals = [
        run("corrupt_chunk", cfg, model, src={}, dst={"block_size": 8}, fault="corrupt"),
        run("manifest_mismatch_rope_theta", cfg, model, src={}, dst={}, dst_model=other_rope),
        run("full_receiver", cfg, model, src={"tp": 2}, dst={}, dst_capacity=2),
        run("mistral_sliding_window_cache", m_cfg, mistral, src={}, dst={}),
    ]
    result = {"variants": variants, "refusals": refusals}
    ok = all(v.get("tokens_identical") for v in variants) and all(
        r.get("refused") and r.get("leaked_blocks") == 0 for r in refusals
    )
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for v in variants:
            print(f"{v['name']:34} tokens identical: {v['tokens_identical']}  "
                  f"max |dlogits| = {v['max_abs_dlogits']:.3g}")  # fmt: skip
        for r in refusals:
            why = r.get("error", "")[:70]
            print(f"{r['name']:34} refused: {r['refused']}  leaked: {r['leaked_blocks']}  {why}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
