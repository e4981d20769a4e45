"""The workload: N requests with a shared prefix and random prompt lengths, and the
single-process reference decode their tokens are compared against.

Prompt lengths are drawn so that each prompt fills 1..``max_blocks`` blocks of the
prefill block size (the per-request spec configs go up to 3 blocks). Every prompt starts
with the same ``prefix`` tokens. The model is the tiny GQA+RoPE decoder of
``refimpl/model.py`` with random weights from ``model_seed``: every process builds the
same weights from the same ``ModelSpec``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import torch

from refimpl.model import RopeConfig, TinyConfig, TinyDecoder, generate


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
