"""The in-process surfaces of ``benchmarks/hostile/corpus.py`` (issue #34's Done-when):
hostile handoff manifests to a ``Receiver`` through a ``DistTransport`` frame, hostile
``DistTransport`` frames, and damaged disk-tier folders. Each case returns "ok" or what
went wrong ("held ...", "touched ...", anything else: a wrong outcome)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from refimpl import channels
from refimpl.api import DiskTier, State, offload, reload
from refimpl.errors import MissError
from tests.library.lib_helpers import geo, held, pair, prefill
from tests.library.test_disk_tier import DEV, MODEL, TOKENS, _device
from tests.refimpl.test_hostile_headers import HOSTILE, _bare_dist_transport
from tests.spec.hostile_manifests import BAD_LITERALS, hostile_documents

Outcome = str
Case = tuple[str, Callable[[], Outcome]]


# ------------------------------------------------------------------ manifests and frames
def manifest_case(doc: str | bytes) -> Outcome:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    p.tx.offer("r", list(range(10)))
    p.t.poll(channels("r").to_receiver)  # the real manifest, dropped
    ch = channels("r").to_receiver
    head = b'{"ch":' + json.dumps(ch).encode() + b',"h":{"type":"manifest","manifest":'
    body = doc.encode("utf-8", "surrogatepass") if isinstance(doc, str) else doc
    t = _bare_dist_transport()
    t._arrive(1, head + body + b"}}", b"")
    for h, data in t.poll(ch):
        p.t.send(ch, h, data)
    p.rx.poll("r")
    st = p.rx.state("r")  # REFUSED, or WAITING when the frame itself was dropped
    if st not in (State.REFUSED, State.WAITING):
        return f"accepted: {st.value}"
    h = held(p.dst)
    return "ok" if not h else f"held {h}"


def manifest_cases(quick: bool) -> Iterator[tuple[str, Callable[[], Outcome]]]:
    p = pair(geo(), geo())
    prefill(p, "r", 10)
    real = p.tx.offer("r", list(range(10))).to_json_dict()
    marker = '"__HOSTILE__"'
    for key in real:
        for lit in (*BAD_LITERALS, *(() if key == "adapter_id" else ("null",))):
            doc = json.dumps({**real, key: "__HOSTILE__"}).replace(marker, lit)
            yield f"manifest {key}={lit[:16]}", lambda doc=doc: manifest_case(doc)
    for k, (label, doc) in enumerate(hostile_documents()):
        if quick and k % 5:
            continue
        if len(doc) > 1 << 22:
            continue  # the 64 MB one: a frame past MAX_HEADER, see frame cases
        yield f"document {label}", lambda doc=doc: manifest_case(doc)


def frame_case(frame: bytes, payload: bytes = b"") -> Outcome:
    t = _bare_dist_transport()
    t._arrive(1, frame, payload)
    bad = t.stats["malformed"]
    t._arrive(1, b'{"ch":"c","h":{"epoch":1}}', b"xy")
    got = t.poll("c")
    if got[-1:] != [({"epoch": 1}, b"xy")]:
        return f"the next frame was not filed ({got!r:.80})"
    return "ok" if bad == 1 else f"not counted as malformed ({bad})"


def frame_cases() -> Iterator[tuple[str, Callable[[], Outcome]]]:
    for name, text, _ in HOSTILE:
        frame = ('{"ch":"c","h":' + text + "}").encode()
        yield f"frame {name}", lambda f=frame: frame_case(f)
    batch = json.dumps({"batch": [{"ch": "c", "h": {"epoch": 1}, "n": 2}] * 3}).encode()
    for cut in range(1, len(batch)):
        yield f"batch cut@{cut}", lambda f=batch[:cut]: frame_case(f, b"xxxxxx")
    wrong = {
        "sizes do not add up": (batch, b"xxxxx"),
        "size a string": (batch.replace(b'"n": 2', b'"n": "2"'), b"xxxxxx"),
        "size negative": (batch.replace(b'"n": 2', b'"n": -2'), b"xxxxxx"),
        "batch empty": (b'{"batch":[]}', b""),
        "batch an object": (b'{"batch":{}}', b""),
        "channel an int": (b'{"ch":5,"h":{}}', b""),
        "no header": (b'{"ch":"c"}', b""),
        "not UTF-8": (b'{"ch":"\xff","h":{}}', b""),
        "past the size bound": (b'{"ch":"c","h":{"a":"' + b"x" * (1 << 24) + b'"}}', b""),
    }
    for name, (f, pl) in wrong.items():
        yield f"frame {name}", lambda f=f, pl=pl: frame_case(f, pl)


# ------------------------------------------------------------------ the disk tier
def fingerprint(p: Path) -> tuple[int, int, str]:
    st = os.stat(p, follow_symlinks=False)
    return st.st_mtime_ns, st.st_size, hashlib.sha256(p.read_bytes()).hexdigest()


def disk_case(d: Path, damage: Callable[[Path, Path], None]) -> Outcome:
    """A stored file, then ``damage(tier folder, its file)``; the tier must open, the load
    be a miss, a reload hold no block, and a file outside the tier stay as it was."""
    tier_dir, outside = d / "tier", d / "outside.safetensors"
    dev, _ = _device()
    st = offload(dev, DEV, DiskTier(tier_dir, MODEL), None, "r1", TOKENS)
    outside.write_bytes(st.path.read_bytes())
    before = fingerprint(outside)
    damage(tier_dir, st.path)
    tier = DiskTier(tier_dir, MODEL)
    got = tier.load(DEV, TOKENS, "r2")
    if type(got).__name__ != "Miss":
        return f"not a miss: {type(got).__name__}"
    dst = DEV.make_pools(16)
    try:
        reload(tier, None, dst, DEV, "r2", TOKENS)
        return "reloaded a damaged file"
    except MissError:
        pass
    if dst.alloc.num_free != 16:
        return f"held {16 - dst.alloc.num_free}"
    return "ok" if fingerprint(outside) == before else "touched outside.safetensors"


def _cut(n: int) -> Callable[[Path, Path], None]:
    return lambda _d, p: p.write_bytes(p.read_bytes()[:n])


def _header(text: bytes, claim: int | None = None) -> Callable[[Path, Path], None]:
    n = len(text) if claim is None else claim
    return lambda _d, p: p.write_bytes(n.to_bytes(8, "little") + text + b"\0" * 64)


def _replace_with(kind: str) -> Callable[[Path, Path], None]:
    def go(d: Path, p: Path) -> None:
        p.unlink()
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "dir":
            p.mkdir()
        elif kind == "symlink out":
            p.symlink_to(d.parent / "outside.safetensors")
        elif kind == "dangling symlink":
            p.symlink_to(d / "nowhere")
        elif kind == "empty":
            p.write_bytes(b"")

    return go


def _odd_temp(kind: str, pid: str) -> Callable[[Path, Path], None]:
    def go(d: Path, p: Path) -> None:
        t = d / f".{p.name.split('.')[0]}.{pid}.ab.tmp"
        if kind == "dir":
            t.mkdir()
        elif kind == "fifo":
            os.mkfifo(t)
        else:
            t.write_bytes(b"junk")
        p.write_bytes(p.read_bytes()[:20])  # and the key itself damaged

    return go


def disk_cases(d: Path, quick: bool) -> Iterator[tuple[str, Callable[[], Outcome]]]:
    dev, _ = _device()
    probe = d / "probe"
    size = offload(dev, DEV, DiskTier(probe, MODEL), None, "r1", TOKENS).path.stat().st_size
    cuts = range(0, size - 1, 97 if quick else 31)
    damages: dict[str, Callable[[Path, Path], None]] = {f"cut@{n}": _cut(n) for n in cuts}
    for kind in ("fifo", "dir", "symlink out", "dangling symlink", "empty"):
        damages[kind] = _replace_with(kind)
    for kind in ("file", "dir", "fifo"):
        for pid in ("0", str(1 << 31), "9" * 40, "-1", "x"):
            damages[f"temp {kind} pid {pid[:12]}"] = _odd_temp(kind, pid)
    damages |= {
        "header length 2^60": _header(b"{}", 1 << 60),
        "header length past the file": _header(b"{}", 1 << 20),
        "header escaped quotes 128 KB": _header(b'{"a":"' + b'\\"' * 65_536 + b'"}'),
        "header deep": _header(b'{"a":' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
        "header 200k junk keys": _header(
            json.dumps({"__metadata__": {f"k{i}": "" for i in range(200_000)}}).encode()
        ),
        "header NaN": _header(b'{"kv":{"dtype":"U8","shape":[NaN],"data_offsets":[0,4]}}'),
        "header not UTF-8": _header(b'{"\xff":1}'),
        "header a list": _header(b"[1,2]"),
    }
    for k, (name, dmg) in enumerate(damages.items()):
        yield f"disk {name}", lambda k=k, dmg=dmg: disk_case(d / f"t{k}", dmg)
