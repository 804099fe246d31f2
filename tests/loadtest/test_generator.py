"""The generator against small loopback servers: every request ends exactly once.

Each server answers request n (in arrival order) as `behaviour(n)` says: a status code,
"hang" (never answer), "drop" (close the connection without answering) or "close" (200
with `connection: close`). Runs are short (about 0.5 s of schedule each).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import pytest
import uvloop

from surge.loadtest.generator import Plan, PulseGenerator, Target
from surge.loadtest.schedule import Schedule, Segment
from surge.loadtest.stats import Record
from tests.ports import free_port

Behaviour = Callable[[int], str]


@dataclass
class Server:
    behaviour: Behaviour
    delay_s: float = 0.0
    seen: int = 0
    bodies: list[bytes] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)  # loop time of each request
    connections: int = 0
    close_on_connect: bool = False  # like a server out of file descriptors


class _Handler(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.body = b""
        self.transport: asyncio.Transport | None = None
        server.connections += 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.server.close_on_connect:
            transport.close()

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        server, body = self.server, self.body
        self.body = b""
        what = server.behaviour(server.seen)
        server.seen += 1
        server.bodies.append(body)
        server.arrived.append(asyncio.get_running_loop().time())
        if server.delay_s:
            asyncio.get_running_loop().call_later(server.delay_s, self.answer, what)
        else:
            self.answer(what)

    def answer(self, what: str) -> None:
        assert self.transport is not None
        if what == "hang" or self.transport.is_closing():
            return
        if what == "drop":
            self.transport.close()
            return
        status = 200 if what == "close" else int(what)
        extra = b"connection: close\r\n" if what == "close" else b""
        body = b"" if status in (204, 304) else b"ok"  # these statuses carry no body
        self.transport.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n%s\r\n%s"
                             % (status, len(body), extra, body))
        if what == "close":
            self.transport.close()


def pulse_against(server: Server | None, rps: float = 200, seconds: float = 0.5,
                  **plan: object) -> tuple[PulseGenerator, Record]:
    port = free_port()

    async def main() -> tuple[PulseGenerator, Record]:
        loop = asyncio.get_running_loop()
        listener = None
        if server is not None:
            listener = await loop.create_server(lambda: _Handler(server), "127.0.0.1", port)
        generator = PulseGenerator(Plan(
            url=f"http://127.0.0.1:{port}/x?y=1",
            schedule=Schedule((Segment(seconds, rps, rps),)), **plan))  # type: ignore[arg-type]
        record = await generator.run()
        if listener is not None:
            listener.close()
        return generator, record

    return uvloop.run(main())


def test_statuses_are_counted_exactly() -> None:
    server = Server(lambda n: ("200", "503", "500", "204")[n % 4])
    _, record = pulse_against(server)
    record.check()
    assert record.sent == server.seen == 100
    assert record.total_ok == 50
    assert record.error_totals() == {"503": 25, "timeout": 0, "connection": 0, "500": 25}
    assert record.unanswered == 0
    assert record.offered[:5] == [20] * 5


def test_no_answer_is_a_timeout_at_its_scheduled_time_plus_timeout() -> None:
    _, record = pulse_against(Server(lambda n: "hang"), rps=100, seconds=0.3, timeout_s=0.3)
    record.check()
    assert record.sent == 30
    assert record.error_totals()["timeout"] == 30
    # requests of points 0..2 time out 0.3 s later: points 3..5
    assert record.errors["timeout"][3:6] == [10, 10, 10]
    assert record.errors_sent["timeout"][:3] == [10, 10, 10]


def test_refused_connections_fail_each_request() -> None:
    notices: list[str] = []

    async def main() -> Record:
        plan = Plan(url=f"http://127.0.0.1:{free_port()}/",
                    schedule=Schedule((Segment(0.3, 100, 100),)))
        return await PulseGenerator(plan, notice=notices.append).run()

    record = uvloop.run(main())
    record.check()
    assert record.sent == 30
    assert record.error_totals()["connection"] == 30
    assert len(notices) == 1 and "cannot connect" in notices[0]


def test_connection_close_responses_are_ok_and_reconnect() -> None:
    server = Server(lambda n: "close")
    _, record = pulse_against(server, rps=100)
    record.check()
    assert record.total_ok == record.sent == 50
    assert record.connections_opened >= 45


def test_dropped_connections_are_connection_errors() -> None:
    server = Server(lambda n: "drop" if n % 3 == 0 else "200")
    _, record = pulse_against(server, rps=150)
    record.check()
    assert record.sent == server.seen == 75
    assert record.error_totals()["connection"] == 25
    assert record.total_ok == 50


def test_connections_closed_on_accept_fail_each_request() -> None:
    server = Server(lambda n: "200", close_on_connect=True)
    generator, record = pulse_against(server, rps=100, seconds=0.3)
    record.check()
    assert record.sent == 30
    assert record.error_totals()["connection"] == 30
    assert generator.outstanding == 0


def test_max_time_stops_the_run_and_counts_the_rest_unanswered() -> None:
    generator, record = pulse_against(Server(lambda n: "hang"), rps=100, seconds=1.0,
                                      timeout_s=5.0, max_time_s=0.5)
    record.check()
    assert generator.stopped_early
    # Nothing scheduled after the 0.5 s bound is sent (the schedule holds 100). Fewer than
    # the 50 scheduled before it go out when the host stalls the sender past the bound.
    assert 0 < record.sent <= 51
    assert record.unanswered == record.sent
    assert record.total_ok == 0


def test_a_full_pool_queues_and_latency_counts_the_wait() -> None:
    server = Server(lambda n: "200", delay_s=0.05)
    generator, record = pulse_against(server, rps=100, connections=2)
    record.check()
    assert record.total_ok == record.sent == 50
    assert record.waited > 0
    assert record.connections_peak <= 2
    assert server.connections <= 2
    # 2 connections x 20 req/s < 100 req/s offered: the last requests waited ~0.7 s
    worst = max(key for histogram in record.latency for key in histogram) / 1e6
    assert worst > 0.5
    assert "worker 0/1" in repr(generator)


def test_post_bodies_with_a_sequence_number() -> None:
    server = Server(lambda n: "200")
    _, record = pulse_against(server, rps=100, seconds=0.2, method="POST",
                              body=b'{"n": {seq}}', headers=(("x-test", "1"),))
    record.check()
    assert record.total_ok == 20
    assert sorted(server.bodies) == sorted(b'{"n": %d}' % i for i in range(1, 21))


def test_latency_counts_from_the_scheduled_time() -> None:
    _, record = pulse_against(Server(lambda n: "200", delay_s=0.03), rps=50, seconds=0.2)
    record.check()
    keys = [key for histogram in record.latency for key in histogram]
    assert min(keys) >= 29_000  # the server's timer may fire a hair early


def test_target_and_plan_validation() -> None:
    assert Target.parse("http://example.test/a?b=c") == Target("example.test", 80, "/a?b=c",
                                                               "example.test")
    assert Target.parse("http://127.0.0.1:81") == Target("127.0.0.1", 81, "/", "127.0.0.1:81")
    schedule = Schedule((Segment(1, 1, 1),))
    for bad in ({"url": "https://x/"}, {"url": "x"}, {"method": "HEAD"},
                {"arrivals": "bursty"}, {"timeout_s": 0}, {"connections": 0},
                {"max_time_s": 0}):
        with pytest.raises(ValueError):
            Plan(**{"url": "http://127.0.0.1/", "schedule": schedule, **bad})  # type: ignore[arg-type]
    head = Plan(url="http://h:1/p", schedule=schedule, headers=(("a", "b"),)).request_head()
    assert head == b"GET /p HTTP/1.1\r\nhost: h:1\r\nuser-agent: surge-pulse\r\na: b\r\n"


def test_a_trace_is_replayed_at_its_times_with_its_requests(tmp_path: Path) -> None:
    import json

    from surge.loadtest.llm import LLMPreset
    from surge.loadtest.traces import TraceRequest, write_mooncake

    trace = [TraceRequest(0.0, 600, 3, (1, 2)), TraceRequest(0.0, 10, 5, (1,)),
             TraceRequest(0.1, 520, 7, (1, 9)), TraceRequest(0.25, 4, 2)]
    write_mooncake(trace, tmp_path / "t.jsonl")
    llm = LLMPreset(trace=str(tmp_path / "t.jsonl"), trace_speed=0.5)  # half speed
    server = Server(lambda n: "200")
    _, record = pulse_against(server, seconds=0.6, method="POST", llm=llm)
    record.check()
    assert record.total_ok == 4
    bodies = [json.loads(b) for b in server.bodies]
    assert sorted(b["max_tokens"] for b in bodies) == [2, 3, 5, 7]
    by_tokens = {b["max_tokens"]: b["messages"][0]["content"].split() for b in bodies}
    assert [len(by_tokens[t]) for t in (3, 5, 7, 2)] == [600, 10, 520, 4]
    assert by_tokens[5] == by_tokens[3][:10] == by_tokens[7][:10]  # block 1, shared
    assert by_tokens[7][512:] != by_tokens[3][512:520]  # block 9 is not block 2
    # at half speed the trace's times double: sent (as scheduled, counted at the 100 ms
    # point of the scheduled time) at 0, 0, 0.2 and 0.5 s. The arrivals' spacing is not
    # checked: a loaded machine may send the first ones late (0.36 s apart once here)
    assert [(p, n) for p, n in enumerate(record.offered) if n] == [(0, 2), (2, 1), (5, 1)]
    assert llm.trace_schedule().total == 4
