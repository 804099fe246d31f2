"""One simulated replica's models: held in LRU order, loading, and the requests waiting.

Two replica sides, chosen by the scenario's `multiplex.loads`:

* `concurrent`, as surge's replica/multiplex.py: one load per model at a time (a
  request for a model being loaded waits for that load), loads of different models at
  once, at most `max_num_models_per_replica` models held or loading; a load that finds
  no room evicts the least recently used held model, or, when every place is taken by
  loads in progress, waits for the next one to finish (then evicts it, if it is the
  LRU, as the replica does). Unlike replica/multiplex.py, loads waiting for room do not
  count against each other (there they can wait on each other forever: see the sim's
  report to issue 17).
* `serial`, as Ray Serve 2.60's ray/serve/multiplex.py: every request for a model not
  held queues on one lock per replica (FIFO); the lock's holder returns at once if its
  model was loaded meanwhile, else evicts the LRU model when `max_num_models_per_
  replica` are held and loads its own; so loads of different models run one after the
  other. Routers see held models and `load_tasks` (Ray's `_model_load_tasks`: added
  by each request that misses, removed when a load ends).

A request occupies a slot (`in_flight`) from its dispatch until its service ends, its
wait for a load included. Unloading takes no time. The replica calls its `Host` to
start a request's service and to time a load; the host calls `finish_load` back.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Host", "MuxReplica", "Request"]


@dataclass(eq=False, slots=True)
class Request:
    arrived: float
    point: int  # the 100 ms point it arrived in
    model: int
    dispatched: float | None = None
    done: bool = False  # dispatched, timed out or rejected: no router may take it again
    hit: bool = False  # its model was held when it reached the replica
    routed_at: float | None = None  # ray: the first routing attempt (matching starts)
    tried_first: bool = False  # ray: routing_context.tried_first_multiplexed_models
    tried_fewest: bool = False  # ray: routing_context.tried_fewest_multiplexed_models
    fallback: bool = False  # surge: past its matching timeout, any replica with room
    task: object | None = None  # ray: the routing task routing it
    replica: MuxReplica | None = None  # where it was dispatched


class Host(Protocol):
    def serve(self, request: Request, now: float) -> None: ...

    def load(self, replica: MuxReplica, model: int, now: float) -> None: ...


@dataclass(eq=False)
class MuxReplica:
    replica_id: str
    capacity: int  # models held or loading at once; 0: unlimited
    serial: bool
    host: Host
    in_flight: int = 0
    models: OrderedDict[int, None] = field(default_factory=OrderedDict)  # LRU first
    loading: dict[int, list[Request]] = field(default_factory=dict)  # concurrent: waiters
    room_wanted: deque[int] = field(default_factory=deque)  # concurrent: loads awaiting room
    active_loads: int = 0  # concurrent: loads in progress (not those awaiting room)
    lock_queue: deque[Request] = field(default_factory=deque)  # serial: Ray's lock
    locked: Request | None = None  # serial: the request whose load holds the lock
    load_tasks: set[int] = field(default_factory=set)  # serial: Ray's _model_load_tasks
    loads: int = 0
    evictions: int = 0
    changed: bool = False  # its model ids changed since its last push (ray routing)
    pushed: frozenset[int] = frozenset()  # ray: what it last pushed to the controller
    advertised: frozenset[int] = frozenset()  # ray: what the routers know of it

    def __repr__(self) -> str:
        return (f"<MuxReplica {self.replica_id} in_flight={self.in_flight} "
                f"held={list(self.models)} loading={sorted(self.loading_ids())}>")

    # -- what routers see ----------------------------------------------------------------

    def loading_ids(self) -> set[int]:
        if self.serial:
            return self.load_tasks - self.models.keys()
        return set(self.loading)

    def model_ids(self) -> set[int]:
        """Held or loading: what surge's replica reports (Ray's, for `serial`)."""
        return set(self.models) | (self.load_tasks if self.serial else self.loading.keys())

    def holds(self, model: int) -> bool:
        return (model in self.models or model in self.loading
                or (self.serial and model in self.load_tasks))

    def model_count(self) -> int:
        if self.serial:
            return len(self.models.keys() | self.load_tasks)
        return len(self.models) + len(self.loading)

    # -- requests ------------------------------------------------------------------------

    def arrive(self, request: Request, now: float) -> None:
        """A request reaches the replica: served now if its model is held, else waits."""
        self.in_flight += 1
        model = request.model
        if model in self.models:
            self.models.move_to_end(model)
            request.hit = True
            self.host.serve(request, now)
        elif self.serial:
            self.load_tasks.add(model)
            self.changed = True
            self.lock_queue.append(request)
            if self.locked is None:
                self._next_under_lock(now)
        elif model in self.loading:
            self.loading[model].append(request)
        else:
            self.loading[model] = [request]
            self.changed = True
            if not self._start_load(model, now):
                self.room_wanted.append(model)

    def finish_load(self, model: int, now: float) -> None:
        self.models[model] = None
        self.changed = True
        if self.serial:
            request, self.locked = self.locked, None
            self.load_tasks.discard(model)
            if request is not None:
                self.host.serve(request, now)
            self._next_under_lock(now)
            return
        self.active_loads -= 1
        for request in self.loading.pop(model):
            self.host.serve(request, now)
        while self.room_wanted and self._start_load(self.room_wanted[0], now):
            self.room_wanted.popleft()

    # -- concurrent loads ------------------------------------------------------------------

    def _start_load(self, model: int, now: float) -> bool:
        """Make room (evict LRU) and start loading `model`; False: no room yet."""
        if self.capacity:
            while self.models and len(self.models) + self.active_loads >= self.capacity:
                self._evict()
            if len(self.models) + self.active_loads >= self.capacity:
                return False
        self.active_loads += 1
        self.loads += 1
        self.host.load(self, model, now)
        return True

    def _evict(self) -> None:
        self.models.popitem(last=False)
        self.evictions += 1
        self.changed = True

    # -- serial loads (Ray) ----------------------------------------------------------------

    def _next_under_lock(self, now: float) -> None:
        while self.lock_queue:
            request = self.lock_queue.popleft()
            if request.model in self.models:  # loaded while it waited (no LRU touch)
                self.host.serve(request, now)
                continue
            if self.capacity and len(self.models) >= self.capacity:
                self._evict()
            self.locked = request
            self.loads += 1
            self.host.load(self, request.model, now)
            return
