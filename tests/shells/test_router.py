"""Router against in-process fake replicas that speak the frame protocol on loopback.

Each fake replica is a real asyncio server on 127.0.0.1:0. It answers a Call with a
Result tagged with its name, holds calls until the test releases them, and rejects
calls beyond a limit of held ones, so each test sets up exactly the load it needs.
Tests wait on events (a sink's result) or on a replica's state (`eventually_async`: a
frame received, a call held), never on sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import linecache
import logging
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest

from surge import testing
from surge.errors import BackPressureError, ReplicaDiedError
from surge.model import DeploymentId, ReplicaInfo, ReplicaSet
from surge.policy.admission import MAX_RETRY_AFTER_S
from surge.policy.dispatch import SHED_HEADER
from surge.router.replica_link import Pending, Reservation
from surge.router.router import Router
from surge.testing import FakeClock
from surge.transport.messages import Call, HttpRequest, HttpStart, Message, Result
from tests.eventually import eventually_async

DEP = DeploymentId("app", "d")
WAIT_S = 5.0


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


class FakeReplica(testing.FakeReplica):
    """surge.testing's fake replica, with a wait on its state."""

    async def wait_for(self, predicate: Callable[[FakeReplica], bool]) -> None:
        code = predicate.__code__
        line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
        await eventually_async(lambda: predicate(self), WAIT_S,
                               what=f"replica {self.name}: {line}")


