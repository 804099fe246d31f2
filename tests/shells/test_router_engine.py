"""The router's LLM-aware choice against fake replicas on loopback (tests/shells/test_router.py).

Once a replica sends `RoutingStats` (its engine's queue), requests go to the replica with
the shorter engine queue, counting what this router sent since the report; a stale
report is ignored; a session id sticks to one replica until it is over the slack; a chat
goes to the replica that holds its prompt's prefix, whatever its body's field order.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import pytest

from surge.router.engine_choice import prompt_chunks, request_key
from surge.router.replica_link import Pending
from surge.router.router import Router
from surge.testing import FakeClock
from surge.transport.messages import Call, GrpcRequest, HttpRequest, PrefixHeld, RoutingStats
from tests.eventually import eventually_async
from tests.shells.test_router import WAIT_S, FakeReplica, Sink, answer, replica_set, routing, run


def call(tag: str, session: str = "") -> Pending:
    return Pending(Call(id=0, method="__call__", payload=tag.encode(), session_id=session),
                   Sink())


async def report(router: Router, replica: FakeReplica, queue: int,
                 period_s: float = 10.0) -> None:
    """The replica reports its engine's queue; returns once the router has it."""
    frame = RoutingStats(0, queue, 0.5, period_s)
    for connection in replica.connections:
        connection.send(frame)
    link = router.pool.links[replica.name]
    await eventually_async(lambda: link.stats == frame, WAIT_S,
                           what=f"the router to learn {replica.name}'s queue")


async def report_idle(router: Router, replicas: list[FakeReplica]) -> None:
    """Every replica reports an empty engine queue."""
    for replica in replicas:
        await report(router, replica, 0)


@asynccontextmanager
async def idle_engines(names: str, hold: bool = True
                       ) -> AsyncIterator[tuple[Router, list[FakeReplica]]]:
    """A replica for each letter of `names`, routed (50 ongoing each), each having
    reported an empty engine queue."""
    replicas = [FakeReplica(name, hold=hold) for name in names]
    async with routing(*replicas, max_ongoing=50) as router:
        await report_idle(router, replicas)
        yield router, replicas


def test_requests_go_to_the_shorter_engine_queue() -> None:
    async def main() -> None:
        a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
        async with routing(a, b, max_ongoing=50) as router:
            await report(router, a, 20)  # busy with other routers' requests
            await report(router, b, 0)
            for i in range(10):
                router.submit(call(str(i)))
            # b's score grows with what this router sends it (0 + sent), a's is 20:
            # every one of the ten goes to b, though a holds none of ours.
            await b.wait_for(lambda r: len(r.held) == 10)
            assert a.held == []
            await report(router, b, 25)  # b's engine filled up meanwhile: a is shorter
            router.submit(call("next"))
            await a.wait_for(lambda r: len(r.held) == 1)
            a.release()
            b.release()

    run(main)


def test_a_stale_report_is_ignored() -> None:
    async def main() -> None:
        a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
        clock = FakeClock(monotonic=0.0)
        async with routing(a, b, max_ongoing=50, clock=clock) as router:
            await report(router, a, 30, period_s=0.01)  # stale after 0.07 s
            await report(router, b, 0, period_s=10.0)
            # time passes on the router's clock (its only one: the reports are stamped
            # on it too) and a's report ages
            clock.advance(0.1)
            for i in range(20):
                router.submit(call(str(i)))
            # a's report no longer counts: its score is the router's own in flight
            await eventually_async(lambda: len(a.held) + len(b.held) == 20, WAIT_S)
            assert len(a.held) >= 5
            a.release()
            b.release()

    run(main)


def test_an_engine_full_by_its_report_takes_nothing_and_the_rest_wait_in_the_queue() -> None:
    async def main() -> None:
        a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
        async with routing(a, b, max_ongoing=3) as router:
            await report(router, a, 0)
            await report(router, b, 100)  # other routers filled b's engine
            pendings = [call(str(i)) for i in range(6)]
            for pending in pendings:
                router.submit(pending)
            # a takes its capacity of this router's requests; b, full, takes none
            await eventually_async(lambda: (len(a.held), router.queued) == (3, 3), WAIT_S)
            assert len(b.held) == 0
            a.release()  # a's answers free its slots: the queue goes there
            for pending in pendings[:3]:
                await answer(pending)
            await eventually_async(lambda: len(a.held) == 3 and router.queued == 0, WAIT_S)
            assert len(b.held) == 0
            a.release()
            for pending in pendings[3:]:
                await answer(pending)

    run(main)


