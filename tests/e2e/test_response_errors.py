"""The exceptions a DeploymentResponse raises are Ray Serve's: a cancelled response
raises RequestCancelledError (its awaiting caller is not cancelled), a blocking method
inside an event loop raises RuntimeError, and a response nested inside an argument
raises RayServeException ("not serializable"), where surge used to raise
asyncio.CancelledError, RayServeException and a pickling TypeError."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

from surge import serve
from surge.serve.exceptions import RayServeException, RequestCancelledError
from tests.e2e.conftest import Running

pytestmark = pytest.mark.e2e

IN_LOOP = "should not be called from within an `asyncio` event loop"


@serve.deployment
class Downstream:
    def __init__(self) -> None:
        self.started = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return [args, kwargs]

    async def numbers(self) -> Any:
        yield 1
        yield 2

    async def hang(self) -> str:
        self.started += 1
        await asyncio.sleep(100)
        return "slept"

    def hung(self) -> int:
        return self.started


@serve.deployment
class Caller:
    def __init__(self, downstream: Any) -> None:
        self.downstream = downstream

    async def cancel_then_await(self) -> list[str]:
        seen = []
        # The first call: this replica's router has no replica set yet (the slow path).
        first = self.downstream.hang.remote()
        first.cancel()
        try:
            await first
        except RequestCancelledError:
            seen.append("queued: RequestCancelledError")
        # A call running on its replica.
        running = self.downstream.hang.remote()
        while await self.downstream.hung.remote() < 1:
            pass
        running.cancel()
        try:
            await running
        except RequestCancelledError:
            seen.append("running: RequestCancelledError")
        try:
            await running  # again: the same answer
        except RequestCancelledError:
            seen.append("again: RequestCancelledError")
        return seen  # and this caller was not cancelled

    async def block_in_loop(self) -> list[str]:
        seen = []
        response = self.downstream.remote(1)
        try:
            response.result()
        except RuntimeError as exc:
            seen.append(str(exc))
        items = self.downstream.options(stream=True).numbers.remote()
        try:
            for _ in items:
                pass
        except RuntimeError as exc:
            seen.append(str(exc))
        assert await response == [(1,), {}]  # both still usable the async way
        assert [item async for item in items] == [1, 2]
        return seen

    async def nested(self) -> str:
        try:
            await self.downstream.remote([self.downstream.remote(1)])
        except RayServeException as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    async def top_level(self) -> Any:
        return await self.downstream.remote(self.downstream.remote(1),
                                            key=self.downstream.remote(2))


@pytest.fixture
def caller(surge_instance: Running) -> Any:
    handle = serve.run(Caller.bind(Downstream.bind()), name="response-errors",
                       route_prefix=None)
    yield handle
    serve.delete("response-errors")


def test_awaiting_a_cancelled_response_raises_request_cancelled(caller: Any) -> None:
    assert caller.cancel_then_await.remote().result(timeout_s=30) == [
        "queued: RequestCancelledError", "running: RequestCancelledError",
        "again: RequestCancelledError"]


def test_blocking_methods_inside_an_event_loop_raise_runtime_error(caller: Any) -> None:
    seen = caller.block_in_loop.remote().result(timeout_s=30)
    assert len(seen) == 2
    assert all(IN_LOOP in message for message in seen), seen
    assert "Use `await response` instead." in seen[0]

    async def in_the_drivers_loop() -> None:  # any running loop, not only surge's
        response = caller.block_in_loop.remote()
        with pytest.raises(RuntimeError, match=IN_LOOP):
            response.result(timeout_s=30)
        assert len(await response) == 2

    asyncio.run(in_the_drivers_loop())


def test_a_nested_response_is_not_serializable(caller: Any) -> None:
    message = caller.nested.remote().result(timeout_s=30)
    assert message.startswith("RayServeException: `DeploymentResponse` is not serializable")
    assert "only pass `DeploymentResponse` objects as top level arguments" in message
    response = caller.top_level.remote()
    with pytest.raises(RayServeException, match="`DeploymentResponse` is not serializable"):
        pickle.dumps(response)
    # Top-level ones are resolved first, positional and keyword alike.
    assert response.result(timeout_s=30) == [([(1,), {}],), {"key": [(2,), {}]}]
