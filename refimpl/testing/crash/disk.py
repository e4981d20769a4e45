"""The disk tier's crash test: writers killed with SIGKILL at random points, then a restart.

Each round forks ``writers`` processes that publish files into one directory as fast as
they can (``DiskTier.store``: temp file, fsync, rename, fsync of the directory), each
reporting a key on a pipe once its ``store`` returned. After a random delay the parent
kills every writer with SIGKILL (by pid) and reaps it, then restarts the tier
(``DiskTier(directory, model)``: orphans removed, published files adopted) and checks:

- no temp file is left (``orphans`` counts those the restart removed: kills that landed
  between the temp file's creation and the rename);
- every key a writer reported is still published (no published file is lost);
- every published file is a verified hit whose bytes are the ones written (nothing
  half-written reads as a hit); a miss or a wrong byte is a failure.

With ``writers=2`` both processes write the same keys (two writers of one entry: each
has its own temp name, the last rename wins). Forked children only write (pure Python and
``os.write`` over tensors prepared before the fork), so the fork is safe under torch.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from refimpl.api.disk import DiskTier, Loaded, file_manifest
from refimpl.api.geometry import KVGeometry, ModelIdentity
from refimpl.checksum import block_checksum
from refimpl.engine.data import gen
from refimpl.tiers.files import TEMP_SUFFIX
from spec.manifest import Manifest, RopeConfig

MODEL = ModelIdentity("crash-test", RopeConfig(10000.0, 64))


@dataclass
class CrashReport:
    rounds: int = 0
    kills: int = 0  # writer processes killed with SIGKILL
    orphans: int = 0  # temp files the restarts removed (kills mid-write)
    reported: int = 0  # distinct keys writers reported published before their death
    published: int = 0  # distinct published files seen over all restarts
    hits_verified: int = 0  # loads that hit and matched the bytes written
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{self.rounds} rounds, {self.kills} kills survived, {self.orphans} orphans "
            f"removed, {self.reported} reported keys kept, {self.hits_verified} hits "
            f"verified, {len(self.failures)} failures"
        )


def sample_file(geometry: KVGeometry, blocks: int) -> tuple[Manifest, torch.Tensor]:
    """A file's manifest and canonical blocks of deterministic values (``blocks`` blocks
    of ``geometry``, this module's MODEL, token ids 0..n-1)."""
    kv = gen((blocks, *geometry.rank_pool_geometry().block_shape), geometry.torch_dtype, "crash")
    tokens = tuple(range(blocks * geometry.block_size))
    m = Manifest.from_json_dict(
        {
            "request_id": "crash",
            "model_id": MODEL.model_id,
            "adapter_id": None,
            "token_ids": list(tokens),
            "num_tokens": len(tokens),
            "cache_fields": list(geometry.cache_fields),
            "num_layers": geometry.num_layers,
            "dtype": geometry.dtype,
            "quantization": "none",
            "kv_heads": geometry.kv_heads,
            "head_dim": geometry.head_dim,
            "block_size": geometry.block_size,
            "layout": "heads_major",
            "start_pos": 0,
            "rope": MODEL.rope.to_json_dict(),
            "src_tp": 1,
            "src_cp": 1,
            "dst_tp": 1,
            "dst_cp": 1,
            "prefix_blocks": 0,
            "block_checksums": [block_checksum(b) for b in kv],
            "version": 1,
            "epoch": 1,
        }
    )
    return file_manifest(m), kv


def _tokens(base: Manifest, i: int) -> tuple[int, ...]:
    return (1_000_000 + i, *base.token_ids[1:])  # key i: a distinct first token


def _manifest(base: Manifest, i: int) -> Manifest:
    return Manifest.from_json_dict({**base.to_json_dict(), "token_ids": list(_tokens(base, i))})


def _writer(tier: DiskTier, base: Manifest, kv: torch.Tensor, start: int, fd: int) -> None:
    i = start
    while True:
        tier.store(_manifest(base, i), kv)
        os.write(fd, f"{i}\n".encode())
        i += 1


