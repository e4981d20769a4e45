"""A KV with another position encoding is installed (seed failure 4).

Prefill hands request r0 to decode, but the manifest decode receives says the keys were
rotated with another RoPE base (theta 500000, where decode runs 10000; the same happens
with another adapter or quantization). The bug: decode skips the manifest compatibility
check and installs the KV. The bytes are exactly the ones sent, so no checksum can
notice; the damage shows in the logits: attention compares decode's queries with keys
rotated by other angles. ManifestGate breaks.

The correct decode checks the manifest against its own config before it installs, and
refuses naming every mismatched field; the attempt is aborted and the source takes r0
back.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.model import ContiguousKV, RopeConfig, TinyConfig, TinyDecoder, decode, generate  # noqa: E402
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "ManifestGate"
MUTANT = "mismatch_installed"
COVERS = ("seed 4: position/adapter/quantization mismatch installed",)
SCENARIO = "decode installs r0 on a manifest with another RoPE theta; logits go wrong"
STEPS = 6


def decode_logits(kv_theta: float, local_theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(reference, handed-off) greedy decode logits of a tiny GQA+RoPE model whose prompt
    KV was computed with ``kv_theta`` and is read by a decoder running ``local_theta``."""
    cfg = TinyConfig(rope=RopeConfig(local_theta, 8))
    model = TinyDecoder(cfg, seed=0)
    sender = TinyDecoder(replace(cfg, rope=RopeConfig(kv_theta, 8)), seed=0)
    prompt = torch.randint(0, cfg.vocab, (12,), generator=torch.Generator().manual_seed(0))
    ref = generate(model, prompt, STEPS)
    kv = ContiguousKV(cfg)
    sender.prefill(prompt, kv)  # the KV as the manifest describes it
    rows, _ = decode(model, ref.tokens[0], prompt.shape[0], STEPS, kv)
    return ref.decode_logits, rows


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    r.model_check()
    e = r.replay_with_bug()
    m = e.rx[0].manifest
    assert m is not None
    theta, local = m.rope.theta, e.d_local.rope.theta
    r.expect(theta != local, f"installed: manifest rope theta {theta}, decode runs {local}")
    ref, got = decode_logits(theta, local)
    err = float((ref - got).abs().max())
    flips = int((ref.argmax(-1) != got.argmax(-1)).sum())
    r.expect(err > 0.1, f"decode logits off by up to {err:.3f}; {flips} of {STEPS} tokens change")
    r.damage = (
        f"KV rotated with theta {theta:g} installed where decode runs {local:g}: logits off by "
        f"up to {err:.3f}, {flips} of {STEPS} greedy tokens differ"
    )

    e, exc = r.replay_without_bug("ManifestGate")
    reasons = list(getattr(exc, "reasons", []))
    r.expect(any("rope.theta" in x for x in reasons), f"the refusal names the field: {reasons}")
    waited = r.survives(e)
    ref, got = decode_logits(local, local)
    r.expect(torch.equal(ref, got), "with a compatible manifest the logits are bit-exact")
    r.prevented = (
        f"validate refused (ManifestGate: {reasons[0] if reasons else '?'}); the attempt is "
        f"aborted and r0 ends ({len(waited.steps)} steps, nothing held); a compatible "
        "manifest gives bit-exact logits"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
