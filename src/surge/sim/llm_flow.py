"""Requests one by one through LLM replicas: routing on the engines' queues, engines stepped.

A scenario with an `llm:` section (sim/llm_spec.py) replays its trace:

* arrivals are the trace's, at its times; a request no replica has room for queues or
  is refused as the router decides it (policy.dispatch.refuse: `max_queued_requests`,
  the routers' summed shares, or with it unset the wait bound by time, with the mean
  time of a request at target load as the service time), and one still waiting in the
  router `timeout_s` after it arrived times out;
* the router picks a replica as surge's router does for an LLM deployment
  (policy/engine_routing.py `choose_by_score` on `engine_score`: each replica's last
  routing-stats report, sent when it starts and then every `report_s` +-10% as
  replica/stats_hooks.py sends them, plus this router's in flight there since,
  power of two choices, none past `max_ongoing_requests`), or in turn (`round_robin`);
  the router's queue is taken in order as requests finish;
* each replica is an EngineModel stepped on virtual time (sim/llm_replica.py); a request
  holds its replica's slot from dispatch to its last token (or to its 429, below); TTFT
  is from arrival to the first token's step end, TPOT (as `vllm bench serve`) the time
  from the first to the last token over the tokens after the first;
* the replicas' reports are also what the controller's EngineTracker sums for
  autoscaling (`engine_load`: fresh reports' waiting, running, mean KV use, the prefill
  backlog and the capacity fields, sim/llm_replica.LLMReplica.report);
* shed, do not fail: when the deployment states objectives (`autoscaling_config.
  objectives` with a TTFT target and `shed` on, as llm/service.py reads them), a request
  reaching its replica's engine is first put to policy/llm_shedding.shed_retry_after,
  the function the real replica calls, with that replica's prefill backlog (prompt
  tokens added to its engine, no first token yet), the request's prompt, and the prefill
  rate the replica measured of its engine model (sim/llm_replica.py: prompt tokens
  answered per busy second over the last 10 s, at its reports, by
  policy/llm_capacity.py's meter, as a real replica measures its engine; 0, so never
  shed, until measured). A request it refuses is answered 429 at once: counted as *shed*
  (`shed`, by the point it was answered, `shed_sent` by the point it arrived; the
  report's "429"), never queued on the engine; its router's load report counts it
  offered but not completed, as a real router counts a replica's 429 (no service time);
* a replica that leaves routing finishes what it holds, then reports no more;
* the router never queues while the engines have room, so it tells the controller of a
  jump in its arrivals instead (policy/arrival_jump.py, as surge's router does for an
  LLM deployment): an urgent decision `URGENT_REPORT_DELAY_S` after it (`pressure_at`),
  its recent rate fed a report a tick, and the rate the jump implied (`jump_rate`) its
  report's.

One router stands for all (its in-flight counts are every router's): the engines' own
queues, which every router reads, dominate the choice. A request within both of the
scenario's objectives (`ttft_ms`, `tpot_ms`) is within the SLO; without objectives, a
2xx within `slo_ms` end to end. A shed request is not within it (`surge pulse` counts the
same: goodput over the served, and over the served + shed).
"""

from __future__ import annotations

import random
from collections import deque

from surge.loadtest.stats import interpolated_percentile, latency_key
from surge.loadtest.traces import TraceRequest
from surge.policy.arrival_jump import ArrivalWatch
from surge.policy.autoscaling import LoadSample
from surge.policy.dispatch import SATURATION_HOLD_S, refuse
from surge.policy.engine_load import EngineLoad, fresh_load
from surge.policy.engine_routing import NO_REPLICA, choose_by_score, engine_score
from surge.policy.llm_shedding import shed_retry_after
from surge.sim.cluster import ClusterState
from surge.sim.engine_model import StepOutput
from surge.sim.event_flow import EventFlow
from surge.sim.llm_replica import LLMReplica, LLMRequest
from surge.sim.llm_spec import LLMSpec
from surge.sim.scenario import Scenario

__all__ = ["LLMFlow"]

_EPS = 1e-9
# A replica's report period is drawn from [0.9, 1.1] x report_s each time (as Ray's and
# replica/stats_hooks.py's JITTER), so replicas do not report in step.
REPORT_JITTER = 0.1


