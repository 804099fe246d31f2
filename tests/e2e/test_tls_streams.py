"""A request's own stream over HTTPS: a WebSocket over TLS (wss, the app sees scheme
`wss`) and a streamed upload read part by part."""

from __future__ import annotations

import hashlib
import os
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, WebSocket
from websockets.sync.client import connect

from surge import serve
from tests.certs import Pki, make_pki
from tests.e2e.conftest import Running, answer_once, running_instance

pytestmark = pytest.mark.e2e

app = FastAPI()


@serve.deployment
@serve.ingress(app)
class Secure:
    @app.websocket("/ws")
    async def ws(self, websocket: WebSocket) -> None:
        await answer_once(websocket, lambda text: f"{websocket.scope['scheme']}:{text}")

    @app.post("/upload")
    async def upload(self, request: Request) -> dict[str, Any]:
        digest, parts = hashlib.sha256(), 0
        async for chunk in request.stream():
            digest.update(chunk)
            parts += 1
        return {"sha256": digest.hexdigest(), "parts": parts}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def instance(pki: Pki) -> Iterator[Running]:
    with running_instance(ssl_certfile=str(pki.cert), ssl_keyfile=str(pki.key)) as running:
        serve.run(Secure.bind(), name="secure", route_prefix="/secure")
        yield running


def test_a_websocket_over_tls(instance: Running, pki: Pki) -> None:
    context = ssl.create_default_context(cafile=str(pki.ca))
    with connect(f"wss://127.0.0.1:{instance.http_port}/secure/ws", ssl=context) as ws:
        ws.send("hi")
        assert ws.recv(timeout=10) == "wss:hi"


def test_a_streamed_upload_over_tls(instance: Running, pki: Pki) -> None:
    body = os.urandom(8 << 20)
    answer = httpx.post(f"https://127.0.0.1:{instance.http_port}/secure/upload",
                        content=body, verify=ssl.create_default_context(cafile=str(pki.ca)),
                        timeout=60).json()
    assert answer["sha256"] == hashlib.sha256(body).hexdigest() and answer["parts"] > 1
