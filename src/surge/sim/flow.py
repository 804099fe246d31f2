"""Requests in aggregate: arrivals, the routers' queue, replicas' slots, completions.

A fluid model with integer counts, so every request is accounted for exactly:

* Arrivals per step come from the schedule: uniform arrivals as `surge pulse` sends
  them (request k at the time the expected count reaches k), Poisson ones drawn with
  the scenario's seed.
* Routing is work-conserving (policy.routing.choose_replica never misses a free
  replica), so a request waits only when all `routable x max_ongoing_requests` slots
  are busy. The routers' queues are one FIFO queue of cohorts (one per step) holding
  the sum of the routers' shares of `max_queued_requests` (policy.admission.
  queue_share); past it, `admit` rejects (503). With `max_queued_requests` unset the
  queue also holds no more than drains within `max_queue_wait_s` (or one mean service
  time) at the current completion rate (policy.admission.queue_room), as the routers
  estimate it. A cohort still queued `timeout_s` after it arrived times out.
* In-flight requests complete at rate ongoing / mean service time (Little's law: a
  replica with all slots busy serves max_ongoing / mean per second), with the
  fractional part carried over, so capacity is exact at saturation. With batching,
  each replica completes min(in flight, batch) / batch-time per second.
* Latency = overhead + time queued + a deterministic in-replica delay (batch fill,
  batch size) + a service time from the distribution. The flow records, per 100 ms
  point of arrival, how many requests were dispatched after each delay; the report
  expands that with the service-time distribution (sim/report.py).

`quiet` advances a whole 0.1 s tick in one step when no request can wait (empty queue,
capacity above the highest rate in the tick): in-flight relaxes exponentially towards
rate x service time, as the fine steps would. Otherwise `fine` steps run at ~1 ms.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from surge.policy.admission import admit, queue_room, queue_share
from surge.sim.event_flow import TickLoad
from surge.sim.scenario import Scenario

__all__ = ["Cohort", "Flow"]

# Float dust in carried fractions and in expected counts is not a request.
_DUST = 1e-7


@dataclass
class Cohort:
    """Requests that arrived in one step and wait in the routers' queue."""

    count: int
    point: int  # the 100 ms point they arrived in
    arrived: float  # start of their step