class Sink:
    """Collects what the router hands back for one request."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.errors: list[BaseException] = []
        self.done: asyncio.Future[Message | BaseException] = (
            asyncio.get_running_loop().create_future())

    def deliver(self, message: Message) -> None:
        self.messages.append(message)
        if not self.done.done():
            self.done.set_result(message)

    def fail(self, exc: BaseException) -> None:
        self.errors.append(exc)
        if not self.done.done():
            self.done.set_result(exc)


def request(payload: bytes) -> Pending:
    return Pending(Call(id=0, method="__call__", payload=payload), Sink())


def reservation() -> Reservation:
    """What handle.choose_replica submits: a slot to be held, its call dispatched later."""
    return Reservation(Call(id=0, method="__call__", payload=b""))


def payload(pending: Pending) -> bytes:
    assert isinstance(pending.message, Call)
    return pending.message.payload


def sink(pending: Pending) -> Sink:
    assert isinstance(pending.sink, Sink)
    return pending.sink


async def outcome(pending: Pending) -> Message | BaseException:
    return await asyncio.wait_for(asyncio.shield(sink(pending).done), WAIT_S)


async def answer(pending: Pending) -> bytes:
    """The payload of the Result the request got."""
    message = await outcome(pending)
    assert isinstance(message, Result), message
    return message.payload


def replica_set(infos: list[ReplicaInfo], max_ongoing: int, queue_limit: int,
                max_queue_wait_s: float | None = None) -> ReplicaSet:
    return ReplicaSet(deployment=DEP, replicas=tuple(infos), max_ongoing_requests=max_ongoing,
                      queue_limit=queue_limit, max_queue_wait_s=max_queue_wait_s)


@asynccontextmanager
async def routing(*replicas: FakeReplica, max_ongoing: int = 5, queue_limit: int = 100,
                  clock: FakeClock | None = None,
                  max_queue_wait_s: float | None = None) -> AsyncIterator[Router]:
    infos = [await replica.start() for replica in replicas]
    router = Router(DEP, rng=random.Random(7), clock=clock or FakeClock(monotonic=0.0))
    try:
        router.update(replica_set(infos, max_ongoing, queue_limit, max_queue_wait_s))
        await asyncio.wait_for(router.ready.wait(), WAIT_S)
        yield router
    finally:
        router.close()
        for replica in replicas:
            await replica.close()


@asynccontextmanager
async def one_replica(**options: Any) -> AsyncIterator[tuple[FakeReplica, Router]]:
    """Replica "r", holding every call until released, behind a router (`routing`'s
    options)."""
    replica = FakeReplica("r", hold=True)
    async with routing(replica, **options) as router:
        yield replica, router


@asynccontextmanager
async def wait_bounded(max_ongoing: int, max_queue_wait_s: float
                       ) -> AsyncIterator[tuple[FakeReplica, Router, FakeClock]]:
    """`one_replica` with its queue bounded by the wait (`max_queue_wait_s`), on a fake
    clock from 0 that the test moves as service goes on."""
    clock = FakeClock(monotonic=0.0)
    async with one_replica(max_ongoing=max_ongoing, clock=clock,
                           max_queue_wait_s=max_queue_wait_s) as (replica, router):
        yield replica, router, clock


async def gather(*waits: Awaitable[Any]) -> list[Any]:
    return list(await asyncio.gather(*waits))


# -- tests ------------------------------------------------------------------------------


def test_requests_spread_over_two_replicas() -> None:
    async def main() -> None:
        a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
        async with routing(a, b, max_ongoing=5) as router:
            assert repr(router).startswith("<Router app#d replicas=2 queued=0/100 in_flight=0")
            pendings = [request(str(i).encode()) for i in range(6)]
            for pending in pendings:
                router.submit(pending)
            # with two replicas both are always sampled: the less loaded one wins
            assert router.in_flight == 6
            assert router.queued == 0
            await a.wait_for(lambda r: len(r.calls) == 3)
            await b.wait_for(lambda r: len(r.calls) == 3)
            a.release()
            b.release()
            payloads = await gather(*(answer(p) for p in pendings))
            by_replica = sorted(p.split(b":")[0] for p in payloads)
            assert by_replica == [b"a"] * 3 + [b"b"] * 3
            assert sorted(p.split(b":")[1] for p in payloads) == sorted(a.calls + b.calls)
            assert router.completed == 6
            assert router.in_flight == 0

    run(main)


class Shedding(FakeReplica):
    """Answers a call whose payload starts with b"shed" as a shedding LLM replica: 429."""

    def result(self, call: Call) -> Message:
        if call.payload.startswith(b"shed"):
            return HttpStart(id=call.id, status=429, headers=[(b"retry-after", b"1")],
                             body=b"{}", more=False)
        return super().result(call)


def test_a_replicas_own_429_is_delivered_but_not_counted_served() -> None:
    async def main() -> None:
        async with routing(Shedding("r")) as router:
            kept, shed = request(b"1"), request(b"shed")
            router.submit(kept)
            router.submit(shed)
            assert await answer(kept) == b"r:1"
            refusal = await outcome(shed)
            assert isinstance(refusal, HttpStart) and refusal.status == 429
            assert (router.completed, router.in_flight) == (1, 0)
            report = router.load_report()  # offered 2, served 1: no service time for a 429
            assert report is not None
            assert (report.arrivals, report.completions, report.rejections) == (2, 1, 0)

    run(main)


class HttpShedding(FakeReplica):
    """An LLM replica whose engine is behind: every HTTP request is shed (429), marked as
    llm/asgi.py marks a shed (`mark=False`: an app's own 429, unmarked)."""

    def __init__(self, name: str, mark: bool = True) -> None:
        super().__init__(name)
        self.mark = mark

    def http_answer(self, request: HttpRequest) -> Message:
        headers = [(SHED_HEADER, b"1")] if self.mark else []
        return HttpStart(id=request.id, status=429, headers=headers, body=b"{}", more=False)


def http_request(body: bytes, more_body: bool = False) -> Pending:
    return Pending(HttpRequest(id=0, method="POST", path="/v1/chat/completions", query=b"",
                               headers=[], body=body, client="", route_prefix="/",
                               request_id="r", more_body=more_body), Sink())


def test_a_shed_is_tried_once_on_another_replica_before_the_caller_hears_it() -> None:
    async def main() -> None:
        behind, free = HttpShedding("behind"), FakeReplica("free")
        async with routing(behind, free) as router:
            for i in range(8):  # some go to the shedding replica first: none end there
                answer = await outcome(submitted(router, http_request(str(i).encode())))
                assert isinstance(answer, HttpStart) and answer.status == 200
                assert answer.body == b"free:" + str(i).encode()
            assert behind.calls and len(free.calls) == 8
            assert (router.completed, router.in_flight) == (8, 0)
            report = router.load_report()
            assert report is not None and (report.arrivals, report.completions) == (8, 8)

    run(main)


def test_a_second_shed_an_unmarked_429_or_a_streamed_body_reach_the_caller() -> None:
    async def main() -> None:
        first, second = HttpShedding("first"), HttpShedding("second")
        async with routing(first, second) as router:
            answer = await outcome(submitted(router, http_request(b"x")))
            assert isinstance(answer, HttpStart) and answer.status == 429
            assert len(first.calls) + len(second.calls) == 2  # tried once more, no more
            streamed = await outcome(submitted(router, http_request(b"y", more_body=True)))
            assert isinstance(streamed, HttpStart) and streamed.status == 429
            assert len(first.calls) + len(second.calls) == 3  # its body is gone: no retry
        own, free = HttpShedding("own", mark=False), FakeReplica("free")
        async with routing(own, free) as router:
            answers = [await outcome(submitted(router, http_request(b"z"))) for _ in range(6)]
            assert own.calls  # an app's own 429 is its answer, never tried elsewhere
            assert sum(isinstance(a, HttpStart) and a.status == 429 for a in answers) \
                == len(own.calls)

    run(main)


def submitted(router: Router, pending: Pending) -> Pending:
    router.submit(pending)
    return pending


def test_a_load_report_says_when_it_was_measured_and_what_it_covers() -> None:
    async def main() -> None:
        clock = FakeClock(monotonic=5.0)
        async with routing(FakeReplica("r", hold=True), clock=clock) as router:
            router.submit(request(b"1"))
            clock.advance(0.25)
            report = router.load_report()
            assert report is not None and report.arrivals == 1
            assert (report.measured_at, report.covers_s) == (5.25, 0.25)  # since it began
            clock.advance(0.5)
            assert router.load_report() is None  # nothing changed: nothing sent...
            router.submit(request(b"2"))
            clock.advance(0.25)
            report = router.load_report()  # ... so the next covers since the last sent
            assert report is not None and report.arrivals == 1
            assert (report.measured_at, report.covers_s) == (6.0, 0.75)

    run(main)


def test_request_beyond_max_ongoing_queues_until_a_slot_frees() -> None:
    async def main() -> None:
        async with one_replica(max_ongoing=1) as (replica, router):
            first, second = request(b"1"), request(b"2")
            router.submit(first)
            router.submit(second)
            assert (router.in_flight, router.queued) == (1, 1)
            assert "queued=1/100 in_flight=1" in repr(router)
            await replica.wait_for(lambda r: r.calls == [b"1"])
            replica.release()
            assert await answer(first) == b"r:1"
            await replica.wait_for(lambda r: r.calls == [b"1", b"2"])
            assert (router.in_flight, router.queued) == (1, 0)
            replica.release()
            assert await answer(second) == b"r:2"

    run(main)


def test_full_queue_share_raises_backpressure_with_the_numbers() -> None:
    async def main() -> None:
        clock = FakeClock(monotonic=0.0)
        async with one_replica(max_ongoing=1, queue_limit=2, clock=clock) as (replica, router):
            pendings = [request(b"1"), request(b"2"), request(b"3")]
            for pending in pendings:
                router.submit(pending)
            extra = request(b"4")
            with pytest.raises(BackPressureError) as info:
                router.submit(extra)
            error = info.value
            assert (error.deployment, error.num_queued_requests, error.max_queued_requests) == (
                "app#d", 2, 2)
            assert error.retry_after_s == MAX_RETRY_AFTER_S  # nothing has drained yet
            assert not error.advise_retry  # Ray's count bound: no Retry-After unless set
            assert (router.rejected, router.queued, router.in_flight) == (1, 2, 1)
            assert not sink(extra).done.done()

            # three complete within one second: the queue of two drains in 2/3 s
            for pending in pendings:
                await replica.wait_for(lambda r: len(r.held) == 1)
                replica.release()
                await answer(pending)
            clock.advance(1.0)
            for payload in (b"5", b"6", b"7"):
                router.submit(request(payload))
            with pytest.raises(BackPressureError) as info:
                router.submit(request(b"8"))
            assert info.value.retry_after_s == pytest.approx(2 / 3)
            assert router.rejected == 2
            assert replica.calls[:3] == [b"1", b"2", b"3"]  # the rejected one never went out

    run(main)


def test_a_configured_retry_after_is_advised_under_the_count_bound() -> None:
    async def main() -> None:
        async with one_replica(max_ongoing=1, queue_limit=1) as (replica, router):
            assert router.replica_set is not None
            router.update(dataclasses.replace(router.replica_set, version=1,
                                              backpressure_status=429, retry_after_s=2.5))
            held = [request(b"1"), request(b"2")]
            for pending in held:
                router.submit(pending)
            with pytest.raises(BackPressureError) as info:
                router.submit(request(b"3"))
            error = info.value
            assert (error.status_code, error.retry_after_s, error.advise_retry) == (
                429, 2.5, True)
            for _ in held:
                await replica.wait_for(lambda r: len(r.held) == 1)
                replica.release()
            await gather(*(answer(p) for p in held))

    run(main)


def test_queue_bounded_by_wait_refuses_what_would_wait_too_long() -> None:
    async def main() -> None:
        async with wait_bounded(max_ongoing=2, max_queue_wait_s=0.2) as (replica, router, clock):
            # nothing measured yet (a cold start): the count alone bounds the queue
            first = [request(str(i).encode()) for i in range(8)]
            for pending in first:
                router.submit(pending)
            assert (router.in_flight, router.queued) == (2, 6)
            for _ in range(4):  # each pair takes 50 ms of service
                await replica.wait_for(lambda r: len(r.held) == 2)
                clock.advance(0.05)
                replica.release()
            await gather(*(answer(p) for p in first))
            assert "service=50.0ms max_wait=0.2" in repr(router)

            # 2 in flight of 50 ms drain 40/s: the 8th queued waits 200 ms, the 9th 225 ms
            running = [request(b"a"), request(b"b")]
            queued = [request(str(i).encode()) for i in range(8)]
            for pending in running + queued:
                router.submit(pending)
            over = request(b"over")
            with pytest.raises(BackPressureError) as info:
                router.submit(over)
            error = info.value
            assert (error.num_queued_requests, error.max_queued_requests) == (8, 100)
            assert error.retry_after_s == pytest.approx(0.2)  # 8 queued at 40/s
            assert error.advise_retry  # surge's own wait bound advises its estimate
            assert "would wait ~0.225s" in str(error)
            assert "max_queue_wait_s (0.2s)" in str(error)
            assert (router.rejected, router.queued) == (1, 8)
            assert not sink(over).done.done()
            for _ in range(5):  # the rest still drain as before
                await replica.wait_for(lambda r: len(r.held) == 2)
                replica.release()
            await gather(*(answer(p) for p in running + queued))
            assert b"over" not in replica.calls

    run(main)


def test_a_slow_model_may_queue_one_service_time() -> None:
    async def main() -> None:
        async with wait_bounded(max_ongoing=1, max_queue_wait_s=0.1) as (replica, router, clock):
            warm = request(b"warm")
            router.submit(warm)
            await replica.wait_for(lambda r: len(r.held) == 1)
            clock.advance(2.0)  # a 2 s model
            replica.release()
            await answer(warm)
            router.submit(request(b"1"))
            router.submit(request(b"2"))  # waits one service time: admitted
            with pytest.raises(BackPressureError):
                router.submit(request(b"3"))  # two: refused
            assert router.queued == 1

    run(main)


@pytest.mark.parametrize("kind", ["request", "reservation"])
def test_no_queueing_allowed_rejects_as_soon_as_replicas_are_full(kind: str) -> None:
    """A request, or a reservation (handle.choose_replica: test_router_reservations.py),
    is refused as soon as the one slot is taken, with the same numbers."""
    async def main() -> None:
        async with one_replica(max_ongoing=1, queue_limit=0) as (_, router):
            router.submit(request(b"1"))
            with pytest.raises(BackPressureError) as info:
                router.submit(request(b"2") if kind == "request" else reservation())
            assert (info.value.num_queued_requests, info.value.max_queued_requests) == (0, 0)
            assert (router.rejected, router.queued, router.in_flight) == (1, 0, 1)

    run(main)


def test_rejected_request_is_requeued_and_succeeds_on_the_other_replica() -> None:
    async def main() -> None:
        # "a" takes one request and rejects any beyond it (other routers keep it busy)
        a, b = FakeReplica("a", hold=True, reject_above=1), FakeReplica("b", hold=True)
        async with routing(a, b, max_ongoing=5) as router:
            pendings = [request(str(i).encode()) for i in range(4)]
            for pending in pendings:
                router.submit(pending)
            # two each; a rejects its second, which then counts a as full: although a
            # has fewer in flight (1) than b (2), the request goes to b
            await b.wait_for(lambda r: len(r.calls) == 3)
            assert len(a.calls) == 2
            assert a.rejected == [a.calls[1]]
            assert b.calls[2] == a.rejected[0]
            assert (router.in_flight, router.queued) == (4, 0)
            assert router.rejected == 0  # a replica's rejection is not back-pressure
            a.release()
            b.release()
            payloads = await gather(*(answer(p) for p in pendings))
            assert sorted(payloads) == sorted(
                [b"a:" + a.calls[0]] + [b"b:" + payload for payload in b.calls])
            assert router.completed == 4

    run(main)


def test_cancel_removes_a_queued_request() -> None:
    async def main() -> None:
        async with one_replica(max_ongoing=1) as (replica, router):
            first, second, third = request(b"1"), request(b"2"), request(b"3")
            for pending in (first, second, third):
                router.submit(pending)
            assert router.queued == 2
            router.cancel(second)
            router.cancel(second)  # a second cancel is a no-op
            assert second.cancelled
            assert router.queued == 1
            await replica.wait_for(lambda r: r.calls == [b"1"])
            replica.release()
            await answer(first)
            await replica.wait_for(lambda r: r.calls == [b"1", b"3"])
            replica.release()
            assert await answer(third) == b"r:3"
            assert replica.cancels == []  # it never left the router
            assert not sink(second).done.done()

    run(main)


def test_cancel_of_an_in_flight_request_tells_the_replica() -> None:
    async def main() -> None:
        async with one_replica(max_ongoing=1) as (replica, router):
            first = request(b"1")
            router.submit(first)
            await replica.wait_for(lambda r: r.calls == [b"1"])
            router.cancel(first)
            await replica.wait_for(lambda r: r.cancels == [first.message.id])
            # the replica answers the cancel with a Failure: it frees the slot but is not
            # delivered to a caller who has gone
            replica.hold = False
            second = request(b"2")
            router.submit(second)
            assert await answer(second) == b"r:2"
            assert sink(first).messages == []
            assert sink(first).errors == []
            assert router.in_flight == 0

    run(main)


def test_lost_replica_fails_its_requests_and_the_queue_moves_to_the_other() -> None:
    async def main() -> None:
        a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
        async with routing(a, b, max_ongoing=1) as router:
            pendings = [request(str(i).encode()) for i in range(4)]
            for pending in pendings:
                router.submit(pending)
            assert (router.in_flight, router.queued) == (2, 2)
            await a.wait_for(lambda r: len(r.calls) == 1)
            await b.wait_for(lambda r: len(r.calls) == 1)
            on_a = next(p for p in pendings if payload(p) == a.calls[0])
            on_b = next(p for p in pendings if payload(p) == b.calls[0])
            a.drop()
            error = await outcome(on_a)
            assert isinstance(error, ReplicaDiedError)
            assert "replica a died" in str(error)
            assert "replicas=1 " in repr(router)
            assert router.queued == 2  # b is still full
            b.release()
            assert await answer(on_b) == b"b:" + payload(on_b)
            await b.wait_for(lambda r: len(r.calls) == 2)
            b.release()
            await b.wait_for(lambda r: len(r.calls) == 3)
            b.release()
            assert [await answer(p) for p in pendings[2:]] == [b"b:2", b"b:3"]
            assert a.calls == [payload(on_a)]

    run(main)


def test_unreachable_replica_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            dead_port = sock.getsockname()[1]  # nothing listens there once closed
        dead = ReplicaInfo(replica_id="dead", deployment=DEP, address=f"127.0.0.1:{dead_port}",
                           pid=0)
        live = FakeReplica("live")
        info = await live.start()
        router = Router(DEP, rng=random.Random(1))
        try:
            router.update(replica_set([dead, info], max_ongoing=1, queue_limit=10))
            await asyncio.wait_for(router.ready.wait(), WAIT_S)
            assert "replicas=1 " in repr(router)
            pendings = [request(b"1"), request(b"2")]
            for pending in pendings:
                router.submit(pending)
            assert [await answer(p) for p in pendings] == [b"live:1", b"live:2"]
        finally:
            router.close()
            await live.close()

    with caplog.at_level(logging.WARNING, logger="surge.router"):
        run(main)
    assert any("cannot reach replica dead" in r.getMessage() for r in caplog.records)


def test_two_updates_before_connecting_make_one_link_per_replica() -> None:
    async def main() -> None:
        replica = FakeReplica("r", hold=True)
        info = await replica.start()
        router = Router(DEP, rng=random.Random(1))
        try:
            # two pushes of the controller can arrive in one read, before any link is up
            router.update(replica_set([info], max_ongoing=1, queue_limit=10))
            router.update(replica_set([info], max_ongoing=1, queue_limit=10))
            await asyncio.wait_for(router.ready.wait(), WAIT_S)
            assert "replicas=1 " in repr(router)
            first, second = request(b"1"), request(b"2")
            router.submit(first)
            router.submit(second)
            assert (router.in_flight, router.queued) == (1, 1)  # max_ongoing is 1 per replica
            await replica.wait_for(lambda r: len(r.connections) == 1 and r.calls == [b"1"])
            replica.release()
            await answer(first)
            await replica.wait_for(lambda r: r.calls == [b"1", b"2"])
            assert len(replica.connections) == 1
        finally:
            router.close()
            await replica.close()

    run(main)


def test_replica_removed_from_the_set_finishes_what_it_has() -> None:
    async def main() -> None:
        old, new = FakeReplica("old", hold=True), FakeReplica("new")
        old_info, new_info = await old.start(), await new.start()
        router = Router(DEP, rng=random.Random(1))
        try:
            router.update(replica_set([old_info], max_ongoing=1, queue_limit=10))
            await asyncio.wait_for(router.ready.wait(), WAIT_S)
            first = request(b"1")
            router.submit(first)
            await old.wait_for(lambda r: r.calls == [b"1"])
            router.update(replica_set([new_info], max_ongoing=1, queue_limit=10))
            second = request(b"2")
            router.submit(second)  # queued until "new" is connected, never sent to "old"
            assert await answer(second) == b"new:2"
            old.release()
            assert await answer(first) == b"old:1"
            # its last answer in, the link to the removed replica closes
            await old.wait_for(lambda r: all(c.is_closed for c in r.connections))
            assert old.calls == [b"1"]
            assert "replicas=1 " in repr(router)
        finally:
            router.close()
            await old.close()
            await new.close()

    run(main)


def test_close_while_connecting_leaves_no_link_open() -> None:
    async def main() -> None:
        replica = FakeReplica("r")
        info = await replica.start()
        router = Router(DEP, rng=random.Random(1))
        try:
            router.update(replica_set([info], max_ongoing=1, queue_limit=10))
            router.close()  # before the connection is up
            await asyncio.wait_for(router.ready.wait(), WAIT_S)
            assert "replicas=0 " in repr(router)
            await replica.wait_for(
                lambda r: len(r.connections) == 1 and r.connections[0].is_closed)
        finally:
            await replica.close()

    run(main)
