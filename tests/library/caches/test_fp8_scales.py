"""fp8 KV with its dequantization scales through the public API: the scales travel in the
manifest; equal ones hand off bit-exact (TP 2 -> 1, 1 -> 2), other ones (or scales on one
side only) are refused by name at the manifest gate with 0 blocks held on either side."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from refimpl.api import (
    DiskTier,
    KVGeometry,
    ModelIdentity,
    Receiver,
    Sender,
    handoff,
    offload,
    read_kv,
    reload,
    write_kv,
)
from refimpl.errors import ManifestError, MissError
from refimpl.transport import InProcessTransport
from spec.manifest import RopeConfig
from tests.library.lib_helpers import Pair, held, prefill

LAYERS, FIELDS = 2, 2
SCALES = (0.5, 0.25, 0.125, 2.0)  # per (layer, field): k0, v0, k1, v1


def model(scales: tuple[float, ...] | None = SCALES) -> ModelIdentity:
    return ModelIdentity(
        "fp8-test", RopeConfig(10000.0, 8), quantization="fp8_e4m3", kv_scales=scales
    )


def geo(tp: int) -> KVGeometry:
    return KVGeometry(LAYERS, 4, 8, 4, "float8_e4m3fn", tp=tp)


def fp8_pair(src_tp: int, dst_tp: int, *, rx_model: ModelIdentity | None = None) -> Pair:
    t = InProcessTransport()
    gs, gd = geo(src_tp), geo(dst_tp)
    ps, pd = gs.make_pools(8), gd.make_pools(8)
    rx = Receiver(pd, gd, t, rx_model or model())
    return Pair(t, ps, pd, Sender(ps, gs, t, model()), rx)


def as_bytes(kv: torch.Tensor) -> torch.Tensor:
    return kv.contiguous().view(torch.uint8)


@pytest.mark.parametrize("src_tp,dst_tp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_equal_scales_hand_off_bit_exact(src_tp: int, dst_tp: int) -> None:
    p = fp8_pair(src_tp, dst_tp)
    kv = prefill(p, "r", 10, seed=src_tp * 10 + dst_tp)
    assert kv.dtype == torch.float8_e4m3fn
    res = handoff(p.tx, p.rx, "r", list(range(10)))
    assert res.received.manifest.kv_scales == SCALES
    got = read_kv(p.dst, res.received.blocks, 10)
    assert torch.equal(as_bytes(got), as_bytes(kv))
    assert held(p.src) == {}


@pytest.mark.parametrize(
    "rx_scales,reason",
    [
        ((0.5, 0.25, 0.125, 4.0), "kv_scales: layer 1 field 'v': manifest 2.0 != local 4.0"),
        ((1.0, 0.25, 0.125, 2.0), "kv_scales: layer 0 field 'k': manifest 0.5 != local 1.0"),
        (None, "kv_scales: only the manifest states scales"),
    ],
)
def test_other_scales_are_refused_by_name_holding_nothing(
    rx_scales: tuple[float, ...] | None, reason: str
) -> None:
    p = fp8_pair(2, 1, rx_model=model(rx_scales))
    kv = prefill(p, "r", 10)
    with pytest.raises(ManifestError) as info:
        handoff(p.tx, p.rx, "r", list(range(10)), free_source=False)
    assert any(r.startswith(reason) for r in info.value.reasons), info.value.reasons
    assert held(p.dst) == {}  # nothing reserved or installed at the receiver
    assert held(p.src) == {"owned": 3}  # the source still holds the request, unpinned
    assert torch.equal(as_bytes(read_kv(p.src, p.src.alloc.blocks_of("r"), 10)), as_bytes(kv))


def test_a_sender_without_scales_to_a_receiver_with_them_is_refused() -> None:
    t = InProcessTransport()
    g = geo(1)
    ps, pd = g.make_pools(8), g.make_pools(8)
    p = Pair(t, ps, pd, Sender(ps, g, t, model(None)), Receiver(pd, g, t, model()))
    prefill(p, "r", 10)
    with pytest.raises(ManifestError, match="only the local cache states scales"):
        handoff(p.tx, p.rx, "r", list(range(10)))
    assert held(p.dst) == {}


def test_scales_on_a_cache_that_is_not_quantized_are_refused_at_construction() -> None:
    g = KVGeometry(LAYERS, 4, 8, 4, "bfloat16")
    bad = ModelIdentity("m", RopeConfig(10000.0, 8), kv_scales=SCALES)
    with pytest.raises(ValueError, match="kv_scales: given for quantization 'none'"):
        Sender(g.make_pools(4), g, InProcessTransport(), bad)


def test_a_disk_tier_keeps_the_scales_and_another_calibration_misses(tmp_path: Path) -> None:
    g = geo(1)
    pools = g.make_pools(16)
    tokens = list(range(20))
    blocks = pools.alloc.allocate("r", g.blocks_for(20))
    kv = torch.randn(2, 2, 4, 20, 8, generator=torch.Generator().manual_seed(3))
    kv = kv.to(torch.float8_e4m3fn)
    write_kv(pools, "r", blocks, [list(layer) for layer in kv])
    stored = offload(pools, g, DiskTier(tmp_path, model()), None, "r", tokens)
    assert all(m.kv_scales == SCALES for m in stored.manifests)
    pools.alloc.free("r")
    got = reload(DiskTier(tmp_path, model()), None, pools, g, "r2", tokens)
    assert got.num_tokens == 20
    assert torch.equal(as_bytes(read_kv(pools, got.blocks, 20)), as_bytes(kv))
    other = DiskTier(tmp_path, model((0.5, 0.25, 0.125, 4.0)))  # another calibration
    assert other.lookup(g, tokens) == 0
    with pytest.raises(MissError):
        reload(other, None, pools, g, "r3", tokens)
    assert not pools.alloc.blocks_of("r3")
