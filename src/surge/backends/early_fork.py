"""The fork server, started first thing in a local controller's process.

It imports for ~1 s (surge, starlette, fastapi); the controller's own imports and bind
take ~0.4 s more before its backend exists. `start_early` (controller/__main__.py, from
the spec's line, before the controller is imported) starts it at once, so the two run
side by side and the first replica waits for the later of them, not for their sum.
`ForkServer` (backends/forking.py) takes the process over when the local backend starts
with the same environment; else the early one is stopped and a fresh one started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from surge.control_auth import TOKEN_ENV

__all__ = ["forkserver_env", "spawn", "start_early", "take_early"]

_early: tuple[dict[str, str], subprocess.Popen[bytes]] | None = None


def forkserver_env() -> dict[str, str]:
    """This process's environment without the control token (a member's spec carries it):
    the fork server's, and what the local backend gives every process it starts."""
    return {k: v for k, v in os.environ.items() if k != TOKEN_ENV}


def spawn(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A fork server (surge.replica.forkserver) that dies with this process."""
    return subprocess.Popen(
        [sys.executable, "-m", "surge.replica.forkserver", str(os.getpid())], env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)


def start_early(spec_line: bytes) -> None:
    """Start the fork server now if the controller's spec says the local backend.

    An unreadable line starts nothing: the controller reads it again and says why."""
    global _early
    try:
        backend = json.loads(spec_line).get("backend", "local")
    except (ValueError, AttributeError):
        return
    if backend == "local" and _early is None:
        env = forkserver_env()
        _early = (env, spawn(env))


def take_early(env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """The early fork server, if it runs with `env`; once (a later caller spawns its own)."""
    global _early
    if _early is None:
        return None
    started_with, process = _early
    _early = None
    if started_with == env and process.poll() is None:
        return process
    process.kill()  # another environment: its replicas would not get what they need
    process.wait()
    return None
