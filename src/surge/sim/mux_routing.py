"""The router of a multiplexed deployment: surge's policy, or a model of Ray Serve 2.60's.

Both take requests the flow admitted (`submit`), hand each to a replica through the
flow (`host.dispatch`) and hear when capacity or holders changed (`wake`), when a
request timed out (`cancel`) and when the replica set changed (`replicas_changed`).

`SurgeRouting` calls policy.model_routing.choose_for_model, the production policy, on
the replicas' exact state: one router, whose view of what each replica holds or loads
is never stale (surge's replicas report it in the frames they already send and a router
counts its own first request as a reservation; several proxies' views are not
modelled). A request that finds no replica waits in its model's FIFO; on every change
the oldest waiting request of each model is tried again, models in the order of their
oldest request; after its matching timeout (drawn in [t, 2t]) a request may go to any
replica with room.

`RayRouting` follows ray/serve/_private/request_router (PowerOfTwoChoicesRequestRouter
with MultiplexMixin and FIFOMixin): at most min(50, 2 x replicas) routing tasks, each
routing one request at a time with backoff (a retry at once, then 25 ms doubling to
0.5 s); a replica found for a task serves the oldest waiting request of the same
model. Candidates per attempt: within the matching timeout (a fresh draw in [t, 2t]
each attempt, since the first) the replicas that advertise the model, or, when there
are none and no request fell back for it yet, or on every attempt after the first,
the replicas advertising the fewest models (when none advertise it and another request
already fell back, no candidate: it waits); past the timeout the fewest once, then all.
Two candidates are sampled and the one with fewer in flight that has room wins; none
with room, the attempt fails. Replicas push their ids (held and loading) every
`advertise_interval_s` when changed; the routers see a push at the controller's next
0.1 s loop. One router with an exact queue-length cache.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from surge.policy.model_routing import FREE_SLOT, NO_REPLICA, ModelHeat, choose_for_model
from surge.sim.multiplexing import Multiplexing
from surge.sim.mux_replica import MuxReplica, Request

__all__ = ["RayRouting", "Router", "RoutingHost", "SurgeRouting", "make_router"]

# Ray's RequestRouter.max_num_routing_tasks_cap and its retry backoff
# (RAY_SERVE_ROUTER_RETRY_INITIAL_BACKOFF_S, _BACKOFF_MULTIPLIER, _MAX_BACKOFF_S).
RAY_MAX_ROUTING_TASKS = 50
RAY_INITIAL_BACKOFF_S = 0.025
RAY_BACKOFF_MULTIPLIER = 2
RAY_MAX_BACKOFF_S = 0.5


class RoutingHost(Protocol):
    replicas: list[MuxReplica]  # routable, in a stable order

    def dispatch(self, request: Request, replica: MuxReplica, now: float) -> None: ...

    def at(self, when: float, action: object, argument: object) -> None: ...


class Router(Protocol):
    def submit(self, request: Request, now: float) -> None: ...

    def wake(self, now: float) -> None: ...

    def cancel(self, request: Request, now: float) -> None: ...

    def replicas_changed(self, now: float) -> None: ...


def make_router(host: RoutingHost, mux: Multiplexing, capacity: int,
                rng: random.Random) -> SurgeRouting | RayRouting:
    if mux.routing == "ray":
        return RayRouting(host, mux, capacity, rng)
    return SurgeRouting(host, mux, capacity, rng)


class SurgeRouting:
    def __init__(self, host: RoutingHost, mux: Multiplexing, capacity: int,
                 rng: random.Random) -> None:
        self.host, self.mux, self.capacity, self.rng = host, mux, capacity, rng
        self.waiting: dict[int, deque[Request]] = {}
        self.heat = ModelHeat()  # as the router keeps it
        self.now = 0.0

    def _coldest(self, replica: MuxReplica) -> float:
        if not replica.capacity or replica.model_count() < replica.capacity:
            return FREE_SLOT
        return self.heat.coldest(replica.model_ids(), self.now)

    def _choose(self, request: Request) -> MuxReplica | None:
        replicas = self.host.replicas
        model = request.model
        index = choose_for_model([r.in_flight for r in replicas], self.capacity,
                                 [r.holds(model) for r in replicas],
                                 [r.model_count() for r in replicas],
                                 self.mux.max_replicas_per_model, self.rng, request.fallback,
                                 [self._coldest(r) for r in replicas])
        return None if index == NO_REPLICA else replicas[index]

    def submit(self, request: Request, now: float) -> None:
        self.now = now
        self.heat.hit(request.model, now)
        queue = self.waiting.get(request.model)
        if queue:
            self._drop_done(queue)
        if not queue:
            replica = self._choose(request)
            if replica is not None:
                self.host.dispatch(request, replica, now)
                return
        self.waiting.setdefault(request.model, deque()).append(request)
        timeout = self.mux.matching_timeout_s
        if timeout is not None:
            self.host.at(now + self.rng.uniform(timeout, 2 * timeout), self._fall_back,
                         request)

    def _fall_back(self, request: Request, now: float) -> None:
        if not request.done:
            request.fallback = True
            self.wake(now)

    @staticmethod
    def _drop_done(queue: deque[Request]) -> None:
        while queue and queue[0].done:
            queue.popleft()

    def wake(self, now: float) -> None:
        self.now = now
        heads = []
        for model, queue in list(self.waiting.items()):
            self._drop_done(queue)
            if queue:
                heads.append((queue[0].arrived, model))
            else:
                del self.waiting[model]
        replicas = self.host.replicas
        for _, model in sorted(heads):
            if all(r.in_flight >= self.capacity for r in replicas):
                return
            queue = self.waiting[model]
            while queue:
                replica = self._choose(queue[0])
                if replica is None:
                    break
                self.host.dispatch(queue.popleft(), replica, now)
                self._drop_done(queue)

    def cancel(self, request: Request, now: float) -> None:
        pass  # dropped lazily from its queue

    def replicas_changed(self, now: float) -> None:
        self.wake(now)


@dataclass(eq=False)
class _Task:
    request: Request
    attempt: int = 0
    backed_off: bool = False  # Ray's entered_backoff: the first retry is at once
    alive: bool = True


class RayRouting:
    def __init__(self, host: RoutingHost, mux: Multiplexing, capacity: int,
                 rng: random.Random) -> None:
        self.host, self.mux, self.capacity, self.rng = host, mux, capacity, rng
        self.timeout_s = mux.matching_timeout_s or 0.0
        self.to_route: deque[Request] = deque()  # not yet taken by a task
        self.by_model: dict[int, deque[Request]] = {}  # waiting, oldest first
        self.waiting = 0
        self.tasks: set[_Task] = set()
        self.fallback_match: set[int] = set()  # models some request fell back for

    @property
    def max_tasks(self) -> int:
        return min(RAY_MAX_ROUTING_TASKS, 2 * len(self.host.replicas))

    def submit(self, request: Request, now: float) -> None:
        self.to_route.append(request)
        self.by_model.setdefault(request.model, deque()).append(request)
        self.waiting += 1
        self._start_tasks(now)

    def wake(self, now: float) -> None:
        pass  # tasks retry on their backoff, not when capacity frees

    def cancel(self, request: Request, now: float) -> None:
        self.waiting -= 1
        task = request.task
        if isinstance(task, _Task) and task.alive:
            self._end(task)
        self._start_tasks(now)

    def replicas_changed(self, now: float) -> None:
        self._start_tasks(now)

    # -- tasks -----------------------------------------------------------------------------

    def _start_tasks(self, now: float) -> None:
        while len(self.tasks) < min(self.waiting, self.max_tasks):
            request = self._next_to_route()
            if request is None:
                return
            task = _Task(request)
            request.task = task
            self.tasks.add(task)
            self._attempt(task, now)

    def _next_to_route(self) -> Request | None:
        while self.to_route:
            request = self.to_route.popleft()
            if not request.done:
                return request
        return None

    def _end(self, task: _Task) -> None:
        task.alive = False
        self.tasks.discard(task)

    def _attempt(self, task: _Task, now: float) -> None:
        if not task.alive:
            return
        request = task.request
        if not request.done:
            replica = self._pick(self._candidates(request, now))
            if replica is not None:
                self._fulfil(request.model, replica, task, now)
        if request.done:
            self._next_request(task, now)
            return
        delay = 0.0
        if task.backed_off:
            delay = min(RAY_INITIAL_BACKOFF_S * RAY_BACKOFF_MULTIPLIER ** task.attempt,
                        RAY_MAX_BACKOFF_S)
            task.attempt += 1
        task.backed_off = True
        self.host.at(now + delay, self._attempt, task)

    def _next_request(self, task: _Task, now: float) -> None:
        request = self._next_to_route() if len(self.tasks) <= min(
            self.waiting, self.max_tasks) else None
        if request is None:
            self._end(task)
            return
        task.request, task.attempt, task.backed_off = request, 0, False
        request.task = task
        self.host.at(now, self._attempt, task)  # the same instant, without recursing

    def _fulfil(self, model: int, replica: MuxReplica, task: _Task, now: float) -> None:
        """FIFOMixin: the oldest waiting request of the same model gets the replica."""
        queue = self.by_model[model]
        while queue[0].done:
            queue.popleft()
        chosen = queue.popleft()
        other = chosen.task
        if other is not task and isinstance(other, _Task) and other.alive:
            self._end(other)
        self.waiting -= 1
        self.host.dispatch(chosen, replica, now)

    # -- MultiplexMixin and power of two choices --------------------------------------------

    def _fewest(self, replicas: Sequence[MuxReplica]) -> list[MuxReplica]:
        least = min(len(r.advertised) for r in replicas)
        return [r for r in replicas if len(r.advertised) == least]

    def _candidates(self, request: Request, now: float) -> list[MuxReplica]:
        replicas = self.host.replicas
        if not replicas:
            return []
        if request.routed_at is None:
            request.routed_at = now
        model = request.model
        if now - request.routed_at < self.rng.uniform(self.timeout_s, 2 * self.timeout_s):
            holders = [r for r in replicas if model in r.advertised]
            candidates: list[MuxReplica] = []
            if (not holders and model not in self.fallback_match) or request.tried_first:
                candidates = self._fewest(replicas)
                self.fallback_match.add(model)
            elif holders:
                self.fallback_match.discard(model)
                candidates = holders
            request.tried_first = True
            return candidates
        if not request.tried_fewest:
            request.tried_fewest = True
            return self._fewest(replicas)
        return list(replicas)

    def _pick(self, candidates: Sequence[MuxReplica]) -> MuxReplica | None:
        n = len(candidates)
        if n == 0:
            return None
        if n == 1:
            chosen = [candidates[0]]
        elif n == 2:
            chosen = list(candidates) if self.rng.getrandbits(1) else [candidates[1],
                                                                        candidates[0]]
        else:
            i = self.rng.randrange(n)
            j = self.rng.randrange(n - 1)
            chosen = [candidates[i], candidates[j + 1 if j >= i else j]]
        best = None
        for replica in chosen:
            if replica.in_flight < self.capacity and (
                    best is None or replica.in_flight < best.in_flight):
                best = replica
        return best
