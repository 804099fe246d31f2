"""A small open-loop HTTP load generator for the benchmarks (loopback only).

Requests are sent at their scheduled times whatever the server does (no coordinated
omission): each one takes an idle keep-alive connection or opens a new one (bounded),
and its latency counts from the scheduled time. Enough for the few thousand requests/s
the autoscaling bench needs; `surge pulse` is the full tool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Outcome:
    scheduled: float  # wall time the request was due
    status: int  # HTTP status, 0 = timeout, -1 = connection error
    latency_s: float
    body: bytes = b""  # kept only when `run(keep_bodies=True)`
    index: int = 0  # the request's number in the run (0, 1, ...)


class _Pool:
    def __init__(self, host: str, port: int, limit: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(limit)

    async def request(self, path: str, extra: bytes = b"") -> tuple[int, bytes]:
        async with self.slots:
            if self.idle:
                reader, writer = self.idle.pop()
            else:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            try:
                writer.write(f"GET {path} HTTP/1.1\r\nhost: bench\r\n".encode() + extra
                             + b"\r\n")
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length, chunked = 0, False
                for line in head.split(b"\r\n"):
                    lower = line.lower()
                    if lower.startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                    elif lower.startswith(b"transfer-encoding:") and b"chunked" in lower:
                        chunked = True
                body = await (_chunked(reader) if chunked else reader.readexactly(length))
            except BaseException:
                writer.close()
                raise
            self.idle.append((reader, writer))
            return status, body


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers: the empty line
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def run(host: str, port: int, path: str, rate_at: Callable[[float], float],
              duration_s: float, timeout_s: float = 10.0, connections: int = 512,
              headers_for: Callable[[int], bytes] | None = None,
              keep_bodies: bool = False) -> tuple[float, list[Outcome]]:
    """Offer `rate_at(t)` requests/s for `duration_s`; returns (start wall time, outcomes).

    `headers_for(n)`: extra header lines for request n (each ending in CRLF)."""
    pool = _Pool(host, port, connections)
    outcomes: list[Outcome] = []
    tasks: set[asyncio.Task[None]] = set()
    start_wall, start = time.time(), time.perf_counter()

    async def one(due: float, index: int) -> None:
        body = b""
        extra = headers_for(index) if headers_for is not None else b""
        try:
            status, body = await asyncio.wait_for(pool.request(path, extra), timeout_s)
        except TimeoutError:
            status = 0
        except (OSError, asyncio.IncompleteReadError, ValueError):
            status = -1
        outcomes.append(Outcome(start_wall + due, status, time.perf_counter() - start - due,
                                body if keep_bodies else b"", index))

    t, index = 0.0, 0
    while t < duration_s:
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(one(t, index))
        index += 1
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        t += 1.0 / max(rate_at(t), 1e-3)
    if tasks:
        await asyncio.wait(tasks)
    for _, writer in pool.idle:
        writer.close()
    return start_wall, outcomes
