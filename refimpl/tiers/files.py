"""Crash-safe published files in the safetensors format (no pickle), for a disk tier.

Write (``write_published``): the bytes go to a temp name unique to this writer
(``.<name>.<pid>.<random>.tmp``, opened with ``O_EXCL``), are flushed (``fsync``), then
published by ``os.replace`` onto ``<name>.safetensors`` and the directory is fsynced, so
the name appears only with every byte behind it, and survives a power loss once
``write_published`` returned. Two writers of one name never share a temp file (LMCache
#2517: a shared temp name let one writer's rename take the other's file away); the last
rename wins, and both files are whole. A writer killed at any point leaves at most its
own temp files, never a published name with partial bytes (``write_batch``: several).

Read (``read_header`` then ``read_into``): the 8-byte header length, the header (strict
JSON, capped), every tensor entry (known dtype, shape, offsets) and the sum of the
entries against the file's size are checked before the caller allocates anything; a
file that is torn, truncated, extended or malformed raises ``TornFileError`` and a tier
reads it as a miss. ``read_into`` fills a preallocated tensor with ``readinto`` (no copy
through Python bytes).

Restart (``sweep_orphans``): temp files of writers that are gone are removed; anything
else is left as it is and never stops the sweep (a folder or a symlink with a temp name, a
"pid" no process can have, another user's file). Published names are adopted as they are
(``published_names``: regular files only); their content is checked on read, and a read
opens only a regular file in the folder (``open_published``: no symlink, FIFO, device or
folder at the name). "Gone" is read from the pid in the temp name, so the directory's
writers must share one pid namespace (one host); writers on several hosts need a lease.

Format: 8 bytes little-endian header length ``N``, ``N`` bytes of UTF-8 JSON (padded with
spaces to 8 bytes), then the tensors' bytes back to back, as in the safetensors spec;
``safetensors.torch.load_file`` reads these files, and this reader reads its files.
"""

from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import re
import secrets
import stat
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from refimpl.checksum import byte_view
from spec.strict_json import StrictJSONError, loads_strict

PUBLISHED_SUFFIX = ".safetensors"
TEMP_SUFFIX = ".tmp"
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's cap
# members and elements of a header, outside its strings: a tier file has 2 metadata keys and
# one tensor (7 each, its shape's dimensions among them); a foreign file gets room for 256
# tensors of 6 dimensions. 5 M junk keys are refused by a count, before any parse.
MAX_HEADER_ITEMS = 4096
MAX_PID = (1 << 31) - 1  # pid_t; a temp name with a larger "pid" is no writer's


def _sync_file_range() -> Any:
    """libc's ``sync_file_range`` (Linux; Python's ``os`` lacks it), else None."""
    try:
        f = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return f


_WRITEBACK = _sync_file_range()  # a file's writeback starts once it is written (RESULTS.md)
_NAME = re.compile(r"^[0-9a-z][0-9a-z_-]{0,127}$")
_TEMP = re.compile(r"^\.(?P<name>[0-9a-z][0-9a-z_-]*)\.(?P<pid>[0-9]+)\.[0-9a-f]+\.tmp$")

ST_DTYPES: dict[torch.dtype, str] = {
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.int32: "I32",
    torch.int64: "I64",
}
_TORCH_OF = {v: k for k, v in ST_DTYPES.items()}


class TornFileError(ValueError):
    """A file that is not one whole, well-formed published file; a tier reads it as a miss."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor of a file: dtype, shape and its byte range after the header."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class Header:
    """A file's validated header: metadata, tensor entries, where the data starts."""

    metadata: dict[str, str]
    entries: dict[str, Entry]
    data_start: int
    file_size: int


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"name {name!r}: lowercase letters, digits, '_' or '-' (<= 128)")


def published_path(directory: Path, name: str) -> Path:
    _check_name(name)
    return directory / f"{name}{PUBLISHED_SUFFIX}"


def header_bytes(
    metadata: Mapping[str, str], entries: Sequence[tuple[str, torch.dtype, Sequence[int]]]
) -> bytes:
    """The 8-byte length and the JSON header of tensors ``(name, dtype, shape)``, stored
    back to back in that order (the data starts 8-byte aligned)."""
    head: dict[str, object] = {"__metadata__": dict(metadata)}
    off = 0
    for name, dtype, shape in entries:
        if dtype not in ST_DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {dtype} has no safetensors name")
        n = math.prod(shape) * dtype.itemsize
        head[name] = {
            "dtype": ST_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [off, off + n],
        }
        off += n
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text


