"""Process-level helpers for surge's own processes: titles and dying with the parent."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["die_with_parent", "raise_fd_limit", "set_title"]

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
