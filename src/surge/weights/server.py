"""The node's weight store: entries, who holds them, and the one materialisation each.

A `Load` is answered from the fingerprint index when the source's stat identity is
known and its entry is there (a hit: a dict lookup and a reference, microseconds);
otherwise the store reads the source's headers (`formats.plan`), decides what to evict
(`policy.weight_budget.make_room`, with in-flight materialisations counted as held),
checks the directory's free space, and copies and hashes the source into a new file in
a worker thread (`materialise.copy_and_hash`). Concurrent requests for the same source
wait for that one copy. A source whose fingerprint changed while it was read is read
again. The finished file is made read-only (mode 0400) and renamed to its entry name;
if its content hash is already an entry (the same bytes from another path), the copy
is dropped and the entry shared. References are counted per connection, so a process
that dies, however it dies, gives its references back when the kernel closes its
socket. Unreferenced entries stay until room is needed (LRU).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import mmap
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from surge.clock import SYSTEM, Clock
from surge.errors import (
    WeightBudgetError,
    WeightSourceError,
    WeightStoreError,
    WeightStoreFullError,
)
from surge.policy.weight_budget import Admit, Resident, make_room
from surge.weights import protocol as p
from surge.weights.formats import Plan, plan
from surge.weights.materialise import COPY_WORKERS, Sink, copy_and_hash, fingerprint
from surge.weights.segments import Owner, create, entry_name, partial_name, unlink_quietly

__all__ = ["Entry", "WeightStore", "free_bytes"]

log = logging.getLogger("surge.weights")

MAX_ENTRIES = 1024
MAX_CONNECTIONS = 4096  # one per replica process on the node
READ_RETRIES = 2  # a source that keeps changing while it is read is an error after these
_PEERCRED = struct.Struct("3i")


def free_bytes(directory: str) -> tuple[int, int]:
    """(free bytes, page size) of the filesystem holding `directory`."""
    info = os.statvfs(directory)
    return info.f_bavail * info.f_frsize, info.f_bsize


@dataclass
class Entry:
    key: str
    name: str
    path: str
    layout: Plan  # its header, tensors and metadata
    source: str
    materialise_s: float
    last_used: float
    refs: int = 0
    pins: int = 0  # requests that waited for it and have not taken their reference yet
    fingerprints: set[bytes] = field(default_factory=set)

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    def info(self) -> p.EntryInfo:
        layout = self.layout
        return p.EntryInfo(self.key, self.name, self.path, layout.nbytes, self.source,
                           self.materialise_s, len(layout.header), list(layout.tensors),
                           layout.metadata)


@dataclass
class Pending:
    """A materialisation in progress, and how many requests wait for it."""

    future: asyncio.Future[Entry]
    waiters: int = 0


@dataclass
class Holder:
    """One connection: a process, and how many references it holds on each entry."""

    pid: int
    refs: collections.Counter[str] = field(default_factory=collections.Counter)


class WeightStore:
    def __init__(self, directory: str, budget_bytes: int, owner: Owner | None = None,
                 clock: Clock = SYSTEM,
                 free_space: Callable[[str], tuple[int, int]] = free_bytes) -> None:
        self.directory = directory
        self.budget = budget_bytes
        self.owner = owner or Owner.this_process()
        self.clock = clock
        self.free_space = free_space
        self.entries: dict[str, Entry] = {}
        self.by_fingerprint: dict[bytes, str] = {}
        self.pending: dict[bytes, Pending] = {}
        self.reserved: dict[int, int] = {}  # materialisation serial -> bytes
        self.holders: dict[asyncio.StreamWriter, Holder] = {}
        self.hits = self.materialised = self.evicted = 0
        self._serial = 0
        self.jobs = concurrent.futures.ThreadPoolExecutor(2, "surge-weights-job")
        # called when the last connection closes and when a first one opens (an orphan
        # timer on a cluster node: surge.weights.main)
        self.on_idle: Callable[[], None] | None = None
        self.on_busy: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return (f"<WeightStore {self.directory} entries={len(self.entries)} "
                f"used={self.used_bytes:,}/{self.budget:,} holders={len(self.holders)}>")

    @property
    def used_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    # -- connections -----------------------------------------------------------------

    async def serve_connection(self, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        if len(self.holders) >= MAX_CONNECTIONS:
            writer.close()
            return
        holder = self.holders[writer] = Holder(_peer_pid(writer))
        if len(self.holders) == 1 and self.on_busy is not None:
            self.on_busy()
        try:
            while True:
                head = await reader.readexactly(4)
                (length,) = struct.unpack(">I", head)
                if length > p.MAX_FRAME_BYTES:
                    break
                message = p.decode_client(await reader.readexactly(length))
                answer = await self.handle(holder, message)
                if answer is not None:
                    writer.write(p.encode(answer))
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass  # gone (or speaking nonsense): its references go with it
        finally:
            self.drop(holder)
            del self.holders[writer]
            writer.close()
            if not self.holders and self.on_idle is not None:
                self.on_idle()

    def drop(self, holder: Holder) -> None:
        for key, count in holder.refs.items():
            entry = self.entries.get(key)
            if entry is not None:
                entry.refs -= count
        holder.refs.clear()

    async def handle(self, holder: Holder, message: p.ClientMessage) -> p.ServerMessage | None:
        if isinstance(message, p.Release):
            entry = self.entries.get(message.key)
            if holder.refs[message.key] > 0 and entry is not None:
                holder.refs[message.key] -= 1
                entry.refs -= 1
            return None
        if isinstance(message, p.Stats):
            return p.StatsReply(message.request, self.stats())
        try:
            entry, hit = await self.load(message.name, message.source)
        except WeightStoreError as exc:
            return p.Failed(message.request, _kind(exc), str(exc))
        except Exception as exc:  # a bug here must not look like the user's file
            log.exception("weight store: loading %s failed", message.source)
            return p.Failed(message.request, "internal", f"{type(exc).__name__}: {exc}")
        entry.refs += 1
        holder.refs[entry.key] += 1
        return p.Loaded(message.request, entry.info(), hit)

    # -- entries ---------------------------------------------------------------------

    async def load(self, name: str, source: str) -> tuple[Entry, bool]:
        """The entry for `source`, and whether it was there already. The caller takes
        the reference at once (no await in between, so it cannot be evicted meanwhile)."""
        for _ in range(READ_RETRIES + 1):
            try:
                print_ = fingerprint(source)
            except OSError as exc:
                raise WeightSourceError(f"{source}: {exc.strerror or exc}") from None
            key = self.by_fingerprint.get(print_)
            if key is not None and key in self.entries:
                entry = self.entries[key]
                entry.last_used = self.clock.monotonic()
                self.hits += 1
                return entry, True
            pending = self.pending.get(print_)
            if pending is None:
                pending = self.pending[print_] = Pending(
                    asyncio.get_running_loop().create_future())
                asyncio.get_running_loop().create_task(
                    self._materialise(name, source, print_, pending))
            try:
                entry = await self._wait(pending)
            except _Changed:
                continue
            entry.last_used = self.clock.monotonic()
            return entry, False
        raise WeightSourceError(f"{source} kept changing while it was read "
                                f"({READ_RETRIES + 1} tries); load it once it is written")

    async def _wait(self, pending: Pending) -> Entry:
        """The entry once made; it stays pinned (not evictable) until this waiter's
        caller has taken its reference, or gave up."""
        pending.waiters += 1
        try:
            entry = await asyncio.shield(pending.future)
        except asyncio.CancelledError:
            if not pending.future.done():
                pending.waiters -= 1
            elif not pending.future.cancelled() and pending.future.exception() is None:
                pending.future.result().pins -= 1
            raise
        entry.pins -= 1
        return entry

    async def _materialise(self, name: str, source: str, print_: bytes,
                           pending: Pending) -> None:
        loop = asyncio.get_running_loop()
        serial = 0
        try:
            try:
                layout = await loop.run_in_executor(self.jobs, plan, source)
            except OSError as exc:
                raise WeightSourceError(f"{source}: {exc.strerror or exc}") from None
            serial = self._reserve(layout.nbytes)
            started = self.clock.monotonic()
            key, path = await loop.run_in_executor(self.jobs, self._copy, layout, serial,
                                                   source, print_)
            entry = self._register(key, path, name, source, layout,
                                   self.clock.monotonic() - started)
            entry.fingerprints.add(print_)
            self.by_fingerprint[print_] = entry.key
            entry.pins += pending.waiters
            pending.future.set_result(entry)
        except BaseException as exc:
            pending.future.set_exception(exc)
            pending.future.exception()  # retrieved: a request that went away must not log it
        finally:
            self.reserved.pop(serial, None)
            self.pending.pop(print_, None)

    def _reserve(self, nbytes: int) -> int:
        """Make room for `nbytes` (evicting), and hold it until the entry is in."""
        residents = [Resident(e.key, e.nbytes, e.refs + e.pins, e.last_used)
                     for e in self.entries.values()]
        residents += [Resident(f"(being made #{s})", n, 1, 0.0) for s, n in self.reserved.items()]
        decision = make_room(residents, nbytes, self.budget, MAX_ENTRIES)
        if not isinstance(decision, Admit):
            raise WeightBudgetError(
                f"{decision.reason}; raise the weight store's budget_bytes or let replicas "
                "drop entries they no longer use")
        for key in decision.evict:
            self.evict(key)
        free, _ = self.free_space(self.directory)
        if free < nbytes:
            raise WeightStoreFullError(
                f"{self.directory} has {free:,} bytes free and the entry needs {nbytes:,}; "
                "enlarge it (a tmpfs: mount -o remount,size=...) or lower budget_bytes")
        self._serial += 1
        self.reserved[self._serial] = nbytes
        return self._serial

    def _copy(self, layout: Plan, serial: int, source: str, print_: bytes) -> tuple[str, str]:
        """In a worker thread: the entry's file, written, read-only, renamed."""
        partial = os.path.join(self.directory, partial_name(self.owner, serial))
        _, page = self.free_space(self.directory)
        fd = create(partial, layout.nbytes, page if page > mmap.PAGESIZE else 1)
        sink = Sink(fd, os.fstat(fd).st_size, mapped=page > mmap.PAGESIZE)
        try:
            try:
                key = copy_and_hash(layout, sink, COPY_WORKERS)
            except OSError as exc:
                if _changed(source, print_):
                    raise _Changed() from None
                raise WeightSourceError(f"{source}: {exc.strerror or exc}") from None
            if _changed(source, print_):
                raise _Changed()
            os.fchmod(fd, 0o400)  # read-only, and only for this user (as its replicas are)
        except BaseException:
            unlink_quietly(partial)
            raise
        finally:
            sink.close()
            os.close(fd)
        final = os.path.join(self.directory, entry_name(self.owner, key, os.path.basename(
            source.rstrip("/"))))
        os.rename(partial, final)
        return key, final

    def _register(self, key: str, path: str, name: str, source: str, layout: Plan,
                  seconds: float) -> Entry:
        existing = self.entries.get(key)
        if existing is not None:  # the same bytes from another path: share the entry
            if existing.path != path:
                unlink_quietly(path)
            return existing
        entry = Entry(key, name, path, layout, source, seconds, self.clock.monotonic())
        self.entries[key] = entry
        self.materialised += 1
        log.info("weights %r materialised from %s: %s MiB in %.2f s (entry %s)", name,
                 source, f"{layout.nbytes / 2**20:,.1f}", seconds, key[:16])
        return entry

    def evict(self, key: str) -> None:
        entry = self.entries.pop(key)
        for print_ in entry.fingerprints:
            self.by_fingerprint.pop(print_, None)
        unlink_quietly(entry.path)
        self.evicted += 1
        log.info("weights %r (entry %s, %s MiB) evicted: least recently used, unreferenced",
                 entry.name, key[:16], f"{entry.nbytes / 2**20:,.1f}")

    def stats(self) -> p.StoreStats:
        now = self.clock.monotonic()
        holders: dict[str, list[int]] = collections.defaultdict(list)
        for holder in self.holders.values():
            for key, count in holder.refs.items():
                if count > 0:
                    holders[key].append(holder.pid)
        entries = [p.EntryStats(e.key, e.name, e.path, e.nbytes, e.refs,
                                sorted(holders.get(e.key, [])), now - e.last_used)
                   for e in self.entries.values()]
        return p.StoreStats(os.getpid(), self.directory, self.budget, self.used_bytes,
                            entries, self.hits, self.materialised, self.evicted)

    def close(self) -> None:
        """Unlink every entry (mappings that replicas hold stay valid until unmapped)."""
        for key in list(self.entries):
            unlink_quietly(self.entries.pop(key).path)
        self.jobs.shutdown(wait=False, cancel_futures=True)


class _Changed(Exception):
    """The source changed while it was copied: read it again."""


def _changed(source: str, print_: bytes) -> bool:
    try:
        return fingerprint(source) != print_
    except OSError:
        return True


def _kind(exc: WeightStoreError) -> str:
    if isinstance(exc, WeightSourceError):
        return "source"
    if isinstance(exc, WeightBudgetError):
        return "budget"
    if isinstance(exc, WeightStoreFullError):
        return "full"
    return "internal"


def _peer_pid(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        return int(_PEERCRED.unpack(raw)[0])
    except (OSError, AttributeError):
        return 0
