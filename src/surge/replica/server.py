"""The replica's frame server: its slots (`max_ongoing_requests`), draining, and what
it tells every router.

Each connection is one router (replica/connection.py: its frames, its requests, their
answers). A request beyond `max_ongoing_requests`, or any request while draining, is
answered `Rejected` at once so the router retries elsewhere; the slot counts are locked
(`_counts`), since a pool worker that answered a handle call to a plain `def` method
frees its slot from its own thread (sync_calls.py). A multiplexed replica sends its
routers a `Models` frame whenever the models it holds or loads change (at most one per
loop turn), and to each new router at once; one whose class reports routing stats sends
a `RoutingStats` frame every period the same way (replica/stats_hooks.py). Latencies
recorded on workers wait for the loop's next telemetry report.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
from collections.abc import Callable

from surge.clock import SYSTEM, Clock
from surge.observability.recorder import Recorder, TelemetryReport
from surge.observability.user_metrics import UserReport
from surge.replica import multiplex
from surge.replica.connection import RouterConnection
from surge.replica.grpc import GrpcMethods
from surge.replica.sync_calls import SyncCalls
from surge.replica.user_code import UserCode
from surge.transport.messages import Models, PrefixHeld, RoutingStats

__all__ = ["ReplicaServer"]

# Latencies recorded by workers that the loop has not yet added to the recorder (it
# does once a second, with each telemetry report); beyond this many the oldest go.
WORKER_RECORDS_MAX = 1 << 16


class ReplicaServer:
    def __init__(self, user: UserCode, max_ongoing_requests: int, name: str,
                 recorder: Recorder | None = None, *, metrics: bool = True,
                 clock: Clock = SYSTEM, app: str = "") -> None:
        self.user = user
        self.app = app  # the application, for each request's context
        # Processing latency and user errors per route (HTTP) or method (handle calls).
        self.recorder = recorder or Recorder("replica", name)
        self.metrics = metrics  # off: no recording at all (nobody reads it)
        self.clock = clock
        self.sync_calls = SyncCalls(user, clock, app)
        self.max_ongoing = max_ongoing_requests
        self.name = name
        self.ongoing = 0
        self.draining = False
        self.served = 0
        self.answered_by_workers = 0
        self._counts = threading.Lock()  # the loop and the pool's workers free slots
        self._answering = 0  # workers that freed their slot and are writing the answer
        self._loop = asyncio.get_running_loop()
        self.idle = asyncio.Event()
        self.idle.set()
        self.connections: set[RouterConnection] = set()
        # (route, latency in ms, ok, the exception's type name when the user's code raised)
        self._worker_records: collections.deque[tuple[str, float, bool, str]] = (
            collections.deque(maxlen=WORKER_RECORDS_MAX))
        self.grpc = GrpcMethods()  # the servicers' methods, imported by the first gRPC call
        self.models: Models | None = None  # the last Models frame sent, None: never
        self.routing_stats: RoutingStats | None = None  # the last RoutingStats sent
        self._models_due = False
        multiplex.watch(self._models_changed)
        if multiplex.has_caches():  # made by the constructor: say so before any load
            self._models_changed()

    def __repr__(self) -> str:
        return (f"<ReplicaServer {self.name} ongoing={self.ongoing}/{self.max_ongoing} "
                f"served={self.served} draining={self.draining}>")

    def protocol(self) -> RouterConnection:
        return RouterConnection(self)

    def protocol_requiring(self, token: str) -> Callable[[], RouterConnection]:
        """For a TCP listener: a connection must complete the token handshake first,
        since handle calls carry pickled arguments (Unix sockets are private to the user)."""
        return functools.partial(RouterConnection, self, token)

    def _models_changed(self) -> None:
        if not self._models_due:
            self._models_due = True
            asyncio.get_running_loop().call_soon(self._send_models)

    def _send_models(self) -> None:
        self._models_due = False
        settings = multiplex.routing_settings()
        frame = Models(0, multiplex.loaded_model_ids(), settings.max_copies,
                       settings.matching_timeout_s, settings.capacity, settings.lora_base)
        if frame == self.models:
            return
        self.models = frame
        self.broadcast(frame)

    def broadcast(self, frame: Models | RoutingStats | PrefixHeld) -> None:
        """Send a frame that is no request's to every router (that proved the token)."""
        if isinstance(frame, RoutingStats):
            self.routing_stats = frame
        for connection in self.connections:
            if connection.handshake is None:
                connection.send(frame)

    def greet(self, connection: RouterConnection) -> None:
        """What a new router is told at once: the models held, the latest routing stats."""
        for frame in (self.models, self.routing_stats):
            if frame is not None:
                connection.send(frame)

    def admit(self) -> bool:
        with self._counts:
            if self.draining or self.ongoing >= self.max_ongoing:
                return False
            self.ongoing += 1
        self.idle.clear()
        return True

    def release(self) -> None:
        with self._counts:
            self.ongoing -= 1
            self.served += 1
            idle = self.ongoing == 0 and self._answering == 0
        if idle:
            self.idle.set()

    def release_from_worker(self, answer: Callable[[], None]) -> None:
        """(A pool worker that ran its call.) Free the slot, then `answer`: the caller may
        send its next call as soon as it has the answer, and finds the slot free. A drain
        ends only once the answer has left too. Only a drain needs the loop told."""
        with self._counts:
            self.ongoing -= 1
            self.served += 1
            self.answered_by_workers += 1
            self._answering += 1
        try:
            answer()
        finally:
            with self._counts:
                self._answering -= 1
                tell = self.draining and self.ongoing == 0 and self._answering == 0
            if tell:
                self._loop.call_soon_threadsafe(self.idle.set)

    def record_from_worker(self, route: str, latency_ms: float, error: str = "") -> None:
        """(A pool worker.) `error`: the type name of what the user's code raised."""
        record = (route, latency_ms, not error, error)
        self._worker_records.append(record)  # deque: safe from any thread

    def drain_telemetry(self, gauges: dict[str, float],
                        user: UserReport | None = None) -> TelemetryReport:
        """(The loop.) What was recorded since the last report, workers' records too
        (`user`: the user's own metrics, as Recorder.drain takes them)."""
        records = self._worker_records
        while records:
            route, latency_ms, ok, error = records.popleft()
            self.recorder.processed(route, latency_ms, ok)
            if error:
                self.recorder.exception(route, error)
        return self.recorder.drain(gauges, user=user)

    async def drain(self, timeout_s: float) -> bool:
        """Stop admitting and wait for in-flight work; True when it all finished."""
        with self._counts:
            self.draining = True  # a worker freeing the last slot from now on tells us
            if self.ongoing == 0 and self._answering == 0:
                return True
        try:
            await asyncio.wait_for(self.idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