def _fork_writer(tier: DiskTier, base: Manifest, kv: torch.Tensor, start: int, fd: int) -> int:
    pid = os.fork()
    if pid == 0:  # the child: write until killed, never return into the caller
        code = 0
        try:
            _writer(tier, base, kv, start, fd)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid


def kill_rounds(
    directory: str | os.PathLike[str],
    rounds: int,
    *,
    seed: int = 0,
    writers: int = 1,
    blocks: int = 16,
    geometry: KVGeometry | None = None,
    window_s: float = 0.05,
) -> CrashReport:
    """Run ``rounds`` kill-and-restart rounds in ``directory``; see the module docstring."""
    geo = geometry or KVGeometry(4, 4, 64, 16, "bfloat16")
    d = Path(directory)
    base, kv = sample_file(geo, blocks)
    rng = random.Random(seed)
    rep = CrashReport()
    reported: set[int] = set()
    verified: set[str] = set()
    next_key = 0
    for _ in range(rounds):
        rep.rounds += 1
        start = next_key
        tier = DiskTier(d, MODEL)
        r, w = os.pipe()
        pids: list[int] = []
        try:
            for _ in range(writers):
                pids.append(_fork_writer(tier, base, kv, next_key, w))
            os.close(w)
            time.sleep(rng.uniform(0.0, window_s))
        finally:
            for pid in pids:  # every process started here ends here, by its pid
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                rep.kills += 1
        with os.fdopen(r) as pipe:
            keys = {int(x) for x in pipe.read().split()}
        reported |= keys
        next_key = max(keys | {next_key - 1}) + 1
        restarted = DiskTier(d, MODEL)  # the restart
        rep.orphans += len(restarted.orphans_removed)
        left = [p.name for p in d.iterdir() if p.name.endswith(TEMP_SUFFIX)]
        if left:
            rep.failures.append(f"temp files left after the restart: {left}")
        fresh = range(start, next_key + 1)  # written this round (one past: unreported)
        _check_all(restarted, geo, base, kv, reported, fresh, verified, rep)
    rep.reported = len(reported)
    rep.published = len(verified)
    return rep


def _check_all(
    tier: DiskTier,
    geo: KVGeometry,
    base: Manifest,
    kv: torch.Tensor,
    reported: set[int],
    fresh: range,
    verified: set[str],
    rep: CrashReport,
) -> None:
    """Every published chunk is one a writer wrote, behind its whole prefix, and reads
    as a verified hit of the bytes written; every reported store is whole."""
    published = set(tier.keys())
    chains = {i: tier.chunk_keys(geo, _tokens(base, i)) for i in range(fresh.stop + 1)}
    for i in sorted(reported):
        if chains[i][-1] not in published:
            rep.failures.append(f"key {i} was reported published and is gone")
    known = {k for c in chains.values() for k in c}
    for key in sorted(published - known):
        rep.failures.append(f"{key}: a published file no writer could have written")
    for i, chain in chains.items():
        have = [k in published for k in chain]
        if any(have[j] and not all(have[:j]) for j in range(len(have))):
            rep.failures.append(f"key {i}: a chunk published without the chunks before it")
        if not have[0] or (all(k in verified for k in chain if k in published) and i not in fresh):
            continue
        got = tier.load(geo, _tokens(base, i), "check")
        if not isinstance(got, Loaded):
            rep.failures.append(f"key {i}: published but a miss ({got.reason})")
            continue
        n = geo.blocks_for(got.num_tokens)
        data = got.pools.pools[0].kv[list(got.blocks)]
        if sum(have) != len(tier.chunk_keys(geo, _tokens(base, i)[: got.num_tokens])):
            rep.failures.append(f"key {i}: {sum(have)} chunks published, {got.num_tokens} hit")
        elif not torch.equal(data.view(torch.uint8), kv[:n].view(torch.uint8)):
            rep.failures.append(f"key {i}: a hit with bytes other than the ones written")
        else:
            rep.hits_verified += 1
            verified.update(k for k in chain if k in published)


