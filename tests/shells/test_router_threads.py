"""Router calls from threads other than the loop's, against in-process fake replicas
(tests/shells/test_router.py): `try_submit` sends without the loop and declines what
must wait; a thread that waits gets a link of its own and reads its answers there; the
loop reads an own link whenever its thread will not (unread answers, a cancel, a
rejection), and a lost replica fails a call a thread is reading for.

One worker thread plays the caller (`Caller`), so that its identity, which own links
are keyed by, stays the same across calls. Waits are on state, never sleeps.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import TypeVar

from surge.errors import ReplicaDiedError
from surge.router.own_links import MAX_OWN_LINKS, MAX_PER_REPLICA
from surge.router.replica_link import Pending
from surge.router.router import Router
from surge.transport.messages import Call, Message, Result
from tests.eventually import eventually_async
from tests.shells.test_router import WAIT_S, FakeReplica, routing, run
from tests.shells.test_router_models import advertise

T = TypeVar("T")


class ThreadSink:
    """A caller's sink on its own thread: a concurrent future, and who delivered it."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[Message | BaseException] = (
            concurrent.futures.Future())
        self.thread: int | None = None

    def deliver(self, message: Message) -> None:
        self._set(message)

    def fail(self, exc: BaseException) -> None:
        self._set(exc)

    def _set(self, outcome: Message | BaseException) -> None:
        if not self.future.done():
            self.thread = threading.get_ident()
            self.future.set_result(outcome)


def call(payload: bytes) -> Pending:
    return Pending(Call(id=0, method="__call__", payload=payload), ThreadSink())


def sink(pending: Pending) -> ThreadSink:
    assert isinstance(pending.sink, ThreadSink)
    return pending.sink


async def outcome(pending: Pending) -> Message | BaseException:
    return await asyncio.wait_for(asyncio.wrap_future(sink(pending).future), WAIT_S)


class Caller:
    """One thread, not the loop's, that runs what the test gives it."""

    def __init__(self) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(1)
        self.ident = self.pool.submit(threading.get_ident).result()

    async def do(self, function: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, function)

    def read(self, pending: Pending) -> None:
        """What `.result()` does on the caller's own link: read until answered."""
        link = pending.link
        assert link is not None and link.owner == self.ident
        link.read_until(lambda: sink(pending).future.done() or pending.link is not link,
                        lambda: WAIT_S)

    def close(self) -> None:
        self.pool.shutdown()


async def own_link_ready(router: Router, caller: Caller) -> None:
    """The first call from a waiting thread asks the loop for its own link."""
    first = call(b"first")
    assert await caller.do(lambda: router.try_submit(first, own_link=True))
    assert first.link is not None and first.link.owner is None  # the shared link, this time
    await eventually_async(lambda: any(link.owner == caller.ident and link.lent
                                       for link in router.own_links.links), WAIT_S,
                           what="the caller's own link, lent to it")
    await outcome(first)


def test_a_thread_submits_without_the_loop_and_the_router_counts_it() -> None:
    async def main() -> None:
        a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
        caller = Caller()
        async with routing(a, b, max_ongoing=5) as router:
            pendings = [call(str(i).encode()) for i in range(4)]
            sent = await caller.do(lambda: [router.try_submit(p) for p in pendings])
            assert sent == [True] * 4
            assert (router.in_flight, router.arrived, router.queued) == (4, 4, 0)
            await a.wait_for(lambda r: len(r.calls) == 2)  # the less loaded one wins
            await b.wait_for(lambda r: len(r.calls) == 2)
            a.release()
            b.release()
            answers = [await outcome(p) for p in pendings]
            assert all(isinstance(m, Result) for m in answers)
            assert all(sink(p).thread == threading.get_ident() for p in pendings)  # the loop
            assert (router.completed, router.in_flight) == (4, 0)
            assert router.own_links.links == set()  # no own link: this thread did not say it waits
        caller.close()

    run(main)


