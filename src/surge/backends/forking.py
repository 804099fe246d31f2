"""The controller's side of the fork server (`surge.replica.forkserver`).

The fork server imports surge, uvloop and starlette once, then forks a replica per
request; importing takes seconds on a busy machine, and each fork a few milliseconds,
so the controller never waits for it: `submit` queues a request and returns at once, a
thread of its own writes the requests as the fork server takes them and reads every
answer, and `poll` (each control-loop tick) returns what happened since: replicas
spawned (with their pid), requests that failed, children reaped. A replica's pid is
unknown until its `spawned` answer is polled (it says its pid when it reports ready).
When the fork server does not become ready, or dies, every request not yet spawned
comes back failed, and the local backend starts those replicas as fresh interpreters.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

from surge.backends.early import FORKSERVER, spawn_forkserver, take_early
from surge.clock import SYSTEM

__all__ = ["ForkEvents", "ForkServer", "ForkServerError"]

log = logging.getLogger("surge.backend")

READY_TIMEOUT_S = 60.0  # importing on a loaded machine; only the fork server's thread waits
SPAWN_TIMEOUT_S = 10.0  # one fork's answer
IDLE_POLL_S = 0.05  # how often the thread looks for reaped children while idle


class ForkServerError(Exception):
    pass


@dataclass
class ForkEvents:
    """What the fork server did since the last poll."""

    spawned: list[tuple[str, int]] = field(default_factory=list)  # (process id, pid)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (process id, why)
    exited: list[tuple[str, int]] = field(default_factory=list)  # (process id, code)

    def __bool__(self) -> bool:
        return bool(self.spawned or self.failed or self.exited)


class ForkServer:
    def __init__(self, env: dict[str, str]) -> None:
        self.process = take_early(FORKSERVER, env) or spawn_forkserver(env)
        assert self.process.stdout is not None and self.process.stdin is not None
        self._out = self.process.stdout.fileno()
        self._in = self.process.stdin.fileno()
        self._buffer = b""
        self._requests: queue.SimpleQueue[tuple[str, bytes, dict[str, str]] | None] = (
            queue.SimpleQueue())
        self._lock = threading.Lock()
        self._events = ForkEvents()  # guarded by _lock
        self._ready = False
        self.broken = ""  # why it cannot spawn any more (set by its thread)
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="surge-forkserver",
                                        daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return (f"<ForkServer pid={self.process.pid} ready={self._ready}"
                f"{' broken: ' + self.broken if self.broken else ''}>")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def ready(self) -> bool:
        """It imported what replicas share and forks on request."""
        return self._ready

    def submit(self, process_id: str, spec: bytes, env: dict[str, str]) -> None:
        """Ask for a replica that becomes `spec` (its surge.launch line) with `env`; its
        pid (or why it failed) comes with a later `poll`."""
        with self._lock:
            if self.broken:
                self._events.failed.append((process_id, self._unavailable()))
            else:
                self._requests.put((process_id, spec, env))

    def poll(self) -> ForkEvents:
        with self._lock:
            events, self._events = self._events, ForkEvents()
        return events

    def close(self) -> None:
        self._closing = True
        self._requests.put(None)
        if self.alive:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._thread.join(timeout=5)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()

    # -- its thread: every read and write of the pipes -------------------------------------

    def _run(self) -> None:
        try:
            self._wait_for("ready", None, READY_TIMEOUT_S)
            while not self._closing:
                try:
                    request = self._requests.get(timeout=IDLE_POLL_S)
                except queue.Empty:
                    self._read(0)  # children reaped while idle
                    continue
                if request is None:
                    return
                self._spawn(*request)
        except (ForkServerError, OSError, ValueError) as exc:
            if not self._closing:
                with self._lock:
                    self.broken = str(exc) or type(exc).__name__
                    self._fail_the_rest()

    def _spawn(self, process_id: str, spec: bytes, env: dict[str, str]) -> None:
        request = {"spawn": process_id, "spec": spec.decode(), "env": env}
        try:
            os.write(self._in, (json.dumps(request) + "\n").encode())
        except OSError as exc:
            self._note(failed=(process_id, f"cannot reach the fork server: {exc}"))
            raise ForkServerError(f"cannot reach the fork server: {exc}") from None
        try:
            answer = self._wait_for("spawned", process_id, SPAWN_TIMEOUT_S)
        except ForkServerError as exc:
            self._note(failed=(process_id, str(exc)))
            if not self.alive or "no answer" in str(exc):
                raise
            return
        self._note(spawned=(process_id, int(answer["pid"])))

    def _unavailable(self) -> str:
        return f"the fork server is unavailable ({self.broken})"

    def _fail_the_rest(self) -> None:
        """(Holding the lock.) Every request not taken yet comes back failed."""
        while True:
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return
            if request is not None:
                self._events.failed.append((request[0], self._unavailable()))

    def _note(self, spawned: tuple[str, int] | None = None,
              failed: tuple[str, str] | None = None,
              exited: tuple[str, int] | None = None) -> None:
        with self._lock:
            if spawned is not None:
                self._events.spawned.append(spawned)
            if failed is not None:
                self._events.failed.append(failed)
            if exited is not None:
                self._events.exited.append(exited)

    def _read(self, timeout: float) -> list[dict[str, Any]]:
        """Messages that arrived (exits and the ready line are noted on the way)."""
        ready, _, _ = select.select([self._out], [], [], timeout)
        if ready:
            data = os.read(self._out, 65536)
            if not data:
                raise ForkServerError("the fork server exited")
            self._buffer += data
        messages = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if not line.strip():
                continue
            message = json.loads(line)
            if "exited" in message:
                self._note(exited=(message["exited"], int(message["code"])))
            elif "ready" in message:
                self._ready = True
            else:
                messages.append(message)
        return messages

    def _wait_for(self, key: str, process_id: str | None, timeout: float) -> dict[str, Any]:
        deadline = SYSTEM.monotonic() + timeout
        while SYSTEM.monotonic() < deadline:
            if key == "ready" and self._ready:
                return {}
            for message in self._read(0.05):
                if key in message and (process_id is None or message[key] == process_id):
                    return message
                if "failed" in message and message["failed"] == process_id:
                    raise ForkServerError(message.get("error", "fork failed"))
            if key == "ready" and self._ready:
                return {}
            if not self.alive:
                raise ForkServerError("the fork server exited")
        raise ForkServerError(f"no answer from the fork server within {timeout:g}s")
