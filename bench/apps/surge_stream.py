"""The streaming app on surge: `python surge_stream.py PORT MAX_ONGOING [ping]`.

GET /stream?n=K&gap_ms=G answers a starlette `StreamingResponse` (text/event-stream) of
K SSE events `data: <i>\\n\\n` (i = 0..K-1) with `await asyncio.sleep(G / 1000)` between
them (bench/streaming.py). For bench/slow_reader.py: GET /stream?bytes=B&chunk=C streams B
bytes in C-byte chunks as fast as the response is taken, GET /stream?ping=1 answers
`pong` from the same replica, and with `ping` a second application answers GET /ping with
`pong` from its own deployment (one replica). One Stream replica with
`max_ongoing_requests=MAX_ONGOING`, behind one proxy process (`proxy_workers=1`).
bench/apps/ray_stream.py is the same app on Ray Serve. Prints `READY url` when serving.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import PlainTextResponse, StreamingResponse

from surge import serve


async def _events(count: int, gap_s: float) -> AsyncIterator[bytes]:
    for i in range(count):
        if i:
            await asyncio.sleep(gap_s)
        yield b"data: %d\n\n" % i


async def _bytes(total: int, chunk: int) -> AsyncIterator[bytes]:
    block = b"x" * chunk
    sent = 0
    while sent < total:
        piece = block if total - sent >= chunk else block[:total - sent]
        sent += len(piece)
        yield piece


class Stream:
    async def __call__(self, request: Any) -> StreamingResponse | PlainTextResponse:
        query = request.query_params
        if "ping" in query:
            return PlainTextResponse("pong")
        if "bytes" in query:
            return StreamingResponse(_bytes(int(query["bytes"]), int(query.get("chunk", 65536))),
                                     media_type="application/octet-stream")
        return StreamingResponse(_events(int(query.get("n", 50)),
                                         float(query.get("gap_ms", 20)) / 1000),
                                 media_type="text/event-stream")


class Ping:
    async def __call__(self, request: Any) -> PlainTextResponse:
        return PlainTextResponse("pong")


def main() -> None:
    port, max_ongoing = int(sys.argv[1]), int(sys.argv[2])
    ping = len(sys.argv) > 3 and sys.argv[3] == "ping"
    os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")
    serve.start(http_options={"host": "127.0.0.1", "port": port, "proxy_workers": 1})
    stream = serve.deployment(name="Stream", max_ongoing_requests=max_ongoing)(Stream)
    serve.run(stream.bind(), name="stream", route_prefix="/stream")
    if ping:
        serve.run(serve.deployment(name="Ping")(Ping).bind(), name="ping", route_prefix="/ping")
    print(f"READY http://127.0.0.1:{port}/stream", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
