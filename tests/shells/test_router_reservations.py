"""A router's reservations (handle.choose_replica, then dispatch) against fake replicas:
a held slot counts like a request in flight, a reservation queues (and is refused as a
request would be: test_router.py's test_no_queueing_allowed...), a dispatch goes to the
held replica only, even after that replica rejected it, and a released slot serves the
queue."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from surge.errors import ReplicaUnavailableError
from surge.model import ReplicaInfo
from surge.router.replica_link import ReplicaLink, Reservation
from surge.router.router import Router
from tests.shells.test_router import (
    WAIT_S,
    FakeReplica,
    answer,
    one_replica,
    replica_set,
    request,
    reservation,
    routing,
    run,
)


async def held(reserved: Reservation) -> ReplicaLink:
    return await asyncio.wait_for(asyncio.wrap_future(reserved.granted), WAIT_S)


def test_a_held_slot_counts_in_flight_and_queues_what_comes_after() -> None:
    async def main() -> None:
        async with one_replica(max_ongoing=1) as (replica, router):
            reserved = reservation()
            router.submit(reserved)
            link = await held(reserved)
            assert link.replica_id == "r"
            assert (router.in_flight, router.queued) == (1, 0)
            assert replica.calls == []  # nothing is sent for a reservation
            after = request(b"after")
            router.submit(after)
            assert router.queued == 1
            router.dispatch(reserved, request(b"chosen"))
            await replica.wait_for(lambda r: r.calls == [b"chosen"])
            replica.release()
            await replica.wait_for(lambda r: r.calls == [b"chosen", b"after"])
            replica.release()
            assert await answer(after) == b"r:after"
            assert router.in_flight == 0

    run(main)


def test_a_released_slot_serves_the_queue_and_a_reservation_waits_its_turn() -> None:
    async def main() -> None:
        async with one_replica(max_ongoing=1) as (_, router):
            first, second = reservation(), reservation()
            router.submit(first)
            router.submit(second)  # full: queued like a request
            await held(first)
            assert (router.in_flight, router.queued) == (1, 1)
            assert not second.granted.done()
            router.release(first)
            await held(second)
            assert (router.in_flight, router.queued) == (1, 0)
            router.release(second)
            router.release(second)  # twice: nothing more to free
            assert router.in_flight == 0
            waiting = reservation()
            router.submit(request(b"busy"))
            router.submit(waiting)
            router.release(waiting)  # given up while queued: it leaves the queue
            assert router.queued == 0

    run(main)


def test_a_dispatch_the_chosen_replica_rejects_is_retried_there_only() -> None:
    async def main() -> None:
        # "a" is full with other routers' requests when the dispatch comes; "b" has room
        a, b = FakeReplica("a", reject_above=0), FakeReplica("b", hold=True)
        async with routing(a, b, max_ongoing=2) as router:
            router.submit(request(b"on-b"))  # b is busier: the reservation goes to a
            await b.wait_for(lambda r: len(r.held) == 1)
            reserved = reservation()
            router.submit(reserved)
            assert (await held(reserved)).replica_id == "a"
            chosen = request(b"chosen")
            router.dispatch(reserved, chosen)
            await a.wait_for(lambda r: len(r.rejected) >= 2)  # tried again, and again
            a.reject_above = None  # room again
            assert await answer(chosen) == b"a:chosen"
            assert b.calls == [b"on-b"]

    run(main)


def test_a_dispatch_to_a_replica_that_has_gone_raises() -> None:
    async def main() -> None:
        a, b = FakeReplica("a"), FakeReplica("b")
        async with routing(a, b, max_ongoing=1) as router:
            reserved = reservation()
            router.submit(reserved)
            gone = (await held(reserved)).replica_id
            stays = [info for info in router_infos(router) if info.replica_id != gone]
            router.update(replica_set(stays, 1, 100))
            with pytest.raises(ReplicaUnavailableError, match=f"Replica {gone} is no longer"):
                router.dispatch(reserved, request(b"late"))
            assert router.in_flight == 0

    run(main)


def router_infos(router: Router) -> list[ReplicaInfo]:
    assert router.replica_set is not None
    return list(router.replica_set.replicas)


def test_a_reservation_is_its_own_sink() -> None:
    reserved = reservation()
    reserved.fail(RuntimeError("no replica"))
    reserved.fail(RuntimeError("twice: the first stands"))
    with pytest.raises(RuntimeError, match="no replica"):
        reserved.granted.result(0)
    given_up = reservation()
    assert given_up.granted.cancel()
    given_up.fail(RuntimeError("after it was given up"))
    assert isinstance(given_up.granted, concurrent.futures.Future)
