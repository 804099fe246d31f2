"""What the single-request flows share: the event heap and the engine's interface.

sim/mux_flow.py (multiplexed deployments) and sim/llm_flow.py (LLM engines) simulate
requests one by one on an event heap instead of the fluid of sim/flow.py. Both give the
engine (sim/engine.py) the same interface, kept here: `point` (the current 100 ms
point), `queued` and `ongoing`, `totals`, the per-point counts the report reads
(`offered`, `ok`, `rejected`, `timeouts_sent`, `timeouts_done`, `latency`, `within`),
`begin_tick` / `run_until` / `sync`, the tick's `LoadSample` (`close_tick`, and
`open_bucket` for an urgent decision), and `pressure_at` (when a router's queue last
started to grow). `engine_load` is what replicas report of their engines (None here).
What their routers share is here too: a request that waits (`wait`) starts the queue's
urgent report and times out `timeout_s` after it arrived unless it has left the queue
(`done`); each flow says how it takes a timed-out request out of its router (`unqueue`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any, Protocol

from surge.loadtest.stats import latency_key
from surge.policy.admission import queue_share
from surge.policy.engine_load import EngineLoad
from surge.policy.load_signals import LoadSample
from surge.sim.cluster import ClusterState
from surge.sim.scenario import Scenario

__all__ = ["EventFlow", "TickLoad", "Waiting"]

_EPS = 1e-9
# An open bucket shorter than this is not a sample (LoadTracker.peek's rule).
_MIN_OPEN_BUCKET_S = 0.005


class TickLoad:
    """A flow's counts over the open tick, and its load sample (any flow: fluid or not).
    The flow keeps `_arrivals`, `_completions`, `_rejections`, `queued`, `ongoing`,
    `totals` and `drain_per_s`."""

    _arrivals: int
    _completions: int
    _rejections: int
    queued: int
    ongoing: int
    totals: dict[str, int]
    drain_per_s: float

    # -- the tick's load sample ------------------------------------------------------------

    def open_bucket(self, now: float, since: float) -> LoadSample | None:
        """The tick so far, as the controller's LoadTracker.peek sees it (None if < 5 ms)."""
        if now - since < _MIN_OPEN_BUCKET_S:
            return None
        return LoadSample(t=now, arrivals=self._arrivals, completions=self._completions,
                          rejections=self._rejections, queued=self.queued,
                          ongoing=self.ongoing, duration_s=now - since)

    def close_tick(self, now: float, duration_s: float) -> LoadSample:
        """What the routers would have reported over the tick, summed (LoadTracker)."""
        sample = LoadSample(t=now, arrivals=self._arrivals, completions=self._completions,
                            rejections=self._rejections, queued=self.queued,
                            ongoing=self.ongoing, duration_s=duration_s)
        self.totals["completed"] += self._completions
        self.drain_per_s = self._completions / duration_s
        self._arrivals = self._completions = self._rejections = 0
        return sample


class Waiting(Protocol):
    """A request as the routers' queue sees it."""

    point: int  # the 100 ms point it arrived in
    done: bool  # dispatched, timed out or rejected: no router may take it again


class EventFlow(TickLoad):
    """The heap, the counters and the load sample of a single-request flow."""

    def __init__(self, scenario: Scenario, points: int) -> None:
        self.events: list[tuple[float, int, Callable[[Any, float], None], Any]] = []
        self._seq = 0
        self.point = 0
        self.queued = 0
        self.ongoing = 0
        self.offered = [0] * points
        self.ok = [0] * points
        self.rejected = [0] * points
        self.timeouts_sent = [0] * points
        self.timeouts_done = [0] * points
        self.latency: list[dict[int, int]] = [{} for _ in range(points)]
        self.within: list[int] = [0] * points  # 2xx within the SLO, by arrival point
        self.slo_s = scenario.slo_ms / 1000
        self.overhead_s = scenario.service.overhead_s
        self.timeout_s = scenario.traffic.timeout_s
        self.max_ongoing = scenario.deployment.max_ongoing_requests
        routers = scenario.cluster.proxies
        self.queue_limit = queue_share(scenario.deployment.queue_limit, routers) * routers
        self._arrivals = self._completions = self._rejections = 0
        self.drain_per_s = 0.0
        self.pressure_at: float | None = None
        self.totals = {"arrived": 0, "completed": 0, "rejected": 0, "timed_out": 0}

    def begin_tick(self, t0: float, t1: float) -> None:
        """Schedule the arrivals of [t0, t1)."""
        raise NotImplementedError

    def sync(self, cluster: ClusterState, now: float) -> None:
        """Follow the cluster's routable replicas."""
        raise NotImplementedError

    def unqueue(self, request: Any, now: float) -> None:
        """Take a request that timed out out of the router's queue."""
        raise NotImplementedError

    # -- the heap ----------------------------------------------------------------------

    def at(self, when: float, action: Any, argument: Any) -> None:
        self._seq += 1
        heapq.heappush(self.events, (when, self._seq, action, argument))

    def next_event(self) -> float:
        return self.events[0][0] if self.events else math.inf

    def run_until(self, stop: float) -> float:
        """Events before `stop`; returns early (the time reached) once a queue starts."""
        events = self.events
        while events and events[0][0] < stop - _EPS:
            when, _, action, argument = heapq.heappop(events)
            action(argument, when)
            if self.pressure_at is not None:
                return when
        return stop

    # -- the routers' queue ---------------------------------------------------------------

    def wait(self, request: Waiting, queued_before: int, now: float) -> None:
        """`request` waits in a router that held `queued_before` waiting ones."""
        if queued_before == 0 and self.pressure_at is None:
            self.pressure_at = now  # a router tells the controller at once (urgent)
        self.at(now + self.timeout_s, self._time_out, request)

    def _time_out(self, request: Waiting, now: float) -> None:
        if request.done:
            return
        request.done = True
        self.queued -= 1
        self.count_timeout(request.point)
        self.unqueue(request, now)

    # -- accounting ----------------------------------------------------------------------

    def count_arrival(self) -> None:
        self.offered[self.point] += 1
        self._arrivals += 1
        self.totals["arrived"] += 1

    def count_rejection(self) -> None:
        self.rejected[self.point] += 1
        self._rejections += 1
        self.totals["rejected"] += 1

    def count_timeout(self, arrival_point: int) -> None:
        self.timeouts_sent[arrival_point] += 1
        self.timeouts_done[self.point] += 1
        self.totals["timed_out"] += 1

    def count_completion(self, arrival_point: int, latency_s: float, within: bool) -> None:
        self.ok[self.point] += 1
        self._completions += 1
        histogram = self.latency[arrival_point]
        key = latency_key(latency_s)
        histogram[key] = histogram.get(key, 0) + 1
        if within:
            self.within[arrival_point] += 1

    def engine_load(self, now: float) -> EngineLoad | None:
        """The engines' fresh reports, summed (flows without engines: None)."""
        return None
