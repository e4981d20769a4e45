"""Registering an engine's caches and giving kvown block ids: every wrong input is refused
with an error naming what is wrong, before anything is registered, reserved or written."""

from __future__ import annotations

import pytest
import torch
from reg_helpers import BS, KINDS, MODEL, D, H, L, N, changed, make, snapshot

from refimpl.api import Receiver
from refimpl.errors import CapacityError, InUseError
from refimpl.memory import register_kv_caches
from refimpl.transport import InProcessTransport

FA, FA_HND, FI, FI_HND, FA_CROSS = KINDS[:5]
G = FA.geometry()


def _per_layer(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.zeros(shape, dtype=dtype) for _ in range(L)]


@pytest.mark.parametrize(
    ("caches", "layout", "cross", "match"),
    [
        (_per_layer((2, N, BS, H, D)), "flash_atn", False, r"layout 'flash_atn': not one of"),
        (_per_layer((2, N, BS, H, D)), 3, False, r"layout 3: not one of"),
        (_per_layer((2, N, BS, H, D), torch.float16), "flash_attn", False, "dtype torch.float16"),
        (_per_layer((2, N, BS, H, D + 1)), "flash_attn", False, r"blocks of \(2, 4, 4, 9\)"),
        (_per_layer((3, N, BS, H, D)), "flash_attn", False, "K = 2 fields"),
        (_per_layer((N, BS, H, D)), "flash_attn", False, "is not a 5-d flash_attn cache"),
        (_per_layer((2, N, BS, H, D))[:2], "flash_attn", False, "2 layers, the geometry has 3"),
        (
            [
                torch.zeros(2, N, BS, H, D),
                torch.zeros(2, N + 1, BS, H, D),
                torch.zeros(2, N, BS, H, D),
            ],
            "flash_attn",
            False,
            "layer 1: 13 blocks",
        ),
        # FlashInfer's tensors named FlashAttention: [N, 2, ...] is not [2, N, ...]
        (_per_layer((N, 2, BS, H, D)), "flash_attn", False, "K = 2 fields"),
        # HND bytes (vLLM's shape, strides of [2, N, H, T, D]) named NHD
        (
            [torch.zeros(2, N, H, BS, D).transpose(2, 3) for _ in range(L)],
            "flash_attn",
            False,
            "lays out bytes as",
        ),
        (torch.zeros(N, L, 2, BS, H, D), "flash_attn", False, "a sequence or a dict of tensors"),
        (_per_layer((2, N, BS, H, D)), "flash_attn", True, "a cross-layer cache is one tensor"),
        (torch.zeros(L, N, 2, BS, H, D).transpose(0, 1), "flash_attn", True, "not contiguous"),
        (
            torch.zeros(N, L, 2, BS, H, D, dtype=torch.bfloat16),
            "flash_attn",
            True,
            "dtype torch.bfloat16",
        ),
        (torch.zeros(N, L + 1, 2, BS, H, D), "flash_attn", True, "4 layers, the geometry has 3"),
        (_per_layer((N, H, BS, 2 * D + 1)), "flash_attn_packed", False, "packs K and V"),
        # HND packed bytes ([N, H, T, 2D], contiguous) named NHD packed ([N, T, H, 2D])
        (_per_layer((N, H, BS, 2 * D)), "flash_attn_packed", False, "lays out bytes as"),
    ],
    ids=[
        "unknown-layout",
        "layout-not-a-str",
        "dtype",
        "head-dim",
        "three-fields",
        "4-d",
        "layers",
        "ragged-blocks",
        "flashinfer-as-flash-attn",
        "hnd-as-nhd",
        "cross-as-per-layer",
        "per-layer-as-cross",
        "cross-not-contiguous",
        "cross-dtype",
        "cross-layers",
        "packed-odd-last-axis",
        "packed-hnd-as-nhd",
    ],
)
def test_bad_caches_are_refused_by_name(
    caches: object, layout: object, cross: bool, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        register_kv_caches(G, caches, layout, cross_layer=cross)  # type: ignore[arg-type]


def test_the_geometry_must_say_the_caches_layout() -> None:
    with pytest.raises(
        ValueError, match=r"flash_attn_hnd caches hold heads_major blocks.*layout='tokens_major'"
    ):
        register_kv_caches(G, make(FA_HND), "flash_attn_hnd")
    with pytest.raises(ValueError, match=r"2 ranks of caches, the geometry has tp=1"):
        register_kv_caches(G, layout="flash_attn", ranks=[make(FA), make(FA)])
    with pytest.raises(ValueError, match="caches= \\(one rank\\) or ranks="):
        register_kv_caches(G, make(FA), "flash_attn", ranks=[make(FA)])


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([0, N], rf"\[{N}\] not block ids 0..{N - 1}"),
        ([-1, 2], r"\[-1\] not block ids"),
        ([1, 2, 1], r"\[1\] given twice"),
        ([1.0, 2], r"\[1.0\] not block ids"),
        ([True, 2], r"\[True\] not block ids"),
    ],
    ids=["out-of-range", "negative", "duplicate", "float", "bool"],
)
def test_bad_block_ids_are_refused_before_anything_is_held_or_written(
    ids: list[object], match: str
) -> None:
    caches = make(FA)
    pools = register_kv_caches(G, caches, "flash_attn")
    before = snapshot(FA, caches)
    with pytest.raises(ValueError, match=match):
        pools.adopt("r", ids)  # type: ignore[arg-type]
    rx = Receiver(pools, G, InProcessTransport(), MODEL)
    with pytest.raises(ValueError, match=match):
        rx.expect("r", blocks=ids)  # type: ignore[arg-type]
    assert pools.alloc.counts()["free"] == N and pools.freeable("r") == ()
    assert rx.records()["expected"] == 0 and changed(FA, caches, before) == []


def test_block_ids_are_the_engines_kvown_picks_none_and_frees_none() -> None:
    pools = register_kv_caches(G, make(FI), "flashinfer")
    with pytest.raises(CapacityError, match="the engine's scheduler chooses block ids"):
        pools.alloc.allocate("r", 2)
    with pytest.raises(CapacityError, match=r"Receiver.expect\(rid, blocks=ids\)"):
        pools.alloc.reserve("r", 2, epoch=1)
    pools.adopt("a", [3, 4])
    with pytest.raises(InUseError, match="4 owned by 'a'"):
        pools.adopt("b", [5, 4])
    assert pools.alloc.blocks_of("b") == () and pools.freeable("b") == ()
    rx = Receiver(pools, G, InProcessTransport(), MODEL)
    with pytest.raises(ValueError, match=r"blocks \[3\] are prefix blocks too"):
        rx.expect("a", blocks=[3, 7], prefix=[3], prefix_tokens=list(range(BS)))
    assert pools.release("a") == (3, 4) and pools.release("a") == ()
    pools.alloc.check_integrity()


def test_a_crash_forgets_the_blocks_but_never_zeroes_the_engines_memory() -> None:
    caches = make(FA_CROSS)
    assert isinstance(caches, torch.Tensor)
    caches.normal_()
    keep = caches.clone()
    pools = register_kv_caches(G, caches, "flash_attn", cross_layer=True)
    pools.adopt("r", [1, 2])
    pools.reset()
    assert pools.alloc.counts()["free"] == N and torch.equal(caches, keep)
    with pytest.raises(TypeError, match="per-layer caches are separate tensors"):
        _ = register_kv_caches(G, make(FA), "flash_attn").pools[0].kv
