"""The seed's numbers, and the break-even points of the two decisions."""

import math

import pytest

from refimpl import costmodel as cm

SEED = dict(num_layers=16, batch=1, tokens=1024, kv_heads=8, head_dim=128, dtype_bytes=2)


def test_seed_payload_is_64_mib() -> None:
    assert cm.kv_bytes(**SEED) == 64 * 2**20
    assert cm.kv_bytes_per_token(16, 8, 128, 2) * 1024 == 64 * 2**20


def test_payload_scales_with_every_factor() -> None:
    base = cm.kv_bytes(**SEED)
    for name in SEED:
        doubled = dict(SEED, **{name: SEED[name] * 2})
        assert cm.kv_bytes(**doubled) == 2 * base, name
    assert cm.kv_bytes(**SEED, num_fields=1) == base // 2  # K only (e.g. MLA-like caches)


def test_negative_sizes_refused() -> None:
    with pytest.raises(ValueError, match="tokens"):
        cm.kv_bytes(**dict(SEED, tokens=-1))


def test_seed_lower_bound_at_100_gbit() -> None:
    bw = cm.gbit_per_s_to_bytes_per_s(100)
    assert bw == 12.5e9
    assert cm.copy_lower_bound_s(64 * 2**20, bw) * 1e3 == pytest.approx(5.36870912, abs=1e-9)
    assert round(cm.copy_lower_bound_s(64 * 2**20, bw) * 1e3, 3) == 5.369
    with pytest.raises(ValueError):
        cm.copy_lower_bound_s(1, 0)


def test_roundtrip_adds_both_copies_and_the_wait() -> None:
    assert cm.roundtrip_s(0.009924, 0.5, 0.009998) == pytest.approx(0.519922)
    with pytest.raises(ValueError, match="queue_s"):
        cm.roundtrip_s(0.01, -1.0, 0.01)


def test_recompute_is_tokens_over_rate() -> None:
    assert cm.recompute_s(1024, 8192.0) == 0.125


def test_swap_or_recompute_break_even() -> None:
    # 128 KiB/token at 16 GiB/s each way: w = 2 * 2**17 / 2**34 s = 15.26 us/token;
    # recompute at 10k tok/s: r = 100 us/token; fixed 5 ms -> T* = 5e-3 / (r - w).
    per_token = cm.kv_bytes_per_token(32, 8, 128, 2) * 2  # 128 KiB/token
    bw = 16 * 2**30
    w = per_token * 2 / bw
    t_star = 5e-3 / (1e-4 - w)
    args = dict(
        bytes_per_token=per_token,
        d2h_bytes_per_s=bw,
        h2d_bytes_per_s=bw,
        prefill_tokens_per_s=1e4,
        fixed_s=5e-3,
    )
    below = cm.swap_or_recompute(math.floor(t_star) - 1, **args)
    above = cm.swap_or_recompute(math.ceil(t_star) + 1, **args)
    assert below.break_even_tokens == pytest.approx(t_star)
    assert (below.choice, above.choice) == ("recompute", "swap")
    assert below.swap_s == pytest.approx(5e-3 + (math.floor(t_star) - 1) * w)


def test_swap_never_wins_when_moving_costs_more_than_computing() -> None:
    d = cm.swap_or_recompute(
        10**6,
        bytes_per_token=1e6,
        d2h_bytes_per_s=1e9,
        h2d_bytes_per_s=1e9,
        prefill_tokens_per_s=1e4,
    )
    assert d.choice == "recompute" and d.break_even_tokens == math.inf


def test_offload_benefit_seed_model() -> None:
    # 1024 tokens, 64 MiB, 25 GB/s PCIe -> swap-in 2.684 ms; recompute 10 us/token, so a
    # full hit saves 10.24 ms and the break-even hit rate is 0.262.
    b = cm.offload_benefit(0.2, 1e-5, 1024, 64 * 2**20, 25e9)
    assert b.time_saved_s == pytest.approx(0.2 * 1e-5 * 1024)
    assert b.swap_in_s == pytest.approx(64 * 2**20 / 25e9)
    assert not b.worthwhile and b.net_s < 0
    assert b.break_even_hit_rate == pytest.approx(b.swap_in_s / (1e-5 * 1024))
    assert b.break_even_hit_rate == pytest.approx(0.2621, abs=1e-4)
    above = cm.offload_benefit(0.27, 1e-5, 1024, 64 * 2**20, 25e9)
    assert above.worthwhile and above.net_s > 0
    with pytest.raises(ValueError, match="hit_rate"):
        cm.offload_benefit(1.5, 1e-5, 1, 1, 1)


def test_per_tier_choice_follows_the_bytes_and_the_rates() -> None:
    # 2*16*1*T*8*128*2 = 64 KiB per token. Host: 10 GB/s each way, 0.1 ms fixed; disk:
    # 2 GB/s each way, 5 ms fixed (fsync); prefill 10k tok/s (100 us per token).
    host = cm.Tier("host", 10e9, 10e9, 1e-4)
    disk = cm.Tier("disk", 2e9, 2e9, 5e-3)
    geo = dict(num_layers=16, kv_heads=8, head_dim=128, dtype_bytes=2)
    per_token = cm.kv_bytes_per_token(16, 8, 128, 2)
    assert per_token == 64 * 1024
    short = cm.swap_or_recompute_per_tier(1, [host, disk], 1e4, **geo)
    assert short.choice == "recompute" and short.kv_bytes == per_token  # 100 us < 113 us
    long = cm.swap_or_recompute_per_tier(1024, [host, disk], 1e4, **geo)
    assert long.choice == "host" and long.kv_bytes == 64 * 2**20
    assert long.swap_s["host"] == pytest.approx(1e-4 + 2 * 64 * 2**20 / 10e9)
    assert long.swap_s["disk"] == pytest.approx(5e-3 + 2 * 64 * 2**20 / 2e9)
    assert long.recompute_s == pytest.approx(0.1024)
    only_disk = cm.swap_or_recompute_per_tier(1024, [disk], 1e4, **geo)
    assert only_disk.choice == "disk" and "M_KV = 2·16·1·1024·8·128·2" in only_disk.reason
    assert only_disk.break_even_tokens["disk"] == pytest.approx(5e-3 / (1e-4 - 2 * per_token / 2e9))
    slow_disk = cm.Tier("disk", 5e8, 5e8, 5e-3)  # 262 us per token to move > 100 us to compute
    never = cm.swap_or_recompute_per_tier(10**5, [slow_disk], 1e4, **geo)
    assert never.choice == "recompute" and never.break_even_tokens["disk"] == math.inf
    batched = cm.swap_or_recompute_per_tier(1024, [host], 1e4, batch=4, **geo)
    assert batched.kv_bytes == 4 * 64 * 2**20 and batched.recompute_s == pytest.approx(0.4096)
