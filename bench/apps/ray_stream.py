"""The streaming app on Ray Serve 2.60: `python ray_stream.py PORT MAX_ONGOING [ping]`.

Run with the Ray virtualenv's Python. The same app as bench/apps/surge_stream.py (see
there): GET /stream?n=K&gap_ms=G streams K SSE events `data: <i>\\n\\n` with
`await asyncio.sleep(G / 1000)` between them (text/event-stream); GET
/stream?bytes=B&chunk=C streams B bytes; GET /stream?ping=1 answers `pong`; with `ping`,
GET /ping answers `pong` from its own deployment. One Stream replica
(`max_ongoing_requests=MAX_ONGOING`), Ray's one HTTP proxy on this node. Replicas ask for
`num_cpus=0.25` (a scheduling hint only, so that both fit the 2-core node). SIGTERM ends
it with `ray.shutdown()` (`serve.shutdown()` takes ~40 s; the local cluster goes anyway).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from starlette.responses import PlainTextResponse, StreamingResponse
from until_sigterm import serve_until_sigterm

ACTOR = {"num_cpus": 0.25}


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
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    stream = serve.deployment(name="Stream", max_ongoing_requests=max_ongoing,
                              ray_actor_options=ACTOR)(Stream)
    serve.run(stream.bind(), name="stream", route_prefix="/stream")
    if ping:
        serve.run(serve.deployment(name="Ping", ray_actor_options=ACTOR)(Ping).bind(),
                  name="ping", route_prefix="/ping")
    print(f"READY http://127.0.0.1:{port}/stream", flush=True)

    import ray

    serve_until_sigterm(ray.shutdown)  # serve.shutdown() takes ~40 s on Ray; the local
    # cluster goes anyway


if __name__ == "__main__":
    main()
