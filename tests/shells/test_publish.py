"""controller.publish: replica sets gathered per flush, pickled once, and deltas."""

from __future__ import annotations

from collections.abc import Callable

from surge.backends.base import LOCAL_PLACEMENT
from surge.config import AppSpec, DeploymentConfig, DeploymentSpec, HTTPOptions
from surge.controller import desired
from surge.controller.publish import DELTAS, PUSH_GAP_MAX_S, Publisher, push_gap
from surge.controller.state import ControllerState, ReplicaRecord
from surge.model import DeploymentId, ReplicaInfo, ReplicaSet, ReplicaSetDelta
from surge.policy.lifecycle import ReplicaState
from surge.testing import FakeClock, FakePeer

DID = DeploymentId("app", "Model")


def setup(config: DeploymentConfig | None = None,
          ) -> tuple[ControllerState, Publisher, list[Callable[[], None]]]:
    state = ControllerState("127.0.0.1:1", HTTPOptions(), 1, head=LOCAL_PLACEMENT)
    spec = DeploymentSpec(config=config or DeploymentConfig(name="Model", max_queued_requests=12),
                          target_blob=b"v", init_blob=b"")
    desired.deploy(state, AppSpec(name="app", route_prefix="/", ingress="Model",
                                  deployments=(spec,)), wall=0.0)
    flushes: list[Callable[[], None]] = []
    return state, Publisher(state, schedule=lambda _, due: flushes.append(due)), flushes


def ready(state: ControllerState, replica_id: str) -> None:
    replica = ReplicaRecord(replica_id, DID, 1, 0.0)
    state.add_replica(replica)
    replica.info = ReplicaInfo(replica_id, DID, f"unix:/s/{replica_id}", 1)
    replica.move(ReplicaState.RUNNING)


def flush(flushes: list[Callable[[], None]]) -> None:
    while flushes:
        flushes.pop(0)()


def test_a_herd_of_changes_is_one_push_per_watcher() -> None:
    state, publisher, flushes = setup()
    router = FakePeer("proxy")
    publisher.watch(router, DID)
    for name in ("a", "b", "c"):
        ready(state, name)
        publisher.replica_set(DID)
    assert len(flushes) == 1  # one flush asked for, however many changes
    flush(flushes)
    sets: list[ReplicaSet] = router.pushed("replica_set")
    assert [[r.replica_id for r in s.replicas] for s in sets] == [["a", "b", "c"]]
    assert (sets[0].queue_limit, sets[0].generation) == (12, 1)
    assert sets[0].max_queue_wait_s is None  # an explicit count: Ray's semantics
    publisher.replica_set(DID)
    flush(flushes)  # nothing changed: nothing pushed
    assert len(router.pushed("replica_set")) == 1


def test_without_max_queued_requests_routers_are_told_the_wait_bound() -> None:
    state, publisher, flushes = setup(DeploymentConfig(name="Model", max_queue_wait_s=0.25))
    ready(state, "a")
    router = FakePeer("proxy", **{DELTAS: True})
    publisher.watch(router, DID)
    flush(flushes)
    first: ReplicaSet = router.pushed("replica_set")[0]
    assert (first.max_queue_wait_s, first.queue_limit) == (0.25, 10_000)
    ready(state, "b")
    publisher.replica_set(DID)
    flush(flushes)
    delta: ReplicaSetDelta = router.pushed("replica_set_delta")[0]
    applied = delta.apply(first)
    assert applied is not None and applied.max_queue_wait_s == 0.25


def test_routers_are_told_when_prefix_routing_is_off() -> None:
    state, publisher, flushes = setup(DeploymentConfig(name="Model", request_router_config={
        "request_router_kwargs": {"prefix_routing": False}}))  # type: ignore[arg-type]
    ready(state, "a")
    router = FakePeer("proxy", **{DELTAS: True})
    publisher.watch(router, DID)
    flush(flushes)
    first: ReplicaSet = router.pushed("replica_set")[0]
    assert first.prefix_routing is False
    ready(state, "b")
    publisher.replica_set(DID)
    flush(flushes)
    applied = router.pushed("replica_set_delta")[0].apply(first)
    assert applied is not None and applied.prefix_routing is False
    _, publisher, flushes = setup()
    publisher.watch(router := FakePeer("proxy"), DID)
    flush(flushes)
    assert router.pushed("replica_set")[0].prefix_routing is True  # the default


