"""Many fake routers in one process, each with its own control connection.

    python bench/scale/router_host.py   (config: one JSON line on stdin, then commands)

A fake router does what a proxy's router runtime (surge/router/runtime.py) does on the
control path: it connects and proves the token, says hello as a proxy, watches the
ingress deployment of every route the controller pushes, keeps the replica sets it is
pushed, pushes a load report every 0.1 s (or the `load_interval` the controller pushes)
when its counters changed (`load`), and one within 5 ms when its queue starts to grow
(`load_urgent`), and its telemetry every second or the `telemetry_interval` pushed (a
proxy's Recorder report, with the requests it "served"; idle, only every
TELEMETRY_KEEPALIVE_S, as the runtime does). It
opens no link to any replica.

What it measures: the size of every push it gets (the frame's payload), and per
replica id the first time it was in a router's set and the time it left it (kept per
host: how many routers saw it, and the latest of their times). Commands on stdin:
`load` (in_flight: the routers' mean requests in flight, spread over this host's routers
as whole requests that add up to it, so a slowly rising load rises one router's request
at a time, not every router's at once; service_s: their service time, which gives each
router's rate; queued per router; `applied` event with its time), `status`,
`seen` / `gone` (ids), `pushes` (sizes by topic since the last reset).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from bench.scale.wire import emit, next_command, read_commands
from surge.model import DeploymentId, LoadReport, ReplicaSet, ReplicaSetDelta, RouteTable
from surge.observability.recorder import Recorder, TelemetryReport
from surge.policy.cadence import TELEMETRY_INTERVAL_S
from surge.router.runtime import (
    MEMBER_CONNECT_TIMEOUT_S,
    RECONNECT_INTERVAL_S,
    telemetry_quiet,
)
from surge.transport.messages import Message, Push
from surge.transport.rpc import RpcPeer, connect_rpc

# surge.router.runtime's cadence (LOAD_REPORT_INTERVAL_S, TELEMETRY_INTERVAL_S, idle
# reports only as keepalives) and surge.policy.autoscale_step.URGENT_REPORT_DELAY_S.
LOAD_REPORT_INTERVAL_S = 0.1
URGENT_REPORT_DELAY_S = 0.005


# Replica-set pushes decoded once per host: the controller pickles one payload for all
# of a deployment's watchers (transport.rpc.broadcast), so this host's routers get the
# same bytes; a real router decodes its own, on its own machine. Without this, the
# routers' unpickling on these 2 cores, not the controller, paced the 10,000 x 1,000 herd.
_SHARED_TOPICS = ("replica_set", "replica_set_delta")
_DECODED_KEPT = 8


class MeasuringPeer(RpcPeer):
    """An RpcPeer that notes the size of each push before handling it."""

    decoded: dict[bytes, Any] = {}  # payload -> value, the last few (one host, one loop)

    def message_received(self, message: Message) -> None:
        if isinstance(message, Push) and isinstance(self.handler, FakeRouter):
            self.handler.host.note_push(message.topic, len(message.payload))
        super().message_received(message)

    def _value(self, message: Push) -> Any:
        if message.topic not in _SHARED_TOPICS:
            return super()._value(message)
        decoded = MeasuringPeer.decoded
        value = decoded.get(message.payload)
        if value is None:
            value = decoded[message.payload] = super()._value(message)
            if len(decoded) > _DECODED_KEPT:
                del decoded[next(iter(decoded))]
        return value


class Load:
    def __init__(self, rps: float = 0.0, in_flight: int = 0, queued: int = 0) -> None:
        self.rps, self.in_flight, self.queued = rps, in_flight, queued


class FakeRouter:
    def __init__(self, host: Host, index: int) -> None:
        self.host = host
        self.router_id = f"bench-router-{os.getpid()}-{index}"
        self.peer: RpcPeer | None = None
        self.watching: set[DeploymentId] = set()
        self.ids: dict[DeploymentId, set[str]] = {}
        self.generation: dict[DeploymentId, int] = {}
        self.resyncs = 0
        self.report_interval_s = LOAD_REPORT_INTERVAL_S  # or what the controller says
        self.telemetry_interval_s = TELEMETRY_INTERVAL_S  # likewise
        self.load = Load()
        self.counts = [0, 0, 0]  # arrived, completed, rejected
        self.owed = 0.0
        self.reported: tuple[int, ...] = (0, 0, 0, 0, 0)
        self.reported_at = time.monotonic()  # as Router.load_report: measured_at, covers_s
        self.recorder = Recorder("proxy", self.router_id)
        self.sent: tuple[float, TelemetryReport] | None = None  # the last telemetry
        self.urgent: asyncio.TimerHandle | None = None
        self.reporting = False  # its report timers run (from its first connection on)
        self.connecting = False
        self.retry: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        """Connect and say hello; after a failure or a lost connection, again (as the
        runtime reconnects), with a new watch of what the routes name."""
        host = self.host
        self.connecting = True
        self.watching.clear()
        self.generation.clear()  # a new connection starts from whole sets
        self.report_interval_s = LOAD_REPORT_INTERVAL_S
        self.telemetry_interval_s = TELEMETRY_INTERVAL_S
        self.sent = None  # a new connection: the next report goes at once, as the runtime
        peer: RpcPeer | None = None
        try:
            peer = self.peer = await connect_rpc(host.controller, self, token=host.token,
                                                 peer_class=MeasuringPeer,
                                                 timeout=MEMBER_CONNECT_TIMEOUT_S)
            deltas = {"replica_set_deltas": True} if host.deltas else {}
            await peer.call("hello", role="proxy", pid=os.getpid(),
                            proxy_id=self.router_id, node_id="local", **deltas)
        except Exception as exc:
            emit("failed", id=self.router_id, t=time.monotonic(), why=repr(exc))
            if peer is not None:
                peer.close()
            self._retry()
            return
        finally:
            self.connecting = False
        if not self.reporting:
            self.reporting = True
            loop = host.loop
            loop.call_later(random.uniform(0, LOAD_REPORT_INTERVAL_S), self.report)
            loop.call_later(random.uniform(0, TELEMETRY_INTERVAL_S), self.telemetry)

    def _retry(self) -> None:
        """One reconnect at a time: a failed hello and its connection's close ask both."""
        if self.retry is None and not self.connecting:
            self.retry = self.host.loop.call_later(RECONNECT_INTERVAL_S, self._again)

    def _again(self) -> None:
        self.retry = None
        if not self.connecting:
            self.connecting = True  # before the task runs: no second one meanwhile
            self.host.loop.create_task(self.run())

    def report(self, topic: str = "load") -> None:
        if topic == "load":
            self.host.loop.call_later(self.report_interval_s, self.report)
        else:
            self.urgent = None
        self._advance()
        peer = self.peer
        if peer is None or peer.is_closed:
            return
        reports, at = [], time.monotonic()
        for deployment in self.watching:
            now = (*self.counts, self.load.queued, self.load.in_flight)
            last = self.reported
            if now == last:
                continue
            self.reported = now
            reports.append(LoadReport(deployment, now[0] - last[0], now[1] - last[1],
                                      now[2] - last[2], now[3], now[4], measured_at=at,
                                      covers_s=at - self.reported_at))
            self.reported_at = at
        if reports:
            peer.push(topic, reports)

    def _advance(self) -> None:
        """The requests of the time since the last report (at the load's rate)."""
        now = time.monotonic()
        elapsed = now - getattr(self, "_last", now)
        self._last = now
        self.owed += self.load.rps * elapsed
        whole = int(self.owed)
        self.owed -= whole
        self.counts[0] += whole
        self.counts[1] += whole
        for _ in range(min(whole, 20)):  # a few requests' worth of telemetry
            for deployment in self.watching:
                self.recorder.http_request((deployment.app, deployment.name, "/", "GET", 200),
                                           5.0)

    def telemetry(self) -> None:
        self.host.loop.call_later(self.telemetry_interval_s, self.telemetry)
        peer = self.peer
        if peer is None or peer.is_closed:
            return  # drained once connected again, as the runtime
        report = self.recorder.drain({"ongoing_http_requests": self.load.in_flight,
                                      "connections": 8})
        now = time.monotonic()
        if not telemetry_quiet(report, self.sent, now):  # as surge.router.runtime
            peer.push("telemetry", report)
            self.sent = (now, report)

    def set_load(self, load: Load) -> None:
        started_queueing = load.queued > 0 and self.load.queued == 0
        self._advance()
        self.load = load
        if started_queueing and self.urgent is None:
            self.urgent = self.host.loop.call_later(URGENT_REPORT_DELAY_S, self.report,
                                                    "load_urgent")

    # -- RpcHandler ------------------------------------------------------------------

    async def handle_rpc(self, peer: RpcPeer, method: str, kwargs: dict[str, Any]) -> Any:
        raise ValueError(f"a router has no RPC method {method!r}")

    def on_push(self, peer: RpcPeer, topic: str, value: Any) -> None:
        if topic == "load_interval":  # as the runtime: many routers report less often
            self.report_interval_s = float(value)
        elif topic == "telemetry_interval":  # and many members send telemetry less often
            self.telemetry_interval_s = float(value)
        elif topic == "routes":
            assert isinstance(value, RouteTable)
            for target in value.targets:
                deployment = DeploymentId(target.app, target.deployment)
                if deployment not in self.watching:
                    self.watching.add(deployment)
                    self.host.loop.create_task(peer.call("watch", deployment=deployment))
        elif topic == "replica_set":  # a whole set: O(its size), as Router.update
            assert isinstance(value, ReplicaSet)
            ids = {info.replica_id for info in value.replicas}
            before = self.ids.get(value.deployment, set())
            self.host.changed(before - ids, ids - before)
            self.ids[value.deployment] = ids
            self.generation[value.deployment] = value.generation
        elif topic == "replica_set_delta":  # what changed: O(the change)
            assert isinstance(value, ReplicaSetDelta)
            did = value.deployment
            if self.generation.get(did) != value.base:  # missed one: the whole set again
                self.resyncs += 1
                self.host.loop.create_task(peer.call("watch", deployment=did))
                return
            ids = self.ids.setdefault(did, set())
            added = {info.replica_id for info in value.added} - ids
            removed = set(value.removed) & ids
            ids |= added
            ids -= removed
            self.generation[did] = value.generation
            self.host.changed(removed, added)

    def on_disconnect(self, peer: RpcPeer) -> None:
        emit("disconnected", id=self.router_id, t=time.monotonic())
        if peer is self.peer:  # its current connection: again
            self._retry()


