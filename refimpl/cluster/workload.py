"""The workload: N requests with a shared prefix and random prompt lengths, and the
single-process reference decode their tokens are compared against.

Prompt lengths are drawn so that each prompt fills 1..``max_blocks`` blocks of the
prefill block size (the per-request spec configs go up to 3 blocks). Every prompt starts
with the same ``prefix`` tokens. The model is the tiny GQA+RoPE decoder of
``refimpl/model.py`` with random weights from ``model_seed``: every process builds the
same weights from the same ``ModelSpec``. ``ClusterConfig`` is what a run is asked
for (this workload, the faults, the ranks), checked when it is made.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field

import torch

from refimpl.cluster.control import ControlFaults
from refimpl.cluster.faults import CancelPlan, parse_kill
from refimpl.model import RopeConfig, TinyConfig, TinyDecoder, generate
from spec.mutants import MUTANTS

CLUSTER_MUTANTS = ("release_before_install", "cancel_ignored")


@dataclass(frozen=True)
class ModelSpec:
    """What every process needs to build the same model and pools (JSON-able)."""

    layers: int = 2
    q_heads: int = 8
    kv_heads: int = 2
    head_dim: int = 8
    dtype: str = "float32"
    seed: int = 0
    block_size: int = 8  # prefill and decode block size, in tokens

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} < 1")
        self.tiny()  # validates the rest

    def tiny(self) -> TinyConfig:
        return TinyConfig(
            layers=self.layers,
            q_heads=self.q_heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
            rope=RopeConfig(theta=10000.0, rotary_dim=min(8, self.head_dim)),
        )

    def model(self) -> TinyDecoder:
        torch.set_num_threads(1)
        return TinyDecoder(self.tiny(), seed=self.seed)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Request:
    rid: str
    prompt: tuple[int, ...]
    steps: int  # decode steps after the first token

    def blocks(self, block_size: int) -> int:
        return -(-len(self.prompt) // block_size)


def make_requests(
    n: int, spec: ModelSpec, *, seed: int = 0, max_blocks: int = 3, steps: int = 4
) -> list[Request]:
    """``n`` requests; the shared prefix is half a block, lengths fill 1..max_blocks."""
    if n < 1:
        raise ValueError(f"requests={n} < 1")
    if not 1 <= max_blocks <= 3:
        raise ValueError(f"max_blocks={max_blocks} not in 1..3")
    rng = random.Random(seed)
    vocab = spec.tiny().vocab
    bs = spec.block_size
    prefix = [rng.randrange(vocab) for _ in range(max(1, bs // 2))]
    out = []
    for k in range(n):
        length = rng.randint(len(prefix) + 1, max_blocks * bs)
        tail = [rng.randrange(vocab) for _ in range(length - len(prefix))]
        out.append(Request(f"r{k}", tuple(prefix + tail), steps))
    return out


def reference_tokens(model: TinyDecoder, req: Request) -> tuple[int, ...]:
    """Prefill + greedy decode in one process, unpaged: the tokens a run must produce."""
    return generate(model, torch.tensor(req.prompt), req.steps).tokens


@dataclass(frozen=True)
class ClusterConfig:
    requests: int = 20
    prefill_tp: int = 2
    decode_tp: int = 1
    seed: int = 0
    kill: str | None = None
    cancel_p: float = 0.0
    delay_p: float = 0.0
    delay_s: float = 0.02
    drop_p: float = 0.0
    timeout_s: float = 3.0
    deadline_s: float = 120.0
    mutant: str | None = None
    model: ModelSpec = field(default_factory=ModelSpec)
    steps: int = 4
    capacity: int = 64
    max_inflight: int = 4
    raw_baseline: bool = True
    backend: str = "gloo"
    log_dir: str = ""  # "": a new temporary folder
    decode_workers: int = 1
    restarts: int = 2  # restarts of killed workers, in all
    retries: int = 2  # new attempts of a failed request
    frames: bool = True  # worker-to-worker control over the pair groups, not the TCPStore

    def __post_init__(self) -> None:
        problems = []

        def bounded(name: str, lo: float, hi: float) -> None:
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi
            if not ok:
                problems.append(f"{name}={v!r} not in [{lo}, {hi}]")

        for name, lo, hi in (
            ("requests", 1, 100_000), ("prefill_tp", 1, 4), ("decode_workers", 1, 4),
            ("steps", 0, 256), ("capacity", 4, 4096), ("max_inflight", 1, 64),
            ("restarts", 0, 8), ("retries", 0, 4), ("delay_s", 0.0, 10.0),
            ("timeout_s", 1e-3, 600.0), ("deadline_s", 1e-3, 7 * 24 * 3600.0),
        ):  # fmt: skip
            bounded(name, lo, hi)
        bounded("decode_tp", 1, 4)
        kv = self.model.kv_heads
        for name, tp in (("prefill_tp", self.prefill_tp), ("decode_tp", self.decode_tp)):
            if isinstance(tp, int) and tp >= 1 and kv % tp:
                problems.append(f"{name}={tp} does not divide the model's {kv} KV heads")
        if self.mutant is not None and self.mutant not in CLUSTER_MUTANTS:
            known = "a spec mutant" if self.mutant in MUTANTS else "not a spec mutant"
            problems.append(
                f"mutant {self.mutant!r} ({known}) has no switch in the cluster workers; "
                f"valid: {', '.join(CLUSTER_MUTANTS)}"
            )
        if self.backend != "gloo":
            problems.append(
                f"backend {self.backend!r}: only gloo (the workers send CPU tensors; an NCCL "
                "path would stage them on the GPU and needs one GPU per rank)"
            )
        if problems:
            raise ValueError("; ".join(problems))
        parse_kill(self.kill, self.prefill_tp, self.decode_workers, self.seed, self.decode_tp)
        CancelPlan(self.cancel_p)
        ControlFaults(self.delay_p, self.delay_s, self.drop_p)
