"""`handle.method.choose_replica()` and `.dispatch()`, as Ray Serve 2.60 has them: pick a
replica (holding a slot on it), then send the call to exactly that replica; from inside a
deployment (Ray's own tests' use, two at once with an AsyncExitStack) and from a driver.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any

import pytest

from surge import serve
from surge.serve.handle import DeploymentHandle, ReplicaSelection
from tests.e2e.conftest import Running, running_instance
from tests.e2e.test_handles import driver_router
from tests.eventually import eventually, eventually_async

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    with running_instance() as running:
        yield running


@serve.deployment(num_replicas=2)
class Backend:
    def process(self, message: str) -> dict[str, str]:
        return {"actual": serve.get_replica_context().replica_id.unique_id,
                "response": message}

    async def count(self, n: int) -> AsyncIterator[str]:
        replica = serve.get_replica_context().replica_id.unique_id
        for i in range(n):
            yield f"{replica}:{i}"


@serve.deployment
class Proxy:
    """Picks a replica of each backend at once, tells each about the other, then sends
    (Ray's prefill/decode use)."""

    def __init__(self, first: DeploymentHandle, second: DeploymentHandle) -> None:
        self.first, self.second = first, second

    async def one(self, message: str) -> dict[str, Any]:
        async with self.first.process.choose_replica(message) as selection:
            assert isinstance(selection, ReplicaSelection)
            assert selection.node_ip
            answer = await self.first.process.dispatch(selection, message)
            return {"selected": selection.replica_id, **answer}

    async def both(self, message: str) -> list[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            picks = await asyncio.gather(
                stack.enter_async_context(self.first.process.choose_replica()),
                stack.enter_async_context(self.second.process.choose_replica()))
            answers = await asyncio.gather(*(
                handle.process.dispatch(pick, f"{message} (other: {other.replica_id})")
                for handle, pick, other in ((self.first, picks[0], picks[1]),
                                            (self.second, picks[1], picks[0]))))
            return [{"selected": pick.replica_id, **answer}
                    for pick, answer in zip(picks, answers, strict=True)]

    async def crossed(self) -> str:
        async with self.first.process.choose_replica() as selection:
            try:
                self.second.process.dispatch(selection, "x")
            except ValueError as exc:
                return str(exc)
        return "dispatched"


def test_dispatch_goes_to_the_chosen_replica_from_inside_a_deployment(instance: Running) -> None:
    handle = serve.run(Proxy.bind(Backend.bind(), Backend.options(name="Other").bind()),
                       name="pick", route_prefix=None)
    for i in range(6):
        answer = handle.one.remote(f"m{i}").result(timeout_s=30)
        assert answer["response"] == f"m{i}"
        assert answer["actual"] == answer["selected"]
    for _ in range(6):
        first, second = handle.both.remote("hi").result(timeout_s=30)
        for answer, other in ((first, second), (second, first)):
            assert answer["actual"] == answer["selected"]
            assert answer["response"] == f"hi (other: {other['selected']})"
    assert "for a different deployment" in handle.crossed.remote().result(timeout_s=30)


@serve.deployment(max_ongoing_requests=1)
class Single:
    def __call__(self) -> str:
        return serve.get_replica_context().replica_id.unique_id

    async def count(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i


def test_a_chosen_replica_holds_a_slot_until_dispatch_or_exit(instance: Running) -> None:
    handle = serve.run(Single.bind(), name="single", route_prefix=None)
    replica = handle.remote().result(timeout_s=30)
    router = driver_router("single", "Single")

    async def main() -> None:
        async with handle.choose_replica() as selection:
            assert selection.replica_id == replica
            assert (selection.node_ip, selection.port) == ("127.0.0.1", None)  # a Unix socket
            assert router.in_flight == 1
            queued = handle.remote()  # max_ongoing_requests=1: the held slot is the one
            await eventually_async(lambda: router.queued == 1, 10, what="a call queued")
            # a second choice waits for the slot, like a call; given up, it leaves the queue
            async with AsyncExitStack() as stack:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(stack.enter_async_context(handle.choose_replica()),
                                           0.2)
            await eventually_async(lambda: router.queued == 1, 10, what="only the call queued")
        # left without dispatching: the slot is free and the queued call runs
        assert await queued == replica
        async with handle.choose_replica() as selection:
            assert await handle.dispatch(selection) == replica
            with pytest.raises(RuntimeError, match="already been dispatched"):
                handle.dispatch(selection)
        async with handle.options(stream=True).count.choose_replica() as selection:
            # the options and method are the choosing handle's, not the dispatching one's
            stream = handle.dispatch(selection, 3)
            assert [i async for i in stream] == [0, 1, 2]

    asyncio.run(main())
    eventually(lambda: router.in_flight == 0 and router.queued == 0, 10,
               what="nothing held after the blocks")


def test_a_selection_of_another_deployment_is_refused(instance: Running) -> None:
    single = serve.run(Single.bind(), name="single", route_prefix=None)
    other = serve.run(Single.options(name="Another").bind(), name="another",
                      route_prefix=None)

    async def main() -> None:
        async with single.choose_replica() as selection:
            with pytest.raises(ValueError, match="different deployment"):
                other.dispatch(selection)
            assert await single.dispatch(selection)

    asyncio.run(main())
