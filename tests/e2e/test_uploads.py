"""Streamed uploads: a large or chunked body reaches the app part by part as it arrives.

A 256 MiB upload is read chunk by chunk by the app while the proxy's and the replica's
RSS stay flat; a slow app holds its client back (and that pause is no 408); a small
body still arrives whole in one `receive()`; an app that answers before reading the
body ends the connection; a replica killed mid-upload is a 500.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from surge import serve
from tests.e2e.conftest import Running, running_instance
from tests.e2e.procs import rss, surge_processes

pytestmark = pytest.mark.e2e

MiB = 1 << 20
TOTAL = 256 * MiB
PART = 1 * MiB  # what the client writes at a time


@serve.deployment(max_ongoing_requests=10)
class Sink:
    def __init__(self) -> None:
        self.received = 0

    async def __call__(self, request: Any) -> dict[str, Any]:
        mode = request.query_params.get("mode", "count")
        if mode == "early":
            return {"refused": True}  # without reading the body
        digest = hashlib.sha256()
        chunks = sizes = 0
        largest = 0
        async for chunk in request.stream():
            if not chunk:
                continue
            chunks += 1
            sizes += len(chunk)
            largest = max(largest, len(chunk))
            digest.update(chunk)
            self.received += len(chunk)
            if mode == "slow":
                import asyncio

                await asyncio.sleep(0.05)
        return {"bytes": sizes, "chunks": chunks, "largest": largest,
                "sha256": digest.hexdigest()}

    def total(self) -> int:
        return self.received


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    with running_instance(max_body_bytes=2 << 30, request_body_timeout_s=1.0) as running:
        serve.run(Sink.bind(), name="sink", route_prefix="/sink")
        yield running


def _pids() -> tuple[int, int]:
    titles = surge_processes(os.getpid())
    proxy = next(pid for pid, title in titles.items() if title.startswith("surge:proxy"))
    replica = next(pid for pid, title in titles.items()
                   if title.startswith("surge:replica:sink:"))
    return proxy, replica


def test_a_small_body_arrives_whole(instance: Running) -> None:
    body = os.urandom(100 * 1024)
    answer = httpx.post(f"{instance.url}/sink", content=body, timeout=30).json()
    assert answer["chunks"] == 1 and answer["bytes"] == len(body)
    assert answer["sha256"] == hashlib.sha256(body).hexdigest()


def test_a_256_mib_upload_streams_at_bounded_memory(instance: Running) -> None:
    proxy, replica = _pids()
    block = os.urandom(PART)
    expected = hashlib.sha256()
    for _ in range(TOTAL // PART):
        expected.update(block)
    peak = {"proxy": 0, "replica": 0}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak["proxy"] = max(peak["proxy"], rss(proxy))
            peak["replica"] = max(peak["replica"], rss(replica))
            time.sleep(0.05)

    before = {"proxy": rss(proxy), "replica": rss(replica)}
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def body() -> Iterator[bytes]:  # chunked: no Content-Length, so nothing to size by
        for _ in range(TOTAL // PART):
            yield block

    started = time.monotonic()
    try:
        answer = httpx.post(f"{instance.url}/sink", content=body(), timeout=120).json()
    finally:
        done.set()
        watcher.join()
    elapsed = time.monotonic() - started
    assert answer["bytes"] == TOTAL
    assert answer["sha256"] == expected.hexdigest()
    assert answer["chunks"] > 100  # read part by part, not as one body
    grew = {name: peak[name] - before[name] for name in peak}
    print(f"\n256 MiB upload in {elapsed:.2f}s ({TOTAL / MiB / elapsed:.0f} MiB/s), "
          f"{answer['chunks']} chunks; RSS before {before}, peak growth {grew}")
    assert grew["proxy"] < 32 * MiB and grew["replica"] < 32 * MiB, (before, peak)


def test_a_slow_app_holds_the_upload_back_without_a_408(instance: Running) -> None:
    handle = serve.get_app_handle("sink")
    start = handle.total.remote().result(timeout_s=10)
    sent = [0]
    length = 64 * MiB
    with socket.create_connection(("127.0.0.1", instance.http_port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.sendall(b"POST /sink?mode=slow HTTP/1.1\r\nhost: x\r\n"
                     b"content-length: %d\r\n\r\n" % length)

        def send() -> None:
            block = b"u" * (64 * 1024)
            try:
                while sent[0] < length:
                    sock.sendall(block)
                    sent[0] += len(block)
            except OSError:
                pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(3.0)  # three body timeouts: a paused upload is not a stalled one
        taken = handle.total.remote().result(timeout_s=10) - start
        ahead = sent[0] - taken
        sock.settimeout(0.2)
        try:
            early = sock.recv(1024)
        except TimeoutError:
            early = b""
        sock.shutdown(socket.SHUT_RDWR)
        sender.join(10)
    print(f"\nslow app: took {taken / MiB:.1f} MiB in 3 s, the client was {ahead / MiB:.1f} "
          "MiB ahead")
    assert early == b""  # no 408 (nor anything else) while the app reads slowly
    assert 0 < taken < 16 * MiB
    assert ahead < 16 * MiB, (sent[0], taken)


def test_an_answer_before_the_body_is_read_ends_the_connection(instance: Running) -> None:
    with httpx.Client(base_url=instance.url, timeout=30) as client:
        response = client.post("/sink?mode=early", content=b"e" * (8 * MiB))
        assert response.status_code == 200 and response.json() == {"refused": True}
        assert response.headers["connection"] == "close"
        assert client.post("/sink", content=b"ok").json()["bytes"] == 2  # a new connection


def test_a_replica_killed_mid_upload_is_a_500(instance: Running) -> None:
    _, replica = _pids()

    def body() -> Iterator[bytes]:
        block = b"k" * PART
        for i in range(1024):
            if i == 8:
                os.kill(replica, signal.SIGKILL)
            yield block

    try:
        response = httpx.post(f"{instance.url}/sink?mode=slow", content=body(), timeout=30)
    except httpx.HTTPError:
        return  # the proxy answered and closed while the client was still sending
    assert response.status_code == 500
