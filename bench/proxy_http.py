"""CPU per request of the proxy's HTTP layer alone, in one process, without sockets.

    python bench/proxy_http.py [--n 5000]

`http_echo.py` measures the whole path (client, proxy, frames, replica) and on a shared
2-core machine its per-request CPU swings by tens of percent. This drives one proxy
connection (`HttpConnection` around the sans-IO `H1Connection`) with a fake transport
and a fake router that answers each request with one frame at once, and times, with
process CPU time, what the proxy's HTTP code costs a request: parsing, the request
head, routing, the replica request message, the response bytes, the metrics record.
What it leaves out (the event loop, the replica link's frames, the router, the
syscalls) is most of what a request costs the proxy end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from surge.model import AccessTokens, ProxySpec, RouteTable, RouteTarget
from surge.policy.auth import token_digest
from surge.proxy.server import Proxy
from surge.transport.messages import HttpStart

TOKEN = "bench-token-0123456789abcdef"
WRK = b"GET /echo?value=x HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n"
BROWSER = (b"GET /echo?value=x HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
           b"User-Agent: Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/120.0\r\n"
           b"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
           b"Accept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br\r\n"
           b"Connection: keep-alive\r\nCookie: session=abc123; theme=dark\r\n"
           b"X-Request-Id: client-chosen-id-1\r\nCache-Control: no-cache\r\n\r\n")
AUTH = (b"GET /locked?value=x HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
        b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
SCENARIOS = {  # key: (what it is, bytes sent at once, requests in them)
    "wrk": ("wrk's GET (1 header)", WRK, 1),
    "browser": ("a browser's GET (10 headers)", BROWSER, 1),
    "auth": ("a GET to a bearer-token route", AUTH, 1),
    "pipelined": ("8 pipelined GETs (per request)", WRK * 8, 8),
}
ANSWER = [(b"content-type", b"application/json"), (b"content-length", b"12")]


class Router:
    def __init__(self) -> None:
        self.pending: list[Any] = []

    def submit(self, pending: Any) -> None:
        self.pending.append(pending)

    def cancel(self, pending: Any) -> None:
        pass


class Runtime:
    def __init__(self) -> None:
        locked = AccessTokens((token_digest(TOKEN),), "bench")
        self.routes = RouteTable((RouteTarget("echo", "Echo", "/echo"),
                                  RouteTarget("locked", "Echo", "/locked", locked)))
        self.routes_received = asyncio.Event()
        self.one = Router()

    def router(self, deployment: Any) -> Router:
        return self.one


class Transport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 5555)


async def per_request_us(data: bytes, batch: int, n: int) -> float:
    runtime = Runtime()
    proxy = Proxy(runtime, ProxySpec("127.0.0.1", 8000, None, 5.0, 10**6))  # type: ignore[arg-type]
    connection = proxy.protocol()
    connection.connection_made(Transport())  # type: ignore[arg-type]
    pending = runtime.one.pending

    def one() -> None:
        connection.data_received(data)
        for each in pending:
            each.sink.deliver(HttpStart(id=1, status=200, headers=ANSWER, body=b'{"echo":"x"}',
                                        more=False))
        pending.clear()

    for _ in range(2000):
        one()
    runs = []
    for _ in range(9):
        started = time.process_time()
        for _ in range(n):
            one()
        runs.append((time.process_time() - started) / (n * batch) * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()
    print("| scenario | CPU µs per request (median of 9) |\n|---|---|")
    results = {}
    for key, (name, data, batch) in SCENARIOS.items():
        results[key] = asyncio.run(per_request_us(data, batch, args.n))
        print(f"| {name} | {results[key]:.1f} |", flush=True)
    print("summary: " + " ".join(f"{key}_us={us:.1f}" for key, us in results.items()))


if __name__ == "__main__":
    main()
