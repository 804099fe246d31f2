"""The controller's side of the fork server (`surge.replica.forkserver`).

`ForkServer.spawn` asks the template process for a replica (its spec and environment)
and returns its pid;
`poll` returns the replicas it reaped. When the fork server is missing or dies, the
local backend falls back to starting replicas as fresh interpreters.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
from typing import Any

from surge.clock import SYSTEM

__all__ = ["ForkServer", "ForkServerError"]

log = logging.getLogger("surge.backend")

READY_TIMEOUT_S = 30.0
SPAWN_TIMEOUT_S = 5.0


class ForkServerError(Exception):
    pass


class ForkServer:
    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "surge.replica.forkserver", str(os.getpid())], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        assert self.process.stdout is not None and self.process.stdin is not None
        self._out = self.process.stdout.fileno()
        self._in = self.process.stdin.fileno()
        os.set_blocking(self._out, False)
        self._buffer = b""
        self._exits: list[tuple[str, int]] = []
        self._ready = False

    def __repr__(self) -> str:
        return f"<ForkServer pid={self.process.pid} ready={self._ready}>"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def _messages(self, timeout: float) -> list[dict[str, Any]]:
        ready, _, _ = select.select([self._out], [], [], timeout)
        if ready:
            try:
                data = os.read(self._out, 65536)
            except BlockingIOError:
                data = b""
            if not data and not self.alive:
                raise ForkServerError("the fork server exited")
            self._buffer += data
        messages = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.strip():
                messages.append(json.loads(line))
        return messages

    def _noted(self, message: dict[str, Any]) -> bool:
        """Keep what any read may bring (an exit; the ready line); True if it was one."""
        if "exited" in message:
            self._exits.append((message["exited"], int(message["code"])))
            return True
        if "ready" in message:
            self._ready = True
            return True
        return False

    def _wait_for(self, key: str, process_id: str | None, timeout: float) -> dict[str, Any]:
        deadline = SYSTEM.monotonic() + timeout
        while SYSTEM.monotonic() < deadline:
            if key == "ready" and self._ready:
                return {}
            for message in self._messages(0.05):
                if self._noted(message):
                    continue
                if key in message and (process_id is None or message[key] == process_id):
                    return message
                elif "failed" in message and message["failed"] == process_id:
                    raise ForkServerError(message.get("error", "fork failed"))
            if not self.alive:
                raise ForkServerError("the fork server exited")
        raise ForkServerError(f"no answer from the fork server within {timeout:g}s")

    def spawn(self, process_id: str, spec: bytes, env: dict[str, str]) -> int:
        """Fork a replica that becomes `spec` (its surge.launch line) with `env`."""
        if not self._ready:
            self._wait_for("ready", None, READY_TIMEOUT_S)
        request = {"spawn": process_id, "spec": spec.decode(), "env": env}
        try:
            os.write(self._in, (json.dumps(request) + "\n").encode())
        except OSError as exc:
            raise ForkServerError(f"cannot reach the fork server: {exc}") from None
        return int(self._wait_for("spawned", process_id, SPAWN_TIMEOUT_S)["pid"])

    def poll(self) -> list[tuple[str, int]]:
        if self.alive or self._buffer:
            try:
                for message in self._messages(0):
                    self._noted(message)  # the ready line too: a spawn must not wait for it
            except ForkServerError:
                pass
        exits, self._exits = self._exits, []
        return exits

    def close(self) -> None:
        if self.alive:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