def test_routers_that_apply_deltas_get_what_changed_and_the_others_whole_sets() -> None:
    state, publisher, flushes = setup()
    ready(state, "a")
    whole, deltas = FakePeer("proxy"), FakePeer("proxy", **{DELTAS: True})
    publisher.watch(whole, DID)
    publisher.watch(deltas, DID)
    flush(flushes)
    first: ReplicaSet = deltas.pushed("replica_set")[0]  # the first set is always whole
    assert [r.replica_id for r in first.replicas] == ["a"] and first.queue_limit == 6
    ready(state, "b")
    state.replicas["a"].move(ReplicaState.DRAINING)
    publisher.replica_set(DID)
    flush(flushes)
    delta: ReplicaSetDelta = deltas.pushed("replica_set_delta")[0]
    assert ([r.replica_id for r in delta.added], delta.removed) == (["b"], ("a",))
    assert (delta.base, delta.generation) == (1, 2)
    assert delta.apply(first) == whole.pushed("replica_set")[-1]
    assert delta.apply(whole.pushed("replica_set")[-1]) is None  # not its base
    late = FakePeer("proxy", **{DELTAS: True})
    publisher.watch(late, DID)  # a new watcher: a whole set; the others a new share
    flush(flushes)
    assert [r.replica_id for r in late.pushed("replica_set")[0].replicas] == ["b"]
    share: ReplicaSetDelta = deltas.pushed("replica_set_delta")[-1]
    assert (share.added, share.removed, share.queue_limit) == ((), (), 4)
    assert whole.pushed("replica_set")[-1].queue_limit == 4


def test_nothing_is_pushed_while_paused_and_everything_after() -> None:
    state, publisher, flushes = setup()
    router = FakePeer("proxy", **{DELTAS: True})
    publisher.paused = True
    publisher.watch(router, DID)
    ready(state, "a")
    publisher.replica_set(DID)
    flush(flushes)
    assert router.pushes == []
    publisher.paused = False
    publisher.replica_sets(force=True)
    flush(flushes)
    assert [r.replica_id for r in router.pushed("replica_set")[0].replicas] == ["a"]


class SlowPeer(FakePeer):
    """A watcher whose push takes `cost` seconds of the controller's (fake) time."""

    def __init__(self, clock: FakeClock, cost: float) -> None:
        super().__init__("proxy")
        self.clock, self.cost = clock, cost

    def push(self, topic: str, value: object) -> None:
        self.clock.advance(self.cost)
        super().push(topic, value)


def test_flushes_are_paced_by_what_the_last_one_cost() -> None:
    """A flush that took 30 ms: the next waits 60 ms, and a change meanwhile is pushed
    then, with the others that came in between; a cheap flush goes at once."""
    state, _, _ = setup()
    clock = FakeClock()
    asked: list[tuple[float, Callable[[], None]]] = []
    publisher = Publisher(state, schedule=lambda delay, due: asked.append((delay, due)),
                          clock=clock)
    router = SlowPeer(clock, 0.030)
    publisher.watch(router, DID)
    ready(state, "a")
    publisher.replica_set(DID)
    delay, due = asked.pop()
    assert delay == 0.0
    due()
    assert len(router.pushed("replica_set")) == 1
    for name in ("b", "c"):
        ready(state, name)
        publisher.replica_set(DID)
    assert [round(d, 6) for d, _ in asked] == [0.06]  # one flush asked for, 2 x 30 ms on
    publisher.flush()  # the control loop's own flush at the end of a tick: too soon
    assert len(router.pushed("replica_set")) == 1 and len(asked) == 1
    clock.advance(0.06)
    asked.pop()[1]()
    sets: list[ReplicaSet] = router.pushed("replica_set")
    assert [r.replica_id for r in sets[-1].replicas] == ["a", "b", "c"] and len(sets) == 2
    router.cost = 0.0001
    clock.advance(0.1)
    ready(state, "d")
    publisher.replica_set(DID)
    assert asked[-1][0] == 0.0
    assert push_gap(0.0001) == 0.0002 and push_gap(1.0) == PUSH_GAP_MAX_S


def test_routers_are_told_a_longer_load_interval_once_and_new_ones_when_they_watch() -> None:
    _, publisher, _ = setup()
    first, second = FakePeer("proxy"), FakePeer("proxy")
    publisher.watch(first, DID)
    assert first.pushed("load_interval") == []  # the default: nothing to say
    publisher.tell_load_interval(0.5)
    publisher.tell_load_interval(0.5)  # unchanged: not again
    assert first.pushed("load_interval") == [0.5]
    publisher.watch(second, DID)
    assert second.pushed("load_interval") == [0.5]
    publisher.drop(first)
    publisher.tell_load_interval(0.1)
    assert first.pushed("load_interval") == [0.5] and second.pushed("load_interval") == [0.5, 0.1]
    assert list(publisher.routers) == [second]


def test_members_are_told_a_longer_telemetry_interval_and_new_ones_at_hello() -> None:
    _, publisher, _ = setup()
    first, second = FakePeer("replica"), FakePeer("proxy")
    publisher.greet_member(first)
    assert first.pushed("telemetry_interval") == []  # the default: nothing to say
    publisher.tell_telemetry_interval(3.0)
    publisher.tell_telemetry_interval(3.0)  # unchanged: not again
    assert first.pushed("telemetry_interval") == [3.0]
    publisher.greet_member(second)
    assert second.pushed("telemetry_interval") == [3.0]
    publisher.drop(first)
    publisher.tell_telemetry_interval(1.0)
    assert second.pushed("telemetry_interval") == [3.0, 1.0]
    assert first.pushed("telemetry_interval") == [3.0]  # gone: not told
    assert publisher.members == {second} and publisher.telemetry_interval_s == 1.0
