"""The end of every bench app: serve until the bench sends SIGTERM, then clean up and
exit 0. Apps run as scripts under surge's or Ray's Python and import this from their
own folder (the script's directory is first on sys.path)."""

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
