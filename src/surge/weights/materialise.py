"""Fingerprints, content hashes, and the one copy of a source into an entry.

`fingerprint(source)` is what the store checks on every request: each file's path,
size, inode, device and modification and change times (stat only; a change time cannot
be set back by hand, so a file rewritten in place gets a new fingerprint). Only a new
fingerprint makes the store read the source; it then copies it into the entry and
hashes it in the same pass (`copy_and_hash`): each file is read once in CHUNK_BYTES
chunks by a few threads into a buffer each (hashlib, preadv and pwrite release the
GIL; pread rather than a mapping of the source, which a truncation would turn into a
SIGBUS); each chunk is hashed and the parts of it that tensors occupy are written where
the plan says. The entry's key is the SHA-256 of the files' names, sizes and chunk
digests: the same bytes give the same key wherever they come from, a changed byte gives
another.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import hashlib
import mmap
import os
import struct
import threading
import zipfile
from collections.abc import Sequence

import msgspec

from surge.weights.formats import Piece, Plan, SourceFile

__all__ = ["CHUNK_BYTES", "COPY_WORKERS", "KEY_VERSION", "Sink", "copy_and_hash", "entry_key",
           "fingerprint"]

CHUNK_BYTES = 16 << 20  # per read; threads x this is the copy's transient memory
COPY_WORKERS = max(1, min(4, os.cpu_count() or 1))  # chunk readers of one copy
KEY_VERSION = b"surge-weights/1\0"  # a new entry layout gets a new version: new keys


def fingerprint(source: str) -> bytes:
    """Stat-only identity of `source`'s bytes; raises OSError if it is gone."""
    info = os.stat(source)
    stats: list[object] = [source]
    if os.path.isdir(source):
        for name in sorted(n for n in os.listdir(source) if n.endswith(".safetensors")):
            stats.append(name)
            stats.append(_stat(os.stat(os.path.join(source, name))))
    else:
        stats.append(_stat(info))
    return hashlib.sha256(msgspec.msgpack.encode(stats)).digest()


def _stat(info: os.stat_result) -> list[int]:
    return [info.st_size, info.st_ino, info.st_dev, info.st_mtime_ns, info.st_ctime_ns]


def entry_key(files: Sequence[SourceFile], digests: Sequence[Sequence[bytes]]) -> str:
    """The content hash of an entry: its files' names and sizes, and their chunk digests."""
    total = hashlib.sha256(KEY_VERSION)
    for file, chunks in zip(files, digests, strict=True):
        total.update(file.name.encode() + b"\0" + struct.pack("<Q", file.size))
        for digest in chunks:
            total.update(digest)
    return total.hexdigest()


class Sink:
    """Writes into the entry's file: pwrite, or a shared mapping where the filesystem
    takes no write() (hugetlbfs)."""

    def __init__(self, fd: int, size: int, mapped: bool = False) -> None:
        self.fd = fd
        self.map = mmap.mmap(fd, size) if mapped and size else None

    def write(self, offset: int, data: bytes | memoryview) -> None:
        if self.map is not None:
            self.map[offset:offset + len(data)] = data
            return
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, offset)
            offset += written
            view = view[written:]

    def close(self) -> None:
        if self.map is not None:
            self.map.close()


def _chunk(path: str, fd: int, offset: int, length: int, pieces: Sequence[Piece],
           starts: Sequence[int], sink: Sink, buffers: threading.local) -> bytes:
    # one buffer per thread, reused: a fresh 16 MiB allocation per chunk costs its faults
    buffer: bytearray | None = getattr(buffers, "buffer", None)
    if buffer is None or len(buffer) < length:
        buffer = buffers.buffer = bytearray(length)
    view = memoryview(buffer)[:length]
    read = os.preadv(fd, [view], offset)
    if read != length:
        raise OSError(f"{path} is shorter than it was ({offset + read:,} bytes read of "
                      f"{offset + length:,}): it changed while it was read")
    end = offset + length
    # pieces are sorted by offset and do not overlap: start from the last one before us
    index = max(0, bisect.bisect_right(starts, offset) - 1)
    while index < len(pieces) and pieces[index].offset < end:
        piece = pieces[index]
        low, high = max(offset, piece.offset), min(end, piece.offset + piece.length)
        if low < high:
            sink.write(piece.target + low - piece.offset, view[low - offset:high - offset])
        index += 1
    return hashlib.sha256(view).digest()


def copy_and_hash(plan: Plan, sink: Sink, workers: int, chunk_bytes: int = CHUNK_BYTES) -> str:
    """Write the entry that `plan` describes into `sink`; returns its key (which depends
    on `chunk_bytes`: the store always uses CHUNK_BYTES)."""
    sink.write(0, plan.header)
    buffers = threading.local()
    with concurrent.futures.ThreadPoolExecutor(max(1, workers), "surge-weights-copy") as pool:
        digests = [_file(file, plan, sink, pool, chunk_bytes, buffers) for file in plan.files]
    for inflate in plan.inflates:
        with zipfile.ZipFile(inflate.path) as archive, archive.open(inflate.member) as member:
            member.read(inflate.skip)
            done = 0
            while done < inflate.length:
                data = member.read(min(CHUNK_BYTES, inflate.length - done))
                if not data:
                    raise OSError(f"{inflate.path}: member {inflate.member} ended early")
                sink.write(inflate.target + done, data)
                done += len(data)
    return entry_key(plan.files, digests)


def _file(file: SourceFile, plan: Plan, sink: Sink, pool: concurrent.futures.Executor,
          chunk_bytes: int, buffers: threading.local) -> list[bytes]:
    """One file's chunk digests, its chunks read (and copied) by the pool's threads."""
    pieces = [p for p in plan.pieces if p.path == file.path]
    starts = [p.offset for p in pieces]
    fd = os.open(file.path, os.O_RDONLY)
    try:
        futures = [pool.submit(_chunk, file.path, fd, offset,
                               min(chunk_bytes, file.size - offset), pieces, starts, sink,
                               buffers)
                   for offset in range(0, file.size, chunk_bytes)]
        concurrent.futures.wait(futures)  # all done before the descriptor closes
        return [future.result() for future in futures]
    finally:
        os.close(fd)
