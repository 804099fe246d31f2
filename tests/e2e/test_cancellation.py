"""Cancelling a request cancels the handle calls it made, down the call tree, as Ray
Serve does: by `response.cancel()`, by the HTTP request timeout, by the client going
away; queued, running or streaming; from async and sync methods.

The replicas tell the test what happened to them with marker files in a temporary
directory (`<name>.started`, `<name>.cancelled`): a cancelled handler's clean-up writes
its file, as Ray's tests have theirs send a signal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from surge import serve
from surge.model import DeploymentId
from surge.router.runtime import current_runtime
from surge.serve.exceptions import RequestCancelledError
from tests.e2e.conftest import Running
from tests.e2e.test_http import RawConnection, request_bytes
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

HANG_S = 100.0  # a handler that is not cancelled keeps its replica this long
T = TypeVar("T")


def _mark(folder: str, name: str) -> None:
    (Path(folder) / name).touch()


def _marked(folder: Path, name: str) -> bool:
    return (folder / name).exists()


async def _watched(folder: str, tag: str, work: Callable[[], Awaitable[T]]) -> T:
    """Mark `<tag>.started`, then await `work()`; mark `<tag>.cancelled` if cancelled."""
    _mark(folder, f"{tag}.started")
    try:
        return await work()
    except asyncio.CancelledError:
        _mark(folder, f"{tag}.cancelled")
        raise


async def _hang(folder: str, tag: str) -> None:
    """Sleep HANG_S, watched as `tag`."""
    await _watched(folder, tag, lambda: asyncio.sleep(HANG_S))


# One request at a time, so that a hung one is seen; queued calls wait by count (not by
# the expected wait, which would refuse the queued child outright and prove nothing).
@serve.deployment(max_ongoing_requests=1, max_queued_requests=10)
class Leaf:
    """Hangs until cancelled, saying so; one request at a time, so a hung one is seen."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.calls = 0

    async def __call__(self, tag: str = "leaf") -> str:
        self.calls += 1
        await _hang(self.folder, tag)
        return "slept"

    async def chunks(self, tag: str = "leaf-stream") -> Any:
        yield "first"
        await _hang(self.folder, tag)
        yield "second"

    async def hold(self, tag: str = "hold") -> str:
        """Hold a slot until the `release` file exists (a gate across processes)."""
        async def released() -> str:
            while not (Path(self.folder) / "release").exists():
                await asyncio.sleep(0.02)
            return "held"

        self.calls += 1
        return await _watched(self.folder, tag, released)

    def ping(self) -> str:
        return "pong"

    def count(self) -> int:
        return self.calls


@serve.deployment
class Middle:
    def __init__(self, leaf: Any, folder: str) -> None:
        self.leaf = leaf
        self.folder = folder

    async def __call__(self) -> str:
        return str(await _watched(self.folder, "middle", self.leaf.remote))

    async def ping(self) -> str:
        return str(await self.leaf.ping.remote())


@serve.deployment
class Ingress:
    def __init__(self, middle: Any, leaf: Any, folder: str) -> None:
        self.middle = middle
        self.leaf = leaf
        self.folder = folder

    async def __call__(self, request: Any = None) -> str:
        return await self.chain()

    async def warm(self) -> str:
        """Through every hop once, so that each router knows its replicas."""
        return str(await self.middle.ping.remote()) + str(await self.leaf.ping.remote())

    async def chain(self) -> str:
        return str(await _watched(self.folder, "ingress", self.middle.remote))

    async def fire_and_forget(self) -> str:
        self.leaf.remote()  # dropped at once: still the request's call
        await asyncio.sleep(HANG_S)
        return "slept"

    async def queue_behind_hold(self) -> str:
        self.leaf.remote("queued")  # waits at this replica's router behind `hold`
        await asyncio.sleep(HANG_S)
        return "slept"

    async def stream_child(self) -> str:
        items = self.leaf.options(stream=True).chunks.remote()
        async for _item in items:
            pass
        return "streamed"

    def leaf_router(self) -> list[int]:
        """[queued, in flight] at this replica's router for Leaf."""
        router = current_runtime().routers[DeploymentId("cancel-chain", "Leaf")]
        return [router.queued, router.in_flight]

    def sync_chain(self) -> str:
        return str(self.leaf.remote("sync-child").result())


@pytest.fixture
def chain(surge_instance: Running, tmp_path: Path) -> Any:
    leaf = Leaf.bind(str(tmp_path))
    handle = serve.run(Ingress.bind(Middle.bind(leaf, str(tmp_path)), leaf, str(tmp_path)),
                       name="cancel-chain", route_prefix="/cancel-chain")
    assert handle.warm.remote().result(timeout_s=30) == "pongpong"
    yield handle
    serve.delete("cancel-chain")


def _leaf_is_free() -> None:
    """Leaf serves one request at a time: a ping answered at once means nothing hangs."""
    leaf = serve.get_deployment_handle("Leaf", "cancel-chain")
    assert leaf.ping.remote().result(timeout_s=10) == "pong"