class Flow(TickLoad):
    def __init__(self, scenario: Scenario, rng: np.random.Generator, points: int) -> None:
        self.schedule = scenario.traffic.schedule
        self.poisson = scenario.traffic.arrivals == "poisson"
        self.rng = rng
        self.timeout_s = scenario.traffic.timeout_s
        self.mean_s = scenario.service.time_s.mean
        self.max_ongoing = scenario.deployment.max_ongoing_requests
        routers = scenario.cluster.proxies
        self.queue_limit = queue_share(scenario.deployment.queue_limit, routers) * routers
        self.max_wait_s = scenario.deployment.queue_wait_limit_s
        batching = scenario.service.batching
        self.batch = (0 if batching is None
                      else min(batching.max_batch_size, self.max_ongoing))
        self.batch_wait_s = batching.batch_wait_timeout_s if batching else 0.0
        self.per_item_s = batching.per_item_s if batching else 0.0
        self.ongoing = 0
        self.queued = 0
        self.queue: deque[Cohort] = deque()
        self._carry = 0.0
        self._sent_by = 0.0  # schedule time up to which arrivals were drawn
        self._sent = 0  # uniform: requests sent so far
        self.point = 0
        # per 100 ms point
        self.offered = [0] * points
        self.ok = [0] * points  # completions, by completion point
        self.rejected = [0] * points  # by arrival point (= rejection point)
        self.timeouts_sent = [0] * points
        self.timeouts_done = [0] * points
        self.delays: list[dict[int, int]] = [{} for _ in range(points)]  # us -> dispatched
        # per tick (the load sample)
        self._arrivals = self._completions = self._rejections = 0
        self.drain_per_s = 0.0
        self.pressure_at: float | None = None  # when the queue last started to grow
        self.totals = {"arrived": 0, "completed": 0, "rejected": 0, "timed_out": 0}

    def __repr__(self) -> str:
        return (f"<Flow ongoing={self.ongoing} queued={self.queued}/{self.queue_limit} "
                f"{self.totals}>")

    # -- arrivals ----------------------------------------------------------------------

    def _arrive(self, end: float) -> int:
        start, self._sent_by = self._sent_by, end
        if self.poisson:
            expected = self.schedule.expected(end) - self.schedule.expected(start)
            return int(self.rng.poisson(expected)) if expected > 0 else 0
        sent = math.ceil(self.schedule.expected(end) - _DUST)
        count, self._sent = sent - self._sent, sent
        return count

    # -- the service -----------------------------------------------------------------------

    def _rate(self, routable: int) -> float:
        """Completions per second with the current in-flight count."""
        if not self.batch:
            return self.ongoing / self.mean_s
        replicas = max(routable, 1)  # draining replicas finish theirs too
        size = min(self.ongoing / replicas, self.batch)
        return replicas * size / (self.mean_s + self.per_item_s * max(size - 1, 0.0))

    def _delay_s(self, routable: int, rate: float) -> float:
        """In-replica delay before the service time: batch fill, size and queueing."""
        if not self.batch or routable == 0:
            return 0.0
        per_replica = self.ongoing / routable
        size = min(max(per_replica, 1.0), self.batch)
        delay = self.per_item_s * (size - 1)
        if per_replica > self.batch:  # waits for the batches ahead of it
            delay += (per_replica - self.batch) / self.batch * (
                self.mean_s + self.per_item_s * (self.batch - 1))
        elif size < self.batch:
            arrivals = rate / routable
            fill = (self.batch - 1) / arrivals if arrivals > 0 else self.batch_wait_s
            delay += min(self.batch_wait_s, fill) / 2
        return delay

    def capacity_rps(self, routable: int) -> float:
        if not self.batch:
            return routable * self.max_ongoing / self.mean_s
        return routable * self.batch / (self.mean_s + self.per_item_s * (self.batch - 1))

    def steady_ongoing(self, rate: float, routable: int) -> float:
        """In-flight requests when `rate` flows through `routable` replicas for long."""
        if not self.batch or routable == 0:
            return rate * self.mean_s
        per_replica = rate / routable
        # per replica: size / (mean + p (size - 1)) = rate  =>  size = rate (mean - p) /
        # (1 - rate p), at least 1 when anything flows
        denominator = 1 - per_replica * self.per_item_s
        size = (per_replica * (self.mean_s - self.per_item_s) / denominator
                if denominator > 0 else float(self.batch))
        return routable * min(max(size, 0.0), float(self.batch))

    # -- steps -------------------------------------------------------------------------------

    def fine(self, t: float, dt: float, routable: int, rate_hint: float) -> None:
        """One step of `dt` seconds from t: complete, time out, dispatch, admit."""
        point = self.point
        arrivals = self._arrive(t + dt)
        if self.ongoing:
            x = self._rate(routable) * dt + self._carry
            done = int(x + _DUST)
            if done >= self.ongoing:
                done, self._carry = self.ongoing, 0.0
            else:
                self._carry = x - done
            self.ongoing -= done
            self.ok[point] += done
            self._completions += done
        queue = self.queue
        while queue and t - queue[0].arrived >= self.timeout_s - _DUST:
            self._time_out(queue.popleft(), point)
        free = routable * self.max_ongoing - self.ongoing
        if free > 0 and queue:
            free = self._dispatch_queued(t, free, routable, rate_hint)
        self._admit(t, arrivals, free, routable, rate_hint)

    def _time_out(self, cohort: Cohort, point: int) -> None:
        self.queued -= cohort.count
        self.timeouts_sent[cohort.point] += cohort.count
        self.timeouts_done[point] += cohort.count
        self.totals["timed_out"] += cohort.count

    def _dispatch_queued(self, t: float, free: int, routable: int, rate: float) -> int:
        queue = self.queue
        extra = self._delay_s(routable, rate)
        while free > 0 and queue:
            cohort = queue[0]
            take = min(free, cohort.count)
            key = round((t - cohort.arrived + extra) * 1e6)
            delays = self.delays[cohort.point]
            delays[key] = delays.get(key, 0) + take
            cohort.count -= take
            self.queued -= take
            self.ongoing += take
            free -= take
            if cohort.count == 0:
                queue.popleft()
        return free

    def _admit(self, t: float, arrivals: int, free: int, routable: int, rate: float) -> None:
        if not arrivals:
            return
        point = self._offer(arrivals)
        direct = min(arrivals, free) if free > 0 and not self.queue else 0
        if direct:
            self._record_delay(direct, routable, rate)
            self.ongoing += direct
        overflow = arrivals - direct
        if not overflow:
            return
        admitted = 0
        room = queue_room(self._rate(routable), self.max_wait_s, self.mean_s)
        limit = self.queue_limit if room is None else min(self.queue_limit, room)
        if admit(self.queued, limit, self.drain_per_s) is None:
            admitted = min(overflow, limit - self.queued)
            queue = self.queue
            if queue and queue[-1].arrived == t:
                queue[-1].count += admitted
            else:
                queue.append(Cohort(admitted, point, t))
            if not self.queued and admitted and self.pressure_at is None:
                self.pressure_at = t  # a router tells the controller at once (urgent)
            self.queued += admitted
        rejected = overflow - admitted
        if rejected:
            self.rejected[point] += rejected
            self._rejections += rejected
            self.totals["rejected"] += rejected

    def quiet(self, t0: float, t1: float, routable: int, rate_end: float) -> None:
        """The whole tick at once: nothing waits, in-flight relaxes towards steady state."""
        arrivals = self._arrive(t1)
        steady = self.steady_ongoing(rate_end, routable)
        settle = math.exp(-(t1 - t0) / self.mean_s)
        before = self.ongoing
        x = before + arrivals - (steady + (before - steady) * settle) + self._carry
        done = min(max(int(x + _DUST), 0), before + arrivals)
        self._carry = min(max(x - done, 0.0), 1.0)
        self.ongoing = before + arrivals - done
        self.ok[self.point] += done
        self._completions += done
        self._admit_quietly(arrivals, routable, rate_end)

    def _admit_quietly(self, arrivals: int, routable: int, rate: float) -> None:
        if arrivals:
            self._offer(arrivals)
            self._record_delay(arrivals, routable, rate)

    def _offer(self, arrivals: int) -> int:
        """Count arrivals at the current report point; returns that point."""
        point = self.point
        self.offered[point] += arrivals
        self._arrivals += arrivals
        self.totals["arrived"] += arrivals
        return point

    def _record_delay(self, count: int, routable: int, rate: float) -> None:
        """`count` requests started at once, each with the current routing delay."""
        key = round(self._delay_s(routable, rate) * 1e6)
        delays = self.delays[self.point]
        delays[key] = delays.get(key, 0) + count
