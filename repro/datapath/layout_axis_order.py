"""A layout mismatch in resharding gives wrong outputs, silently (incident 3:
TensorRT-LLM #6507).

Prefill runs TP=2 and decode TP=1, so the KV heads of both prefill ranks must be
concatenated for decode. The prefill buffer's blocks are laid out
[pages, 2, page_size, kv_heads, head_dim] (tokens_major), but the split/concat code
assumed [pages, 2, kv_heads, page_size, head_dim] (heads_major). With 2 local heads and
2-token pages both orders have the same shape, so nothing can raise: heads are sliced
from the token axis, and decode attends over scrambled keys and values. The property:
the layout belongs in the handoff manifest, is validated (ManifestGate), and the
reshard uses the actual layouts of both sides.

There is no spec mutant for this one (the spec abstracts bytes away): the model check
is the z3 proof of the shard maps, which finds the misread element for the buggy
reader and proves the layout-aware permutation a bijection. The bug is replayed on a
tiny GQA+RoPE model's paged KV; the fix is also shown on the reference engine, whose
prefill (heads_major) and decode (tokens_major) differ in layout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from model_checks.layouts.proofs import axis_order_claim, incident3_claim  # noqa: E402
from refimpl.model import PagedKV, TinyConfig, TinyDecoder, decode, generate  # noqa: E402
from refimpl.replay import Out, Repro, Result, step  # noqa: E402
from refimpl.reshard import ShardedKV, reshard  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.config import get_config  # noqa: E402

PROPERTY = "ManifestGate"
MUTANT = None
COVERS = ("incident 3: TensorRT-LLM #6507",)
SCENARIO = "TP2->TP1 reshard slices heads from a tokens_major buffer as if heads_major"
STEPS = 6


def handoff_logits(trust_buffer_layout: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(reference, after the handoff) decode logits; prefill TP=2 tokens_major, decode
    TP=1 heads_major. Without ``trust_buffer_layout`` the reshard reads the prefill
    buffers as heads_major (the bug)."""
    cfg = TinyConfig(kv_heads=4)  # 2 heads per prefill rank == block size: same shapes
    model = TinyDecoder(cfg, seed=0)
    prompt = torch.randint(0, cfg.vocab, (12,), generator=torch.Generator().manual_seed(0))
    ref = generate(model, prompt, STEPS)
    cap = prompt.shape[0] + STEPS
    src = PagedKV.empty(cfg, "tokens_major", 2, cap, tp=2)
    logits = model.prefill(prompt, src)
    kv = src.kv
    if not trust_buffer_layout:  # the same tensors, declared with the assumed axis order
        kv = ShardedKV(cfg.kv_layout("heads_major", 2, tp=2), kv.pools, kv.block_tables)
        kv.num_tokens = src.kv.num_tokens
    dst = PagedKV.empty(cfg, "heads_major", 2, cap, tp=1)
    reshard(kv, dst.kv)
    rows, _ = decode(model, int(logits[-1].argmax()), prompt.shape[0], STEPS, dst)
    return ref.decode_logits, rows


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.say("model check (z3, model_checks/layout_proofs):")
    bug = incident3_claim()
    r.expect(bug.result == "violated", f"{bug.id}: {bug.result}")
    r.say(f"      counterexample: {bug.detail}")

    r.say("with the bug (a heads_major reader on tokens_major buffers), on a tiny model:")
    try:
        ref, got = handoff_logits(trust_buffer_layout=False)
        raised = ""
    except ValueError as exc:
        ref = got = torch.zeros(0)
        raised = str(exc)
    r.expect(not raised, "the reshard raises nothing" + (f": {raised}" if raised else ""))
    err = float((ref - got).abs().max()) if got.numel() else 0.0
    flips = int((ref.argmax(-1) != got.argmax(-1)).sum()) if got.numel() else 0
    r.expect(err > 0.1, f"decode logits off by up to {err:.3f}; {flips} of {STEPS} tokens change")
    r.damage = (
        f"no error raised; heads read from the token axis: decode logits off by up to "
        f"{err:.3f}, {flips} of {STEPS} greedy tokens differ"
    )

    r.say("without the bug:")
    fix = axis_order_claim()
    r.expect(fix.result == "proved", f"{fix.id}: {fix.result} ({fix.detail})")
    ref, got = handoff_logits(trust_buffer_layout=True)
    r.expect(torch.equal(ref, got), "resharding by the actual layouts: logits bit-exact")
    r.config = get_config("handoff_tp2to1")
    e = r.engine(bug=False)
    r.run_steps(e, [step(a, req=0) for a in ("PrefillAdmit", "PrefillRun", "PrefillFreeze")])
    lay = (e.p_local.layout, e.d_local.layout)
    waited = r.survives(e)
    r.expect(lay[0] != lay[1], f"engine handoff {lay[0]} TP=2 -> {lay[1]} TP=1, exact at install")
    r.prevented = (
        "the manifest carries the layout and the reshard permutes by it: tiny-model logits "
        f"bit-exact; engine handoff {lay[0]}->{lay[1]} byte-exact ({len(waited.steps)} steps)"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