def _wait_for(folder: Path, *names: str, timeout_s: float = 10.0) -> None:
    for name in names:
        eventually(lambda name=name: _marked(folder, name), timeout_s, what=name)


def _cancel_once_started(response: Any, folder: Path, started: str, *cancelled: str) -> None:
    """Cancels `response` once the call it made marked `started`: the response ends
    cancelled, each of `cancelled` is marked (that hop saw asyncio.CancelledError), and
    the leaf's replica is free again."""
    _wait_for(folder, started)
    response.cancel()
    with pytest.raises(RequestCancelledError):
        response.result(timeout_s=10)
    _wait_for(folder, *cancelled)
    _leaf_is_free()


def test_response_cancel_cancels_a_chain_of_three(chain: Any, tmp_path: Path) -> None:
    _cancel_once_started(chain.chain.remote(), tmp_path, "leaf.started",
                         "ingress.cancelled", "middle.cancelled", "leaf.cancelled")


def test_request_timeout_cancels_the_chain(chain: Any, tmp_path: Path,
                                           surge_instance: Running) -> None:
    with httpx.Client(base_url=surge_instance.url, timeout=30) as http:
        response = http.get("/cancel-chain", headers={"x-request-timeout-seconds": "1"})
    assert response.status_code == 408
    _wait_for(tmp_path, "leaf.started", "ingress.cancelled", "middle.cancelled",
              "leaf.cancelled")
    _leaf_is_free()


def test_client_disconnect_cancels_the_chain(chain: Any, tmp_path: Path,
                                             surge_instance: Running) -> None:
    with RawConnection(surge_instance.http_port) as conn:
        conn.send(request_bytes("GET", "/cancel-chain"))
        _wait_for(tmp_path, "leaf.started")
    _wait_for(tmp_path, "ingress.cancelled", "middle.cancelled", "leaf.cancelled")
    _leaf_is_free()


def test_a_dropped_response_is_cancelled_with_its_request(chain: Any,
                                                          tmp_path: Path) -> None:
    _cancel_once_started(chain.fire_and_forget.remote(), tmp_path, "leaf.started",
                         "leaf.cancelled")


def test_a_call_queued_at_the_parents_router_never_runs(chain: Any,
                                                        tmp_path: Path) -> None:
    leaf = serve.get_deployment_handle("Leaf", "cancel-chain")
    held = leaf.hold.remote()
    _wait_for(tmp_path, "hold.started")
    before = leaf.count.remote()  # queued behind `hold` too: it counts after it
    response = chain.queue_behind_hold.remote()
    # Its child waits for Leaf's one slot at Ingress's router: queued, or in flight
    # while a full replica bounces it back.
    eventually(lambda: sum(chain.leaf_router.remote().result(timeout_s=10)) == 1, 10,
               what="the child pending at Ingress's router")
    response.cancel()
    with pytest.raises(RequestCancelledError):
        response.result(timeout_s=10)
    # Left Ingress's router (a full replica bounces it back to the queue until then),
    # as Ray's test checks that no call stays pending assignment.
    eventually(lambda: chain.leaf_router.remote().result(timeout_s=10) == [0, 0], 10,
               what="nothing queued or in flight for Leaf at Ingress's router")
    (tmp_path / "release").touch()
    assert held.result(timeout_s=10) == "held"
    assert before.result(timeout_s=10) == 1  # `hold`
    for _ in range(3):  # the queued child was dropped, not sent once the slot freed
        assert leaf.count.remote().result(timeout_s=10) == 1
    assert not _marked(tmp_path, "queued.started")


def test_a_streaming_child_is_cancelled(chain: Any, tmp_path: Path) -> None:
    _cancel_once_started(chain.stream_child.remote(), tmp_path, "leaf-stream.started",
                         "leaf-stream.cancelled")


def test_a_sync_methods_child_is_cancelled(chain: Any, tmp_path: Path) -> None:
    _cancel_once_started(chain.sync_chain.remote(), tmp_path, "sync-child.started",
                         "sync-child.cancelled")


@serve.deployment
class Keeper:
    """Makes one call in its constructor (no request's) and one per request."""

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf
        self.out_of_band = leaf.hold.remote("out-of-band")

    async def __call__(self) -> str:
        return str(await self.leaf.hold.remote("in-request"))

    async def out_of_band_result(self) -> str:
        return str(await self.out_of_band)


def test_a_call_made_outside_any_request_is_not_cancelled(surge_instance: Running,
                                                          tmp_path: Path) -> None:
    leaf = Leaf.options(max_ongoing_requests=2).bind(str(tmp_path))
    keeper = serve.run(Keeper.bind(leaf), name="cancel-keeper", route_prefix=None)
    try:
        response = keeper.remote()
        _wait_for(tmp_path, "out-of-band.started", "in-request.started")
        response.cancel()
        _wait_for(tmp_path, "in-request.cancelled")
        (tmp_path / "release").touch()
        assert keeper.out_of_band_result.remote().result(timeout_s=10) == "held"
        assert not _marked(tmp_path, "out-of-band.cancelled")
    finally:
        serve.delete("cancel-keeper")
