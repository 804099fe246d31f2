"""The ceiling: a single-process uvloop + httptools echo server (no framework at all)."""

from __future__ import annotations

import asyncio
import json
import sys
from urllib.parse import parse_qs

import httptools
import uvloop


class Echo(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        query = httptools.parse_url(self.url).query or b""
        value = parse_qs(query.decode()).get("value", [""])[0]
        body = json.dumps({"echo": value}).encode()
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def main(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Echo, "127.0.0.1", port, backlog=4096)
    print(f"READY http://127.0.0.1:{port}/echo?value=x", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
    uvloop.run(main(int(sys.argv[1])))
