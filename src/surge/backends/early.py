"""The processes a local controller starts first thing, before its own imports.

The controller's imports and bind take ~0.45 s before its backend exists. Two of its
members import for longer or as long: the fork server (~1 s: surge, starlette, fastapi)
and the head node's first proxy (~0.3 s). `start_early` (controller/__main__.py, from the
spec's line, before the controller is imported) starts both at once, so they import
beside the controller and `serve.start` waits for the latest of the three, not for
their sum. Each then waits: the fork server for requests, the proxy for its spec on
stdin (the spec names the controller's bound address, known only later).

The local backend takes each over (`take_early`) when it starts one with the same
environment; one found with another environment is stopped then, and
`stop_untaken` stops any not taken when the controller exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from surge.control_auth import TOKEN_ENV

__all__ = ["FORKSERVER", "PROXY", "early_kinds", "forkserver_env", "spawn_forkserver",
           "start_early", "stop_untaken", "take_early"]

FORKSERVER, PROXY = "forkserver", "proxy"
# The proxy's argument that says it may never get a spec (surge.proxy.__main__).
EARLY_ARG = "early"
_NO_HTTP = ("Disabled", "NoServer")

_early: dict[str, tuple[dict[str, str], subprocess.Popen[bytes]]] = {}


def forkserver_env() -> dict[str, str]:
    """This process's environment without the control token (a member's spec carries it):
    the fork server's, and what the local backend gives every process it starts."""
    return {k: v for k, v in os.environ.items() if k != TOKEN_ENV}


def spawn_forkserver(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A fork server (surge.replica.forkserver) that dies with this process."""
    return subprocess.Popen(
        [sys.executable, "-m", "surge.replica.forkserver", str(os.getpid())], env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)


def _spawn_proxy(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A proxy that imports now and reads its spec when `surge.launch.hand_spec` writes it
    (it exits quietly at EOF, when this process dies first)."""
    return subprocess.Popen([sys.executable, "-m", "surge.proxy", EARLY_ARG], env=env,
                            stdin=subprocess.PIPE, bufsize=0, close_fds=True)


def early_kinds(spec_line: bytes) -> tuple[str, ...]:
    """What to start early for a controller with this spec's line: the fork server on
    the local backend, and the first proxy too where HTTP is served and it is a fresh
    start (a restart re-attaches to the proxies that run). Nothing for a line that does
    not read: the controller reads it again and says why."""
    try:
        spec = json.loads(spec_line)
        backend = spec.get("backend", "local")
        location = (spec.get("http") or {}).get("location", "EveryNode")
        recover = bool(spec.get("recover", False))
    except (ValueError, AttributeError):
        return ()
    if backend != "local":
        return ()
    if location in _NO_HTTP or recover:
        return (FORKSERVER,)
    return (FORKSERVER, PROXY)


def start_early(spec_line: bytes) -> None:
    """Start what `early_kinds` says, once."""
    if _early:
        return
    env = forkserver_env()
    for kind in early_kinds(spec_line):
        _early[kind] = (env, spawn_forkserver(env) if kind == FORKSERVER else _spawn_proxy(env))


def take_early(kind: str, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """The early process of `kind`, if it runs with `env`; once (later callers start
    their own)."""
    entry = _early.pop(kind, None)
    if entry is None:
        return None
    started_with, process = entry
    if started_with == env and process.poll() is None:
        return process
    _stop(process)  # another environment: its children would not get what they need
    return None


def stop_untaken() -> None:
    """Stop the early processes nobody took (the controller is exiting)."""
    while _early:
        _stop(_early.popitem()[1][1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()
