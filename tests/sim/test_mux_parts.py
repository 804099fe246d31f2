"""The multiplexing simulator's parts: a replica's models, Ray's candidates, popularity."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.sim.multiplexing import parse_multiplexing, parse_popularity
from surge.sim.mux_replica import MuxReplica, Request
from surge.sim.mux_routing import RAY_INITIAL_BACKOFF_S, RAY_MAX_BACKOFF_S, RayRouting

# -- a replica's models --------------------------------------------------------------------


class Host:
    """Records services and loads; a request is served only once its model is held."""

    def __init__(self) -> None:
        self.served: list[Request] = []
        self.loading: list[tuple[MuxReplica, int]] = []

    def serve(self, request: Request, now: float) -> None:
        assert request.replica is not None and request.model in request.replica.models
        assert request not in self.served
        self.served.append(request)

    def load(self, replica: MuxReplica, model: int, now: float) -> None:
        assert (replica, model) not in self.loading  # one load per model at a time
        self.loading.append((replica, model))

    def finish(self, index: int = 0) -> None:
        replica, model = self.loading.pop(index)
        replica.finish_load(model, 0.0)


def replica(capacity: int, serial: bool = False) -> tuple[MuxReplica, Host]:
    host = Host()
    return MuxReplica("r1", capacity, serial, host), host


def send(target: MuxReplica, model: int) -> Request:
    request = Request(0.0, 0, model, replica=target)
    target.arrive(request, 0.0)
    return request


def test_requests_for_a_model_being_loaded_wait_for_that_one_load() -> None:
    r, host = replica(3)
    first, second = send(r, 1), send(r, 1)
    assert host.loading == [(r, 1)] and r.in_flight == 2 and not host.served
    host.finish()
    assert host.served == [first, second] and not first.hit
    assert send(r, 1).hit


def test_different_models_load_at_once_on_a_surge_replica() -> None:
    r, host = replica(3)
    send(r, 1), send(r, 2)
    assert host.loading == [(r, 1), (r, 2)]


def test_a_ray_replica_loads_one_model_after_the_other() -> None:
    r, host = replica(3, serial=True)
    a, b, a2 = send(r, 1), send(r, 2), send(r, 1)
    assert host.loading == [(r, 1)] and r.model_ids() == {1, 2}  # Ray advertises both
    host.finish()
    assert host.served == [a] and host.loading == [(r, 2)]
    host.finish()  # a2 waited behind model 2's load, then finds model 1 loaded
    assert host.served == [a, b, a2]


def test_the_least_recently_used_model_is_evicted() -> None:
    r, host = replica(2)
    send(r, 1), host.finish(), send(r, 2), host.finish()
    send(r, 1)  # touched: 2 is now the least recently used
    send(r, 3)
    assert list(r.models) == [1] and r.evictions == 1
    host.finish()
    assert list(r.models) == [1, 3]


def test_a_load_without_room_waits_for_a_load_in_progress() -> None:
    r, host = replica(2)
    send(r, 1), send(r, 2), send(r, 3)
    assert host.loading == [(r, 1), (r, 2)] and list(r.room_wanted) == [3]
    host.finish()  # 1 is held and the LRU: 3 evicts it and starts
    assert list(r.models) == [] and host.loading == [(r, 2), (r, 3)]


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 4), serial=st.booleans(),
       steps=st.lists(st.tuples(st.booleans(), st.integers(0, 6)), max_size=60))
def test_a_replica_never_holds_more_than_its_capacity_and_serves_everyone(
        capacity: int, serial: bool, steps: list[tuple[bool, int]]) -> None:
    r, host = replica(capacity, serial)
    sent = 0
    for is_request, value in steps:
        if is_request or not host.loading:
            send(r, value)
            sent += 1
        else:
            host.finish(value % len(host.loading))
        if serial:
            assert len(host.loading) <= 1 and len(r.models) <= capacity
        else:
            assert len(r.models) + r.active_loads <= capacity
            assert r.active_loads == len(host.loading)
    while host.loading:
        host.finish()
    assert len(host.served) == sent


# -- Ray's candidates --------------------------------------------------------------------


class Routing:
    """A RoutingHost: replicas, scheduled attempts, dispatches."""

    def __init__(self, advertised: list[set[int]], in_flight: list[int]) -> None:
        self.replicas = [MuxReplica(f"r{i}", 3, True, Host())
                         for i in range(len(advertised))]
        for target, models, load in zip(self.replicas, advertised, in_flight, strict=True):
            target.advertised, target.in_flight = frozenset(models), load
        self.scheduled: list[float] = []
        self.dispatched: list[tuple[Request, MuxReplica]] = []

    def dispatch(self, request: Request, replica: MuxReplica, now: float) -> None:
        request.done = True
        self.dispatched.append((request, replica))

    def at(self, when: float, action: Any, argument: Any) -> None:
        self.scheduled.append(when)


MUX = parse_multiplexing({"models": 8, "load_time_s": 0.2, "routing": "ray",
                          "loads": "serial"}, "multiplex")


def ray(advertised: list[set[int]], in_flight: list[int]) -> tuple[RayRouting, Routing]:
    host = Routing(advertised, in_flight)
    return RayRouting(host, MUX, 2, random.Random(1)), host


def names(replicas: list[MuxReplica]) -> list[str]:
    return sorted(r.replica_id for r in replicas)


def test_ray_tries_the_holders_first_then_the_replicas_with_fewest_models() -> None:
    router, _ = ray([{5}, {1, 2}, {3}], [0, 0, 0])
    request = Request(0.0, 0, 5)
    assert names(router._candidates(request, 0.0)) == ["r0"]
    assert names(router._candidates(request, 0.01)) == ["r0", "r2"]  # fewest: one model


def test_ray_falls_back_once_per_model_until_it_is_advertised() -> None:
    router, _ = ray([{1}, {2}, set()], [0, 0, 0])
    first, second = Request(0.0, 0, 7), Request(0.0, 0, 7)
    assert names(router._candidates(first, 0.0)) == ["r2"]
    assert router._candidates(second, 0.0) == []  # another request already fell back
    assert names(router._candidates(second, 0.0)) == ["r2"]  # its retry: the fewest


def test_past_the_matching_timeout_ray_tries_the_fewest_once_then_all() -> None:
    router, _ = ray([{5}, {1, 2}, {3}], [0, 0, 0])
    request = Request(0.0, 0, 5)
    router._candidates(request, 0.0)
    assert names(router._candidates(request, 2.5)) == ["r0", "r2"]
    assert names(router._candidates(request, 2.6)) == ["r0", "r1", "r2"]


def test_ray_retries_at_once_then_backs_off_doubling() -> None:
    router, host = ray([{5}, {1}], [2, 2])  # both full
    router.submit(Request(0.0, 0, 5), 0.0)
    assert host.scheduled == [0.0]
    task = next(iter(router.tasks))
    for when in [0.0, 0.025, 0.075, 0.175]:
        router._attempt(task, when)
    assert host.scheduled == pytest.approx([0.0, 0.025, 0.075, 0.175, 0.375])
    assert RAY_INITIAL_BACKOFF_S * 2 ** 5 > RAY_MAX_BACKOFF_S  # capped from the 6th


def test_a_replica_found_by_one_task_serves_the_oldest_request_of_its_model() -> None:
    router, host = ray([{5}, {1}], [2, 2])
    older, newer = Request(0.0, 0, 5), Request(0.1, 1, 5)
    router.submit(older, 0.0)
    router.submit(newer, 0.1)
    host.replicas[0].in_flight = 0
    tasks = {t.request: t for t in router.tasks}
    router._attempt(tasks[newer], 0.2)
    assert host.dispatched == [(older, host.replicas[0])]
    assert not tasks[older].alive and tasks[newer].alive  # the older one's task ends


# -- popularity ------------------------------------------------------------------------------


def test_zipf_popularity_follows_the_rank() -> None:
    p = parse_popularity({"distribution": "zipf", "s": 1.1}, 40, "p")
    assert sum(p.probabilities) == pytest.approx(1.0)
    assert p.probabilities[0] == pytest.approx(0.272, abs=1e-3)
    assert p.probabilities[0] / p.probabilities[1] == pytest.approx(2 ** 1.1)
    assert p.top(3) == [0, 1, 2]
    picks = p.sample(np.random.default_rng(1), 20000)
    assert picks.count(0) / 20000 == pytest.approx(0.272, abs=0.01)


def test_weights_and_uniform_popularity() -> None:
    assert parse_popularity([1, 3], 2, "p").top(1) == [1]
    assert parse_popularity("uniform", 4, "p").probabilities == (0.25,) * 4
    with pytest.raises(ValueError, match="p: a list of weights needs 3 numbers"):
        parse_popularity([0, 0, 0], 3, "p")
