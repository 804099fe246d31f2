"""The per-process router runtime: one controller subscription, one router per deployment.

Proxies, handles in the driver and handles inside replicas all use it. It subscribes
to the controller's pushes (route table, replica sets) and keeps serving from the last
copy while the controller is away, reconnecting in the background.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from surge.clock import SYSTEM, Clock
from surge.control_auth import find_token
from surge.errors import ControlAuthError, ControllerUnavailableError
from surge.model import LOCAL_NODE, DeploymentId, ReplicaSet, RouteTable
from surge.policy.cadence import (
    MAX_LOAD_REPORT_INTERVAL_S,
    MAX_TELEMETRY_INTERVAL_S,
    TELEMETRY_INTERVAL_S,
    TELEMETRY_KEEPALIVE_S,
    TICK_S,
    URGENT_REPORT_DELAY_S,
)
from surge.router.router import Router
from surge.transport.rpc import HANDSHAKE_TIMEOUT_S, RpcPeer, connect_rpc

if TYPE_CHECKING:
    from surge.observability.recorder import TelemetryReport

__all__ = [
    "BackgroundLoop",
    "RouterRuntime",
    "current_runtime",
    "set_runtime",
    "set_runtime_factory",
    "telemetry_quiet",
]

log = logging.getLogger("surge.runtime")

RECONNECT_INTERVAL_S = 0.2  # a restarted controller is back in ~1 s
RECONNECT_WAIT_S = 10.0  # a control call made while reconnecting waits this long
# How long a member's connect may wait for the controller to accept it: a herd of thousands can
# overflow its accept queue, and a dropped SYN is retried by the kernel after 1, 3, 7 s
# (a refused connection still fails at once).
MEMBER_CONNECT_TIMEOUT_S = HANDSHAKE_TIMEOUT_S
CONNECT_TIMEOUT_S = 5.0  # a driver's (connect_rpc's default)
# How often routers report their load to the controller (only what changed is sent):
# once per control-loop tick, or less often when a controller with many routers says
# so (`load_interval`, policy/cadence.py; a new controller starts from this). An urgent
# report (a queue started to grow) goes after URGENT_REPORT_DELAY_S instead, to gather
# the burst's first few ms.
LOAD_REPORT_INTERVAL_S = TICK_S
# Proxies and replicas send their request metrics (counter deltas) every
# TELEMETRY_INTERVAL_S (Prometheus scrapes every 10-15 s and the dashboard samples every
# second, so 1 s loses nothing), or less often when a controller with many members says
# so (`telemetry_interval`), an idle one only every TELEMETRY_KEEPALIVE_S
# (policy/cadence.py: a replica's keepalive is also its default health check).

RpcMethod = Callable[..., Awaitable[Any]]


def telemetry_quiet(report: Any, sent: tuple[float, TelemetryReport] | None,
                    now: float) -> bool:
    """An idle report that repeats the last one `sent` (at, report) in all but time,
    within TELEMETRY_KEEPALIVE_S of it: skipped (it carries no counts, and its gauges
    and models are the ones sent, so nothing is lost)."""
    # Imported here: only replicas and proxies report telemetry (they import it anyway);
    # a driver's routers do not, and need not import the recorder.
    from surge.observability.recorder import TelemetryReport

    if not isinstance(report, TelemetryReport) or sent is None:
        return False
    at, last = sent
    return (report.empty and not report.exceptions and not report.first
            and now - at < TELEMETRY_KEEPALIVE_S
            and report.gauges == last.gauges and report.models == last.models)


class RouterRuntime:
    def __init__(self, controller_address: str, role: str,
                 rpc_methods: dict[str, RpcMethod] | None = None,
                 hello: dict[str, Any] | None = None, *, token: str | None = None,
                 node_id: str = LOCAL_NODE, clock: Clock = SYSTEM) -> None:
        self.address = controller_address
        # The instance's token (given to members; a driver finds it): it also guards
        # links to replicas on other nodes.
        self.token = token if token is not None else find_token(controller_address)
        self.role = role
        self.node_id = node_id
        self.clock = clock
        self.loop = asyncio.get_running_loop()
        self.routers: dict[DeploymentId, Router] = {}
        self.routes = RouteTable()
        self.routes_received = asyncio.Event()
        self.rpc_methods = dict(rpc_methods or {})
        self.hello = dict(hello or {})
        self.report_interval_s = LOAD_REPORT_INTERVAL_S  # the controller may ask for less
        self.telemetry_interval_s = TELEMETRY_INTERVAL_S  # as may it for telemetry
        self.peer: RpcPeer | None = None
        self.on_controller_lost: Callable[[], None] | None = None
        # While reconnecting: give up after this long (None: never), then call on_gave_up.
        self.reconnect_limit_s: float | None = None
        self.on_gave_up: Callable[[], None] | None = None
        self._closing = False
        self._reporter: asyncio.TimerHandle | None = None
        self._urgent: asyncio.TimerHandle | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._telemetry: Callable[[], Any] | None = None
        self._telemetry_timer: asyncio.TimerHandle | None = None
        self._telemetry_sent: tuple[float, Any] | None = None  # at, the last report sent

    def __repr__(self) -> str:
        return (f"<RouterRuntime {self.role} controller={self.address} "
                f"connected={self.peer is not None and not self.peer.is_closed} "
                f"routers={len(self.routers)}>")

    async def connect(self) -> None:
        # A driver is told at once that nothing answers; a member waits its turn.
        patience = CONNECT_TIMEOUT_S if self.role == "driver" else MEMBER_CONNECT_TIMEOUT_S
        peer = await connect_rpc(self.address, self, token=self.token, timeout=patience)
        self.report_interval_s = LOAD_REPORT_INTERVAL_S  # until this controller says
        self.telemetry_interval_s = TELEMETRY_INTERVAL_S
        await peer.call("hello", role=self.role, pid=os.getpid(), **self.hello)
        self.peer = peer
        self._telemetry_sent = None  # a new controller: the next report goes at once
        for deployment in self.routers:
            await peer.call("watch", deployment=deployment)
        if self._reporter is None:
            self._reporter = self.loop.call_later(self.report_interval_s, self._report_load)

    def _push_load(self, topic: str) -> None:
        """Send what changed in every router since its last report, if anything did."""
        peer = self.peer
        if peer is not None and not peer.is_closed:
            urgent = topic == "load_urgent"
            reports = [r for r in (router.load_report(urgent)
                                   for router in self.routers.values()) if r is not None]
            if reports:
                peer.push(topic, reports)

    def _urgent_report(self) -> None:
        """Report within a few ms (once): a queue started to grow."""
        if self._urgent is None and not self._closing:
            self._urgent = self.loop.call_later(URGENT_REPORT_DELAY_S, self._send_urgent)

    def _send_urgent(self) -> None:
        self._urgent = None
        self._push_load("load_urgent")

    def _report_load(self) -> None:
        self._reporter = None
        if self._closing:
            return
        for router in self.routers.values():
            router.reclaim_unread()
        self._push_load("load")
        self._reporter = self.loop.call_later(self.report_interval_s, self._report_load)

    def report_telemetry(self, source: Callable[[], Any]) -> None:
        """Push `source()` (a TelemetryReport of counter deltas) every
        `telemetry_interval_s`, and at close."""
        self._telemetry = source
        if self._telemetry_timer is None:
            self._telemetry_timer = self.loop.call_later(self.telemetry_interval_s,
                                                         self._push_telemetry)

    def _push_telemetry(self, again: bool = True) -> None:
        self._telemetry_timer = None
        peer, source = self.peer, self._telemetry
        if source is not None and peer is not None and not peer.is_closed:
            try:  # drained only when it can be sent: a report is never lost on purpose
                report, now = source(), self.clock.monotonic()
                if not again or not telemetry_quiet(report, self._telemetry_sent, now):
                    peer.push("telemetry", report)
                    self._telemetry_sent = (now, report)
            except Exception:
                log.exception("%s: cannot send telemetry", self.role)
        if again and not self._closing:
            self._telemetry_timer = self.loop.call_later(self.telemetry_interval_s,
                                                         self._push_telemetry)

    def router(self, deployment: DeploymentId) -> Router:
        router = self.routers.get(deployment)
        if router is None:
            router = self.routers[deployment] = Router(deployment, node_id=self.node_id,
                                                       clock=self.clock)
            router.token = self.token
            router.on_pressure = self._urgent_report
            if self.peer is not None and not self.peer.is_closed:
                self.loop.create_task(self._watch(deployment))
        return router

    async def _watch(self, deployment: DeploymentId) -> None:
        assert self.peer is not None
        try:
            await self.peer.call("watch", deployment=deployment)
        except ConnectionError:
            pass  # re-sent on reconnect

    async def call(self, method: str, timeout: float | None = None, **kwargs: Any) -> Any:
        """A call to the controller. Made while the link is down and being reconnected
        (a restarted controller is back in about a second), it waits for the link, up to
        RECONNECT_WAIT_S, as a call to Ray's restarting controller actor waits."""
        if self.peer is not None and self.peer.is_closed and not self._closing \
                and self.on_controller_lost is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._until_reconnected(), RECONNECT_WAIT_S)
        if self.peer is None or self.peer.is_closed:
            raise ControllerUnavailableError(f"not connected to the controller at {self.address}")
        return await self.peer.call(method, timeout=timeout, **kwargs)

    async def _until_reconnected(self) -> None:
        while self.peer is not None and self.peer.is_closed and not self._closing:
            if self._reconnecting is None:  # the loss is not seen yet, or it gave up
                await asyncio.sleep(RECONNECT_INTERVAL_S)
            else:
                await asyncio.wait([self._reconnecting])

    # -- RpcHandler ----------------------------------------------------------------------

    async def handle_rpc(self, peer: RpcPeer, method: str, kwargs: dict[str, Any]) -> Any:
        handler = self.rpc_methods.get(method)
        if handler is None:
            raise ValueError(f"{self.role} has no RPC method {method!r}")
        return await handler(**kwargs)

    def on_push(self, peer: RpcPeer, topic: str, value: Any) -> None:
        if topic == "replica_set":
            assert isinstance(value, ReplicaSet)
            self.router(value.deployment).update(value)
        elif topic == "routes":
            assert isinstance(value, RouteTable)
            self.routes = value
            self.routes_received.set()
        elif topic == "load_interval":  # the controller has many routers (policy/cadence.py)
            self.report_interval_s = min(MAX_LOAD_REPORT_INTERVAL_S,
                                         max(LOAD_REPORT_INTERVAL_S, float(value)))
        elif topic == "telemetry_interval":  # ... or many members
            self.telemetry_interval_s = min(MAX_TELEMETRY_INTERVAL_S,
                                            max(TELEMETRY_INTERVAL_S, float(value)))

    def on_disconnect(self, peer: RpcPeer) -> None:
        if self._closing:
            return
        log.warning("%s lost the controller at %s; serving from the last routes", self.role,
                    self.address)
        if self.on_controller_lost is not None:
            self.on_controller_lost()
        elif self._reconnecting is None:
            self._reconnecting = self.loop.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        started = self.clock.monotonic()
        try:
            while not self._closing:
                await asyncio.sleep(RECONNECT_INTERVAL_S)
                try:
                    await self.connect()
                    log.info("%s reconnected to the controller", self.role)
                    return
                except ControlAuthError:  # another instance holds the address now
                    log.error("%s: the instance at %s is not ours any more; giving up",
                              self.role, self.address)
                    break
                except (ControllerUnavailableError, ConnectionError):
                    limit = self.reconnect_limit_s
                    if limit is not None and self.clock.monotonic() - started > limit:
                        log.error("%s: no controller at %s for %.0f s; giving up", self.role,
                                  self.address, limit)
                        break
            if not self._closing and self.on_gave_up is not None:
                self.on_gave_up()
        finally:
            self._reconnecting = None

    def expect_disconnect(self) -> None:
        """The controller is being shut down on purpose: do not reconnect."""
        self._closing = True
        for router in self.routers.values():
            router.closing = True

    async def settle(self, timeout_s: float) -> bool:
        """Wait, at most `timeout_s`, until no call this process made is queued or in
        flight (e.g. one a replica's `__del__` fired and forgot): whether they all ended."""
        deadline = self.clock.monotonic() + timeout_s
        await asyncio.sleep(0.01)  # calls just made start on the loop's next turns
        while any(router.in_flight or router.queued for router in self.routers.values()):
            if self.clock.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def close(self) -> None:
        self.expect_disconnect()
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self._reporter is not None:
            self._reporter.cancel()
        if self._telemetry_timer is not None:
            self._telemetry_timer.cancel()
            self._push_telemetry(again=False)  # the last second's counts
        for router in self.routers.values():
            router.close()
        if self.peer is not None:
            self.peer.close()


_current: RouterRuntime | None = None
_factory: Callable[[], RouterRuntime] | None = None


def set_runtime(runtime: RouterRuntime | None) -> None:
    global _current
    _current = runtime


def set_runtime_factory(factory: Callable[[], RouterRuntime] | None) -> None:
    """How a process without a runtime (a driver script) gets one on first use."""
    global _factory
    _factory = factory


def current_runtime() -> RouterRuntime:
    global _current
    if _current is None:
        if _factory is None:
            raise ControllerUnavailableError(
                "no surge instance in this process; call serve.start() or serve.run() first")
        _current = _factory()
    return _current


class BackgroundLoop:
    """An event loop on a daemon thread, for processes whose main thread is the user's."""

    def __init__(self, name: str = "surge-loop") -> None:
        import uvloop

        self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(
            coro, self.loop)
        return future.result(timeout)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