def _write_views(fd: int, views: list[memoryview]) -> None:
    """Write ``views`` in order, up to 1024 per ``writev`` (Linux's IOV_MAX)."""
    while views:
        n = os.writev(fd, views[:1024])
        while views and n >= views[0].nbytes:  # what is written, then the rest of one
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Pending:
    """One file to publish: its name, metadata, tensors ``(name, dtype, shape)`` and the
    data as byte views in file order (views of the caller's memory: no copy is made)."""

    name: str
    metadata: Mapping[str, str]
    entries: Sequence[tuple[str, torch.dtype, Sequence[int]]]
    data: Sequence[memoryview]
    note: object = None  # the caller's, handed back to ``seen``


class Stopped(Exception):
    """A batch write stopped by its caller (``stop()`` turned true): nothing published."""


def write_batch(
    directory: Path,
    files: Iterable[Pending],
    stop: Callable[[], bool] | None = None,
    seen: Callable[[Pending, os.stat_result], None] | None = None,
    last_stop: bool = True,
) -> list[Path]:
    """Publish ``files`` (consumed one at a time: a caller may reuse one buffer once a
    file was yielded): each written to a temp name unique to this writer, every temp file
    fsynced, then the names published by ``os.replace`` in order, the directory fsynced
    once. Until the renames begin, a failure or ``stop()`` (asked before each file and the
    renames; ``last_stop=False``, a bug switch: the last answer ignored) removes every temp
    file, publishing nothing; a crash among the renames leaves a run published.
    ``seen(file, stat)``: each published file's inode."""
    temps: list[tuple[int, Path, Path, Pending]] = []
    out: list[Path] = []
    try:
        for p in files:
            if stop is not None and stop():
                raise Stopped(f"stopped before {p.name!r}")
            temps.append((*_write_temp(directory, p), p))
        if temps and stop is not None and stop() and last_stop:  # the last chance
            raise Stopped("stopped before the renames")
        for fd, *_ in temps:
            os.fsync(fd)  # every byte on the device before any name can appear
        for _, tmp, final, _ in temps:
            os.replace(tmp, final)  # the publish: atomic within one directory
            out.append(final)
        for fd, _, _, p in temps if seen is not None else ():
            seen(p, os.fstat(fd))  # type: ignore[misc]  # not None: the loop is empty then
    except BaseException:
        for _, tmp, _, _ in temps[len(out) :]:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        for fd, *_ in temps:
            os.close(fd)
    if out:
        fsync_dir(directory)  # the renames themselves survive a power loss
    return out


def _write_temp(directory: Path, p: Pending) -> tuple[int, Path, Path]:
    final = published_path(directory, p.name)
    names = [e[0] for e in p.entries]
    if len(set(names)) != len(names) or "__metadata__" in names:
        raise ValueError(f"tensor names {names} must be distinct and not '__metadata__'")
    header = header_bytes(p.metadata, p.entries)
    want, got = (
        sum(math.prod(e[2]) * e[1].itemsize for e in p.entries),
        sum(v.nbytes for v in p.data),
    )
    if got != want:
        raise ValueError(f"{p.name!r}: {got} data bytes for tensors of {want}")
    tmp = directory / f".{p.name}.{os.getpid()}.{secrets.token_hex(8)}{TEMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_views(fd, [memoryview(header), *(memoryview(v).cast("B") for v in p.data)])
        if _WRITEBACK is not None:  # start writing back now: the fsync later waits less
            _WRITEBACK(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE: advisory, the fsync still runs
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd, tmp, final


def write_published(
    directory: Path,
    name: str,
    metadata: Mapping[str, str],
    tensors: Sequence[tuple[str, torch.Tensor]],
) -> Path:
    """Write ``tensors`` (contiguous, CPU) and ``metadata`` as ``<name>.safetensors``:
    temp file unique to this writer, fsync, atomic rename, fsync of the directory.
    On any failure the temp file is removed and nothing is published."""
    views = [byte_view(t) for _, t in tensors]  # raises on a CUDA or strided tensor
    entries = [(n, t.dtype, tuple(t.shape)) for n, t in tensors]
    return write_batch(directory, [Pending(name, metadata, entries, views)])[0]


def _entry(name: str, v: object, data_bytes: int) -> Entry:
    if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
        raise TornFileError(f"tensor {name!r}: entry must hold dtype, shape, data_offsets")
    dtype, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
    if dtype not in _TORCH_OF:
        raise TornFileError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise TornFileError(f"tensor {name!r}: shape {shape!r} is not a list of ints >= 0")
    ok = isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)
    if not ok or not 0 <= offs[0] <= offs[1] <= data_bytes:
        raise TornFileError(f"tensor {name!r}: offsets {offs!r} outside {data_bytes} data bytes")
    t = _TORCH_OF[dtype]
    if offs[1] - offs[0] != math.prod(shape) * t.itemsize:
        raise TornFileError(f"tensor {name!r}: {offs[1] - offs[0]} bytes for shape {shape}")
    return Entry(name, t, tuple(shape), offs[0], offs[1])


