"""The bench's own processes (hosts of fake members), talked to in JSON lines."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import time
from typing import Any

__all__ = ["BenchProcess", "percentile"]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


class BenchProcess:
    """A host process in its own process group: config as its first stdin line, then
    commands; its events (one JSON object per stdout line) are kept by kind."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._arrived = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(cls, argv: list[str], config: dict[str, Any]) -> BenchProcess:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            start_new_session=True, limit=1 << 24)
        running = cls(process)
        running.send(config)
        return running

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            event = json.loads(line)
            self._events.setdefault(event["ev"], []).append(event)
            self._arrived.set()

    def events(self, kind: str) -> list[dict[str, Any]]:
        return self._events.get(kind, [])

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())

    async def expect(self, kind: str, timeout_s: float) -> dict[str, Any]:
        """The next event of `kind` not taken yet."""
        taken = self._taken = getattr(self, "_taken", {})
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.events(kind)
            if len(found) > taken.get(kind, 0):
                taken[kind] = taken.get(kind, 0) + 1
                return found[taken[kind] - 1]
            left = deadline - time.monotonic()
            if left <= 0 or self.process.returncode is not None:
                raise RuntimeError(f"no {kind!r} event from pid {self.process.pid} "
                                   f"(exit code {self.process.returncode})")
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                pass

    async def stop(self) -> None:
        if self.process.returncode is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await self.process.wait()
        self._reader.cancel()
