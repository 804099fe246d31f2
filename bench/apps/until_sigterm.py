"""The end of every bench app: wait until its replicas are up, serve until the bench
sends SIGTERM, then clean up and exit 0. Apps run as scripts under surge's or Ray's
Python and import this from their own folder (the script's directory is first on
sys.path)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from typing import Any


def serve_until_sigterm(cleanup: Callable[[], object] | None = None) -> None:
    """Block until SIGTERM; then `cleanup()` (e.g. serve.shutdown) and exit 0."""
    def stop(*_: Any) -> None:
        if cleanup is not None:
            cleanup()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        time.sleep(3600)


def wait_for_replicas(serve: Any, app: str, counts: dict[str, int], timeout_s: float) -> None:
    """Wait, at most `timeout_s`, until `app`'s deployments together have at least
    `counts[state]` replicas in each state named (e.g. {"RUNNING": 2, "STANDBY": 1})."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        deployments = serve.status().applications[app].deployments.values()
        if all(sum(d.replica_states.get(state, 0) for d in deployments) >= wanted
               for state, wanted in counts.items()):
            return
        time.sleep(0.1)
