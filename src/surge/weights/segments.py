"""Entry files in the store's directory: their names, their creation, and the sweep.

Every file the store makes is named `surge-weights.PID.START.KEY.LABEL` (a finished
entry: KEY is 32 hex digits of its content hash, LABEL the sanitised name asked for) or
`surge-weights.PID.START.partial-N` (one being written), PID and START (its start time
in clock ticks since boot) naming the store process that owns it. Nothing else in the
directory is ever touched. An owner unlinks its files when it leaves; its guardian
(surge.weights.main) unlinks them if it is killed; and every store sweeps, when it
starts, the files of owners that no longer run (the pid is gone, or is another process
now: its start time differs), which catches an instance killed whole.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from surge.errors import WeightStoreFullError
from surge.process import start_time

__all__ = ["PREFIX", "Owner", "create", "entry_name", "orphans", "owner_of", "partial_name",
           "sweep", "unlink_quietly"]

PREFIX = "surge-weights"
_LABEL = re.compile(r"[^A-Za-z0-9_-]+")
MAX_LABEL = 40


@dataclass(frozen=True)
class Owner:
    pid: int
    start: int  # clock ticks since boot: with the pid, one process

    @classmethod
    def this_process(cls) -> Owner:
        pid = os.getpid()
        return cls(pid, start_time(pid) or 0)

    @property
    def stem(self) -> str:
        return f"{PREFIX}.{self.pid}.{self.start}."

    def alive(self) -> bool:
        return start_time(self.pid) == self.start


def entry_name(owner: Owner, key: str, label: str) -> str:
    clean = _LABEL.sub("_", label)[:MAX_LABEL].strip("_") or "weights"
    return f"{owner.stem}{key[:32]}.{clean}"


def partial_name(owner: Owner, serial: int) -> str:
    return f"{owner.stem}partial-{serial}"


def owner_of(filename: str) -> Owner | None:
    """The store process that made `filename`, or None if surge did not name it."""
    parts = filename.split(".")
    if len(parts) < 4 or parts[0] != PREFIX or not parts[1].isdigit() \
            or not parts[2].isdigit():
        return None
    return Owner(int(parts[1]), int(parts[2]))


def orphans(filenames: Iterable[str], alive: Callable[[Owner], bool]) -> list[str]:
    """The surge entry files among `filenames` whose owner no longer runs."""
    verdicts: dict[Owner, bool] = {}
    found = []
    for name in filenames:
        owner = owner_of(name)
        if owner is None:
            continue
        if owner not in verdicts:
            verdicts[owner] = alive(owner)
        if not verdicts[owner]:
            found.append(name)
    return sorted(found)


def unlink_quietly(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def sweep(directory: str, owner: Owner | None = None) -> list[str]:
    """Unlink the files of `owner` (None: of every owner that no longer runs); returns
    the names removed."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    if owner is not None:
        doomed = sorted(n for n in names if n.startswith(owner.stem))
    else:
        doomed = orphans(names, Owner.alive)
    return [name for name in doomed if unlink_quietly(os.path.join(directory, name))]


def create(path: str, size: int, page: int) -> int:
    """A new file of `size` bytes (rounded up to the filesystem's page where it needs
    whole pages, as hugetlbfs does), its memory reserved now: a full directory is an
    error here, not a SIGBUS later. Returns a read-write descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        length = -(-size // page) * page if page > 1 else size
        os.ftruncate(fd, length)
        if length:
            os.posix_fallocate(fd, 0, length)
    except OSError as exc:
        os.close(fd)
        unlink_quietly(path)
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT):
            raise WeightStoreFullError(
                f"{os.path.dirname(path)} has no room for {size:,} more bytes "
                f"({exc.strerror}); enlarge it (a tmpfs: mount -o remount,size=...) or lower "
                "the weight store's budget_bytes") from None
        raise
    return fd