def test_a_session_sticks_then_spills_when_its_replica_is_over_the_slack() -> None:
    async def main() -> None:
        async with idle_engines("abc") as (router, replicas):
            for i in range(3):
                router.submit(call(str(i), session="chat-1"))
            await eventually_async(lambda: sum(len(r.held) for r in replicas) == 3, WAIT_S)
            holders = [r for r in replicas if r.held]
            assert len(holders) == 1  # sticky: 0, 1, 2 are within the slack of 2
            home = holders[0]
            for i in range(3, 12):
                router.submit(call(str(i), session="chat-1"))
            await eventually_async(lambda: sum(len(r.held) for r in replicas) == 12, WAIT_S)
            counts = Counter({r.name: len(r.held) for r in replicas})
            assert counts[home.name] == max(counts.values()) < 12  # spilled, bounded
            others = [r for r in replicas if r is not home]
            assert all(r.held for r in others)
            for replica in replicas:
                replica.release()

    run(main)


def test_different_sessions_spread_and_each_finds_its_replica_again() -> None:
    async def main() -> None:
        async with idle_engines("abc", hold=False) as (router, _):
            homes: dict[str, set[bytes]] = {}
            for round_ in range(3):
                for s in range(12):
                    pending = call(f"{round_}", session=f"s{s}")
                    router.submit(pending)
                    homes.setdefault(f"s{s}", set()).add((await answer(pending))[:1])
            assert all(len(home) == 1 for home in homes.values())  # each session: one replica
            assert len({next(iter(home)) for home in homes.values()}) == 3  # all are used

    run(main)


# A long system prompt that chats share: several chunks of prefix.
SHOP = "You answer questions about the shoes on sale tonight. " * 20


