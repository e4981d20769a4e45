"""A hybrid transformers model (Qwen2 with sliding-window layers beside full-attention ones,
random weights, no hub, eager) as two KV cache groups: the layers of each attention type are
one group with its own geometry and block table (full: TP 2 -> 1 at block size 16;
sliding: block size 8 -> 4), handed off by ``handoff_groups`` under one request. Decoding
from the cache rebuilt on the receiving side (its sliding layers sliding again) gives the
same tokens and logits as the model's own hybrid cache."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from refimpl.adapters.hf import identity_from_hf_config
from refimpl.api import KVGeometry, Receiver, Sender, read_kv, write_kv
from refimpl.api.serve.groups import Group, group_request, handoff_groups
from refimpl.transport import InProcessTransport
from tests.library.lib_helpers import greedy, held

transformers = pytest.importorskip("transformers")

PROMPT, STEPS = 21, 6
TYPES = ["sliding_attention", "full_attention"] * 2


def build() -> tuple[Any, Any]:
    cfg = transformers.Qwen2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        use_sliding_window=True, sliding_window=8, max_window_layers=0, layer_types=TYPES,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    return cfg, transformers.Qwen2ForCausalLM(cfg).eval()


def test_a_hybrid_models_two_groups_hand_off_and_decode_the_same() -> None:
    cfg, model = build()
    prompt = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        own = model(input_ids=prompt, use_cache=True)  # the model's own hybrid cache
        kept = model(input_ids=prompt, cache=transformers.DynamicCache(), use_cache=True)
    assert [type(x).__name__ for x in own.cache.layers][:2] == [
        "DynamicSlidingWindowLayer",
        "DynamicLayer",
    ]
    base = KVGeometry.from_hf_config(cfg).with_(num_layers=2)
    plan = {  # group: (its layers, the sender's geometry, the receiver's)
        "full": ([1, 3], base.with_(tp=2), base),
        "sliding": ([0, 2], base.with_(block_size=8), base.with_(block_size=4)),
    }
    identity = identity_from_hf_config(cfg, "tiny-qwen2-hybrid")
    t = InProcessTransport()
    groups, pools = [], {}
    for name, (layers, gs, gd) in plan.items():
        ps, pd = gs.make_pools(8), gd.make_pools(8)
        rid = group_request("r", name)
        blocks = ps.alloc.allocate(rid, gs.blocks_for(PROMPT))
        cache = kept.cache.layers
        write_kv(ps, rid, blocks, [[cache[i].keys[0], cache[i].values[0]] for i in layers])
        groups.append(Group(name, Sender(ps, gs, t, identity), Receiver(pd, gd, t, identity)))
        pools[name] = (ps, pd)
    out = handoff_groups(groups, "r", prompt[0].tolist())
    per_layer: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, (layers, _, _) in plan.items():
        ps, pd = pools[name]
        assert held(ps) == {}
        kv = read_kv(pd, out[name].received.blocks, PROMPT)  # [2 layers, k/v, H, T, D]
        for j, i in enumerate(layers):
            want = kept.cache.layers[i]
            assert torch.equal(kv[j, 0], want.keys[0]) and torch.equal(kv[j, 1], want.values[0])
            per_layer[i] = (kv[j, 0][None], kv[j, 1][None])
    legacy = tuple(per_layer[i] for i in range(len(TYPES)))
    rebuilt = transformers.DynamicCache(ddp_cache_data=legacy, config=cfg)
    first = own.logits[0, -1]
    ref_tokens, ref_logits = greedy(model, first, own.cache, STEPS)
    tokens, logits = greedy(model, first, rebuilt, STEPS)
    assert tokens == ref_tokens and len(set(tokens)) > 1
    assert torch.equal(logits, ref_logits)
