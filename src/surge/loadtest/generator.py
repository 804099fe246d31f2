"""The open-loop generator: send each request at its scheduled time, whatever the server does.

One asyncio loop (uvloop in practice) drives a bounded pool of keep-alive HTTP/1.1
connections, raw `asyncio.Protocol`s with httptools parsing the responses; one request
in flight per connection, no pipelining, so latency is never hidden behind another
request. A ticker wakes when the next request is due (timers tick in ~1 ms) and hands
every due request to an idle connection; with none idle it opens a new one up to
`connections`, and past that the request waits in a bounded FIFO. Nothing ever lowers
the offered load: latency counts from the *scheduled* send time, so a request that
waited (for the CPU or for a connection) carries its wait, and the wait is recorded as
send lag so the report can say how far behind the generator fell.

Every request ends exactly once in the `Record`: 2xx, another status, "timeout" (no
answer `timeout_s` after its scheduled time; its connection is closed), "connection"
(refused, reset or closed mid-request, unparseable answer), "overflow" (the wait queue
was full) or, if the run is cut short by `max_time_s`, unanswered.

(A little over 500 lines: the schedule's sender and the connection pool it hands requests
to are one state machine, whose hot path is kept flat; split, each half would reach into
the other's fields.)
"""

from __future__ import annotations

import asyncio
import collections
import gc
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools
import numpy as np

from surge.clock import Clock, SystemClock
from surge.loadtest.llm import LLMPreset, StreamTracker
from surge.loadtest.schedule import ARRIVALS, Schedule, arrival_times
from surge.loadtest.stats import POINTS_PER_S, Record

__all__ = ["MAX_WAITING", "Plan", "PulseGenerator", "Target"]

# Arrival times are generated this many seconds at a time: bounded memory at any rate.
CHUNK_S = 0.1
# Timeouts are enforced by a sweep this often (so at most this late), not one timer each.
SWEEP_S = 0.05
# Never sleep less than this between ticks: uvloop timers have 1 ms resolution, and
# spinning would steal the CPU from the server on a small machine.
TICK_S = 0.001
# Requests that may wait for a connection at once; past it they fail as "overflow".
MAX_WAITING = 1_000_000
# Connections opened before t=0 so the first requests do not pay for a TCP handshake.
WARM_CONNECTIONS = 8
_EPS = 1e-9


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str  # path and query, as sent on the request line
    host_header: str

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http://host[:port]/path URL, got {url!r} "
                             "(https is not supported)")
        port = parts.port or 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = parts.hostname if port == 80 else f"{parts.hostname}:{port}"
        return cls(parts.hostname, port, path, host_header)