def test_try_submit_declines_what_must_wait_for_the_loop() -> None:
    async def main() -> None:
        replica = FakeReplica("r", hold=True)
        caller = Caller()
        async with routing(replica, max_ongoing=1) as router:
            assert await caller.do(lambda: router.try_submit(call(b"1")))
            full = call(b"2")
            assert not await caller.do(lambda: router.try_submit(full))  # no room: queue
            router.submit(full)  # (what the handle does next, on the loop)
            assert router.queued == 1
            replica.release()
            await replica.wait_for(lambda r: r.calls == [b"1", b"2"])
            assert not await caller.do(lambda: router.try_submit(call(b"3")))  # r is full
            assert router.arrived == 2  # declined calls are counted where they go next
            assert full.link is not None
        caller.close()

    run(main)


def test_a_waiting_thread_reads_its_answers_on_its_own_link() -> None:
    async def main() -> None:
        replica = FakeReplica("r")
        caller = Caller()
        async with routing(replica, max_ongoing=5) as router:
            await own_link_ready(router, caller)
            pending = call(b"2")
            assert await caller.do(lambda: router.try_submit(pending, own_link=True))
            link = pending.link
            assert link is not None and link.owner == caller.ident
            await caller.do(lambda: caller.read(pending))
            answer = sink(pending).future.result()
            assert isinstance(answer, Result) and answer.payload == b"r:2"
            assert sink(pending).thread == caller.ident  # answered without the loop
            assert (router.completed, router.in_flight) == (2, 0)
            assert link.lent and not link.reading
            report = router.load_report()
            assert report is not None and (report.arrivals, report.completions) == (2, 2)
        caller.close()

    run(main)


def test_answers_a_thread_does_not_read_are_read_by_the_loop() -> None:
    async def main() -> None:
        replica = FakeReplica("r")
        caller = Caller()
        async with routing(replica, max_ongoing=5) as router:
            await own_link_ready(router, caller)
            pending = call(b"unread")
            assert await caller.do(lambda: router.try_submit(pending, own_link=True))
            await replica.wait_for(lambda r: b"unread" in r.calls)
            assert router.in_flight == 1  # answered, but nobody has read it
            router.reclaim_unread()  # (every load report)
            assert isinstance(await outcome(pending), Result)
            assert sink(pending).thread == threading.get_ident()  # read by the loop
            link = next(iter(router.own_links.links))
            await eventually_async(lambda: link.lent, WAIT_S,
                                   what="lent again once nothing is in flight")
            assert router.in_flight == 0
        caller.close()

    run(main)


def test_a_cancel_on_an_own_link_reaches_the_replica_and_its_answer_the_loop() -> None:
    async def main() -> None:
        replica = FakeReplica("r", hold=True)
        caller = Caller()
        async with routing(replica, max_ongoing=5) as router:
            replica.hold = False
            await own_link_ready(router, caller)
            replica.hold = True
            pending = call(b"held")
            assert await caller.do(lambda: router.try_submit(pending, own_link=True))
            await replica.wait_for(lambda r: len(r.held) == 1)
            router.cancel(pending)
            await replica.wait_for(lambda r: r.cancels == [pending.message.id])
            await eventually_async(lambda: router.in_flight == 0, WAIT_S,
                                   what="the replica's Failure read by the loop")
            assert not sink(pending).future.done()  # the caller was told by the handle
        caller.close()

    run(main)


def test_a_rejection_read_by_the_thread_requeues_the_call() -> None:
    async def main() -> None:
        replica = FakeReplica("r", hold=True, reject_above=1)
        caller = Caller()
        async with routing(replica, max_ongoing=5) as router:
            replica.hold, replica.reject_above = False, None
            await own_link_ready(router, caller)
            replica.hold, replica.reject_above = True, 1
            other = call(b"other router's")  # fills the replica from the shared link
            router.submit(other)
            await replica.wait_for(lambda r: len(r.held) == 1)
            pending = call(b"rejected")
            assert await caller.do(lambda: router.try_submit(pending, own_link=True))
            await caller.do(lambda: caller.read(pending))  # reads the Rejected, stops
            assert replica.rejected == [b"rejected"]
            assert pending.link is None or pending.link.owner is None
            replica.reject_above = None
            replica.release()  # frees the slot: the queue drains once the hold ends
            await replica.wait_for(lambda r: r.calls.count(b"rejected") == 2)
            replica.release()
            answer = await outcome(pending)
            assert isinstance(answer, Result) and answer.payload == b"r:rejected"
            assert router.in_flight == 0
        caller.close()

    run(main)


