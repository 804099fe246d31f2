"""The controller: desired state in, replica processes and route pushes out.

It is never on the request path. Its parts, each in its own module:

* `ControllerState` (state.py): apps, deployments, replicas, proxies; status from it;
* `plan` (plan.py): pure decisions, state + observations -> actions;
* `Executor` (executor.py): performs actions through the backend and the members;
* `ControlApi` (api.py): the RPCs drivers, proxies and replicas call;
* `Publisher` (publish.py): route table and replica-set pushes to routers;
* `Autoscaler` + `LoadTracker` (autoscaler.py): load reports -> policy.autoscale_step;
* `EngineTracker` (engine_load.py): engines' `record_autoscaling_stats` -> the same step;
* `Recovery` (recovery.py): checkpoints, and re-attachment after a restart;
* `Observer` (observer.py): metrics and the dashboard's timeline;
* the node's CPU (node_cpu.py, when the process entry point gives a reader): once a
  second, the busy share of the head node's cores, fed to the autoscaling step of each
  deployment whose replicas all run there (policy/saturation.py).

This class wires them and runs the loop: every `TICK_S` it takes the backend's exits,
closes the load bucket, runs each autoscaled deployment's step, applies the plan, and
checkpoints the members. A router whose queue starts to grow reports within
URGENT_REPORT_DELAY_S (`load_urgent`), and the deployment is decided and reconciled
without waiting a tick: at the end of the event loop's turn, so that the reports of
every router that saw the same burst are in the sum, and, when the last urgent decision
was under URGENT_DECISION_INTERVAL_S ago, as soon as that interval ends; so is
everything a member's report changes (a proxy that serves, a replica that is ready).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Callable, Coroutine
from typing import Any

from surge.backends.base import Backend
from surge.clock import SYSTEM, Clock, thread_cpu_s
from surge.config import HTTPOptions, default_proxy_workers, gRPCOptions
from surge.controller.actions import FailReplica, KillProcess, StopProxy, StopReplica
from surge.controller.api import ControlApi
from surge.controller.autoscaler import Autoscaler, LoadTracker
from surge.controller.checkpoint import Checkpoint
from surge.controller.engine_load import EngineTracker
from surge.controller.executor import DRAIN_GRACE_S, Executor
from surge.controller.node_cpu import NODE_CPU_INTERVAL_S, NodeCpu
from surge.controller.observer import Observer
from surge.controller.pace import LoopPace, TickSample
from surge.controller.plan import (
    Observed,
    absorb_exits,
    is_proxy,
    plan,
    reconcile_deployment,
    settled,
)
from surge.controller.publish import Publisher
from surge.controller.recovery import Recovery
from surge.controller.state import ControllerState, DeploymentRecord, Peer
from surge.model import DeploymentId, LoadReport
from surge.policy.autoscale_step import (
    TICK_S,
    StepInputs,
    urgent_decision_due,
    urgent_decision_wait,
)
from surge.policy.autoscaling import LoadSample
from surge.policy.cadence import load_report_interval_s, telemetry_interval_s
from surge.policy.engine_load import EngineReport
from surge.policy.lifecycle import LOADED, ReplicaState

__all__ = ["TICK_S", "Controller"]

log = logging.getLogger("surge.controller")

# At shutdown proxies go first (they finish what they hold while replicas still serve).
PROXY_STOP_TIMEOUT_S = 6.0
SHUTDOWN_POLL_S = 0.02
# How often the routers' load-report and the members' telemetry intervals are reviewed
# (policy/cadence.py).
INTERVALS_REVIEW_S = 1.0


def random_replica_id(deployment: str) -> str:
    return f"{deployment}-{secrets.token_hex(4)}"


class Controller:
    # Pushes whose handlers only read the value: an idle replica's telemetry, a router's
    # unchanged report, repeated byte for byte, is not unpickled again (transport.rpc).
    memo_topics = frozenset({"telemetry", "load"})

    def __init__(self, address: str, http: HTTPOptions, backend: Backend,
                 checkpoint: Checkpoint | None = None, *, clock: Clock = SYSTEM,
                 new_replica_id: Callable[[str], str] = random_replica_id,
                 grpc: gRPCOptions | None = None, node_cpu: NodeCpu | None = None) -> None:
        workers = http.proxy_workers
        self.state = ControllerState(address, http,
                                     workers if workers is not None else default_proxy_workers(),
                                     head=backend.head, grpc=grpc or gRPCOptions())
        self.backend = backend
        self.clock = clock
        self.stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._urgent: set[DeploymentId] = set()  # urgent reports not decided on yet
        self._jump_rates: dict[DeploymentId, float] = {}  # ... the rates their jumps implied
        self._urgent_timer: asyncio.Handle | None = None
        self._intervals_at = -math.inf  # when the report intervals were last reviewed
        self._node_cpu = node_cpu
        self._node_cpu_at = -math.inf  # when the node's CPU was last read
        self.load = LoadTracker(TICK_S)
        self.engines = EngineTracker()  # the engines' own load reports (LLM replicas)
        self.autoscaler = Autoscaler()
        self.recovery = Recovery(checkpoint or Checkpoint(None), backend.deaths_visible_at_once)
        self.publisher = Publisher(self.state, clock=clock)
        self.observer = Observer(self.state, self.load, self.autoscaler, clock)
        self.pace = LoopPace()
        self.executor = Executor(self.state, backend, self.publisher, clock, spawn=self.spawn,
                                 new_replica_id=new_replica_id, forgotten=self._forgotten)
        self.api = ControlApi(self.state, self.executor, self.publisher, self.recovery,
                              self.autoscaler, self.load, self.observer, clock,
                              changed=asyncio.Condition(), replan=self.replan, pace=self.pace,
                              shutdown=lambda: self.spawn(self.shutdown()))

    def __repr__(self) -> str:
        state = self.state
        return (f"<Controller {state.address} apps={len(state.apps)} "
                f"replicas={len(state.replicas)} proxy={state.proxy_address or '-'}>")

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait until every call to a member it started has finished."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def restore(self) -> None:
        """After a restart: re-deploy what the previous controller saved, then wait for
        its members to re-attach (nothing is pushed meanwhile)."""
        now = self.clock.monotonic()
        for saved in self.recovery.start(now):
            try:
                self.api.deploy(saved.spec)
            except Exception as exc:
                log.error("cannot restore application %r: %r", saved.spec.name, exc)
                continue
            self.recovery.specs[saved.spec.name] = saved.spec
            for name, version in saved.versions.items():
                record = self.state.deployments.get(DeploymentId(saved.spec.name, name))
                if record is not None:
                    record.version = version
        self.publisher.paused = True
        self.executor.apply(self.recovery.due(self.state, now))

    def serve_http(self) -> None:
        """Start the proxies (the plan keeps them running from now on)."""
        self.state.serve_http = True
        self.replan()

    def replan(self) -> None:
        """Take the backend's news and act on the plan now, without waiting for a tick.

        Not while recovering (recovery.due decides then) nor once stopping: shutdown
        drains what runs, and a plan then would start replacements for the draining."""
        if self.recovery.active or self.state.stopping:
            return
        self.executor.apply(absorb_exits(self.state, self.backend.poll_exits()))
        self._plan(self.clock.monotonic())

    def _plan(self, now: float) -> None:
        actions = plan(self.state, self._observe(), now)
        settled(self.state, actions, now)
        self.executor.apply(actions)

    # -- the control connection (transport.rpc.RpcHandler) --------------------------------

    async def handle_rpc(self, peer: Peer, method: str, kwargs: dict[str, Any]) -> Any:
        return await self.api.handle(peer, method, kwargs)

    def on_push(self, peer: Peer, topic: str, value: Any) -> None:
        if topic == "telemetry":
            self.observer.telemetry(value)
            replica = self.state.replicas.get(getattr(value, "source", ""))
            if replica is not None and replica.peer is peer:  # its loop is alive
                replica.heard_at = self.clock.monotonic()  # (a default health check)
        elif topic == "engine_load" and isinstance(value, EngineReport):
            replica = self.state.replicas.get(value.replica_id)
            if replica is not None and replica.state in LOADED:  # not a standby's
                self.engines.report(replica.deployment, value, self.clock.monotonic())
        elif topic in ("load", "load_urgent"):
            now = self.clock.monotonic()
            for report in value:
                assert isinstance(report, LoadReport)
                self.load.report(id(peer), report, now)
            if topic == "load_urgent" and not self.state.stopping:
                self._urgent.update(report.deployment for report in value)
                for report in value:  # an LLM router's jump: the rate it implied
                    if report.jump_rate > self._jump_rates.get(report.deployment, 0.0):
                        self._jump_rates[report.deployment] = report.jump_rate
                if self._urgent_timer is None:  # after the other reports of this turn
                    self._urgent_timer = asyncio.get_running_loop().call_soon(
                        self._decide_urgent)

    def _decide_urgent(self) -> None:
        self._urgent_timer = None
        pending, self._urgent = self._urgent, set()
        now, wait = self.clock.monotonic(), None
        for deployment in pending:
            record = self.state.deployments.get(deployment)
            if record is None:
                continue
            if not urgent_decision_due(record.last_urgent_decision, now):
                self._urgent.add(deployment)  # decided on once the interval is over
                left = urgent_decision_wait(record.last_urgent_decision, now)
                wait = left if wait is None else min(wait, left)
                continue
            try:
                self.decide_now(deployment)
            except Exception:  # never on the member's connection
                log.exception("urgent decision for %s failed", deployment)
        if wait is not None:
            self._urgent_timer = asyncio.get_running_loop().call_later(
                wait, self._decide_urgent)

    def on_disconnect(self, peer: Peer) -> None:
        self.publisher.drop(peer)
        self.load.forget_source(id(peer))
        replica = self.state.replicas.get(peer.info.get("replica_id", ""))
        if replica is not None and replica.state is ReplicaState.RUNNING \
                and not self.state.stopping:
            self.executor.apply([FailReplica(replica.replica_id,
                                             "lost its control connection")])

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        clock = self.clock
        due = clock.monotonic()
        while not self.state.stopping:
            started, cpu = clock.monotonic(), thread_cpu_s()
            try:
                self.tick()
            except Exception:
                log.exception("control loop step failed")
            ended = clock.monotonic()
            self.pace.record(TickSample(started, ended - started, thread_cpu_s() - cpu,
                                        max(0.0, started - due)))
            await self.api.notify()
            due = clock.monotonic() + TICK_S
            await asyncio.sleep(TICK_S)

    def tick(self) -> None:
        now, state = self.clock.monotonic(), self.state
        self.executor.apply(absorb_exits(state, self.backend.poll_exits()))
        self.load.close_bucket(now, state.deployments)
        if self._node_cpu is not None and now - self._node_cpu_at >= NODE_CPU_INTERVAL_S:
            self._node_cpu_at = now
            self._note_node_cpu(self._node_cpu())
        if self.recovery.active:  # re-attaching after a restart: change nothing yet
            self.executor.apply(self.recovery.due(state, now))
            return
        for record in list(state.deployments.values()):
            self._autoscale(record, now)
        self._plan(now)
        state.note_running_apps()
        self.recovery.save_members(state, now)
        if now - self._intervals_at >= INTERVALS_REVIEW_S:
            self._intervals_at = now
            self._review_intervals()
        self.publisher.flush()

    def _note_node_cpu(self, busy: float | None) -> None:
        """The head node's CPU, given to each deployment whose replicas all run there
        (on one machine: all of them; a backend lists no placement for those)."""
        state = self.state
        state.node_cpu = busy
        placements = self.backend.placements() if busy is not None else {}
        head = state.head.node_id
        for did, record in state.deployments.items():
            members = state.replicas_of(did) if placements else []
            elsewhere = any(p.node_id != head for p in
                            (placements.get(r.replica_id) for r in members) if p is not None)
            record.node_cpu = None if elsewhere else busy

    def _review_intervals(self) -> None:
        """How often routers report their load and members their telemetry, from how
        many there are (policy/cadence.py); told to them when it changes."""
        publisher = self.publisher
        publisher.tell_load_interval(load_report_interval_s(len(publisher.routers)))
        self.load.report_interval_s = publisher.load_interval_s  # what its reports cover
        publisher.tell_telemetry_interval(telemetry_interval_s(len(publisher.members)))

    def _observe(self) -> Observed:
        """The backend's proxies (its replicas are known from the state) and placements."""
        others = frozenset(self.backend.alive()).difference(self.state.replicas)
        return Observed(frozenset(p for p in others if is_proxy(p)), self.backend.placements())

    def decide_now(self, did: DeploymentId) -> None:
        """A router's queue just started to grow, or an LLM router's arrivals jumped: decide
        (and act) without waiting a tick; only a scale-up counts (policy/autoscale_step.py)."""
        jump_rate = self._jump_rates.pop(did, 0.0)  # spent (or stale) after this call
        record = self.state.deployments.get(did)
        if record is None or record.config.autoscaling_config is None or \
                self.recovery.active:
            return
        now = self.clock.monotonic()
        if not urgent_decision_due(record.last_urgent_decision, now):
            return
        record.last_urgent_decision = now
        self._autoscale(record, now, self.load.peek(did, now), urgent=True,
                        jump_rate=jump_rate)
        self.executor.apply(reconcile_deployment(self.state, did, now))

    def _autoscale(self, record: DeploymentRecord, now: float,
                   open_bucket: LoadSample | None = None, urgent: bool = False,
                   jump_rate: float = 0.0) -> None:
        config = record.config.autoscaling_config
        if config is None or record.deleting:
            if record.node_saturated:  # autoscaling was removed: no hold is left to show
                record.node_saturated = ""
                self.autoscaler.forget(record.id)
            return
        samples = list(self.load.series.get(record.id, ()))
        if open_bucket is not None:
            samples.append(open_bucket)
        step = self.autoscaler.step(record.id, config, StepInputs(
            now=now, second_of_day=self.clock.second_of_day(),
            running=self.state.count_running_current(record.id),
            target=record.target,
            samples=samples, startup_lead_s=record.startup_lead_s,
            standbys=self.state.group(record.id).count(ReplicaState.STANDBY, record.version),
            engine=self.engines.load(record.id, now), node_cpu=record.node_cpu,
            urgent=urgent, jump_rate=jump_rate))
        record.standby_floor = step.standby_replicas
        record.target = step.target
        record.node_saturated = self.autoscaler.saturated(record.id)

    def _forgotten(self, did: DeploymentId, app: str | None) -> None:
        self.load.drop(did)
        self._jump_rates.pop(did, None)
        self.engines.drop(did)
        self.autoscaler.forget(did)
        if app is not None:
            self.recovery.deleted(self.state, app)

    # -- shutdown --------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Proxies first (they finish what they hold while replicas still serve), then
        the replicas drain; whatever is left at the deadline is killed."""
        state = self.state
        if state.stopping:
            return
        state.stopping = True
        if self.recovery.active:  # stop waiting: adopt nobody else, stop the stragglers
            self.executor.apply(self.recovery.due(state, self.clock.monotonic()))
        log.info("shutting down: stopping %d replica(s) and the proxy", len(state.replicas))
        self.executor.apply(StopProxy(p, "shutdown") for p in self._proxies())
        await self._until(lambda: not self._proxies(), PROXY_STOP_TIMEOUT_S)
        self.executor.apply(StopReplica(r.replica_id, "shutdown")
                            for r in list(state.replicas.values()) if r.alive)
        longest = max((d.config.graceful_shutdown_timeout_s
                       for d in state.deployments.values()), default=0.0)
        await self._until(lambda: not self._alive(), longest + DRAIN_GRACE_S)
        self.executor.apply(KillProcess(p, "still alive at shutdown") for p in self._alive())
        self.backend.close()
        self.stopped.set()

    def _alive(self) -> list[str]:
        """The backend's live processes, after taking note of those that exited."""
        self.executor.apply(absorb_exits(self.state, self.backend.poll_exits()))
        return self.backend.alive()

    def _proxies(self) -> list[str]:
        return [p for p in self._alive() if is_proxy(p) and p not in self.state.replicas]

    async def _until(self, done: Callable[[], bool], timeout_s: float) -> None:
        """Wait for `done` (processes exit in real time; the backend has no event to
        wait on, so poll it)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not done():
                    await asyncio.sleep(SHUTDOWN_POLL_S)

    # -- for the instance's entry point -----------------------------------------------------

    @property
    def proxy_ready(self) -> asyncio.Event:
        return self.api.proxy_ready
