"""HTTP behaviour of the proxy, end to end: real processes, httpx and raw sockets.

Covers the built-in routes, how `__call__` return values become responses, errors,
overload (503; Retry-After only where advised), per-request timeouts (408), cancel-on-disconnect,
malformed requests, x-request-id, keep-alive and pipelining, and what a handler sees
of the request. The raw-socket helpers here are also used by test_http_limits.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from surge import serve
from tests.e2e.dashboard_tools import scrape, total
from tests.eventually import eventually, eventually_async
from tests.raw_socket import RawSocket

pytestmark = pytest.mark.e2e


# -- raw-socket HTTP/1.1 client ------------------------------------------------------------


@dataclass
class RawResponse:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class _Collector:
    """httptools callbacks: every response on the connection, in order."""

    def __init__(self) -> None:
        self.responses: list[RawResponse] = []
        self.current = RawResponse()
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.current = RawResponse()

    def on_status(self, status: bytes) -> None:
        self.current.status = self.parser.get_status_code()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.current.body += body

    def on_message_complete(self) -> None:
        self.responses.append(self.current)


class RawConnection(RawSocket):
    """One TCP connection to the proxy: exact bytes out, parsed responses in.

    Its reads block on the socket until data, the close or the timeout: they wait on the
    peer itself, not on a poll, so they need no `eventually`."""

    def __init__(self, port: int, timeout_s: float = 10.0) -> None:
        super().__init__(port, timeout_s)
        self.collector = _Collector()
        self.peer_closed = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _feed(self, timeout_s: float) -> bool:
        """Read once and parse; False when the peer closed the connection."""
        self.sock.settimeout(max(timeout_s, 0.001))
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.peer_closed = True
            return False
        self.collector.parser.feed_data(data)
        return True

    def read_responses(self, count: int, timeout_s: float = 10.0) -> list[RawResponse]:
        deadline = time.monotonic() + timeout_s
        while len(self.collector.responses) < count:
            if self.peer_closed or not self._feed(deadline - time.monotonic()):
                break
        taken = self.collector.responses[:count]
        del self.collector.responses[:count]
        assert len(taken) == count, f"got {len(taken)} of {count} responses before close"
        return taken

    def read_raw_until(self, done: Any, timeout_s: float = 10.0) -> bytes:
        """Unparsed bytes, read until `done(data)` holds, the peer closes, or time is up."""
        deadline = time.monotonic() + timeout_s
        data = b""
        while not done(data):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                more = self.sock.recv(65536)
            except TimeoutError:
                break
            if not more:
                self.peer_closed = True
                break
            data += more
        return data

    def read_response(self, timeout_s: float = 10.0) -> RawResponse:
        return self.read_responses(1, timeout_s)[0]

    def closed_by_peer(self, timeout_s: float = 5.0) -> bool:
        """True when the peer closes within `timeout_s` without sending another response."""
        deadline = time.monotonic() + timeout_s
        while not self.peer_closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                self._feed(left)
            except TimeoutError:
                return False
        return not self.collector.responses


def request_bytes(method: str, path: str, headers: dict[str, str] | None = None,
                  body: bytes = b"") -> bytes:
    headers = headers or {}
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    framed = any(n.lower() in ("content-length", "transfer-encoding") for n in headers)
    if body and not framed:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(data: bytes, size: int) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size])
             for i in range(0, len(data), size)]
    return b"".join(parts) + b"0\r\n\r\n"


# -- deployments ---------------------------------------------------------------------------

SECRET = "s3cr3t-detail-do-not-leak"


@serve.deployment(num_replicas=1, max_ongoing_requests=16)
class Main:
    """Dispatches on the path below /main; each branch exercises one behaviour."""

    def __init__(self) -> None:
        self.hang_started = 0
        self.hang_cancelled = 0
        self.work_finished = 0

    def counts(self) -> dict[str, int]:
        return {"started": self.hang_started, "cancelled": self.hang_cancelled,
                "finished": self.work_finished}

    async def __call__(self, request: Request) -> Any:
        kind = request.url.path.removeprefix("/main").strip("/").split("/")[0]
        if kind == "dict":
            return {"kind": "dict", "n": 1}
        if kind == "list":
            return [1, "two", None]
        if kind == "str":
            return "hello, text"
        if kind == "bytes":
            return b"\x00\x01raw\xff"
        if kind == "json-response":
            return JSONResponse({"custom": True}, status_code=202, headers={"x-custom": "j"})
        if kind == "plain-response":
            return PlainTextResponse("teapot", status_code=418, headers={"x-custom": "p"})
        if kind == "empty-response":
            return Response(status_code=204)
        if kind == "stream":
            return StreamingResponse(_ticks(int(request.query_params.get("n", "3"))),
                                     media_type="text/plain")
        if kind == "stream-fails":
            return StreamingResponse(_ticks_then_fail(), media_type="text/plain")
        if kind == "stream-hang":
            return StreamingResponse(self._first_then_hang(), media_type="text/plain")
        if kind == "cookies":
            response = PlainTextResponse("cookies")
            response.set_cookie("a", "1")
            response.set_cookie("b", "2")
            return response
        if kind == "none":
            return None
        if kind == "boom":
            raise ValueError(SECRET)
        if kind == "slow":
            seconds = float(request.query_params.get("s", "0"))
            await asyncio.sleep(seconds)
            return f"slept {seconds:g}"
        if kind == "hang":
            self.hang_started += 1
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.hang_cancelled += 1
                raise
            return "not cancelled"
        if kind == "work":
            self.hang_started += 1
            try:
                await asyncio.sleep(float(request.query_params.get("s", "1")))
            except asyncio.CancelledError:
                self.hang_cancelled += 1
                raise
            self.work_finished += 1
            return "worked"
        if kind == "echo":
            body = await request.body()
            parsed = await request.json() if body else None
            return {
                "method": request.method,
                "path": request.url.path,
                "root_path": request.scope.get("root_path"),
                "query": dict(request.query_params),
                "query_multi": request.query_params.getlist("m"),
                "headers": {k: v for k, v in request.headers.items() if k.startswith("x-")},
                "body": body.decode("latin-1"),
                "json": parsed,
            }
        return {"kind": "unknown", "path": request.url.path}

    async def _first_then_hang(self) -> Any:
        yield "first\n"
        self.hang_started += 1
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.hang_cancelled += 1
            raise
        yield "never\n"


async def _ticks(count: int) -> Any:
    for i in range(count):
        if i:
            await asyncio.sleep(0.3)
        yield f"tick {i}\n"


async def _ticks_then_fail() -> Any:
    yield "first\n"
    await asyncio.sleep(0.1)
    raise RuntimeError(SECRET)


@serve.deployment(num_replicas=1, max_ongoing_requests=1, max_queued_requests=1)
class Busy:
    async def __call__(self, request: Request) -> str:
        await asyncio.sleep(1.0)
        return "done"


@dataclass
class Apps:
    url: str
    port: int
    main: Any


@pytest.fixture(scope="module")
def apps(surge_instance: Any) -> Iterator[Apps]:
    main = serve.run(Main.bind(), name="main", route_prefix="/main")
    serve.run(Busy.bind(), name="busy", route_prefix="/busy")
    yield Apps(surge_instance.url, surge_instance.http_port, main)


@pytest.fixture
def http(apps: Apps) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=apps.url, timeout=30) as client:
        yield client


# -- built-in routes -----------------------------------------------------------------------


def test_unknown_route_is_404_naming_the_path(http: httpx.Client) -> None:
    response = http.get("/no/such/place")
    assert response.status_code == 404
    assert "/no/such/place" in response.text
    assert "not found" in response.text.lower()
    assert response.headers["x-request-id"]


def test_healthz(http: httpx.Client) -> None:
    response = http.get("/-/healthz")
    assert response.status_code == 200
    assert response.text == "success"


def test_routes_lists_route_prefixes(http: httpx.Client) -> None:
    response = http.get("/-/routes")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {"/main": "main", "/busy": "busy"}


def test_unknown_builtin_is_404(http: httpx.Client) -> None:
    response = http.get("/-/nope")
    assert response.status_code == 404
    assert "/-/nope" in response.text


# -- return values -------------------------------------------------------------------------


def test_dict_and_list_become_json(http: httpx.Client) -> None:
    response = http.get("/main/dict")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {"kind": "dict", "n": 1}
    response = http.get("/main/list")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == [1, "two", None]


def test_str_becomes_text_plain(http: httpx.Client) -> None:
    response = http.get("/main/str")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == "hello, text"
    assert response.headers["content-length"] == str(len("hello, text"))


def test_bytes_pass_through(http: httpx.Client) -> None:
    response = http.get("/main/bytes")
    assert response.status_code == 200
    assert response.content == b"\x00\x01raw\xff"


def test_starlette_responses_pass_through(http: httpx.Client) -> None:
    response = http.get("/main/json-response")
    assert response.status_code == 202
    assert response.headers["x-custom"] == "j"
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {"custom": True}

    response = http.get("/main/plain-response")
    assert response.status_code == 418
    assert response.headers["x-custom"] == "p"
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == "teapot"

    response = http.get("/main/empty-response")
    assert response.status_code == 204
    assert response.content == b""


def test_streaming_response_is_chunked_and_incremental(http: httpx.Client) -> None:
    arrivals: list[tuple[float, bytes]] = []
    start = time.monotonic()
    with http.stream("GET", "/main/stream", params={"n": "3"}) as response:
        assert response.status_code == 200
        assert response.headers["transfer-encoding"] == "chunked"
        assert "content-length" not in response.headers
        assert response.headers["x-request-id"]
        for data in response.iter_raw():
            arrivals.append((time.monotonic() - start, data))
    assert b"".join(d for _, d in arrivals) == b"tick 0\ntick 1\ntick 2\n"
    # The first tick is sent at once, the last 0.6 s later: the client saw them apart.
    assert len(arrivals) >= 2
    assert arrivals[0][1].startswith(b"tick 0")
    assert b"tick 2" not in arrivals[0][1]
    # The wait under test: the handler waits 0.3 s between ticks, and an unbuffered
    # stream passes those waits on (a lower bound: a slow machine only adds to it).
    assert arrivals[-1][0] - arrivals[0][0] >= 0.4


def test_streaming_on_a_raw_socket_is_framed_as_chunks(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("GET", "/main/stream?n=2"))
        response = conn.read_response()
        assert response.status == 200
        assert response.headers["transfer-encoding"] == "chunked"
        assert response.body == b"tick 0\ntick 1\n"
        # The connection stays usable after a streamed response.
        conn.send(request_bytes("GET", "/main/str"))
        assert conn.read_response().body == b"hello, text"


def test_none_is_an_empty_body(http: httpx.Client) -> None:
    response = http.get("/main/none")
    assert response.status_code == 200
    assert response.content == b""
    assert response.headers["content-type"].startswith("text/plain")


def test_204_has_no_content_length(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("GET", "/main/empty-response")
                  + request_bytes("GET", "/main/str"))
        empty, after = conn.read_responses(2)
        assert empty.status == 204
        assert "content-length" not in empty.headers
        assert "transfer-encoding" not in empty.headers
        assert after.body == b"hello, text"


def test_head_gets_headers_but_no_body(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        # A body after a HEAD response would be read as the next response's start.
        conn.send(request_bytes("HEAD", "/main/str") + request_bytes("GET", "/main/dict"))
        data = conn.read_raw_until(lambda d: d.endswith(b'{"kind":"dict","n":1}'), 5)
        first, _, rest = data.partition(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200 ")
        assert b"content-length: 11" in first.lower()
        assert rest.startswith(b"HTTP/1.1 200 "), rest
        assert rest.endswith(b'{"kind":"dict","n":1}')


def test_head_of_a_stream_and_of_a_404_have_no_body(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("HEAD", "/main/stream?n=2")
                  + request_bytes("HEAD", "/nowhere")
                  + request_bytes("GET", "/-/healthz"))
        data = conn.read_raw_until(lambda d: d.endswith(b"success"), 5)
        heads = data.split(b"\r\n\r\n")
        assert heads[0].startswith(b"HTTP/1.1 200 ")
        assert heads[1].startswith(b"HTTP/1.1 404 ")
        assert heads[2].startswith(b"HTTP/1.1 200 ")
        assert heads[3] == b"success"


def test_head_of_an_endless_stream_answers_at_once_and_stops_it(apps: Apps) -> None:
    counts = apps.main.options(method_name="counts")
    before = counts.remote().result(timeout_s=10)
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("HEAD", "/main/stream-hang"))
        # the stream hangs for 60 s: headers within this 5 s read did not wait for it
        data = conn.read_raw_until(lambda d: b"\r\n\r\n" in d, 5)
        assert data.startswith(b"HTTP/1.1 200 ")
        assert data.endswith(b"\r\n\r\n")  # headers only
        conn.send(request_bytes("GET", "/main/str"))  # the connection carries on
        assert conn.read_response().body == b"hello, text"
    eventually(lambda: _counts(counts)["cancelled"] > before["cancelled"], 2.0,
               what="the stream cancelled at the replica")


def test_http_1_0_gets_a_streamed_body_without_chunks(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(b"GET /main/stream?n=2 HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := conn.sock.recv(65536):
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"transfer-encoding" not in head.lower()
        assert body == b"tick 0\ntick 1\n"


def test_http_1_0_keep_alive_is_acknowledged(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        for _ in range(2):
            conn.send(b"GET /main/str HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            response = conn.read_response()
            assert response.body == b"hello, text"
            assert response.headers["connection"].lower() == "keep-alive"


def test_expect_100_continue(apps: Apps) -> None:
    body = b'{"big": "' + b"b" * 2000 + b'"}'
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("POST", "/main/echo", {"Content-Length": str(len(body)),
                                                       "Expect": "100-continue"}))
        # the 100 must come before the body is sent (the read ends as soon as it is in)
        interim = conn.read_raw_until(lambda d: d.endswith(b"\r\n\r\n"), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        conn.send(body)
        response = conn.read_response()
        assert response.status == 200
        assert len(json.loads(response.body)["json"]["big"]) == 2000


def test_repeated_headers_pass_through(http: httpx.Client) -> None:
    response = http.get("/main/cookies")
    assert response.status_code == 200
    cookies = response.headers.get_list("set-cookie")
    assert len(cookies) == 2
    assert cookies[0].startswith("a=1") and cookies[1].startswith("b=2")


def test_stream_that_fails_midway_is_cut_off(apps: Apps, http: httpx.Client) -> None:
    with pytest.raises(httpx.RemoteProtocolError), \
            http.stream("GET", "/main/stream-fails") as response:
        assert response.status_code == 200
        received = b"".join(response.iter_raw())
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("GET", "/main/stream-fails"))
        received = b""
        while chunk := conn.sock.recv(65536):
            received += chunk
        assert b"first" in received
        assert not received.endswith(b"0\r\n\r\n")  # no clean end of the chunked body
        assert SECRET.encode() not in received
    assert http.get("/main/str").text == "hello, text"


# -- errors --------------------------------------------------------------------------------


def test_user_exception_is_500_without_details_and_replica_keeps_serving(
        http: httpx.Client) -> None:
    response = http.get("/main/boom")
    assert response.status_code == 500
    assert response.headers["x-request-id"]
    for leak in (SECRET, "Traceback", "ValueError", "File \""):
        assert leak not in response.text
    again = http.get("/main/dict")
    assert again.status_code == 200
    assert again.json() == {"kind": "dict", "n": 1}


# -- overload ------------------------------------------------------------------------------


def _burst(url: str, path: str, count: int) -> list[tuple[int, float, httpx.Headers, str]]:
    async def one(client: httpx.AsyncClient) -> tuple[int, float, httpx.Headers, str]:
        start = time.monotonic()
        response = await client.get(path)
        return response.status_code, time.monotonic() - start, response.headers, response.text

    async def burst() -> list[tuple[int, float, httpx.Headers, str]]:
        limits = httpx.Limits(max_connections=count)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
            return await asyncio.gather(*(one(client) for _ in range(count)))

    return asyncio.run(burst())


def test_overload_rejects_fast_with_503_and_no_retry_after_as_ray(apps: Apps) -> None:
    with httpx.Client(base_url=apps.url, timeout=30) as warm:
        assert warm.get("/busy").status_code == 200  # the proxy's router is connected
    results = _burst(apps.url, "/busy", 6)
    statuses = sorted(status for status, *_ in results)
    assert set(statuses) <= {200, 503}, statuses
    ok = [r for r in results if r[0] == 200]
    rejected = [r for r in results if r[0] == 503]
    # One runs, one waits in the queue, the rest are turned away.
    assert len(ok) == 2, statuses
    assert len(rejected) == 4, statuses
    for _, elapsed, headers, text in rejected:
        # the wait under test: a 503 does not wait for the 1 s handler (generous bound)
        assert elapsed < 0.9, f"a 503 took {elapsed:.2f}s; it should not wait for the handler"
        # an explicit max_queued_requests is Ray's bound: no Retry-After unless configured
        # (backpressure_config.retry_after_s, test_backpressure_config.py); surge's wait
        # bound advises one (test_queue_wait.py)
        assert "retry-after" not in headers
        assert headers["x-request-id"]
        assert "Traceback" not in text
    for _, elapsed, _headers, text in ok:
        assert text == "done"
        assert elapsed >= 0.9  # the wait under test: each one waited for the 1 s handler


@serve.deployment(num_replicas=1, max_ongoing_requests=1, max_queued_requests=1)
class Gate:
    """Busy's limits, but each call first appends a line to `<dir>/calls`, then holds its
    slot until the test opens the gate (creates `<dir>/open`): tests order by these."""

    async def __call__(self, request: Request) -> str:
        folder = Path(request.query_params["dir"])
        with open(folder / "calls", "a") as out:
            out.write("call\n")
        while not (folder / "open").exists():
            await asyncio.sleep(0.01)
        return "done"


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_disconnect_while_queued_frees_the_queue_slot(apps: Apps, tmp_path: Path) -> None:
    serve.run(Gate.bind(), name="gate", route_prefix="/gate")
    dashboard = serve.status().dashboard_address
    path = f"/gate?dir={tmp_path}"
    calls = tmp_path / "calls"

    def queued() -> float:
        """Requests waiting in the proxy's router for Gate (the controller's view)."""
        return total(scrape(dashboard), "serve_deployment_queued_queries",
                     application="gate", deployment="Gate")

    async def scenario() -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=apps.url, timeout=30) as client:
            running = asyncio.ensure_future(client.get(path))
            await eventually_async(lambda: _lines(calls) == 1, 10,
                                   what="the first request holding Gate's one slot")
            # A raw connection takes the one queue slot, then goes away.
            _reader, writer = await asyncio.open_connection("127.0.0.1", apps.port)
            writer.write(request_bytes("GET", path))
            await writer.drain()
            await eventually_async(lambda: asyncio.to_thread(lambda: queued() == 1), 10,
                                   interval_s=0.05, what="the raw request queued")
            writer.close()
            await writer.wait_closed()
            await eventually_async(lambda: asyncio.to_thread(lambda: queued() == 0), 10,
                                   interval_s=0.05, what="the abandoned request dequeued")
            waiting = asyncio.ensure_future(client.get(path))  # takes the freed slot
            await eventually_async(lambda: asyncio.to_thread(lambda: queued() == 1), 10,
                                   interval_s=0.05, what="the next request queued, not a 503")
            (tmp_path / "open").touch()
            return (await running).status_code, (await waiting).status_code

    try:
        assert asyncio.run(scenario()) == (200, 200)
        assert _lines(calls) == 2  # the abandoned request never ran
    finally:
        serve.delete("gate")


def test_the_first_burst_after_deploy_is_limited_too(apps: Apps) -> None:
    # No warm-up request: the proxy must know the queue limit before the first request.
    serve.run(Busy.bind(), name="busy-cold", route_prefix="/busy-cold")
    try:
        results = _burst(apps.url, "/busy-cold", 6)
    finally:
        serve.delete("busy-cold")
    statuses = sorted(status for status, *_ in results)
    assert statuses == [200, 200, 503, 503, 503, 503]
    # the wait under test: a 503 does not wait for the 1 s handler (generous bound)
    assert all(elapsed < 0.9 for status, elapsed, *_ in results if status == 503)


# -- timeouts ------------------------------------------------------------------------------


def test_request_timeout_header_gives_408(http: httpx.Client) -> None:
    start = time.monotonic()
    response = http.get("/main/slow", params={"s": "2"},
                        headers={"x-request-timeout-seconds": "0.3"})
    elapsed = time.monotonic() - start
    assert response.status_code == 408
    assert response.headers["x-request-id"]
    # the wait under test: answered at its 0.3 s timeout, before the 2 s handler would be
    assert 0.25 <= elapsed < 1.9, elapsed
    # A request that finishes in time is unaffected by the header.
    response = http.get("/main/slow", params={"s": "0.05"},
                        headers={"x-request-timeout-seconds": "5"})
    assert response.status_code == 200
    assert response.text == "slept 0.05"


@pytest.mark.parametrize("value", ["soon", "nan", "inf", "", "1e400"])
def test_unusable_timeout_header_is_ignored(http: httpx.Client, value: str) -> None:
    response = http.get("/main/slow", params={"s": "0.05"},
                        headers={"x-request-timeout-seconds": value})
    assert response.status_code == 200


def test_zero_timeout_header_times_out_at_once(http: httpx.Client) -> None:
    response = http.get("/main/slow", params={"s": "1"},
                        headers={"x-request-timeout-seconds": "0"})
    assert response.status_code == 408


# -- client disconnect ---------------------------------------------------------------------


def _counts(counts: Any) -> dict[str, int]:
    """Main's hang/work counters: started, cancelled, finished."""
    found: dict[str, int] = counts.remote().result(timeout_s=10)
    return found


