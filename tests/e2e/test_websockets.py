"""WebSockets through the proxy to a FastAPI app, with a real client (`websockets`).

Echo (text, bytes, subprotocols, the app's headers), close codes both ways, a client
that vanishes, a message over the limit (1009), the idle limit (1001), a replica killed
mid-connection (1011), a full deployment (503 before the upgrade), many sockets at
once, and flow control both ways: a slow app holds its client back and a client that
does not read holds a chatty app back, at bounded memory.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from surge import serve
from tests.e2e.conftest import Running, running_instance
from tests.e2e.procs import rss, surge_processes
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

MAX_MESSAGE = 256 * 1024
IDLE_S = 2.0
CHUNK = 64 * 1024

app = FastAPI()


@serve.deployment(max_ongoing_requests=1000)
@serve.ingress(app)
class Sockets:
    def __init__(self) -> None:
        self.disconnects: list[int] = []
        self.sent = 0
        self.received = 0

    @app.websocket("/echo")
    async def echo(self, ws: WebSocket) -> None:
        offered = ws.scope["subprotocols"]
        await ws.accept(subprotocol=offered[0] if offered else None,
                        headers=[(b"x-app", b"sockets")])
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    self.disconnects.append(message["code"])
                    return
                if message.get("text") == "close-please":
                    await ws.close(code=4001, reason="asked to")
                    return
                if message.get("text") is not None:
                    await ws.send_text(message["text"])
                else:
                    await ws.send_bytes(message["bytes"])
        except WebSocketDisconnect as exc:
            self.disconnects.append(exc.code)

    @app.websocket("/deny")
    async def deny(self, ws: WebSocket) -> None:
        await ws.close(code=1008)

    @app.websocket("/slow")
    async def slow(self, ws: WebSocket) -> None:
        """Takes a message every 50 ms: its client must be held back."""
        await ws.accept()
        try:
            while True:
                data = await ws.receive_bytes()
                self.received += len(data)
                await asyncio.sleep(0.05)
        except WebSocketDisconnect:
            pass

    @app.websocket("/chatty")
    async def chatty(self, ws: WebSocket) -> None:
        """Sends as fast as it may: a client that does not read must hold it back."""
        await ws.accept()
        block = b"c" * CHUNK
        try:
            while True:
                await ws.send_bytes(block)
                self.sent += CHUNK
        except (WebSocketDisconnect, OSError):
            pass

    @app.get("/stats")
    def stats(self) -> dict[str, Any]:
        return {"disconnects": self.disconnects, "sent": self.sent, "received": self.received}


solo = FastAPI()


@serve.deployment(max_ongoing_requests=1, max_queued_requests=0)
@serve.ingress(solo)
class Solo:
    @solo.websocket("/")
    async def hold(self, ws: WebSocket) -> None:
        await ws.accept()
        try:
            while True:
                await ws.send_text(await ws.receive_text())
        except WebSocketDisconnect:
            pass


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    with running_instance(websocket_max_message_bytes=MAX_MESSAGE,
                          websocket_idle_timeout_s=IDLE_S) as running:
        serve.run(Sockets.bind(), name="ws", route_prefix="/ws")
        serve.run(Solo.bind(), name="solo", route_prefix="/solo")
        yield running


def url(instance: Running, path: str) -> str:
    return f"ws://127.0.0.1:{instance.http_port}{path}"


def stats(instance: Running) -> dict[str, Any]:
    return dict(httpx.get(f"{instance.url}/ws/stats", timeout=10).json())


def test_echo_text_and_bytes_with_a_subprotocol(instance: Running) -> None:
    with connect(url(instance, "/ws/echo"), subprotocols=["chat.v2", "chat.v1"]) as ws:
        assert ws.subprotocol == "chat.v2"
        assert ws.response.headers["x-app"] == "sockets"
        assert ws.response.headers["x-request-id"]
        ws.send("hello")
        assert ws.recv(timeout=10) == "hello"
        ws.send("héllo ✓")
        assert ws.recv(timeout=10) == "héllo ✓"
        ws.send(b"\x00\x01" * 1000)
        assert ws.recv(timeout=10) == b"\x00\x01" * 1000
        big = os.urandom(MAX_MESSAGE - 10)  # under the limit, over a window
        ws.send(big)
        assert ws.recv(timeout=10) == big


def test_the_apps_close_code_reaches_the_client(instance: Running) -> None:
    with connect(url(instance, "/ws/echo")) as ws:
        ws.send("close-please")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "asked to")


def test_a_close_before_the_accept_is_a_403(instance: Running) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(url(instance, "/ws/deny"))
    assert refused.value.response.status_code == 403


def test_the_clients_close_code_and_its_vanishing_reach_the_app(instance: Running) -> None:
    before = len(stats(instance)["disconnects"])
    with connect(url(instance, "/ws/echo")) as ws:
        ws.send("x")
        ws.recv(timeout=10)
        ws.close(code=4002, reason="client done")
    eventually(lambda: 4002 in stats(instance)["disconnects"][before:], 10,
               what="the app to hear the client's 4002")
    with connect(url(instance, "/ws/echo")) as ws:
        ws.send("x")
        ws.recv(timeout=10)
        ws.socket.shutdown(socket.SHUT_RDWR)  # gone without a close frame
    eventually(lambda: 1006 in stats(instance)["disconnects"][before:], 10,
               what="the app to hear 1006")


def test_a_message_over_the_limit_closes_with_1009(instance: Running) -> None:
    with connect(url(instance, "/ws/echo"), max_size=None) as ws:
        ws.send(b"x" * (MAX_MESSAGE + 1))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    eventually(lambda: 1009 in stats(instance)["disconnects"], 10, what="the app to hear 1009")


def test_an_idle_socket_is_closed_with_1001(instance: Running) -> None:
    with connect(url(instance, "/ws/echo"), ping_interval=None) as ws:
        ws.send("x")
        ws.recv(timeout=10)
        started = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=IDLE_S + 5)
        waited = time.monotonic() - started
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    assert IDLE_S - 0.1 <= waited < IDLE_S + 5  # swept about once a second


def test_a_full_deployment_answers_503_before_the_upgrade(instance: Running) -> None:
    with connect(url(instance, "/solo/")) as first:
        first.send("hold")
        assert first.recv(timeout=10) == "hold"
        with pytest.raises(InvalidStatus) as refused:
            connect(url(instance, "/solo/"))
        assert refused.value.response.status_code == 503
        assert "retry-after" not in refused.value.response.headers  # as Ray, by default


def test_many_sockets_at_once(instance: Running) -> None:
    sockets, rounds = 200, 5

    async def one(i: int) -> int:
        async with aconnect(url(instance, "/ws/echo")) as ws:
            for r in range(rounds):
                await ws.send(f"{i}:{r}")
                assert await ws.recv() == f"{i}:{r}"
        return i

    async def all_of_them() -> list[int]:
        return await asyncio.gather(*(one(i) for i in range(sockets)))

    started = time.monotonic()
    assert sorted(asyncio.run(asyncio.wait_for(all_of_them(), 60))) == list(range(sockets))
    elapsed = time.monotonic() - started
    print(f"{sockets} sockets x {rounds} echoes in {elapsed:.2f}s")


def _proxy_and_replica(app_name: str) -> tuple[int, int]:
    titles = surge_processes(os.getpid())
    proxy = next(pid for pid, title in titles.items() if title.startswith("surge:proxy"))
    replica = next(pid for pid, title in titles.items()
                   if title.startswith(f"surge:replica:{app_name}:"))
    return proxy, replica


def test_a_slow_app_holds_its_client_back(instance: Running) -> None:
    proxy, replica = _proxy_and_replica("ws")
    before = rss(proxy), rss(replica)
    sent = [0]

    def flood(ws: Any) -> None:
        block = b"s" * CHUNK
        try:
            for _ in range(2000):  # 125 MiB, far more than any buffer on the way
                ws.send(block)
                sent[0] += CHUNK
        except (ConnectionClosed, OSError):
            pass  # cut off below

    with connect(url(instance, "/ws/slow")) as ws:
        sender = threading.Thread(target=flood, args=(ws,), daemon=True)
        sender.start()
        time.sleep(3.0)  # the behaviour: a client flooding a slow app for 3 s
        received = stats(instance)["received"]
        after = rss(proxy), rss(replica)
        ws.socket.shutdown(socket.SHUT_RDWR)
        sender.join(10)
    print(f"\nslow app: took {received >> 20} MiB in 3 s, the client {sent[0] - received >> 20} "
          f"MiB ahead; RSS growth proxy {after[0] - before[0] >> 10} KiB, replica "
          f"{after[1] - before[1] >> 10} KiB")
    # The app takes ~20 messages a second; the client got a window and socket buffers ahead.
    assert sent[0] - received < 32 << 20, (sent[0], received)
    assert after[0] - before[0] < 20 << 20 and after[1] - before[1] < 20 << 20, (before, after)


def test_a_client_that_does_not_read_holds_a_chatty_app_back(instance: Running) -> None:
    with connect(url(instance, "/ws/chatty"), max_queue=1) as ws:
        ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        ws.recv(timeout=10)
        previous = [-1]

        def stopped() -> int | None:  # the same count one interval apart: it waits
            now = stats(instance)["sent"]
            still, previous[0] = now == previous[0], now
            return now if still else None

        first = eventually(stopped, 20, interval_s=0.5, what="the chatty app to stop sending")
        time.sleep(1.0)  # a hold to prove a negative: it sends nothing more
        second = stats(instance)["sent"]
        ws.socket.shutdown(socket.SHUT_RDWR)  # no close handshake behind 10 MiB unread
    print(f"\nchatty app: stopped after {first >> 10} KiB sent to a client that read 64 KiB")
    assert second == first  # it stopped: the window and the buffers are full
    assert first < 64 << 20


def test_a_replica_killed_mid_connection_closes_with_1011(instance: Running) -> None:
    with connect(url(instance, "/ws/echo")) as ws:
        ws.send("x")
        assert ws.recv(timeout=10) == "x"
        _, replica = _proxy_and_replica("ws")
        os.kill(replica, signal.SIGKILL)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011


SCRIPT = '''
from __future__ import annotations  # annotations are strings: the replica must resolve them

import sys

from fastapi import FastAPI, Request, WebSocket
from websockets.sync.client import connect

from surge import serve

app = FastAPI()


@serve.deployment
@serve.ingress(app)
class Script:
    @app.get("/hi")
    def hi(self, request: Request) -> str:
        return request.url.path

    @app.websocket("/")
    async def ws(self, websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()


port = int(sys.argv[1])
serve.start(http_options={"host": "127.0.0.1", "port": port})
serve.run(Script.bind(), name="script", route_prefix="/s")
import httpx

print("GET", httpx.get(f"http://127.0.0.1:{port}/s/hi").json())
with connect(f"ws://127.0.0.1:{port}/s/") as ws:
    ws.send("hello")
    print("WS", ws.recv(timeout=10))
serve.shutdown()
'''


def test_a_main_script_with_postponed_annotations(tmp_path: Any) -> None:
    """Class routes of a `__main__` script (pickled by value) under
    `from __future__ import annotations`: `request: Request` and `ws: WebSocket` resolve."""
    import subprocess
    import sys

    from tests.ports import free_port

    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "SURGE_ADDRESS": f"127.0.0.1:{free_port()}",
           "SURGE_LOG_LEVEL": "WARNING"}
    done = subprocess.run([sys.executable, str(script), str(free_port())], env=env,
                          capture_output=True, text=True, timeout=100, check=False)
    assert "GET /s/hi" in done.stdout and "WS hello" in done.stdout, done.stdout + done.stderr
