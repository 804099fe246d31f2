"""Requests one by one, for a multiplexed deployment: a discrete-event simulation.

A request's model matters (which replica holds it, whether it waits for a load), so
the fluid of sim/flow.py gives way to single requests on an event heap, with the same
accounting and the same interface to the engine (`point`, `queued`, `ongoing`,
`totals`, the per-point counts, `close_tick` / `open_bucket`, `pressure_at`):

* arrivals per tick are `surge pulse`'s (loadtest.schedule.arrival_times, uniform or
  Poisson), each naming a model drawn from the scenario's popularity;
* the router (sim/mux_routing.py) sends each to a replica or keeps it waiting; past
  `max_queued_requests` (the routers' summed shares, policy.admission) it is rejected,
  and a request still waiting `timeout_s` after it arrived times out;
* at the replica (sim/mux_replica.py) it is served at once if its model is held, else
  after that model's load (`load_time_s`, drawn per load); its service time is drawn
  from the scenario's distribution; it holds a slot from dispatch to its end;
* the engine's cluster decides which replicas are routable (`sync`): a new one starts
  with no model, one that leaves routing finishes what it holds.

Latencies are exact: overhead + wait + load wait + the request's own service time.
What only multiplexing has is counted in `MuxStats` (sim/mux_report.py reports it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from surge.loadtest.schedule import arrival_times
from surge.loadtest.stats import latency_key
from surge.policy.admission import admit
from surge.policy.load_signals import LoadSample
from surge.sim.cluster import ClusterState
from surge.sim.event_flow import EventFlow
from surge.sim.multiplexing import Multiplexing
from surge.sim.mux_replica import MuxReplica, Request
from surge.sim.mux_routing import make_router
from surge.sim.scenario import Scenario

__all__ = ["TOP_MODELS", "LoadSpan", "MuxFlow", "MuxStats"]

# How many of the most requested models have their holders followed over time.
TOP_MODELS = 3


@dataclass(frozen=True)
class LoadSpan:
    replica_id: str
    model: int
    start: float
    end: float


@dataclass
class MuxStats:
    """Per 100 ms point (by dispatch point) and in total."""

    points: int
    hits: list[int] = field(init=False)
    waited: list[int] = field(init=False)  # reached a replica that did not hold the model
    loads: list[int] = field(init=False)  # by the point the load started
    top_holders: list[tuple[int, ...]] = field(default_factory=list)  # per tick end
    load_wait: dict[int, int] = field(default_factory=dict)  # latency_key -> requests
    spans: list[LoadSpan] = field(default_factory=list)  # every load, for the tests

    def __post_init__(self) -> None:
        self.hits = [0] * self.points
        self.waited = [0] * self.points
        self.loads = [0] * self.points


class MuxFlow(EventFlow):
    def __init__(self, scenario: Scenario, mux: Multiplexing, rng: np.random.Generator,
                 py_rng: random.Random, points: int) -> None:
        super().__init__(scenario, points)
        self.mux = mux  # the scenario's `multiplex:` section
        self.scenario = scenario
        self.schedule = scenario.traffic.schedule
        self.rng, self.py_rng = rng, py_rng
        self.service_s = scenario.service.time_s
        self.top = mux.popularity.top(TOP_MODELS)
        self.replicas: list[MuxReplica] = []  # routable, in the cluster's order
        self.by_id: dict[str, MuxReplica] = {}
        self.router = make_router(self, mux, self.max_ongoing, py_rng)
        self.stats = MuxStats(points)

    def __repr__(self) -> str:
        return (f"<MuxFlow {self.mux.routing} ongoing={self.ongoing} queued={self.queued} "
                f"replicas={len(self.replicas)} {self.totals}>")

    # -- arrivals ------------------------------------------------------------------------

    def begin_tick(self, t0: float, t1: float) -> None:
        """Schedule the tick's arrivals, each with its model."""
        times = arrival_times(self.schedule, t0, t1, arrivals=self.scenario.traffic.arrivals,
                              rng=self.rng)
        models = self.mux.popularity.sample(self.rng, len(times))
        for when, model in zip(times.tolist(), models, strict=True):
            self.at(when, self._arrive, model)

    # -- replicas ------------------------------------------------------------------------

    def sync(self, cluster: ClusterState, now: float) -> None:
        """Follow the cluster's routable replicas (new ones hold no model)."""
        routable = [r.replica_id for r in cluster.replicas.values() if r.routable]
        if [r.replica_id for r in self.replicas] == routable:
            return
        for replica_id in routable:
            if replica_id not in self.by_id:
                replica = MuxReplica(replica_id, self.mux.capacity,
                                     self.mux.loads == "serial", self)
                self.by_id[replica_id] = replica
                if self.mux.routing == "ray":
                    self.at(now + self.py_rng.uniform(0, self.mux.advertise_interval_s),
                            self._push, replica)
        self.replicas = [self.by_id[i] for i in routable]
        self.router.replicas_changed(now)

    def _push(self, replica: MuxReplica, now: float) -> None:
        """Ray: a replica pushes its model ids to the controller when they changed."""
        if replica.changed:
            replica.pushed = frozenset(replica.model_ids())
            replica.changed = False
        if replica in self.replicas:
            self.at(now + self.mux.advertise_interval_s, self._push, replica)

    # -- requests ------------------------------------------------------------------------

    def _arrive(self, model: int, now: float) -> None:
        point = self.point
        self.count_arrival()
        request = Request(now, point, model)
        queued_before = self.queued
        self.queued += 1
        self.router.submit(request, now)
        if request.dispatched is not None:
            return
        if admit(queued_before, self.queue_limit, self.drain_per_s) is not None:
            request.done = True
            self.queued -= 1
            self.router.cancel(request, now)
            self.count_rejection()
            return
        self.wait(request, queued_before, now)

    def unqueue(self, request: Request, now: float) -> None:
        self.router.cancel(request, now)

    def dispatch(self, request: Request, replica: MuxReplica, now: float) -> None:
        request.done = True
        request.dispatched = now
        request.replica = replica
        self.queued -= 1
        self.ongoing += 1
        replica.arrive(request, now)
        (self.stats.hits if request.hit else self.stats.waited)[self.point] += 1

    def serve(self, request: Request, now: float) -> None:
        if not request.hit:
            assert request.dispatched is not None
            key = latency_key(now - request.dispatched)
            self.stats.load_wait[key] = self.stats.load_wait.get(key, 0) + 1
        self.at(now + max(0.0, self.service_s.sample(self.py_rng)), self._complete, request)

    def _complete(self, request: Request, now: float) -> None:
        assert request.replica is not None
        request.replica.in_flight -= 1
        self.ongoing -= 1
        latency = now - request.arrived + self.overhead_s
        self.count_completion(request.point, latency, latency <= self.slo_s + 1e-12)
        self.router.wake(now)

    def load(self, replica: MuxReplica, model: int, now: float) -> None:
        duration = max(0.0, self.mux.load_time_s.sample(self.py_rng))
        self.stats.loads[self.point] += 1
        self.stats.spans.append(LoadSpan(replica.replica_id, model, now, now + duration))
        self.at(now + duration, self._loaded, (replica, model))

    def _loaded(self, item: tuple[MuxReplica, int], now: float) -> None:
        replica, model = item
        replica.finish_load(model, now)
        self.router.wake(now)

    # -- the tick's load sample ------------------------------------------------------------

    def close_tick(self, now: float, duration_s: float) -> LoadSample:
        sample = super().close_tick(now, duration_s)
        for replica in self.replicas:  # the controller's loop passes pushes on
            replica.advertised = replica.pushed
        self.stats.top_holders.append(tuple(
            sum(1 for r in self.replicas if r.holds(model)) for model in self.top))
        return sample

    @property
    def evictions(self) -> int:
        return sum(r.evictions for r in self.by_id.values())
