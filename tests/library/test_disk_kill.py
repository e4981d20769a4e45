"""The disk tier killed the hard way: writer processes SIGKILLed, then a restart.

Deterministic first: one store killed at each phase (temp created, half written, written
but not flushed, flushed but not renamed, renamed but the directory not yet flushed);
then random kill points, one writer and two writers of the same keys. After every
restart no temp file is left, every reported file is still published, and every
published file is a verified hit with the written bytes. Every writer is killed and
reaped by its pid inside ``refimpl.testing.crash.disk``. At scale:
``benchmarks/disk_tier.py --kills N``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from refimpl.testing.crash.disk import PHASES, kill_at, kill_rounds

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


@pytest.mark.parametrize("phase", PHASES)
def test_a_store_killed_at_each_phase(phase: str, tmp_path: Path) -> None:
    k = kill_at(tmp_path, phase, blocks=40 if phase == "between_renames" else 4)
    if phase == "dirsync":  # renamed: published and whole, though the writer never returned
        assert (k.orphans_removed, k.published, k.hit) == (0, True, True)
    elif phase == "between_renames":  # 3 chunks: the first published, 2 temp files left
        assert (k.orphans_removed, k.published, k.hit, k.prefix_tokens) == (2, False, False, 256)
    else:  # not renamed: the restart removes the temp file, the key is a miss
        assert (k.orphans_removed, k.published, k.hit) == (1, False, False)
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("writers", [1, 2])
def test_writers_killed_at_random_points(writers: int, tmp_path: Path) -> None:
    rep = kill_rounds(tmp_path, 4 if writers == 1 else 3, seed=writers, writers=writers, blocks=4)
    assert rep.failures == [], rep.line()
    assert rep.kills == rep.rounds * writers


@pytest.mark.parametrize("writers", [1, 2])
def test_writers_of_several_chunks_killed_at_random_points(writers: int, tmp_path: Path) -> None:
    # 40 blocks of 16 tokens: chunks of 256, 256 and a partial 128; a kill among the
    # renames leaves a leading run of whole chunks, never a chunk without its prefix
    rep = kill_rounds(tmp_path, 3, seed=10 + writers, writers=writers, blocks=40, window_s=0.2)
    assert rep.failures == [], rep.line()
    assert rep.kills == rep.rounds * writers


@pytest.mark.nightly
def test_writers_killed_at_random_points_at_scale(tmp_path: Path) -> None:
    rep = kill_rounds(tmp_path, 200, seed=7, writers=2, blocks=16, window_s=0.2)
    assert rep.failures == [], rep.line()
    assert rep.orphans > 0 and rep.hits_verified > 0, rep.line()
