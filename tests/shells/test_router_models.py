"""The router's model affinity against fake replicas on loopback (tests/shells/test_router.py).

A request carrying a multiplexed model id goes to a replica that holds it (its `Models`
frame says, or this router already sent it a request for the model), spreads to one more
replica when every holder is full, waits (without holding up other models) when the
model may not spread further, and after the matching timeout takes any replica.
"""

from __future__ import annotations

from surge.router.replica_link import Pending
from surge.router.router import Router
from surge.testing import FakeClock
from surge.transport.messages import Call, Models
from tests.eventually import eventually_async
from tests.shells.test_router import (
    WAIT_S,
    FakeReplica,
    Sink,
    answer,
    routing,
    run,
)


def for_model(model: str, tag: str) -> Pending:
    return Pending(Call(id=0, method="__call__", payload=tag.encode(), model_id=model), Sink())


async def advertise(router: Router, replica: FakeReplica, ids: list[str], *,
                    max_copies: int = 0, matching_timeout_s: float = 1.0) -> None:
    """The replica says which models it holds; returns once the router has it."""
    for connection in replica.connections:
        connection.send(Models(0, ids, max_copies, matching_timeout_s))
    link = router.pool.links[replica.name]
    await eventually_async(lambda: link.model_set == frozenset(ids), WAIT_S,
                           what=f"the router to learn {replica.name}'s models")


def test_requests_for_one_model_stay_together_then_spread_when_the_holder_is_full() -> None:
    async def main() -> None:
        replicas = [FakeReplica(name, hold=True) for name in "abc"]
        async with routing(*replicas, max_ongoing=3) as router:
            pendings = [for_model("x", str(i)) for i in range(5)]
            for pending in pendings:
                router.submit(pending)
            # nobody advertised "x" yet: the first request reserves its replica for the
            # next two; the fourth finds the holder full and loads a second copy
            await eventually_async(lambda: sorted(len(r.held) for r in replicas) == [0, 2, 3],
                                   WAIT_S, what="3 + 2 requests on two replicas")
            counts = sorted(len(r.held) for r in replicas)
            assert counts == [0, 2, 3]
            for replica in replicas:
                replica.release()
            for pending in pendings:
                await answer(pending)
            assert router.in_flight == 0

    run(main)


def test_an_advertised_model_draws_its_requests() -> None:
    async def main() -> None:
        a, b, c = (FakeReplica(name) for name in "abc")
        async with routing(a, b, c, max_ongoing=5) as router:
            await advertise(router, b, ["y", "z"])
            for i in range(20):
                pending = for_model("y", str(i))
                router.submit(pending)
                assert (await answer(pending)).startswith(b"b:")
            # a model nobody holds goes to a replica holding the fewest models
            pending = for_model("w", "w")
            router.submit(pending)
            assert not (await answer(pending)).startswith(b"b:")

    run(main)


def test_a_model_at_its_copy_bound_waits_without_holding_up_other_models() -> None:
    async def main() -> None:
        clock = FakeClock(monotonic=0.0)
        a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
        async with routing(a, b, max_ongoing=1, clock=clock) as router:
            await advertise(router, a, ["x"], max_copies=1, matching_timeout_s=30.0)
            await advertise(router, b, [], max_copies=1, matching_timeout_s=30.0)
            first, second = for_model("x", "1"), for_model("x", "2")
            router.submit(first)
            router.submit(second)  # "a" is full and "x" may not spread: it waits
            assert (router.in_flight, router.queued) == (1, 1)
            other = for_model("y", "3")
            router.submit(other)  # not behind "x"
            await b.wait_for(lambda r: [call.payload for _, call in r.held] == [b"3"])
            a.release()
            await answer(first)
            await a.wait_for(lambda r: [call.payload for _, call in r.held] == [b"2"])
            a.release()
            b.release()
            await answer(second)
            await answer(other)

    run(main)


def test_after_the_matching_timeout_any_replica_takes_a_waiting_request() -> None:
    async def main() -> None:
        clock = FakeClock(monotonic=0.0)
        a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
        async with routing(a, b, max_ongoing=1, clock=clock) as router:
            await advertise(router, a, ["x"], max_copies=1, matching_timeout_s=0.05)
            await advertise(router, b, [], max_copies=1, matching_timeout_s=0.05)
            first, second = for_model("x", "1"), for_model("x", "2")
            router.submit(first)
            router.submit(second)
            assert router.queued == 1
            clock.advance(0.05)  # the router's timer fires on the loop's clock; the wait
            await b.wait_for(lambda r: len(r.held) == 1)  # is measured on this one
            a.release()
            b.release()
            assert (await answer(second)).startswith(b"b:")

    run(main)


def test_requests_without_a_model_are_routed_as_before() -> None:
    async def main() -> None:
        replicas = [FakeReplica(name, hold=True) for name in "ab"]
        async with routing(*replicas, max_ongoing=5) as router:
            await advertise(router, replicas[0], ["x"])
            pendings = [Pending(Call(id=0, method="__call__", payload=b"p"), Sink())
                        for _ in range(6)]
            for pending in pendings:
                router.submit(pending)
            await eventually_async(lambda: sorted(len(r.held) for r in replicas) == [3, 3],
                                   WAIT_S, what="3 requests on each replica")
            for replica in replicas:
                replica.release()
            for pending in pendings:
                await answer(pending)

    run(main)

