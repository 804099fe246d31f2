"""Flow control end to end: a slow consumer costs bounded memory and stalls only itself.

A client reads a 1 GiB streamed response at about 1 MiB/s for a few seconds while
another client keeps calling a small endpoint: the replica's generator must run only a
flow-control window ahead of what the client took, the proxy's and the replica's RSS
must stay flat, and the other client's requests keep being answered. A handle iterating
a fast generator slowly holds the generator back the same way.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.responses import StreamingResponse

from surge import serve
from tests.e2e.conftest import Running, running_instance
from tests.e2e.procs import rss, surge_processes
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

CHUNK = 64 * 1024
TOTAL = 1 << 30  # 1 GiB, far more than any buffer on the way
READ_RATE = 1 << 20  # the slow client: 1 MiB/s
# What may be produced beyond what the client read: the flow-control window (512 KiB)
# plus the kernel's socket buffers on the way (loopback autotunes them to a few MiB).
AHEAD_LIMIT = 16 << 20
RSS_LIMIT = 20 << 20


@serve.deployment(max_ongoing_requests=100)
class Big:
    def __init__(self) -> None:
        self.produced = 0

    async def __call__(self, request: Any) -> StreamingResponse:
        async def body() -> Any:
            block = b"x" * CHUNK
            for _ in range(TOTAL // CHUNK):
                self.produced += CHUNK
                yield block

        return StreamingResponse(body(), media_type="application/octet-stream")

    def bytes_produced(self) -> int:
        return self.produced


@serve.deployment(max_ongoing_requests=100)
class Items:
    def __init__(self) -> None:
        self.yielded = 0

    async def fast(self, n: int) -> Any:
        for i in range(n):
            self.yielded += 1
            yield b"y" * 1024 + str(i).encode()

    def count(self) -> int:
        return self.yielded


@serve.deployment
async def ping(request: Any) -> str:
    return "pong"


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    with running_instance() as running:
        serve.run(Big.bind(), name="big", route_prefix="/big")
        serve.run(ping.bind(), name="ping", route_prefix="/ping")
        yield running


def serving_pids() -> dict[str, int]:
    """The proxy's and the big app's replica's pids (this process is the driver)."""
    titles = surge_processes(os.getpid())
    proxy = next(pid for pid, title in titles.items() if title.startswith("surge:proxy"))
    replica = next(pid for pid, title in titles.items()
                   if title.startswith("surge:replica:big:"))
    return {"proxy": proxy, "replica": replica}


def slow_read(port: int, seconds: float, received: list[int]) -> None:
    """Read /big at READ_RATE for `seconds` through a small receive buffer."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            data = sock.recv(CHUNK)
            if not data:
                raise AssertionError("the stream ended early")
            received[0] += len(data)
            # The slow reader's pace is the behaviour under test.
            time.sleep(max(0.0, received[0] / READ_RATE - (time.monotonic() - started)))


def test_a_slow_reader_costs_bounded_memory_and_does_not_stall_others(
        instance: Running) -> None:
    handle = serve.get_app_handle("big")
    pids = serving_pids()
    received = [0]
    reader = threading.Thread(target=slow_read, args=(instance.http_port, 6.0, received))
    reader.start()
    eventually(lambda: received[0] >= 1 << 20, 10, what="the first MiB read")
    before = {name: rss(pid) for name, pid in pids.items()}
    pings = []
    with httpx.Client(base_url=instance.url, timeout=10) as client:
        while reader.is_alive():
            pings.append(client.get("/ping").status_code)
    reader.join()
    produced = handle.bytes_produced.remote().result(timeout_s=10)
    after = {name: rss(pid) for name, pid in pids.items()}
    assert received[0] > 4 << 20  # it did read at its pace
    assert produced - received[0] < AHEAD_LIMIT, (produced, received[0])
    for name in pids:
        assert after[name] - before[name] < RSS_LIMIT, (name, before, after)
    assert pings and set(pings) == {200}  # answered all along


def test_a_slow_handle_consumer_holds_the_generator_back(instance: Running) -> None:
    handle = serve.run(Items.bind(), name="items", route_prefix=None)
    stream = handle.options(stream=True).fast.remote(100_000)
    taken = [next(iter(stream)) for _ in range(3)]
    assert taken[0].endswith(b"0")

    def yielded() -> int:
        return int(handle.count.remote().result(timeout_s=10))

    # It runs a window ahead (512 KiB of ~1 KiB items, ~480 of them) and then waits.
    stalled = eventually(lambda: (n := yielded()) == yielded() and n, 10,
                         what="the generator to stop")
    assert 3 < stalled < 1000
    rest = sum(1 for _ in stream)  # taking the items lets it run to the end
    assert rest == 100_000 - 3
    assert yielded() == 100_000