def test_client_disconnect_cancels_the_request_at_the_replica(apps: Apps) -> None:
    counts = apps.main.options(method_name="counts")
    before = counts.remote().result(timeout_s=10)
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("GET", "/main/hang"))
        eventually(lambda: _counts(counts)["started"] > before["started"], 5.0,
                   what="the request started at the replica")
    # the close cancels the 60 s handler within the wait's 2 s
    eventually(lambda: _counts(counts)["cancelled"] > before["cancelled"], 2.0,
               what="the request cancelled at the replica")


def test_disconnect_disabled_header_lets_the_request_finish(apps: Apps) -> None:
    counts = apps.main.options(method_name="counts")
    before = counts.remote().result(timeout_s=10)
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("GET", "/main/work?s=0.8",
                                {"x-request-disconnect-disabled": "?1"}))
        eventually(lambda: _counts(counts)["started"] > before["started"], 5.0,
                   what="the request started at the replica")
    eventually(lambda: _counts(counts)["finished"] > before["finished"], 3.0,
               what="the request finished at the replica")
    assert counts.remote().result(timeout_s=10)["cancelled"] == before["cancelled"]


def test_disconnect_disabled_request_is_still_bound_by_its_timeout(apps: Apps) -> None:
    counts = apps.main.options(method_name="counts")
    before = counts.remote().result(timeout_s=10)
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("GET", "/main/work?s=30", {
            "x-request-disconnect-disabled": "?1", "x-request-timeout-seconds": "1"}))
        eventually(lambda: _counts(counts)["started"] > before["started"], 5.0,
                   what="the request started at the replica")
    # a hold to prove a negative: the close does not cancel it (disconnect disabled)...
    time.sleep(0.3)
    assert counts.remote().result(timeout_s=10)["cancelled"] == before["cancelled"]
    # ...its 1 s timeout does
    eventually(lambda: _counts(counts)["cancelled"] > before["cancelled"], 3.0,
               what="the request cancelled at the replica")