@dataclass(frozen=True)
class Plan:
    """What one generator process sends: its share of the schedule and of the pool."""

    url: str
    schedule: Schedule
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""  # "{seq}" in it is replaced by the request's number
    arrivals: str = "uniform"
    seed: int = 0
    timeout_s: float = 10.0
    connections: int = 512
    max_time_s: float | None = None  # bound on the whole run, draining included
    worker: int = 0
    workers: int = 1
    llm: LLMPreset | None = None  # streamed OpenAI requests, a body per request
    target: Target = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", Target.parse(self.url))
        if self.method.upper() == "HEAD":
            raise ValueError("HEAD is not supported (responses carry no body to parse)")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals must be one of {ARRIVALS}")
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        if self.connections < 1:
            raise ValueError("connections must be >= 1")
        if self.max_time_s is not None and not self.max_time_s > 0:
            raise ValueError("max_time_s must be > 0")

    def request_head(self) -> bytes:
        lines = [f"{self.method.upper()} {self.target.path} HTTP/1.1",
                 f"host: {self.target.host_header}", "user-agent: surge-pulse"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        return ("\r\n".join(lines) + "\r\n").encode("latin-1")


def _transport(conn: _Connection) -> asyncio.Transport:
    assert conn.transport is not None  # connections enter the pool once connected
    return conn.transport


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `scheduled` >= 0 while a request is in flight."""

    __slots__ = ("closed", "parser", "pool", "scheduled", "stream", "transport")

    def __init__(self, pool: PulseGenerator) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.scheduled = -1.0
        self.closed = False  # connection_lost came: never write to it again
        self.stream: StreamTracker | None = None  # the LLM preset's, per request

    def on_body(self, body: bytes) -> None:
        stream = self.stream
        if stream is not None:
            stream.feed(body, self.pool._now() - self.pool._t0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.pool._broken(self)

    def on_message_complete(self) -> None:
        # The per-response hot path, kept flat: account, then reuse the connection.
        scheduled = self.scheduled
        if scheduled < 0:
            return  # nothing was asked: ignore
        pool = self.pool
        now = pool._now() - pool._t0
        self.scheduled = -1.0
        pool._in_flight -= 1
        status = self.parser.get_status_code()
        sent_point = int(scheduled * POINTS_PER_S + _EPS)
        done_point = int(now * POINTS_PER_S + _EPS)
        if 200 <= status < 300:
            pool.record.ok_at(sent_point, done_point, now - scheduled)
            stream = self.stream
            if stream is not None and stream.first >= 0:
                pool.record.stream_at(sent_point, stream.first, now, stream.first - scheduled,
                                      stream.tpot(), stream.tokens, stream.gaps,
                                      now - scheduled)
        else:
            pool.record.error_at(str(status), sent_point, done_point)
            if status == 503 or status == 429:
                pool.record.refused_at(sent_point, now - scheduled)
        if not self.parser.should_keep_alive():
            if self.transport is not None:
                self.transport.close()
        elif pool._waiting:
            pool._reuse(self, now)
        else:
            pool._idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._lost(self)


class PulseGenerator:
    """Runs one `Plan` on the running loop and fills a `Record`."""

    def __init__(self, plan: Plan, clock: Clock | None = None,
                 notice: Callable[[str], None] | None = None) -> None:
        self.plan = plan
        self.record = Record(slo=plan.llm.goodput if plan.llm is not None else None)
        self._now = (clock or SystemClock()).monotonic
        self._notice = notice or (lambda message: None)
        self._t0 = 0.0
        self._timeout = plan.timeout_s
        self._head = plan.request_head()
        self._templated = b"{seq}" in plan.body or plan.llm is not None
        self._request = self._render(0)
        self._seq = 0
        # a replayed trace: send time -> the trace indices scheduled then, in order
        self._trace = plan.llm is not None and bool(plan.llm.requests)
        self._trace_index: dict[float, collections.deque[int]] = {}
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._connecting = 0
        self._waiting: collections.deque[float] = collections.deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._connect_errors = 0
        self.stopped_early = False

    def __repr__(self) -> str:
        return (f"<PulseGenerator {self.plan.url} worker {self.plan.worker}/"
                f"{self.plan.workers} open={len(self._open)} idle={len(self._idle)} "
                f"in_flight={self._in_flight} waiting={len(self._waiting)}>")

    # -- what the runner reads -------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        """Seconds since t=0 of the schedule (negative before it)."""
        return self._now() - self._t0

    @property
    def open_connections(self) -> int:
        return len(self._open)

    @property
    def outstanding(self) -> int:
        return self._in_flight + len(self._waiting)

    # -- the run ----------------------------------------------------------------------------

    async def run(self, t0: float | None = None) -> Record:
        """Send the schedule starting at monotonic time `t0` (default: now + 0.2 s)."""
        self._t0 = self._now() + 0.2 if t0 is None else t0
        self.record.reserve(int((self.plan.schedule.duration_s + self._timeout + 1)
                                * POINTS_PER_S))
        deadline = math.inf if self.plan.max_time_s is None else self.plan.max_time_s
        chunks = self._chunks()
        first = next(chunks)  # numpy and the rng warmed up before t=0, not at it
        # Objects that exist now are never garbage: keep the collector's pauses short.
        gc.collect()
        gc.freeze()
        try:
            await self._warm_up()
            await self._send_all(deadline, first, chunks)
            await self._drain(deadline)
        finally:
            self._close()
            gc.unfreeze()
        return self.record

    def _chunks(self) -> Iterator[tuple[float, list[float]]]:
        """(end of the chunk, sorted send times in it), CHUNK_S of schedule at a time."""
        plan = self.plan
        if self._trace:
            assert plan.llm is not None
            yield from self._trace_chunks(plan.llm)
            return
        rng = np.random.default_rng([plan.seed, plan.worker])
        start = 0.0
        while True:
            end = start + CHUNK_S
            yield end, arrival_times(plan.schedule, start, end, arrivals=plan.arrivals,
                                     rng=rng, worker=plan.worker,
                                     workers=plan.workers).tolist()
            start = end

    def _trace_chunks(self, llm: LLMPreset) -> Iterator[tuple[float, list[float]]]:
        """The trace's send times (this worker's share), CHUNK_S at a time; each time's
        trace index waits in `_trace_index` for the send that carries it."""
        sends = llm.trace_times(self.plan.worker, self.plan.workers)
        at = 0
        end = 0.0
        while True:
            end += CHUNK_S
            times = []
            while at < len(sends) and sends[at][0] < end:
                time_s, index = sends[at]
                times.append(time_s)
                self._trace_index.setdefault(time_s, collections.deque()).append(index)
                at += 1
            yield end, times

    async def _warm_up(self) -> None:
        # Connections opened before t=0 are free; a refused one is no request's error yet.
        count = min(WARM_CONNECTIONS, self.plan.connections)
        target = self.plan.target
        loop = asyncio.get_running_loop()
        for _ in range(count):
            if self._now() >= self._t0:
                break
            try:
                _, conn = await asyncio.wait_for(loop.create_connection(
                    lambda: _Connection(self), target.host, target.port),
                    max(self._t0 - self._now(), 0.01))
            except (OSError, TimeoutError):
                break
            if conn.closed:
                break
            self._opened(conn)
            self._idle.append(conn)
        delay = self._t0 - self._now()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _send_all(self, deadline: float, first: tuple[float, list[float]],
                        chunks: Iterator[tuple[float, list[float]]]) -> None:
        duration = self.plan.schedule.duration_s
        chunk_end, times = first
        index = 0
        next_sweep = 0.0
        while True:
            now = self._now() - self._t0
            if now >= deadline:
                self.stopped_early = True
                return
            while index >= len(times):
                if chunk_end >= duration:
                    return
                chunk_end, times = next(chunks)
                index = 0
            count = len(times)
            idle, record, transport_of = self._idle, self.record, _transport
            while index < count and times[index] <= now:
                # the per-request hot path, kept flat: account, then send or queue
                scheduled = times[index]
                index += 1
                record.sent_at(int(scheduled * POINTS_PER_S + _EPS), now - scheduled)
                conn = idle.pop() if idle and not self._templated else None
                if conn is not None and not conn.closed:
                    conn.scheduled = scheduled
                    self._in_flight += 1
                    transport_of(conn).write(self._request)
                else:
                    self._dispatch(scheduled, now)
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + SWEEP_S
            due = times[index] if index < count else chunk_end
            await asyncio.sleep(max(min(due, next_sweep) - now, TICK_S))

    async def _drain(self, deadline: float) -> None:
        while self.outstanding:
            now = self._now() - self._t0
            if now >= deadline:
                self.stopped_early = True
                return
            self._sweep(now)
            await asyncio.sleep(SWEEP_S / 5)

    def _close(self) -> None:
        self.record.unanswered += self.outstanding
        self._waiting.clear()
        self._in_flight = 0
        for conn in list(self._open):
            conn.scheduled = -1.0
            if conn.transport is not None:
                conn.transport.abort()
        for task in self._tasks:
            task.cancel()

    # -- requests ---------------------------------------------------------------------------

    def _render(self, seq: int) -> bytes:
        if self.plan.llm is not None:
            body = self.plan.llm.body(seq + self.plan.worker * 1_000_000_000)
        elif self._templated:
            body = self.plan.body.replace(b"{seq}", str(seq).encode())
        else:
            body = self.plan.body
        return self._with_body(body)

    def _with_body(self, body: bytes) -> bytes:
        if not body and self.plan.method.upper() == "GET":
            return self._head + b"\r\n"
        return self._head + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body

    def _dispatch(self, scheduled: float, now: float) -> None:
        """Send a request already counted as offered, or queue it for a connection."""
        point = int(scheduled * POINTS_PER_S + _EPS)
        if self._idle:
            self._send(self._idle.pop(), scheduled)
            return
        waiting = self._waiting
        full = len(self._open) + self._connecting >= self.plan.connections
        if full:
            self.record.waited += 1
        if len(waiting) >= MAX_WAITING:
            self.record.error_at("overflow", point, int(now * POINTS_PER_S + _EPS))
            self._never_sent(scheduled)
            return
        waiting.append(scheduled)
        if not full and self._connecting < len(waiting):
            self._connect()

    def _send(self, conn: _Connection, scheduled: float) -> None:
        if conn.closed:  # the server closed it before it could carry this request
            self._never_sent(scheduled)
            now = self._now() - self._t0
            self.record.error_at("connection", int(scheduled * POINTS_PER_S + _EPS),
                                 int(now * POINTS_PER_S + _EPS))
            return
        conn.scheduled = scheduled
        self._in_flight += 1
        if self.plan.llm is not None:
            conn.stream = StreamTracker()
        if self._trace:
            body = self.plan.llm.trace_body(self._trace_request(scheduled))  # type: ignore[union-attr]
            request = self._with_body(body)
        elif self._templated:
            self._seq += 1
            request = self._render(self._seq)
        else:
            request = self._request
        assert conn.transport is not None
        conn.transport.write(request)

    def _next_waiting(self, now: float) -> float | None:
        """The oldest waiting request that has not timed out yet (expired ones end here)."""
        waiting = self._waiting
        while waiting:
            scheduled = waiting.popleft()
            if scheduled + self._timeout > now:
                return scheduled
            self._timed_out(scheduled)
        return None

    def _trace_request(self, scheduled: float) -> int:
        """The trace index of the request scheduled at `scheduled` (taken)."""
        indices = self._trace_index[scheduled]
        index = indices.popleft()
        if not indices:
            del self._trace_index[scheduled]
        return index

    def _never_sent(self, scheduled: float) -> None:
        """A request that ended before it was sent: its trace index is dropped."""
        if self._trace:
            self._trace_request(scheduled)

    def _timed_out(self, scheduled: float) -> None:
        self._never_sent(scheduled)
        self.record.error_at("timeout", int(scheduled * POINTS_PER_S + _EPS),
                             int((scheduled + self._timeout) * POINTS_PER_S + _EPS))

    def _fail(self, conn: _Connection, kind: str, now: float) -> None:
        """End the request in flight on `conn` as an error of class `kind`."""
        scheduled = conn.scheduled
        conn.scheduled = -1.0
        self._in_flight -= 1
        self.record.error_at(kind, int(scheduled * POINTS_PER_S + _EPS),
                             int(now * POINTS_PER_S + _EPS))

    # -- connection events (called by _Connection) -------------------------------------------

    def _reuse(self, conn: _Connection, now: float) -> None:
        scheduled = self._next_waiting(now)
        if scheduled is None:
            self._idle.append(conn)
        else:
            self._send(conn, scheduled)

    def _broken(self, conn: _Connection) -> None:
        if conn.scheduled >= 0:
            self._fail(conn, "connection", self._now() - self._t0)
        if conn.transport is not None:
            conn.transport.abort()

    def _lost(self, conn: _Connection) -> None:
        self._open.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        if conn.scheduled >= 0:
            self._fail(conn, "connection", self._now() - self._t0)
        if self._waiting and self._connecting < len(self._waiting) \
                and len(self._open) + self._connecting < self.plan.connections:
            self._connect()

    # -- the pool ----------------------------------------------------------------------------

    def _connect(self) -> None:
        self._connecting += 1
        task = asyncio.get_running_loop().create_task(self._open_one())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open_one(self) -> None:
        target, loop = self.plan.target, asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: _Connection(self), target.host, target.port), self._timeout)
        except (OSError, TimeoutError) as exc:
            self._connecting -= 1
            self._connect_failed(exc)
            return
        self._connecting -= 1
        if conn.closed:  # accepted and closed at once (e.g. a server out of descriptors)
            self._connect_failed(ConnectionResetError("closed by the server on connect"))
            return
        self._opened(conn)
        now = self._now() - self._t0
        scheduled = self._next_waiting(now) if self._waiting else None
        if scheduled is None:
            self._idle.append(conn)
        else:
            self._send(conn, scheduled)

    def _opened(self, conn: _Connection) -> None:
        self._open.add(conn)
        self.record.connections_opened += 1
        self.record.connections_peak = max(self.record.connections_peak, len(self._open))

    def _connect_failed(self, exc: BaseException) -> None:
        self._connect_errors += 1
        if self._connect_errors == 1:
            target = self.plan.target
            self._notice(f"cannot connect to {target.host}:{target.port}: "
                         f"{exc or type(exc).__name__}; each refused attempt fails one "
                         "request as a connection error")
        now = self._now() - self._t0
        scheduled = self._next_waiting(now) if self._waiting else None
        if scheduled is not None:
            self.record.error_at("connection", int(scheduled * POINTS_PER_S + _EPS),
                                 int(now * POINTS_PER_S + _EPS))

    def _sweep(self, now: float) -> None:
        """End every request older than timeout_s: waiting ones, and in-flight ones."""
        limit = now - self._timeout
        waiting = self._waiting
        while waiting and waiting[0] <= limit:
            self._timed_out(waiting.popleft())
        for conn in [c for c in self._open if 0 <= c.scheduled <= limit]:
            scheduled = conn.scheduled
            conn.scheduled = -1.0
            self._in_flight -= 1
            self._timed_out(scheduled)
            if conn.transport is not None:
                conn.transport.abort()