def read_header(f: BinaryIO) -> Header:
    """Validate an open file's header against its size (nothing large is allocated)."""
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    raw = f.read(8)
    if len(raw) != 8:
        raise TornFileError(f"{size} bytes: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw)
    if not 2 <= n <= min(MAX_HEADER_BYTES, size - 8):
        raise TornFileError(f"header length {n} does not fit a {size}-byte file")
    raw = f.read(n)
    if len(raw) != n:
        raise TornFileError(f"header: {len(raw)} of {n} bytes")
    try:  # decoded here so that the bytes go before the parse: peak twice the header, not 5x
        text = raw.decode("utf-8")
        del raw
        head = loads_strict(  # the padding spaces are JSON whitespace
            text, max_bytes=MAX_HEADER_BYTES, max_depth=3, max_int_digits=19,
            max_items=MAX_HEADER_ITEMS, what="header",
        )  # fmt: skip
    except UnicodeDecodeError as e:
        raise TornFileError(f"header: not UTF-8 (byte {e.start})") from None
    except StrictJSONError as e:
        raise TornFileError(f"header: {e}") from None
    if not isinstance(head, dict):
        raise TornFileError("header: not a JSON object")
    meta = head.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(x, str) for x in meta.values()):
        raise TornFileError("header: __metadata__ must map strings to strings")
    data_bytes = size - 8 - n
    entries = {k: _entry(k, v, data_bytes) for k, v in head.items()}
    spans = sorted((e.begin, e.end) for e in entries.values())
    at = 0
    for lo, hi in spans:  # back to back, covering the data exactly: no gap, no overlap
        if lo != at:
            raise TornFileError(f"data: a gap or overlap at byte {at}")
        at = hi
    if at != data_bytes:
        raise TornFileError(f"data: entries cover {at} bytes, the file holds {data_bytes}")
    return Header(meta, entries, 8 + n, size)


def _regular(p: Path) -> bool:
    """``p`` is a regular file itself (not a symlink, FIFO, device or folder)."""
    try:
        return stat.S_ISREG(p.lstat().st_mode)
    except OSError:
        return False


def open_published(path: Path) -> BinaryIO:
    """Open a published file for reading, only when it is a regular file in its folder: a
    symlink (it may lead out of the tier), a FIFO (an open would wait for a writer), a
    device or a folder at the name is a TornFileError naming what it is.
    FileNotFoundError: nothing is published there."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise TornFileError("a symlink, not a file of the tier") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a folder", stat.S_IFSOCK: "a socket"}
            kind = what.get(stat.S_IFMT(mode), "a device")
            raise TornFileError(f"{kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def published_names(directory: Path) -> list[str]:
    """Names published in ``directory``: regular files with a published name (temp
    files, foreign files, symlinks, FIFOs and folders are not)."""
    out = []
    for p in directory.iterdir():
        stem = p.name[: -len(PUBLISHED_SUFFIX)]
        if p.name.endswith(PUBLISHED_SUFFIX) and _NAME.match(stem) and _regular(p):
            out.append(stem)
    return sorted(out)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def sweep_orphans(directory: Path, *, all_writers: bool = False) -> list[str]:
    """Remove temp files whose writer is gone (every temp file with ``all_writers``);
    returns their names. A writer whose temp file was removed fails its own rename and
    publishes nothing."""
    removed = []
    for p in directory.iterdir():
        m = _TEMP.match(p.name)
        if not m or not _regular(p):
            continue  # not a temp file of a writer: a folder, a symlink, a foreign name
        pid = int(m["pid"]) if len(m["pid"]) <= 10 else 0
        if not 0 < pid <= MAX_PID:
            continue  # no process has that id: not ours to judge
        if all_writers or not _alive(pid):
            try:
                p.unlink()
            except FileNotFoundError:
                pass  # another sweep was first
            except OSError:
                continue  # another user's file in a shared folder: left as it is
            removed.append(p.name)
    return sorted(removed)
