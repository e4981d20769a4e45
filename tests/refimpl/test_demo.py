"""`kvown demo`: every handoff path decodes bit-exactly; mismatches are refused or visible."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from kvown_cli.main import main
from refimpl.api import channels
from refimpl.demo import (
    DEMO_CONFIG,
    PATHS,
    PROMPT_LEN,
    SPECS,
    STEPS,
    PathSpec,
    prompt_of,
    run_path,
)
from refimpl.demo.handoff import Worker, handoff
from refimpl.demo.mismatch import KINDS, mismatch
from refimpl.demo.turns import TURN_PATHS
from refimpl.errors import ChecksumError
from refimpl.model import TinyDecoder
from refimpl.transport import Fault, InProcessTransport, Payload

# one canonical block: layers * (K, V) * kv_heads * block_size * head_dim * float32
BLOCK_BYTES = DEMO_CONFIG.layers * 2 * DEMO_CONFIG.kv_heads * 4 * DEMO_CONFIG.head_dim * 4
PROMPT_BLOCKS = -(-PROMPT_LEN // 4)
EXPECTED = {  # name: (blocks moved, checksums verified)
    "tp2->tp1": (PROMPT_BLOCKS, PROMPT_BLOCKS * (2 + 1)),  # 2 rank chunks + 1 end-to-end
    "tp1->tp2": (PROMPT_BLOCKS, PROMPT_BLOCKS * (1 + 1)),
    "tp4->tp2": (PROMPT_BLOCKS, PROMPT_BLOCKS * (4 + 1)),
    "tp2->tp1 +prefix": (PROMPT_BLOCKS - 2, (PROMPT_BLOCKS - 2) * (2 + 1)),
    "tp2->tp1 +offload": (PROMPT_BLOCKS, PROMPT_BLOCKS * (2 + 1) + PROMPT_BLOCKS * 2),
    "bs4->6 +layout": (PROMPT_BLOCKS, PROMPT_BLOCKS * (2 + 1)),
    # + the file's blocks verified once on read (the offload hashes them; no comparison)
    "tp2->tp1 +disk": (PROMPT_BLOCKS, PROMPT_BLOCKS * (2 + 1) + PROMPT_BLOCKS),
}


@pytest.mark.parametrize("path", PATHS, ids=list(SPECS))
def test_every_path_is_bit_exact(path: Any) -> None:
    r = path()
    assert r.logits_equal and r.max_abs_diff == 0.0
    assert (r.blocks_moved, r.checksums_verified) == EXPECTED[r.name]
    assert r.bytes_moved == r.blocks_moved * BLOCK_BYTES


def test_prefix_on_the_decode_side_sends_only_the_suffix() -> None:
    full, suffix = run_path(SPECS["tp2->tp1"]), run_path(SPECS["tp2->tp1 +prefix"])
    assert suffix.logits_equal
    assert suffix.blocks_moved == full.blocks_moved - 2
    assert suffix.bytes_moved < full.bytes_moved


def test_full_prefix_hit_moves_nothing_and_still_decodes_exactly() -> None:
    spec = PathSpec("full hit", (2, 4, "heads_major"), (1, 4, "heads_major"), prefix_tokens=12)
    r = run_path(spec, prompt_len=12)
    assert (r.blocks_moved, r.bytes_moved, r.logits_equal) == (0, 0, True)


def test_other_seeds_and_lengths_stay_exact() -> None:
    for seed, n in ((3, 9), (7, 17)):
        assert run_path(SPECS["bs4->6 +layout"], seed=seed, prompt_len=n).logits_equal


class _Tamper(InProcessTransport):
    """Flips one byte of the first chunk and, if `rehash`, rewrites its header checksum
    to match (a consistent but wrong chunk: only the end-to-end check can catch it)."""

    def __init__(self, rehash: bool) -> None:
        super().__init__(copy_payload=True)
        self.rehash, self.done = rehash, False

    def send(self, channel: str, header: Mapping[str, Any], payload: Payload = b"") -> None:
        if header.get("type") == "chunk" and not self.done:
            self.done, data = True, bytearray(payload)
            data[len(data) // 2] ^= 0x01
            payload = bytes(data)
            if self.rehash:
                from refimpl.checksum import bytes_checksum

                header = {**header, "checksum": bytes_checksum(payload)}
        super().send(channel, header, payload)


@pytest.mark.parametrize("how", ["corrupt", "consistent"])
def test_a_bad_chunk_is_never_installed(how: str) -> None:
    model = TinyDecoder(DEMO_CONFIG, seed=0)
    src = Worker(model, tp=2, block_size=4, layout="heads_major", capacity=8)
    dst = Worker(model, tp=1, block_size=4, layout="heads_major", capacity=8)
    prompt = prompt_of(DEMO_CONFIG, 0)
    logits, _ = src.prefill("req", prompt)
    if how == "corrupt":
        t = InProcessTransport(copy_payload=True)
        t.inject(channels("req").to_receiver, Fault.CORRUPT, skip=1)  # the manifest, a chunk
        match = "do not hash to the header"
    else:
        t, match = _Tamper(rehash=True), "manifest's checksum"
    before = dst.pool_bytes()
    with pytest.raises(ChecksumError, match=match):
        handoff(src, dst, "req", prompt.tolist(), int(logits[-1].argmax()), transport=t)
    assert all(torch.equal(a, p.kv) for a, p in zip(before, dst.rp.pools, strict=True))
    assert dst.rp.alloc.num_free == dst.rp.alloc.capacity  # the reservation was given back
    assert src.rp.alloc.holders() == ("req",)  # the sender's pins are released
    dst.rp.alloc.check_integrity()
    src.rp.alloc.check_integrity()


@pytest.mark.parametrize("kind", KINDS)
def test_mismatch_installed_without_the_check_changes_the_logits(kind: str) -> None:
    r = mismatch(kind, check=False)
    assert r.installed and not r.dst_unchanged and r.leaked_blocks == 0
    assert r.max_abs_diff is not None and r.max_abs_diff > 0.1
    assert len(r.reasons) == 1  # the check would have refused it, for this reason


@pytest.mark.parametrize(("kind", "reason"), [("rope", "rope.theta"), ("adapter", "adapter_id")])
def test_mismatch_is_refused_with_the_check_and_nothing_is_installed(
    kind: str, reason: str
) -> None:
    r = mismatch(kind, check=True)
    assert not r.installed and r.max_abs_diff is None
    assert [x.split(":")[0] for x in r.reasons] == [reason]
    assert r.dst_unchanged and r.leaked_blocks == 0


def test_cli_demo_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--json", "--steps", str(STEPS)]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [p["name"] for p in out["paths"]]
    assert names == list(SPECS) + list(TURN_PATHS)  # refimpl/demo/turns.py
    for p in out["paths"]:
        assert set(p) == {"name", "blocks_moved", "bytes_moved", "logits_equal", "max_abs_diff"}
        assert p["logits_equal"] is True and p["max_abs_diff"] == 0.0
    rows = out["swap_or_recompute"]  # per tier, rates measured here
    assert [r["tokens"] for r in rows] == [13, 1024, 32768]
    for r in rows:
        assert r["kv_bytes"] == 2 * 2 * r["tokens"] * 4 * 8 * 4  # 2·L·B·T·H_kv·D·s, float32
        assert r["choice"] in {"recompute", "host", "disk"} and r["reason"].startswith("M_KV")
        fastest = min([r["recompute_s"], *r["swap_s"].values()])
        want = r["choice"] == "recompute" or r["swap_s"][r["choice"]] == fastest
        assert want and set(r["swap_s"]) == {"host", "disk"}


def test_cli_demo_table_and_mismatch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--no-tiers"]) == 0
    assert "tp2->tp1 +disk" in capsys.readouterr().out
    assert main(["demo", "--mismatch", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["mismatch"]
    assert [(r["name"], r["check"], r["installed"]) for r in out] == [
        ("rope", False, True),
        ("rope", True, False),
        ("adapter", False, True),
        ("adapter", True, False),
    ]
    assert main(["demo", "--steps", "0"]) == 2


def test_offload_reload_moves_the_bytes_to_new_blocks_unchanged() -> None:
    from refimpl.demo import offload_reload
    from refimpl.reshard import unshard

    model = TinyDecoder(DEMO_CONFIG, seed=0)
    w = Worker(model, tp=2, block_size=4, layout="tokens_major", capacity=16)
    prompt = prompt_of(DEMO_CONFIG, 0)
    _, store = w.prefill("req", prompt, room=STEPS)
    before, old = unshard(store.kv), w.rp.alloc.blocks_of("req")
    table, checks, moved = offload_reload(w, "req", PROMPT_LEN, STEPS)
    assert set(table).isdisjoint(old) and len(table) == len(old)
    # each way: both ranks' chunks, then every canonical block end to end (the API's checks)
    assert checks == 2 * (2 + 1) * PROMPT_BLOCKS and moved == PROMPT_BLOCKS * BLOCK_BYTES
    assert torch.equal(unshard(w.store(table, PROMPT_LEN).kv), before)
    w.finish("req")
    assert w.rp.alloc.num_free == w.rp.alloc.capacity