def test_timeout_cancels_the_request_at_the_replica(apps: Apps, http: httpx.Client) -> None:
    counts = apps.main.options(method_name="counts")
    before = counts.remote().result(timeout_s=10)
    response = http.get("/main/hang", headers={"x-request-timeout-seconds": "0.3"})
    assert response.status_code == 408
    eventually(lambda: _counts(counts)["cancelled"] > before["cancelled"], 2.0,
               what="the request cancelled at the replica")


def test_disconnect_mid_stream_cancels_the_stream_at_the_replica(apps: Apps) -> None:
    counts = apps.main.options(method_name="counts")
    before = counts.remote().result(timeout_s=10)
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("GET", "/main/stream-hang"))
        assert b"first" in conn.read_raw_until(lambda d: b"first" in d, 5)
        eventually(lambda: _counts(counts)["started"] > before["started"], 5.0,
                   what="the request started at the replica")
    eventually(lambda: _counts(counts)["cancelled"] > before["cancelled"], 2.0,
               what="the request cancelled at the replica")


def test_timeout_mid_stream_resets_the_connection_and_cancels(apps: Apps) -> None:
    counts = apps.main.options(method_name="counts")
    before = counts.remote().result(timeout_s=10)
    with RawConnection(apps.port) as conn:
        start = time.monotonic()
        conn.send(request_bytes("GET", "/main/stream-hang", {"x-request-timeout-seconds": "0.5"}))
        received = conn.read_raw_until(lambda d: b"first" in d, 5)
        assert received.startswith(b"HTTP/1.1 200 ")
        conn.sock.settimeout(5)
        # As Ray's proxy: a stream past its timeout ends with a reset, not a clean close
        # (and never with the last chunk).
        with pytest.raises(ConnectionResetError):
            while chunk := conn.sock.recv(65536):
                received += chunk
        elapsed = time.monotonic() - start
        # the wait under test: the 0.5 s timeout cuts a stream that would hang for 60 s
        # (generous upper bound; each recv above gives up after 5 s anyway)
        assert 0.45 <= elapsed < 4.0, elapsed
        assert not received.endswith(b"0\r\n\r\n")
    eventually(lambda: _counts(counts)["cancelled"] > before["cancelled"], 2.0,
               what="the request cancelled at the replica")