PHASES = ("create", "write", "fsync", "rename", "dirsync", "between_renames")


def _stall_at(phase: str, fd: int) -> None:
    """In the child: tell the parent, then wait to be killed, at ``phase`` of one store."""
    real = {n: getattr(os, n) for n in ("open", "write", "writev", "fsync", "replace")}
    count = {"write": 0, "fsync": 0, "replace": 0}

    def stall(*_: object) -> None:
        real["write"](fd, b"!")
        while True:
            time.sleep(60)

    def hook_open(path: object, flags: int, *a: object) -> int:
        out: int = real["open"](path, flags, *a)
        if phase == "create" and flags & os.O_CREAT:
            stall()  # the temp file exists, empty
        return out

    def hook_write(f: int, data: object) -> int:
        count["write"] += 1
        if phase == "write" and count["write"] == 2:
            real["write"](f, memoryview(data)[: len(memoryview(data)) // 2])  # type: ignore[arg-type]
            stall()  # the header and half the data are in the temp file
        n: int = real["write"](f, data)
        return n

    def hook_writev(f: int, bufs: list[memoryview]) -> int:
        if phase == "write":  # a file's header and bytes go in one writev: the header,
            real["write"](f, bufs[0])  # then half of the first block's bytes, then the stall
            if len(bufs) > 1:
                real["write"](f, bufs[1][: bufs[1].nbytes // 2])
            stall()
        n: int = real["writev"](f, bufs)
        return n

    def hook_fsync(f: int) -> None:
        count["fsync"] += 1
        if (phase == "fsync" and count["fsync"] == 1) or (
            phase == "dirsync" and count["fsync"] == 2
        ):
            stall()  # fsync: every byte written, none flushed; dirsync: renamed already
        real["fsync"](f)

    def hook_replace(a: object, b: object) -> None:
        count["replace"] += 1
        if phase == "rename" or (phase == "between_renames" and count["replace"] == 2):
            stall()  # flushed, not yet renamed (between: the first chunk renamed)
        real["replace"](a, b)

    os.open, os.write, os.fsync, os.replace = hook_open, hook_write, hook_fsync, hook_replace  # type: ignore[assignment]
    os.writev = hook_writev  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class PhaseKill:
    phase: str
    orphans_removed: int  # temp files the restart removed
    published: bool  # the key's file was published when the writer died
    hit: bool  # and it loads as a verified hit with the written bytes
    prefix_tokens: int = 0  # tokens of the verified hit with the written bytes (0: a miss)


def kill_at(directory: str | os.PathLike[str], phase: str, *, blocks: int = 4) -> PhaseKill:
    """One store killed (SIGKILL) at ``phase`` (of ``PHASES``), then a restart and a load.
    ``between_renames``: a store of several chunks, killed after its first rename."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}; known: {PHASES}")
    geo = KVGeometry(4, 4, 64, 16, "bfloat16")
    d = Path(directory)
    base, kv = sample_file(geo, blocks)
    tier = DiskTier(d, MODEL)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            _stall_at(phase, w)
            tier.store(_manifest(base, 0), kv)
        finally:
            os._exit(1)  # the store returned: the stall never came
    os.close(w)
    try:
        with os.fdopen(r, "rb") as pipe:
            reached = pipe.read(1) == b"!"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if not reached:
        raise RuntimeError(f"the writer never reached {phase!r}")
    restarted = DiskTier(d, MODEL)
    key = restarted.key(geo, _tokens(base, 0))
    got = restarted.load(geo, _tokens(base, 0), "check")
    same = isinstance(got, Loaded) and torch.equal(
        got.pools.pools[0].kv[list(got.blocks)].view(torch.uint8),
        kv[: len(got.blocks)].view(torch.uint8),
    )
    n = got.num_tokens if isinstance(got, Loaded) and same else 0
    whole = n == blocks * geo.block_size
    return PhaseKill(phase, len(restarted.orphans_removed), key in restarted.keys(), whole, n)