def chat(system: str, user: str, fields_first: bool = True) -> Pending:
    body = {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": user}]}
    if not fields_first:
        body = {"messages": body["messages"], "max_tokens": 9, "model": "m"}
    message = HttpRequest(0, "POST", "/v1/chat/completions", b"", [],
                          json.dumps(body).encode(), "", "/", "r")
    return Pending(message, Sink())


def holder(router: Router, pending: Pending) -> str:
    """The replica a request was sent to."""
    return next(name for name, link in router.pool.links.items()
                if pending in link.in_flight.values())


def test_a_chat_goes_where_its_prompts_prefix_is_held() -> None:
    async def main() -> None:
        async with idle_engines("abc") as (router, _):
            first = chat(SHOP, "which are red?")
            router.submit(first)
            home = holder(router, first)
            # another question after the same system prompt, its fields in another order:
            # a byte-prefix key would differ, the prompt's prefix does not
            second = chat(SHOP, "and which are blue?", fields_first=False)
            router.submit(second)
            assert holder(router, second) == home
            assert router.pool.prefixes.matched(second.prefix or [])[home] >= 4
            other = chat("You write code. " * 80, "a sort function")
            router.submit(other)
            assert holder(router, other) != home  # nothing held: the less loaded of two
            assert first.prefix and other.prefix and first.prefix[0] != other.prefix[0]

    run(main)


def test_with_prefix_routing_off_chats_go_by_load_alone() -> None:
    """request_router_kwargs `prefix_routing: false` (the set says so): the second chat
    after the same system prompt goes to the less loaded replica, not to the one that
    holds the prefix, and the router neither reads prompts nor records them; set back on,
    it routes by prefix again."""
    async def main() -> None:
        replicas = [FakeReplica(name, hold=True) for name in "ab"]
        async with routing(*replicas, max_ongoing=50) as router:
            assert router.replica_set is not None
            on = router.replica_set
            router.update(dataclasses.replace(on, prefix_routing=False))
            await report_idle(router, replicas)
            first, second = chat(SHOP, "which are red?"), chat(SHOP, "and blue?")
            router.submit(first)
            router.submit(second)
            # scores 1 and 0: the less loaded one wins (on, the holder would: 1 <= 0 + 2)
            assert holder(router, second) != holder(router, first)
            assert first.prefix is None and second.prefix is None  # never read
            assert router.pool.prefixes.matched(
                prompt_chunks(chat(SHOP, "x"), router.pool.prompt_names)) == {}
            router.update(on)
            third, fourth = chat(SHOP, "green?"), chat(SHOP, "and black?")
            router.submit(third)
            router.submit(fourth)
            assert holder(router, fourth) == holder(router, third)
            for replica in replicas:
                replica.release()

    run(main)


def test_only_a_post_is_read_for_its_prompt() -> None:
    """From a deployment's first request (no engine report yet) a chat's prompt is read;
    the same body sent by any other method is not (the router tells those by their
    method alone)."""
    async def main() -> None:
        replicas = [FakeReplica(name, hold=True) for name in "ab"]
        async with routing(*replicas, max_ongoing=50) as router:
            post = chat(SHOP, "which are red?")
            router.submit(post)
            assert post.prefix
            get = Pending(msgspec.structs.replace(post.message, method="GET"), Sink())
            router.submit(get)
            assert get.prefix == []
            for replica in replicas:
                replica.release()

    run(main)


def test_what_an_engine_reports_it_holds_or_evicted_moves_the_index() -> None:
    async def main() -> None:
        async with idle_engines("ab") as (router, replicas):
            probe = chat(SHOP, "which are red?")
            names = prompt_chunks(probe, router.pool.prompt_names)
            index = router.pool.prefixes

            async def tell(replica: FakeReplica, frame: PrefixHeld,
                           expect: dict[str, int]) -> None:
                for connection in replica.connections:
                    connection.send(frame)
                await eventually_async(lambda: index.matched(names) == expect, WAIT_S,
                                       what=f"the index to follow {replica.name}'s engine")

            # b's engine computed the prompt (another router sent it): b holds 4 chunks
            await tell(replicas[1], PrefixHeld(0, stored=[names[:4]]), {"b": 4})
            router.submit(probe)  # so this router sends it there, and records it whole
            assert probe in router.pool.links["b"].in_flight.values()
            assert index.matched(names) == {"b": len(names)}
            # b's engine evicted the tail; then a's engine holds 2 and b's is cleared
            await tell(replicas[1], PrefixHeld(0, removed=names[3:]), {"b": 3})
            await tell(replicas[0], PrefixHeld(0, stored=[names[:2]]), {"a": 2, "b": 3})
            await tell(replicas[1], PrefixHeld(0, cleared=True), {"a": 2})

    run(main)


def test_a_replica_that_left_the_set_stays_out_of_the_index() -> None:
    """Its link delivers frames while its last answers drain: none may give it a bit
    again (it was dropped when it left), and retiring its link drops whatever it has."""
    async def main() -> None:
        async with idle_engines("ab") as (router, replicas):
            probe = chat(SHOP, "which are red?")
            router.submit(probe)
            home = holder(router, probe)
            link = router.pool.links[home]
            names, index = probe.prefix, router.pool.prefixes
            assert index.matched(names) == {home: len(names)}
            stay = next(r for r in replicas if r.name != home)
            router.update(replica_set([router.pool.by_id[stay.name].info], 50, 100))
            assert home not in index.bits and index.matched(names) == {}
            frame = PrefixHeld(0, stored=[names[:3]])
            assert link.on_prefix is not None
            with router.lock:  # what the departed link delivers while its answer drains
                link.on_prefix(link, frame)
            assert home not in index.bits
            for connection in stay.connections:  # the routable replica's engine reports
                connection.send(frame)
            await eventually_async(lambda: index.matched(names) == {stay.name: 3}, WAIT_S,
                                   what="the routable replica's report")
            assert home not in index.bits
            index.record(home, names)  # however it came there
            with router.lock:
                router.pool.retire(link)
            assert home not in index.bits and index.matched(names) == {stay.name: 3}

    run(main)


def test_request_keys() -> None:
    def http(path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> HttpRequest:
        return HttpRequest(0, "POST", path, b"", headers, body, "", "/", "r")

    assert request_key(http("/v1/chat/completions", [(b"x-session-id", b"abc")], b"{}")) \
        == b"s:abc"
    long_body = b'{"messages": [{"role": "system", "content": "' + b"x" * 2000
    assert request_key(http("/v1/chat/completions", [], long_body)) == \
        b"p:" + long_body[:1024]
    assert request_key(http("/v1/models", [], long_body)) == b""
    # prefix routing off: a session still counts, a body's first bytes do not
    assert request_key(http("/v1/chat/completions", [], long_body), by_prefix=False) == b""
    assert request_key(http("/v1/chat/completions", [(b"x-session-id", b"abc")], long_body),
                       by_prefix=False) == b"s:abc"
    assert request_key(Call(0, "m", b"", session_id="s-9")) == b"s:s-9"
    assert request_key(Call(0, "m", b"")) == b""
    grpc = GrpcRequest(0, "/pkg.S/M", "mod:add", [], b"", "r", "app")
    assert request_key(grpc) == b""


@dataclasses.dataclass
class Watch:
    """Requests arriving at a router on a fake clock, and the times it called
    `on_pressure` (its arrival watch saw a jump)."""

    router: Router
    replica: FakeReplica
    clock: FakeClock
    pressed: list[float] = dataclasses.field(default_factory=list)

    def arrive(self, gap_s: float) -> None:
        """A request `gap_s` after the clock's last reading."""
        self.clock.advance(gap_s)
        self.router.submit(call(f"{self.clock.monotonic():.3f}"))


@asynccontextmanager
async def watched(max_ongoing: int) -> AsyncIterator[tuple[Watch, Router, FakeClock]]:
    """One held replica "a" behind a router whose clock starts at 0, its pressure
    watched; the replica is released at the end."""
    replica, clock = FakeReplica("a", hold=True), FakeClock(monotonic=0.0)
    async with routing(replica, max_ongoing=max_ongoing, clock=clock) as router:
        watch = Watch(router, replica, clock)
        router.on_pressure = lambda: watch.pressed.append(clock.monotonic())
        yield watch, router, clock
        replica.release()


def test_a_jump_in_arrivals_is_reported_at_once_once_the_engines_queue() -> None:
    """Engines queue, not this router, so its queue never starts to grow: two requests
    1 ms apart after 1 req/s call `on_pressure` (policy/arrival_jump.py) once the
    replicas report their engines, once per regular report; before, they do not."""
    async def main() -> None:
        async with watched(max_ongoing=50) as (watch, router, clock):
            for _ in range(2):  # a burst before any engine report: not watched
                watch.arrive(0.001)
            assert watch.pressed == []
            await report(router, watch.replica, 0)
            for _ in range(20):  # 1 req/s, a report every 0.1 s
                for _ in range(10):
                    clock.advance(0.1)
                    router.load_report()
                watch.arrive(0.0)
            assert watch.pressed == []
            watch.arrive(0.001)  # the next 1 ms after: a jump
            assert watch.pressed == [pytest.approx(20.003)]
            watch.arrive(0.001)
            router.load_report(urgent=True)  # the urgent report does not rearm...
            watch.arrive(0.001)
            assert len(watch.pressed) == 1
            clock.advance(0.1)
            router.load_report()  # ... the regular one does
            watch.arrive(0.001)
            assert len(watch.pressed) == 2

    run(main)


def test_the_urgent_report_carries_the_rate_a_run_of_arrivals_implied() -> None:
    """10 req/s evenly, then six requests 5 ms apart: a jump (the third), then the rate
    they imply, (6 - 2) / 25 ms (policy/arrival_jump.py), each calling `on_pressure`;
    the urgent report carries the rate, and the regular one after it none."""
    async def main() -> None:
        async with watched(max_ongoing=500) as (watch, router, clock):
            await report(router, watch.replica, 0)
            for _ in range(200):  # 10 req/s, a report every 0.1 s
                clock.advance(0.1)
                router.load_report()
                watch.arrive(0.0)
            watch.pressed.clear()  # (jumps while the recent rate rose from 0 to 10)
            for _ in range(5):
                watch.arrive(0.005)
            assert watch.pressed == [pytest.approx(20.01), pytest.approx(20.025)]
            urgent = router.load_report(urgent=True)
            assert urgent is not None and urgent.jump_rate == pytest.approx(160.0)
            watch.arrive(0.1)
            regular = router.load_report()
            assert regular is not None and regular.jump_rate == 0.0

    run(main)