class LLMFlow(EventFlow):
    def __init__(self, scenario: Scenario, spec: LLMSpec, rng: random.Random,
                 points: int) -> None:
        super().__init__(scenario, points)
        self.spec = spec  # the scenario's `llm:` section
        self.rng = rng
        self.max_wait_s = scenario.deployment.queue_wait_limit_s
        # the service time the routers measure, which bounds a wait by time from below:
        # a request's mean time on an engine at its target load (Scenario.llm_capacity)
        self.service_s = scenario.service.time_s.mean
        self.waiting: deque[LLMRequest] = deque()  # in the router, in arrival order
        self.replicas: list[LLMReplica] = []  # routable, in the cluster's order
        self.by_id: dict[str, LLMReplica] = {}
        self._next = 0  # the trace's next request
        self._turn = 0  # round robin's
        self._now = 0.0  # the time of the event being handled (for report ages)
        # per request that finished: (arrival time, TTFT s, TPOT s or -1, within SLO)
        self.finished: list[tuple[float, float, float, bool]] = []
        self.watch = ArrivalWatch()  # the router's: its arrivals jump (an urgent report)
        self.jump_rate = 0.0  # ... the rate its last jump implied (the urgent report's)
        # shed, do not fail: the deployment's TTFT target when it sheds (None: never)
        config = scenario.deployment.autoscaling_config
        objectives = config.latency_objectives if config is not None else None
        self.shed_ttft_s = (objectives.ttft_s if objectives is not None and objectives.shed
                            else None)
        self.shed = [0] * points  # answered 429 by the replica, by the point answered
        self.shed_sent = [0] * points  # ... by the point they arrived
        self.totals["shed"] = 0

    def __repr__(self) -> str:
        return (f"<LLMFlow {self.spec.routing} ongoing={self.ongoing} queued={self.queued} "
                f"replicas={len(self.replicas)} {self.totals}>")

    # -- arrivals ------------------------------------------------------------------------

    def close_tick(self, now: float, duration_s: float) -> LoadSample:
        self.watch.reported(self._arrivals, duration_s)  # the router's report a tick
        return super().close_tick(now, duration_s)

    def begin_tick(self, t0: float, t1: float) -> None:
        """Schedule the trace's requests that arrive in [t0, t1)."""
        requests = self.spec.requests
        while self._next < len(requests) and requests[self._next].at_s < t1 - _EPS:
            r = requests[self._next]
            self.at(max(r.at_s, t0), self._arrive, (self._next, r))
            self._next += 1

    def _arrive(self, item: tuple[int, TraceRequest], now: float) -> None:
        index, trace = item
        self._now = now
        request = LLMRequest(index, now, self.point, trace)
        self.count_arrival()
        if self.watch.arrived(now) and self.pressure_at is None:
            self.pressure_at = now  # the router reports at once (urgent), with the rate
            self.jump_rate = self.watch.jump_rate
        replica = self._choose()
        if replica is not None:
            self._dispatch(request, replica, now)
            return
        queued_before = self.queued
        if refuse(queued_before, self.queue_limit, self.max_wait_s, self.ongoing,
                  self.service_s, self.drain_per_s, None, 503) is not None:
            request.done = True
            self.count_rejection()
            return
        self.queued += 1
        self.waiting.append(request)
        self.wait(request, queued_before, now)

    def unqueue(self, request: LLMRequest, now: float) -> None:
        self.waiting.remove(request)

    # -- routing -------------------------------------------------------------------------

    def _choose(self) -> LLMReplica | None:
        replicas = self.replicas
        if not replicas:
            return None
        if self.spec.routing == "round_robin":
            for k in range(len(replicas)):
                replica = replicas[(self._turn + k) % len(replicas)]
                if replica.in_flight < self.max_ongoing:
                    self._turn = (self._turn + k + 1) % len(replicas)
                    return replica
            return None
        full, now = self.max_ongoing, self._now  # a replica that shed is full a moment
        in_flight = [full if r.saturated_until > now else r.in_flight for r in replicas]
        index = choose_by_score(in_flight, [self._score(r) for r in replicas], self.max_ongoing,
                                self.rng)
        return None if index == NO_REPLICA else replicas[index]

    def _score(self, replica: LLMReplica) -> int:
        if replica.reported is None:
            return replica.in_flight
        queue, then, at = replica.reported
        return engine_score(queue, replica.in_flight - then, replica.in_flight,
                            self._now - at, self.spec.report_s)

    def _dispatch(self, request: LLMRequest, replica: LLMReplica, now: float) -> None:
        request.done = True
        request.replica = replica
        self.ongoing += 1
        replica.in_flight += 1
        delay = self.spec.timing.request_s
        if delay > 0:  # the frontend's cost, before the engine sees it (as the mock)
            self.at(now + delay, self._add, request)
        else:
            self._add(request, now)

    def _wake(self, now: float) -> None:
        """Requests finished: send the router's waiting ones while replicas have room."""
        self._now = now
        while self.waiting:
            replica = self._choose()
            if replica is None:
                return
            request = self.waiting.popleft()
            self.queued -= 1
            self._dispatch(request, replica, now)

    # -- the engines ---------------------------------------------------------------------

    def _add(self, request: LLMRequest, now: float) -> None:
        replica = request.replica
        assert replica is not None
        if self.shed_ttft_s is not None:  # the replica's admission (llm/service.py's)
            meter = replica.meter
            if shed_retry_after(meter.backlog_tokens, request.trace.input_length,
                                meter.prefill_tokens_per_s, self.shed_ttft_s) is not None:
                self._shed(request, replica, now)  # (Retry-After: the real replica's)
                return
        replica.add(request, now)
        if not replica.stepping:
            self._step(replica, now)

    def _shed(self, request: LLMRequest, replica: LLMReplica, now: float) -> None:
        """The replica answered 429: its slot is free, and the router tries the request
        once on another replica (held as full a moment: dispatch.SATURATION_HOLD_S) before
        its caller has the answer (policy/dispatch.retry_shed)."""
        replica.in_flight -= 1
        self.ongoing -= 1
        if not request.shed and sum(r.routable for r in self.replicas) > 1:
            request.shed = True
            replica.saturated_until = now + SATURATION_HOLD_S
            self._now = now
            other = self._choose()
            if other is not None:
                self._dispatch(request, other, now)
            else:  # back to the queue's head, sent once a replica has room or the hold ends
                self.waiting.appendleft(request)
                self.queued += 1
                self.at(now + SATURATION_HOLD_S, self._after_shed, None)
            return
        self.shed[self.point] += 1
        self.shed_sent[request.point] += 1
        self.totals["shed"] += 1
        # not a completion: a router counts a replica's 429 as no service (policy/dispatch.py)
        if self.waiting:  # room for the router's queue (as an event: no recursion)
            self.at(now, self._after_shed, None)

    def _after_shed(self, _: None, now: float) -> None:
        self._wake(now)

    def _step(self, replica: LLMReplica, now: float) -> None:
        out = replica.step()
        if out is not None:
            self.at(now + replica.duration(out), self._step_end, (replica, out))

    def _step_end(self, item: tuple[LLMReplica, StepOutput], now: float) -> None:
        replica, out = item
        self._now = now
        for sid, _ in out.tokens:
            request = replica.requests[sid]
            request.tokens += 1
            if request.first_at is None:
                request.first_at = now
                replica.first_token(request, now)
        for sid in out.finished:
            self._complete(replica.finished(sid, now), replica, now)
        self._step(replica, now)
        if out.finished:
            self._wake(now)

    def _complete(self, request: LLMRequest, replica: LLMReplica, now: float) -> None:
        replica.in_flight -= 1
        self.ongoing -= 1
        assert request.first_at is not None
        ttft = request.first_at - request.arrived + self.overhead_s
        tpot = ((now - request.first_at) / (request.tokens - 1) if request.tokens > 1
                else -1.0)
        spec = self.spec
        if spec.ttft_s is None and spec.tpot_s is None:
            within = now - request.arrived + self.overhead_s <= self.slo_s + 1e-12
        else:
            within = ((spec.ttft_s is None or ttft <= spec.ttft_s + 1e-12)
                      and (spec.tpot_s is None or tpot <= spec.tpot_s + 1e-12))
        self.finished.append((request.arrived, ttft, tpot, within))
        self.count_completion(request.point, now - request.arrived + self.overhead_s, within)

    # -- replicas and their reports ---------------------------------------------------------

    def sync(self, cluster: ClusterState, now: float) -> None:
        """Follow the cluster's routable replicas (a new one starts with an empty cache)."""
        routable = [r.replica_id for r in cluster.replicas.values() if r.routable]
        if [r.replica_id for r in self.replicas] == routable:
            return
        for replica in self.replicas:
            replica.routable = False
        for replica_id in routable:
            if replica_id not in self.by_id:
                replica = LLMReplica.new(replica_id, self.spec.timing)
                self.by_id[replica_id] = replica
                # as replica/stats_hooks.py: a report at once, then every report_s +-10%
                self.at(now, self._report, replica)
        self.replicas = [self.by_id[i] for i in routable]
        for replica in self.replicas:
            replica.routable = True
        for replica_id in [i for i, r in self.by_id.items() if not r.routable and
                           not r.in_flight]:
            del self.by_id[replica_id]  # gone, its requests done
        self._now = now
        self._wake(now)

    def _report(self, replica: LLMReplica, now: float) -> None:
        """A replica's routing stats (to the router) and autoscaling stats (controller)."""
        if not replica.routable:
            return
        replica.reported = (replica.queue, replica.in_flight, now)
        replica.engine_report = replica.report(now, self.spec.report_s)
        self.at(now + self.spec.report_s * self.rng.uniform(1 - REPORT_JITTER,
                                                          1 + REPORT_JITTER),
                self._report, replica)

    def engine_load(self, now: float) -> EngineLoad | None:
        return fresh_load([r.engine_report for r in self.replicas
                           if r.engine_report is not None], now)

    # -- results ---------------------------------------------------------------------------

    def percentiles(self, which: int, until: float | None = None) -> dict[str, float | None]:
        """p50/p90/p99 in ms of TTFT (which=1) or TPOT (2) of requests arrived before
        `until` (all: None), interpolated as `surge pulse` reports vLLM's keys (numpy's
        percentile), so a simulated and a real run's figures compare."""
        values = [row[which] for row in self.finished
                  if row[which] >= 0 and (until is None or row[0] < until)]
        histogram: dict[int, int] = {}
        for v in values:
            key = latency_key(v)
            histogram[key] = histogram.get(key, 0) + 1
        found = {q: interpolated_percentile(histogram, q / 100) for q in (50, 90, 99)}
        return {f"p{q}": None if v is None else round(v, 3) for q, v in found.items()}
