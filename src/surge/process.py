"""Process-level helpers for surge's own processes: titles, lifetimes, descriptors.

Lifetimes (surge.launch.Lifetime): the controller dies with the process that started
it (its supervisor) through a parent-death signal. Proxies, the fork server and
replicas must outlive a controller that crashes (the supervisor restarts it and they
re-attach), so they watch the supervisor itself through a pidfd and leave when it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import select
import signal
import sys
from collections.abc import Callable

__all__ = ["at_exit", "die_with_parent", "keep_freed_memory", "open_pidfd", "pid_gone",
           "raise_fd_limit", "run_exit_hooks", "set_title", "start_time", "watch_supervisor"]

_exit_hooks: list[Callable[[], object]] = []


def at_exit(hook: Callable[[], object]) -> None:
    """Run `hook` when this surge process leaves through `os._exit` (replicas do, so that
    no finalizer runs twice, which also skips `atexit`): e.g. stop an engine's own child
    processes, which live in sessions of their own and would outlive the replica."""
    _exit_hooks.append(hook)


def run_exit_hooks() -> None:
    while _exit_hooks:
        hook = _exit_hooks.pop()
        try:
            hook()
        except Exception as exc:  # leaving anyway: say so, run the others
            print(f"surge: an exit hook failed: {exc!r}", file=sys.stderr)

SUPERVISOR_POLL_S = 0.5  # only where pidfds are missing (old kernels)

_PR_SET_PDEATHSIG = 1


def set_title(title: str) -> None:
    """Make `ps -o args` and /proc/PID/cmdline show `title` (e.g. surge:proxy)."""
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:  # pragma: no cover - setproctitle is a dependency
        pass


def die_with_parent(expected_parent: int) -> None:
    """Get SIGTERM when the parent dies (Linux); exit now if it is already gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except OSError:  # pragma: no cover
            pass
    if expected_parent and os.getppid() != expected_parent:
        os._exit(0)


def raise_fd_limit() -> int:
    """Lift the soft open-file limit to the hard one: every connection is a descriptor."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return int(target)
        return int(soft)
    except (ImportError, ValueError, OSError):  # pragma: no cover - not on every platform
        return -1


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# A buffer up to this size comes from the heap (glibc's most), and freed heap memory up
# to this much stays with the process.
HEAP_BUFFER_BYTES = 32 * 1024 * 1024
RETAINED_BYTES = 128 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Let glibc's malloc reuse freed memory for large buffers instead of returning it.

    By default a buffer past 128 KiB is its own mapping and, at most a few of them
    later, the heap's free top goes back to the kernel: every large message (a 10 MB
    gRPC request and the five buffers it passes through) then costs a page fault per
    4 KiB, measured at 13,000 faults and most of a replica's 42 ms of CPU per 10 MB
    call. With buffers up to HEAP_BUFFER_BYTES on the heap and RETAINED_BYTES of free
    heap kept, the same pages serve the next message; a process keeps that much of
    its peak. False where this is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, HEAP_BUFFER_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, RETAINED_BYTES))


def open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits; None without pidfd support."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def pid_gone(pid: int, pidfd: int | None) -> bool:
    if pidfd is not None:
        return bool(select.select([pidfd], [], [], 0)[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def watch_supervisor(loop: asyncio.AbstractEventLoop, pid: int,
                     on_gone: Callable[[], None]) -> bool:
    """Call `on_gone` once when the supervisor `pid` exits. False: there is none (0)."""
    if not pid:
        return False
    fd = open_pidfd(pid)
    if fd is None and pid_gone(pid, None):
        loop.call_soon(on_gone)
        return True

    def gone() -> None:
        if fd is not None:
            loop.remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        on_gone()

    def poll() -> None:
        if pid_gone(pid, None):
            on_gone()
        else:
            loop.call_later(SUPERVISOR_POLL_S, poll)

    if fd is not None:
        loop.add_reader(fd, gone)
    else:
        loop.call_later(SUPERVISOR_POLL_S, poll)
    return True


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat field 22); None if gone
    or a zombie (dead, not yet reaped: in a container whose init never reaps, forever).
    A pid and its start time name one process: a recycled pid has another start time."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
