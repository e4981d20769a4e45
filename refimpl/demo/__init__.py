"""``kvown demo``: the data path on a tiny GQA+RoPE decoder, logits bit-exact.

``paths`` runs every handoff path (TP 2→1, 1→2, 4→2, a prefix hit, an offload round trip,
a block-size and layout change, a disk round trip through a published file) and compares
the logits with decoding without a handoff;
``handoff`` is the manifest → checksum → reshard → install pipeline between two workers;
``tiers`` measures the host and disk tiers and chooses swap or recompute per tier;
``mismatch`` shows what a wrong RoPE base or adapter does with the compatibility check off;
``turns`` runs two turns of one conversation, the second appended on the decode worker
from the longest common token-id prefix (PPD), against the unbroken run.
"""

from refimpl.demo.handoff import Handoff, Worker, handoff
from refimpl.demo.paths import (
    DEMO_CONFIG,
    PATHS,
    PROMPT_LEN,
    SEED,
    SPECS,
    STEPS,
    DemoRecord,
    PathSpec,
    offload_reload,
    prompt_of,
    run_all,
    run_path,
)
from refimpl.demo.tiers import choices, disk_round_trip, measure_prefill, measure_tiers

__all__ = [
    "DEMO_CONFIG",
    "PATHS",
    "PROMPT_LEN",
    "SEED",
    "SPECS",
    "STEPS",
    "DemoRecord",
    "Handoff",
    "PathSpec",
    "Worker",
    "handoff",
    "offload_reload",
    "prompt_of",
    "run_all",
    "run_path",
    "choices",
    "disk_round_trip",
    "measure_prefill",
    "measure_tiers",
]
