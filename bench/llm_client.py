"""A closed-loop streaming chat client for bench/llm.py: `users` keep one request each in
flight, back to back, on their own keep-alive connections (asyncio + httptools, the
cheapest client we have, so it steals little CPU from the servers on 2 cores).

Per request it records the time to the first content event (TTFT), the gaps between
content events (ITL), the output tokens (from the usage chunk) and the status.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field

import httptools

_CONTENT = re.compile(rb'"(?:content|text)":"(?:[^"\\]|\\.)')
_USAGE = re.compile(rb'"completion_tokens":(\d+)')


@dataclass
class Result:
    started: float  # perf_counter
    status: int = 0
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    done: float = 0.0
    error: str = ""


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.result: Result | None = None
        self.finished: asyncio.Future[None] | None = None
        self.tail = b""
        self.last = 0.0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._end(f"parse: {exc}")

    def on_body(self, body: bytes) -> None:
        result = self.result
        if result is None:
            return
        now = time.perf_counter()
        data = self.tail + body
        cut = data.rfind(b"\n\n") + 2
        complete, self.tail = data[:cut], data[cut:]
        found = len(_CONTENT.findall(complete))
        if found:
            if result.ttft_s is None:
                result.ttft_s = now - result.started
            else:
                result.gaps_s.append((now - self.last) / found)
            self.last = now
        usage = _USAGE.search(complete)
        if usage is not None:
            result.tokens = int(usage.group(1))

    def on_message_complete(self) -> None:
        if self.result is not None:
            self.result.status = self.parser.get_status_code()
        self._end("")

    def _end(self, error: str) -> None:
        if self.result is not None:
            self.result.done = time.perf_counter()
            self.result.error = error
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.result is not None and not self.result.done:
            self._end("connection lost")

    async def request(self, head: bytes, body: bytes, timeout_s: float) -> Result:
        result = self.result = Result(time.perf_counter())
        self.finished = asyncio.get_running_loop().create_future()
        self.tail = b""
        assert self.transport is not None
        self.transport.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            await asyncio.wait_for(self.finished, timeout_s)
        except TimeoutError:
            result.error = "timeout"
            result.done = time.perf_counter()
            self.transport.close()
        return result


def chat_body(model: str, max_tokens: int, prompt: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "stream": True, "temperature": 0,
                       "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()


async def run_users(host: str, port: int, users: int, duration_s: float, body: bytes, *,
                    ramp: list[tuple[float, int]] | None = None,
                    timeout_s: float = 60.0) -> list[Result]:
    """`users` closed-loop users for `duration_s` (or a ramp: [(at_s, users), ...])."""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
            "content-type: application/json\r\ncontent-length: ").encode()
    results: list[Result] = []
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    stop_at = start + duration_s

    async def user(begin_s: float) -> None:
        await asyncio.sleep(max(0.0, start + begin_s - time.perf_counter()))
        conn: _Conn | None = None
        while time.perf_counter() < stop_at:
            if conn is None or conn.closed:
                _, conn = await loop.create_connection(_Conn, host, port)
            result = await conn.request(head, body, timeout_s)
            results.append(result)
            if result.error:
                conn = None
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    starts = [0.0] * users
    if ramp:
        starts = []
        for at_s, count in ramp:
            starts += [at_s] * (count - len(starts))
    await asyncio.gather(*(user(s) for s in starts))
    for result in results:
        result.started -= start
        result.done -= start
    return results
