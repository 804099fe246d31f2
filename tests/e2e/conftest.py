"""Fixtures that start real surge instances on free loopback ports, and a WebSocket
route's one exchange for the apps they serve."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import WebSocket

from surge import serve
from tests.ports import free_port


@dataclass
class Running:
    http_port: int
    control_address: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"



async def answer_once(websocket: WebSocket, answer: Callable[[str], str]) -> None:
    """A WebSocket route's whole conversation: accept, read one text, send `answer` of
    it, close."""
    await websocket.accept()
    await websocket.send_text(answer(await websocket.receive_text()))
    await websocket.close()


@contextlib.contextmanager
def running_instance(start_options: dict[str, Any] | None = None,
                     **http_options: Any) -> Iterator[Running]:
    """Start surge on free loopback ports with these HTTP options (and other
    serve.start options); shut it down after."""
    control = f"127.0.0.1:{free_port()}"
    http_port = free_port()
    previous = os.environ.get("SURGE_ADDRESS")
    os.environ["SURGE_ADDRESS"] = control
    serve.start(http_options={"host": "127.0.0.1", "port": http_port, **http_options},
                **(start_options or {}))
    try:
        yield Running(http_port, control)
    finally:
        serve.shutdown()
        if previous is None:
            os.environ.pop("SURGE_ADDRESS", None)
        else:
            os.environ["SURGE_ADDRESS"] = previous


@pytest.fixture(scope="module")
def surge_instance() -> Iterator[Running]:
    """One surge instance (controller + proxy) per test module, this process its driver."""
    with running_instance() as running:
        yield running


@pytest.fixture
def client(surge_instance: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=surge_instance.url, timeout=30) as http:
        yield http
