"""HTTP limits set through http_options: request_timeout_s, max_body_bytes, keep-alive.

This module starts its own surge instance (not conftest's `surge_instance`) because the
limits are per-instance options; only one instance may run in a process at a time.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
from starlette.requests import Request
from starlette.responses import StreamingResponse

from surge import serve
from tests.e2e.conftest import Running, running_instance
from tests.e2e.test_http import RawConnection, chunked, request_bytes
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

LIMIT = 1000
TIMEOUT_S = 0.5
KEEP_ALIVE_S = 1.0


@serve.deployment(num_replicas=1, max_ongoing_requests=8)
class Limited:
    async def __call__(self, request: Request) -> Any:
        if request.query_params.get("stall"):
            return StreamingResponse(self.stalls(), media_type="text/plain")
        seconds = float(request.query_params.get("s", "0"))
        if seconds:
            await asyncio.sleep(seconds)
        body = await request.body()
        return {"length": len(body), "slept": seconds}

    async def stalls(self) -> Any:
        yield "generated 0"
        await asyncio.sleep(60)
        yield "never"


@pytest.fixture(scope="module")
def limited_instance() -> Iterator[Running]:
    with running_instance(request_timeout_s=TIMEOUT_S, max_body_bytes=LIMIT,
                          keep_alive_timeout_s=KEEP_ALIVE_S) as running:
        serve.run(Limited.bind(), name="limited", route_prefix="/limited")
        yield running


@pytest.fixture
def http(limited_instance: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=limited_instance.url, timeout=30) as client:
        yield client


# -- request_timeout_s ---------------------------------------------------------------------


def test_configured_request_timeout_gives_408(http: httpx.Client) -> None:
    start = time.monotonic()
    response = http.get("/limited", params={"s": "2"})
    elapsed = time.monotonic() - start
    assert response.status_code == 408
    assert response.headers["x-request-id"]
    assert f"after {TIMEOUT_S:g}s" in response.text
    # the wait under test: answered at the configured 0.5 s, before the 2 s handler would be
    assert TIMEOUT_S - 0.05 <= elapsed < 1.9, elapsed


def test_fast_requests_are_unaffected_by_the_timeout(http: httpx.Client) -> None:
    response = http.get("/limited", params={"s": "0.05"})
    assert response.status_code == 200
    assert response.json() == {"length": 0, "slept": 0.05}


def test_timeout_header_overrides_the_configured_timeout(http: httpx.Client) -> None:
    # Longer than the configured 0.5 s: the header wins and the request completes.
    response = http.get("/limited", params={"s": "0.8"},
                        headers={"x-request-timeout-seconds": "5"})
    assert response.status_code == 200
    assert response.json()["slept"] == 0.8
    # Shorter than the configured timeout: the header wins again.
    response = http.get("/limited", params={"s": "2"},
                        headers={"x-request-timeout-seconds": "0.2"})
    assert response.status_code == 408
    assert "after 0.2s" in response.text  # the header's timeout, not the configured 0.5 s


def test_a_stream_that_runs_out_of_time_is_reset(limited_instance: Running) -> None:
    # Ray Serve's proxy resets a connection whose stream outlives its timeout: `requests`
    # reports a broken connection, not "Response ended prematurely" (a clean close). The
    # header's 3 s, not the configured 0.5 s, leaves a busy machine time for the first chunk.
    start = time.monotonic()
    response = requests.get(f"{limited_instance.url}/limited?stall=1", stream=True, timeout=30,
                            headers={"x-request-timeout-seconds": "3"})
    chunks = response.iter_content(chunk_size=None, decode_unicode=True)
    assert response.status_code == 200 and next(chunks) == "generated 0"
    with pytest.raises(requests.exceptions.ChunkedEncodingError) as broken:
        next(chunks)
    assert "Connection broken" in str(broken.value)
    assert "reset" in str(broken.value).lower()
    assert time.monotonic() - start < 20  # at the deadline, not the generator's 60 s sleep
    response.close()


def test_the_connection_survives_a_timeout(limited_instance: Running) -> None:
    with RawConnection(limited_instance.http_port) as conn:
        conn.send(request_bytes("GET", "/limited?s=2"))
        assert conn.read_response().status == 408
        conn.send(request_bytes("GET", "/limited"))
        response = conn.read_response()
        assert response.status == 200
        assert response.body == b'{"length":0,"slept":0.0}'


# -- max_body_bytes ------------------------------------------------------------------------


def test_body_at_the_limit_is_accepted(http: httpx.Client) -> None:
    response = http.post("/limited", content=b"x" * LIMIT)
    assert response.status_code == 200
    assert response.json()["length"] == LIMIT


def test_declared_content_length_over_the_limit_is_413_before_the_body(
        limited_instance: Running) -> None:
    with RawConnection(limited_instance.http_port) as conn:
        # Only the head is sent: the proxy answers from Content-Length alone.
        conn.send(request_bytes("POST", "/limited", {"Content-Length": str(LIMIT + 1),
                                                     "x-request-id": "too-big-1"}))
        response = conn.read_response(timeout_s=5)
        assert response.status == 413
        assert str(LIMIT) in response.body.decode()
        assert response.headers["x-request-id"] == "too-big-1"
        assert response.headers.get("connection") == "close"
        assert conn.closed_by_peer(5.0)


def test_httpx_body_over_the_limit_is_413(http: httpx.Client) -> None:
    response = http.post("/limited", content=b"x" * (LIMIT * 3))
    assert response.status_code == 413


def test_large_body_over_the_limit_is_413_not_a_reset(limited_instance: Running) -> None:
    # The client is still sending when the proxy answers: the 413 must still arrive.
    with httpx.Client(base_url=limited_instance.url, timeout=30) as client:
        response = client.post("/limited", content=b"x" * 2_000_000)
    assert response.status_code == 413


def test_chunked_body_over_the_limit_is_413(limited_instance: Running) -> None:
    with RawConnection(limited_instance.http_port) as conn:
        conn.send(request_bytes("POST", "/limited", {"Transfer-Encoding": "chunked"})
                  + chunked(b"y" * (LIMIT + 200), 300))
        response = conn.read_response(timeout_s=5)
        assert response.status == 413
        assert response.headers.get("connection") == "close"
        assert conn.closed_by_peer(5.0)


def test_chunked_body_within_the_limit_is_accepted(limited_instance: Running) -> None:
    with RawConnection(limited_instance.http_port) as conn:
        conn.send(request_bytes("POST", "/limited", {"Transfer-Encoding": "chunked"})
                  + chunked(b"y" * LIMIT, 300))
        response = conn.read_response(timeout_s=5)
        assert response.status == 200
        assert response.body == b'{"length":1000,"slept":0.0}'


def test_httpx_streamed_upload_over_the_limit_is_413(http: httpx.Client) -> None:
    def parts() -> Iterator[bytes]:
        for _ in range(5):
            yield b"z" * 400

    response = http.post("/limited", content=parts())  # no length: sent chunked
    assert response.status_code == 413


def test_the_proxy_keeps_serving_after_413(http: httpx.Client) -> None:
    assert http.post("/limited", content=b"x" * (LIMIT + 1)).status_code == 413
    response = http.post("/limited", content=b"x" * 10)
    assert response.status_code == 200
    assert response.json()["length"] == 10


# -- keep_alive_timeout_s ------------------------------------------------------------------


def test_idle_keep_alive_connection_is_closed(limited_instance: Running) -> None:
    with RawConnection(limited_instance.http_port) as conn:
        conn.send(request_bytes("GET", "/limited"))
        assert conn.read_response().status == 200
        idle_from = time.monotonic()
        assert conn.closed_by_peer(KEEP_ALIVE_S + 2.0)
        # the wait under test: closed after the keep-alive timeout, not before
        assert time.monotonic() - idle_from >= KEEP_ALIVE_S - 0.1


def test_a_connection_that_never_sends_is_closed(limited_instance: Running) -> None:
    with RawConnection(limited_instance.http_port) as conn:
        assert conn.closed_by_peer(KEEP_ALIVE_S + 2.0)


def test_a_long_request_is_not_cut_by_the_keep_alive_timeout(
        limited_instance: Running) -> None:
    with RawConnection(limited_instance.http_port) as conn:
        conn.send(request_bytes("GET", "/limited?s=1.5", {"x-request-timeout-seconds": "10"}))
        response = conn.read_response()
        assert response.status == 200
        assert response.body == b'{"length":0,"slept":1.5}'
        conn.send(request_bytes("GET", "/limited"))  # still open right after
        assert conn.read_response().status == 200


def test_a_pipelined_upload_is_not_cut_by_the_keep_alive_timeout(
        limited_instance: Running) -> None:
    with RawConnection(limited_instance.http_port) as conn:
        # The second request's body arrives after the first is answered and more than
        # the keep-alive timeout later: the connection is busy, not idle.
        conn.send(request_bytes("GET", "/limited")
                  + b"POST /limited HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n12")
        assert conn.read_response().status == 200
        time.sleep(KEEP_ALIVE_S + 0.5)  # the behaviour: a client slower than the timeout
        conn.send(b"34")
        response = conn.read_response()
        assert response.status == 200
        assert response.body == b'{"length":4,"slept":0.0}'


# -- header limits, slow clients, connection cap ------------------------------------------


@pytest.fixture(scope="module")
def guarded() -> Iterator[Running]:
    """An instance with small header limits, a short header timeout and 3 connections."""
    serve.shutdown()
    with running_instance(max_header_bytes=2048, request_header_timeout_s=0.5,
                          max_connections=3) as running:
        serve.run(Limited.bind(), name="quick", route_prefix="/quick")
        yield running


def _raw(port: int, data: bytes, wait_s: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks)


def test_huge_headers_get_431(guarded: Running) -> None:
    answer = _raw(guarded.http_port, b"GET /quick HTTP/1.1\r\nhost: x\r\nx-big: "
                  + b"a" * 4000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert httpx.get(f"{guarded.url}/quick").status_code == 200


def test_slowloris_gets_408_and_others_are_served(guarded: Running) -> None:
    with socket.create_connection(("127.0.0.1", guarded.http_port), timeout=5) as slow:
        slow.sendall(b"GET /quick HTTP/1.1\r\nhost: x\r\nx-slow: ")
        started = time.monotonic()
        assert httpx.get(f"{guarded.url}/quick").status_code == 200
        answer = slow.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        # the wait under test: the 0.5 s header timeout answers it (generous bound; the
        # client above would wait 5 s)
        assert time.monotonic() - started < 3.0


def test_connections_over_the_cap_get_503(guarded: Running) -> None:
    held = [RawConnection(guarded.http_port) for _ in range(3)]
    try:
        for conn in held:  # a round trip on each: the proxy holds all three now
            conn.send(request_bytes("GET", "/-/healthz"))
            assert conn.read_response().status == 200
        # The proxy answers at once on connect, before the client says anything.
        with socket.create_connection(("127.0.0.1", guarded.http_port), timeout=5) as extra:
            answer = extra.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b"retry-after: 1" in answer.lower()
    finally:
        for conn in held:
            conn.sock.close()
    # once the proxy has seen the closes, a new connection is served again
    eventually(lambda: httpx.get(f"{guarded.url}/quick").status_code == 200, 5,
               what="a connection under the cap served")
