"""surge demo: deploy an echo app, load it, then overload a slow one and watch the 503s.

Run with `make demo`. Everything stays on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.echo import Echo
from surge import serve

PORT = int(os.environ.get("SURGE_DEMO_PORT", "8000"))
os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")


@serve.deployment(max_ongoing_requests=2, max_queued_requests=4)
class Slow:
    async def __call__(self, request: Any) -> str:
        await asyncio.sleep(0.1)
        return "slow but fine"


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               path: str) -> int:
    writer.write(f"GET {path} HTTP/1.1\r\nhost: demo\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return status


async def load(path: str, connections: int, seconds: float) -> tuple[list[float], dict[int, int]]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", PORT)
        while time.perf_counter() < stop:
            started = time.perf_counter()
            status = await _get(reader, writer, path)
            latencies.append(time.perf_counter() - started)
            statuses[status] = statuses.get(status, 0) + 1
        writer.close()

    await asyncio.gather(*[worker() for _ in range(connections)])
    return latencies, statuses


async def burst(path: str, count: int) -> list[tuple[int, float]]:
    async def one() -> tuple[int, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", PORT)
        started = time.perf_counter()
        status = await _get(reader, writer, path)
        writer.close()
        return status, time.perf_counter() - started

    return list(await asyncio.gather(*[one() for _ in range(count)]))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main() -> None:
    print(f"starting surge (controller, proxy on 127.0.0.1:{PORT}, replicas) ...")
    started = time.perf_counter()
    serve.start(http_options={"port": PORT})
    handle = serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    serve.run(Slow.bind(), name="slow", route_prefix="/slow")
    print(f"  two applications running after {time.perf_counter() - started:.2f} s")
    print(f"  handle call: Echo.double(21) = {handle.double.remote(21).result(timeout_s=10)}")

    print("\n1) echo under steady load: 16 keep-alive connections for 3 s (the client shares "
          "the 2 cores)")
    latencies, statuses = asyncio.run(load("/echo?value=hi", 16, 3.0))
    latencies.sort()
    print(f"  {len(latencies) / 3.0:,.0f} requests/s  p50 {ms(statistics.median(latencies))}  "
          f"p99 {ms(latencies[int(len(latencies) * 0.99)])}  statuses {statuses}")

    print("\n2) a burst of 60 concurrent requests at a deployment that can hold 2 running + 4 "
          "queued (100 ms each)")
    results = asyncio.run(burst("/slow", 60))
    ok = [t for s, t in results if s == 200]
    rejected = [t for s, t in results if s == 503]
    print(f"  200: {len(ok)} (slowest {ms(max(ok))})   503: {len(rejected)} "
          f"(answered within {ms(max(rejected)) if rejected else '-'}, with Retry-After)")
    print("  overload is answered at once with a clear 503 instead of a timeout.")

    status = serve.status()
    for name, app in status.applications.items():
        print(f"\nstatus: {name}: {app.status.value}, "
              + ", ".join(f"{d}: {o.status.value} {o.replica_states}"
                          for d, o in app.deployments.items()))
    serve.shutdown()
    print("\nshut down; no surge process is left running.")


if __name__ == "__main__":
    main()
