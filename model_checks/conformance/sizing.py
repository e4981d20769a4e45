"""The sizes of a log's world that cannot grow once the log has begun, read from the log
before the check starts (issue #32): the blocks per request, the prefill and decode TP
ranks and the prefix decode holds at the start. A header that states a size wins.

Each is the least the log shows: a RankDone of rank r means at least r + 1 prefill
ranks; an attempt that sends n items from T ranks with h prefix blocks means at least
n / T - 1 + h blocks; a chunk index k (rank-major) at least k / T + 1 blocks; k
per-block copies in one offload, reload, host-cache load or store, or k staged blocks,
at least k blocks; k rank installs in one attempt at least k decode ranks; a Ready that
counts h prefix blocks (or a prefix eviction or recycle) a prefix of at least h (at
least 1); k window prunes of one copy (``PrefillPruneWindow`` since its ``PrefillAdmit``
or ``HostLoadBegin``: the window keeps a block) at least k + 1. A log cut short of its
transfer shows fewer blocks than it has: such a log states ``blocks`` in its header.
Lines that are not JSON objects are skipped here; the check itself reports them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from model_checks.conformance.jsonline import LogError, loads_line

__all__ = ["GIVEN_UP_FRONT", "declares_world", "prescan"]

GIVEN_UP_FRONT = ("blocks", "src_tp", "dst_tp", "prefix")  # the sizes read ahead
_COPIES = {
    "PrefillOffloadCopy": "PrefillOffloadBegin",
    "PrefillReloadCopy": "PrefillReloadBegin",
    "HostLoadCopy": "HostLoadBegin",
    "HostStoreCopy": "HostStoreBegin",
    "PrefillStage": "PrefillFreeze",
}
_BEGINS = frozenset(_COPIES.values())


def _declared(obj: dict[str, Any]) -> bool:
    """A header that declares its world (behaviours, faults or sizes) and names no config."""
    return "config" not in obj and bool({"behaviours", "faults", "sizes"} & obj.keys())


def declares_world(raw: bytes | str) -> bool:
    """Whether a log's first line is a header declaring its world: only such a log is
    read ahead for its sizes (``prescan``)."""
    obj = next(iter(_objects([(1, raw)])), None)
    return obj is not None and _declared(obj)


def _objects(lines: Iterable[tuple[int, bytes | str]]) -> Iterable[dict[str, Any]]:
    try:
        for _n, raw in lines:
            if not raw.strip():
                continue
            try:
                obj = loads_line(_n, raw)  # the one strict reader, the check's own limits
            except LogError:
                continue
            if isinstance(obj, dict):
                yield obj
    except LogError:  # an unreadable line: the check itself reports it
        return


def _int(v: object) -> int | None:
    return v if type(v) is int and 0 <= v < 1 << 16 else None


def prescan(lines: Iterable[tuple[int, bytes | str]]) -> dict[str, int]:
    """The up-front sizes the log shows (``GIVEN_UP_FRONT``), for a header without them."""
    src_tp, prefix, max_idx = 1, 0, -1
    blocks, dst_tp = 1, 1
    sends: Counter[tuple[int, int]] = Counter()  # (req, attempt) -> PrefillSendChunk lines
    hits: dict[tuple[int, int], int] = {}  # (req, attempt) -> the Ready's prefix blocks
    copies: dict[int, Counter[str]] = {}  # req -> copy action -> lines since its begin
    installs: Counter[int] = Counter()  # req -> DecodeRankInstall since its reserve
    attempt: Counter[int] = Counter()  # req -> PrefillFreeze lines so far
    prunes: Counter[int] = Counter()  # req -> PrefillPruneWindow lines since its copy began
    for k, obj in enumerate(_objects(lines)):
        if k == 0 and not _declared(obj):
            return {}  # a named config (or no declared world): nothing to read ahead
        name, args = obj.get("action"), obj.get("args")
        args = args if isinstance(args, dict) else {}
        req = _int(args.get("req"))
        msg, idx, ep = args.get("msg"), _int(args.get("idx")), _int(args.get("epoch"))
        if msg == "RankDone" and idx is not None:
            src_tp = max(src_tp, idx + 1)
        if msg in ("Chunk", "ChunkCorrupt", "ChunkUnstaged") and idx is not None:
            max_idx = max(max_idx, idx)
        if msg == "Ready" and idx is not None:
            prefix = max(prefix, idx)
            if req is not None and ep is not None:
                hits[(req, ep)] = idx
        if name in ("DecodeEvictPrefix", "DecodeRecyclePrefix"):
            prefix = max(prefix, 1)
        if req is None or type(name) is not str:
            continue
        if name == "PrefillFreeze":
            attempt[req] += 1
        if name in ("PrefillAdmit", "HostLoadBegin"):
            prunes[req] = 0
        if name == "PrefillPruneWindow":
            prunes[req] += 1
            blocks = max(blocks, prunes[req] + 1)
        if name == "PrefillSendChunk":
            sends[(req, attempt[req])] += 1
        if name in _BEGINS and req in copies:  # at most len(_COPIES) entries a request
            for copy in [c for c in copies[req] if _COPIES[c] == name]:
                del copies[req][copy]
        if name in _COPIES:
            mine = copies.setdefault(req, Counter())
            mine[name] += 1
            blocks = max(blocks, mine[name])
        if name == "DecodeReserve":
            installs[req] = 0
        if name == "DecodeRankInstall":
            installs[req] += 1
            dst_tp = max(dst_tp, installs[req])
    for (req, ep), n in sends.items():
        blocks = max(blocks, -(-n // src_tp) - 1 + hits.get((req, ep), 0))
    if max_idx >= 0:
        blocks = max(blocks, max_idx // src_tp + 1)
    return {"blocks": max(blocks, prefix, 1), "src_tp": src_tp, "dst_tp": dst_tp, "prefix": prefix}