# -- malformed requests --------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
    b"GET /main/str HTTP/1.1\r\nBad Header Line\r\n\r\n",
])
def test_malformed_request_is_400_and_closes(apps: Apps, http: httpx.Client,
                                             garbage: bytes) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(garbage)
        response = conn.read_response()
        assert response.status == 400
        assert response.headers.get("connection") == "close"
        assert response.headers["x-request-id"]
        assert conn.closed_by_peer(5.0)
    assert http.get("/-/healthz").status_code == 200
    assert http.get("/main/str").text == "hello, text"


def test_unparseable_request_target_is_400_and_the_connection_goes_on(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(b"GET http://h:99999/main/str HTTP/1.1\r\nHost: x\r\n\r\n"
                  + request_bytes("GET", "/main/str"))
        bad, good = conn.read_responses(2, timeout_s=5)
        assert bad.status == 400
        assert bad.headers["x-request-id"]
        assert good.status == 200
        assert good.body == b"hello, text"


def test_connect_is_refused_with_400(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        response = conn.read_response(timeout_s=5)
        assert response.status == 400
        assert conn.closed_by_peer(5.0)


def test_upgrade_request_is_served_as_plain_http_then_closed(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(b"GET /main/str HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                  b"Upgrade: websocket\r\n\r\n\x81\x05hello")
        response = conn.read_response(timeout_s=5)
        assert response.status == 200
        assert response.body == b"hello, text"
        assert response.headers.get("connection") == "close"
        assert conn.closed_by_peer(5.0)  # one answer only, then the close


def test_malformed_request_after_a_good_one_answers_both(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("GET", "/main/slow?s=0.2") + b"GARBAGE\r\n\r\n")
        first, second = conn.read_responses(2)
        assert first.status == 200
        assert first.body == b"slept 0.2"
        assert second.status == 400
        assert conn.closed_by_peer(5.0)


# -- request ids ---------------------------------------------------------------------------


def test_every_response_has_a_request_id_and_a_given_one_is_echoed(
        http: httpx.Client) -> None:
    ids = set()
    for path in ("/main/dict", "/main/boom", "/nowhere", "/-/healthz", "/-/routes",
                 "/main/stream"):
        response = http.get(path)
        assert response.headers.get("x-request-id"), path
        ids.add(response.headers["x-request-id"])
    assert len(ids) == 6
    for path in ("/main/dict", "/main/boom", "/nowhere", "/-/healthz", "/main/stream",
                 "/main/json-response"):
        response = http.get(path, headers={"x-request-id": "my-id-123"})
        assert response.headers.get_list("x-request-id") == ["my-id-123"], path
    # The handler sees the same id the client gave.
    echoed = http.get("/main/echo", headers={"x-request-id": "abc-42"}).json()
    assert echoed["headers"]["x-request-id"] == "abc-42"


# -- keep-alive and pipelining -------------------------------------------------------------


def test_keep_alive_reuses_one_connection_with_httpx(http: httpx.Client) -> None:
    addresses = set()
    for i in range(5):
        response = http.get("/main/echo", params={"i": str(i)})
        assert response.status_code == 200
        assert response.json()["query"] == {"i": str(i)}
        assert response.headers.get("connection") != "close"
        stream = response.extensions["network_stream"]
        addresses.add(stream.get_extra_info("client_addr"))
    assert len(addresses) == 1


def test_keep_alive_on_a_raw_socket(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        for path, body in (("/main/str", b"hello, text"), ("/-/healthz", b"success"),
                           ("/main/slow?s=0", b"slept 0"), ("/main/str", b"hello, text")):
            conn.send(request_bytes("GET", path))
            response = conn.read_response()
            assert response.status == 200
            assert response.body == body
        # A request asking to close gets its answer and then the close.
        conn.send(request_bytes("GET", "/main/str", {"Connection": "close"}))
        response = conn.read_response()
        assert response.body == b"hello, text"
        assert response.headers.get("connection") == "close"
        assert conn.closed_by_peer(5.0)


def test_http_1_0_closes_after_the_response(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(b"GET /main/str HTTP/1.0\r\n\r\n")
        response = conn.read_response()
        assert response.status == 200
        assert response.body == b"hello, text"
        assert conn.closed_by_peer(5.0)


def test_pipelined_requests_are_answered_in_order(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("GET", "/main/slow?s=0.3", {"x-request-id": "p1"})
                  + request_bytes("GET", "/main/slow?s=0", {"x-request-id": "p2"})
                  + request_bytes("GET", "/main/str", {"x-request-id": "p3"}))
        responses = conn.read_responses(3)
        assert [r.headers["x-request-id"] for r in responses] == ["p1", "p2", "p3"]
        assert [r.body for r in responses] == [b"slept 0.3", b"slept 0", b"hello, text"]
        assert all(r.status == 200 for r in responses)


def test_pipelined_mix_of_builtin_error_and_stream(apps: Apps) -> None:
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("GET", "/main/stream?n=2")
                  + request_bytes("GET", "/nowhere")
                  + request_bytes("GET", "/-/healthz")
                  + request_bytes("POST", "/main/echo", body=b'{"a": 1}')
                  + request_bytes("GET", "/main/boom"))
        responses = conn.read_responses(5)
        assert [r.status for r in responses] == [200, 404, 200, 200, 500]
        assert responses[0].body == b"tick 0\ntick 1\n"
        assert responses[2].body == b"success"
        assert json.loads(responses[3].body)["json"] == {"a": 1}


def test_pipelined_overload_answers_in_order(apps: Apps) -> None:
    with httpx.Client(base_url=apps.url, timeout=30) as warm:
        assert warm.get("/busy").status_code == 200
    with RawConnection(apps.port) as conn:
        conn.send(b"".join(request_bytes("GET", "/busy", {"x-request-id": f"b{i}"})
                           for i in range(4)))
        responses = conn.read_responses(4, timeout_s=10)
    assert [r.headers["x-request-id"] for r in responses] == ["b0", "b1", "b2", "b3"]
    # One runs, one queues; the two beyond the queue are rejected but wait their turn.
    assert [r.status for r in responses] == [200, 200, 503, 503]
    assert responses[0].body == b"done"
    assert "retry-after" not in responses[2].headers  # Ray's count bound, none configured


# -- what the handler sees -----------------------------------------------------------------


def test_post_body_headers_query_and_path_reach_the_handler(http: httpx.Client) -> None:
    response = http.post("/main/echo/sub/path?x=1&m=a&m=b", json={"hello": ["world", 1]},
                         headers={"x-custom-header": "value 1"})
    assert response.status_code == 200
    seen = response.json()
    assert seen["method"] == "POST"
    assert seen["path"] == "/main/echo/sub/path"
    assert seen["root_path"] == "/main"
    assert seen["query"]["x"] == "1"
    assert seen["query_multi"] == ["a", "b"]
    assert seen["headers"]["x-custom-header"] == "value 1"
    assert seen["json"] == {"hello": ["world", 1]}
    assert json.loads(seen["body"]) == {"hello": ["world", 1]}


def test_percent_encoded_path_and_query(http: httpx.Client) -> None:
    response = http.get("/main/echo/a%20b", params={"q": "x y&z"})
    seen = response.json()
    assert seen["path"] == "/main/echo/a b"
    assert seen["query"] == {"q": "x y&z"}


def test_chunked_request_body_reaches_the_handler(apps: Apps) -> None:
    payload = json.dumps({"numbers": list(range(200))}).encode()
    with RawConnection(apps.port) as conn:
        conn.send(request_bytes("POST", "/main/echo", {"Transfer-Encoding": "chunked"})
                  + chunked(payload, 100))
        response = conn.read_response()
        assert response.status == 200
        assert json.loads(response.body)["json"] == {"numbers": list(range(200))}


def test_large_body_within_the_default_limit(http: httpx.Client) -> None:
    payload = b"x" * 300_000
    response = http.post("/main/echo", content=b'"' + payload + b'"')
    assert response.status_code == 200
    assert len(response.json()["json"]) == len(payload)


def test_route_prefix_matches_whole_segments(http: httpx.Client) -> None:
    assert http.get("/main").status_code == 200
    assert http.get("/main/").status_code == 200
    assert http.get("/mainly").status_code == 404


def test_raw_path_keeps_the_bytes_sent(client: httpx.Client) -> None:
    """ASGI apps see %2F in raw_path even though path is decoded."""
    serve.run(RawPath.bind(), name="rawpath", route_prefix="/rawpath")
    data = client.get("/rawpath/a%2Fb").json()
    assert data == {"path": "/rawpath/a/b", "raw_path": "/rawpath/a%2Fb"}
    serve.delete("rawpath")


@serve.deployment
class RawPath:
    def __call__(self, request: Any) -> dict[str, str]:
        return {"path": request.scope["path"], "raw_path": request.scope["raw_path"].decode()}