def test_a_replica_lost_under_a_reading_thread_fails_its_call() -> None:
    async def main() -> None:
        replica = FakeReplica("r", hold=True)
        caller = Caller()
        async with routing(replica, max_ongoing=5) as router:
            replica.hold = False
            await own_link_ready(router, caller)
            replica.hold = True
            pending = call(b"held")
            assert await caller.do(lambda: router.try_submit(pending, own_link=True))
            reading = asyncio.ensure_future(caller.do(lambda: caller.read(pending)))
            link = pending.link
            assert link is not None
            await eventually_async(lambda: link.reading, WAIT_S, what="the thread polling")
            replica.drop()
            await reading
            error = await outcome(pending)
            assert isinstance(error, ReplicaDiedError)
            assert router.in_flight == 0 and router.own_links.links == set()
        caller.close()

    run(main)


def test_closing_the_router_ends_a_thread_reading_its_own_link() -> None:
    async def main() -> None:
        replica = FakeReplica("r", hold=True)
        caller = Caller()
        async with routing(replica, max_ongoing=5) as router:
            replica.hold = False
            await own_link_ready(router, caller)
            replica.hold = True
            pending = call(b"held")
            assert await caller.do(lambda: router.try_submit(pending, own_link=True))
            reading = asyncio.ensure_future(caller.do(lambda: caller.read(pending)))
            link = pending.link
            assert link is not None
            await eventually_async(lambda: link.reading, WAIT_S, what="the thread polling")
            router.close()
            await reading
            assert isinstance(await outcome(pending), ReplicaDiedError)
            replica.release()
        caller.close()

    run(main)


def test_own_links_are_bounded_per_replica_and_per_router() -> None:
    async def main() -> None:
        replicas = [FakeReplica(f"r{i}") for i in range(5)]
        async with routing(*replicas, max_ongoing=5) as router:
            own = router.own_links
            with router.lock:  # 20 threads ask for a link to each of 5 replicas
                for replica in replicas:
                    for thread in range(20):
                        own.get(replica.name, thread)
            await eventually_async(lambda: len(own.links) == MAX_OWN_LINKS and not own._opening,
                                   WAIT_S, what="the links open, up to the router's bound")
            per_replica = collections.Counter(link.replica_id for link in own.links)
            assert max(per_replica.values()) == MAX_PER_REPLICA
            with router.lock:
                assert own.get(replicas[-1].name, 999) is None
                assert not own._opening  # no more asked for: the thread shares the links
        assert own.links == set()

    run(main)


def test_a_thread_s_calls_for_a_model_go_where_the_model_is() -> None:
    async def main() -> None:
        replicas = [FakeReplica(name) for name in "abc"]
        caller = Caller()
        async with routing(*replicas, max_ongoing=5) as router:
            await advertise(router, replicas[1], ["y"])

            def call_for_model(tag: str) -> Pending:
                pending = Pending(Call(id=0, method="__call__", payload=tag.encode(),
                                       model_id="y"), ThreadSink())
                assert router.try_submit(pending, own_link=True)
                link = pending.link
                if link is not None and link.owner == caller.ident:
                    caller.read(pending)  # on its own link to "b", once it has one
                return pending

            for i in range(10):
                pending = await caller.do(functools.partial(call_for_model, str(i)))
                answer = await outcome(pending)
                assert isinstance(answer, Result) and answer.payload == f"b:{i}".encode()
            assert any(link.owner == caller.ident and link.replica_id == "b"
                       for link in router.own_links.links)
            assert router.pool.by_id["b"].reserved == {}  # every answer released its model
            assert (router.arrived, router.completed) == (10, 10)
        caller.close()

    run(main)