class Host:
    def __init__(self, config: dict[str, Any]) -> None:
        self.loop = asyncio.get_running_loop()
        self.controller: str = config["controller"]
        self.token: str = config["token"]
        self.deltas: bool = config.get("deltas", True)
        self.routers = [FakeRouter(self, i) for i in range(config["routers"])]
        self.first_seen: dict[str, list[float]] = {}  # id -> [routers, latest time]
        self.gone: dict[str, list[float]] = {}
        self.pushes: dict[str, list[int]] = {}

    def note_push(self, topic: str, size: int) -> None:
        self.pushes.setdefault(topic, []).append(size)

    def changed(self, removed: set[str], added: set[str]) -> None:
        now = time.monotonic()
        for replica_id in added:
            seen = self.first_seen.setdefault(replica_id, [0, 0.0])
            seen[0] += 1
            seen[1] = max(seen[1], now)
        for replica_id in removed:
            gone = self.gone.setdefault(replica_id, [0, 0.0])
            gone[0] += 1
            gone[1] = max(gone[1], now)

    async def serve(self, commands: asyncio.StreamReader) -> None:
        for router in self.routers:  # all at once: a herd of routers, as at a restart
            self.loop.create_task(router.run())
        emit("started", pid=os.getpid())
        while (command := await next_command(commands)) is not None:
            self.handle(command)

    def handle(self, command: dict[str, Any]) -> None:
        kind = command["cmd"]
        if kind == "load":
            count = len(self.routers)
            base, extra = divmod(round(command["in_flight"] * count), count)
            for i, router in enumerate(self.routers):
                in_flight = base + (1 if i < extra else 0)
                router.set_load(Load(in_flight / command["service_s"], in_flight,
                                     command["queued"]))
            emit("applied", t=time.monotonic())
        elif kind == "status":
            sizes = [len(ids) for r in self.routers for ids in r.ids.values()]
            emit("status", resyncs=sum(r.resyncs for r in self.routers),
                 connected=sum(1 for r in self.routers
                               if r.peer is not None and not r.peer.is_closed),
                 with_set=len(sizes), smallest=min(sizes, default=0),
                 largest=max(sizes, default=0))
        elif kind in ("seen", "gone"):
            table = self.first_seen if kind == "seen" else self.gone
            emit(kind, result={i: table.get(i, [0, 0.0]) for i in command["ids"]})
        elif kind == "pushes":
            emit("pushes", result={topic: [len(sizes), sum(sizes), max(sizes),
                                           statistics.median(sizes)]
                                   for topic, sizes in self.pushes.items() if sizes})
            if command.get("reset"):
                self.pushes = {}


async def main() -> None:
    commands = await read_commands()
    config = await next_command(commands)
    assert config is not None
    await Host(config).serve(commands)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
