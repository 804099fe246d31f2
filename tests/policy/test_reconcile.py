"""reconcile: desired vs observed replicas -> start/stop actions that keep capacity."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from surge.policy.lifecycle import ReplicaState
from surge.policy.reconcile import (
    ActivateReplica,
    ObservedReplica,
    Rollout,
    StartReplicas,
    StopReplica,
    reconcile,
)

S = ReplicaState
ids = itertools.count()


def replica(state: ReplicaState, version: int = 1, started_at: float = 0.0,
            replica_id: str | None = None) -> ObservedReplica:
    return ObservedReplica(replica_id or f"r{next(ids)}", state, version, started_at)


def stopped(actions: Sequence[object]) -> list[str]:
    return [a.replica_id for a in actions if isinstance(a, StopReplica)]


def started(actions: Sequence[object]) -> int:
    return sum(a.count for a in actions if isinstance(a, StartReplicas))


# -- scaling one version -----------------------------------------------------------------


def test_nothing_to_do_at_target() -> None:
    replicas = [replica(S.RUNNING), replica(S.STARTING)]
    assert reconcile(2, 1, replicas) == []


def test_scale_up_from_nothing() -> None:
    assert reconcile(3, 1, []) == [StartReplicas(3, "0 of 3 live")]


def test_scale_up_counts_starting_replicas_as_live() -> None:
    replicas = [replica(S.RUNNING), replica(S.STARTING)]
    assert reconcile(5, 1, replicas) == [StartReplicas(3, "2 of 5 live")]


def test_replicas_that_are_not_live_are_replaced() -> None:
    # DRAINING, STOPPED and FAILED replicas serve no new requests: start new ones.
    replicas = [replica(S.DRAINING), replica(S.STOPPED), replica(S.FAILED), replica(S.RUNNING)]
    assert reconcile(2, 1, replicas) == [StartReplicas(1, "1 of 2 live")]


def test_scale_down_stops_starting_first_then_newest() -> None:
    replicas = [
        replica(S.RUNNING, started_at=1.0, replica_id="oldest"),
        replica(S.RUNNING, started_at=3.0, replica_id="newest"),
        replica(S.RUNNING, started_at=2.0, replica_id="middle"),
        replica(S.STARTING, started_at=0.5, replica_id="starting"),
    ]
    assert reconcile(2, 1, replicas) == [
        StopReplica("starting", "scale down to 2"),
        StopReplica("newest", "scale down to 2"),
    ]


def test_scale_down_among_starting_stops_newest_first() -> None:
    replicas = [replica(S.STARTING, started_at=t, replica_id=f"s{t:g}") for t in (1, 3, 2)]
    replicas.append(replica(S.RUNNING, started_at=9.0, replica_id="running"))
    assert stopped(reconcile(1, 1, replicas)) == ["s3", "s2", "s1"]


def test_scale_to_zero_stops_everything() -> None:
    replicas = [replica(S.RUNNING, version=1), replica(S.STARTING, version=1),
                replica(S.RUNNING, version=0)]
    actions = reconcile(0, 1, replicas)
    assert sorted(stopped(actions)) == sorted(r.replica_id for r in replicas)
    assert started(actions) == 0


# -- rolling updates ---------------------------------------------------------------------


def test_update_starts_new_replicas_and_keeps_old_running_ones() -> None:
    old = [replica(S.RUNNING, version=1, started_at=t) for t in (1.0, 2.0)]
    assert reconcile(2, 2, old) == [StartReplicas(2, "0 of 2 live")]


def test_outdated_starting_replicas_stop_at_once() -> None:
    old_starting = replica(S.STARTING, version=1, replica_id="old-starting")
    old_running = replica(S.RUNNING, version=1, replica_id="old-running")
    actions = reconcile(1, 2, [old_starting, old_running])
    assert actions == [
        StopReplica("old-starting", "outdated version, not yet serving"),
        StartReplicas(1, "0 of 1 live"),
    ]


def test_old_replicas_stop_one_for_one_as_new_ones_run() -> None:
    old = [replica(S.RUNNING, version=1, started_at=t, replica_id=f"old{t:g}") for t in (3, 1, 2)]
    new = [replica(S.RUNNING, version=2, started_at=10.0),
           replica(S.STARTING, version=2, started_at=11.0),
           replica(S.STARTING, version=2, started_at=12.0)]
    # one new replica runs: exactly one old one (the oldest) may stop
    assert reconcile(3, 2, old + new) == [StopReplica("old1", "replaced by new version")]


def test_all_old_replicas_stop_once_target_new_ones_run() -> None:
    old = [replica(S.RUNNING, version=1, started_at=t, replica_id=f"old{t:g}") for t in (1, 2)]
    new = [replica(S.RUNNING, version=2, started_at=10.0 + t) for t in range(2)]
    assert reconcile(2, 2, old + new) == [
        StopReplica("old1", "replaced by new version"),
        StopReplica("old2", "replaced by new version"),
    ]


def test_no_old_replica_stops_while_no_new_one_runs() -> None:
    old = [replica(S.RUNNING, version=1) for _ in range(3)]
    new = [replica(S.STARTING, version=2) for _ in range(3)]
    assert reconcile(3, 2, old + new) == []


def test_update_while_scaling_down_stops_old_surplus_at_once() -> None:
    # 4 old replicas running, the new target is 2: two old ones are surplus right away.
    old = [replica(S.RUNNING, version=1, started_at=t, replica_id=f"old{t:g}")
           for t in (1, 2, 3, 4)]
    assert reconcile(2, 2, old) == [
        StartReplicas(2, "0 of 2 live"),
        StopReplica("old1", "replaced by new version"),
        StopReplica("old2", "replaced by new version"),
    ]


def test_update_while_scaling_up_keeps_every_old_replica() -> None:
    old = [replica(S.RUNNING, version=1) for _ in range(2)]
    new = [replica(S.RUNNING, version=2)]
    assert reconcile(4, 2, old + new) == [StartReplicas(3, "1 of 4 live")]


def test_too_many_new_replicas_and_old_ones_left() -> None:
    old = [replica(S.RUNNING, version=1, replica_id="old")]
    new = [replica(S.RUNNING, version=2, started_at=t, replica_id=f"new{t:g}") for t in (1, 2, 3)]
    assert reconcile(2, 2, old + new) == [
        StopReplica("new3", "scale down to 2"),
        StopReplica("old", "replaced by new version"),
    ]


# -- properties: a simulated control loop ------------------------------------------------

STATES = st.sampled_from([S.STARTING, S.RUNNING, S.DRAINING, S.STOPPED, S.FAILED])


@st.composite
def clusters(draw: st.DrawFn) -> tuple[int, int, list[ObservedReplica]]:
    version = draw(st.integers(min_value=1, max_value=3))
    target = draw(st.integers(min_value=0, max_value=6))
    specs = draw(st.lists(st.tuples(STATES, st.integers(min_value=0, max_value=version)),
                          max_size=12))
    replicas = [ObservedReplica(f"r{i}", state, v, float(i))
                for i, (state, v) in enumerate(specs)]
    return target, version, replicas


def running(replicas: Sequence[ObservedReplica]) -> int:
    return sum(1 for r in replicas if r.state is S.RUNNING)


def apply(replicas: list[ObservedReplica], actions: Sequence[object], version: int,
          now: float) -> list[ObservedReplica]:
    """Carry out actions: a stopped replica leaves, a started one appears STARTING."""
    stops = stopped(actions)
    assert len(stops) == len(set(stops)), "a replica is stopped twice"
    live = {r.replica_id for r in replicas if r.state in (S.STARTING, S.RUNNING)}
    assert set(stops) <= live, "only live replicas are stopped"
    result = [r for r in replicas if r.replica_id not in stops]
    for i in range(started(actions)):
        result.append(ObservedReplica(f"n{now:g}-{i}", S.STARTING, version, now))
    return result


def promote(replicas: list[ObservedReplica], which: Sequence[bool]) -> list[ObservedReplica]:
    """Some STARTING replicas finish starting (the chosen ones; all when `which` runs out)."""
    flags = iter(which)
    return [ObservedReplica(r.replica_id, S.RUNNING, r.version, r.started_at)
            if r.state is S.STARTING and next(flags, True) else r for r in replicas]


@settings(max_examples=300)
@given(clusters(), st.lists(st.lists(st.booleans(), max_size=8), max_size=6))
def test_converges_to_target_running_replicas_of_the_new_version(
        cluster: tuple[int, int, list[ObservedReplica]], schedule: list[list[bool]]) -> None:
    target, version, replicas = cluster
    # a few rounds where only some replicas finish starting, then all of them do
    rounds = [*schedule, *([[]] * 4)]
    for now, which in enumerate(rounds, start=100):
        before = running(replicas)
        actions = reconcile(target, version, replicas)
        replicas = apply(replicas, actions, version, float(now))
        # capacity is kept: running replicas never drop below the target because of us
        assert running(replicas) >= min(before, target)
        # and the new version always has exactly `target` live replicas after acting
        assert sum(1 for r in replicas
                   if r.version == version and r.state in (S.STARTING, S.RUNNING)) == target
        replicas = promote(replicas, which)
    live = [r for r in replicas if r.state in (S.STARTING, S.RUNNING)]
    assert [r.state for r in live] == [S.RUNNING] * target
    assert all(r.version == version for r in live)
    assert reconcile(target, version, replicas) == []  # a fixed point


@given(clusters())
def test_actions_are_consistent(cluster: tuple[int, int, list[ObservedReplica]]) -> None:
    target, version, replicas = cluster
    actions = reconcile(target, version, replicas)
    starts = [a for a in actions if isinstance(a, StartReplicas)]
    assert len(starts) <= 1
    assert all(a.count > 0 and a.reason for a in starts)
    by_id = {r.replica_id: r for r in replicas}
    for stop in (a for a in actions if isinstance(a, StopReplica)):
        victim = by_id[stop.replica_id]
        assert victim.state in (S.STARTING, S.RUNNING)
        if victim.version == version:
            assert stop.reason == f"scale down to {target}"
        elif victim.state is S.STARTING:
            assert stop.reason == "outdated version, not yet serving"
        else:
            assert stop.reason == "replaced by new version"


# -- standby replicas ----------------------------------------------------------------------


def test_scale_up_activates_standbys_first_and_refills_the_pool() -> None:
    replicas = [ObservedReplica("r1", S.RUNNING, 1, 0.0), ObservedReplica("s1", S.STANDBY, 1, 1.0),
                ObservedReplica("s2", S.STANDBY, 1, 2.0)]
    actions = reconcile(2, 1, replicas, standby=2)
    assert ActivateReplica("s1", "1 of 2 running") in actions
    assert started(actions) == 1  # target 2 + standby 2 = 4 live wanted, 3 there
    assert stopped(actions) == []


def test_activated_standby_is_never_stopped_for_surplus() -> None:
    replicas = [ObservedReplica("r1", S.RUNNING, 1, 0.0), ObservedReplica("s1", S.STANDBY, 1, 1.0),
                ObservedReplica("t1", S.STARTING, 1, 2.0)]
    actions = reconcile(2, 1, replicas, standby=0)
    assert [a.replica_id for a in actions if isinstance(a, ActivateReplica)] == ["s1"]
    assert stopped(actions) == ["t1"]


def test_outdated_standby_stops_at_once() -> None:
    replicas = [ObservedReplica("r1", S.RUNNING, 2, 0.0), ObservedReplica("s1", S.STANDBY, 1, 1.0)]
    actions = reconcile(1, 2, replicas, standby=1)
    assert stopped(actions) == ["s1"]
    assert started(actions) == 1


# -- rollouts (rolling_update_percentage, max_surge_percent) ---------------------------------


def test_rollout_counts_round_up_from_rays_percentages() -> None:
    assert Rollout.of(10, 0.2, 25) == Rollout(batch=2, surge=3)
    assert Rollout.of(4, 0.2, 0) == Rollout(batch=1, surge=0)
    assert Rollout.of(3, None, None) == Rollout()


def test_a_batch_bounds_the_new_replicas_starting_at_once() -> None:
    old = [replica(S.RUNNING, version=1) for _ in range(4)]
    assert started(reconcile(4, 2, old, rollout=Rollout(batch=2))) == 2
    starting = [replica(S.STARTING, version=2) for _ in range(2)]
    assert reconcile(4, 2, old + starting, rollout=Rollout(batch=2)) == []


def test_without_surge_room_an_old_replica_goes_first() -> None:
    old = [replica(S.RUNNING, version=1, started_at=float(i), replica_id=f"o{i}")
           for i in range(4)]
    actions = reconcile(4, 2, old, rollout=Rollout(batch=1, surge=0))
    assert actions == [StopReplica("o0", "making room for the new version")]
    draining = [replica(S.DRAINING, version=1), *old[1:]]  # it left: room for one
    assert reconcile(4, 2, draining, rollout=Rollout(batch=1, surge=0)) == [
        StartReplicas(1, "0 of 4 live")]


def simulate_rollout(target: int, rollout: Rollout, steps: int = 200) -> list[tuple[int, int]]:
    """Apply reconcile's actions as if starts and stops completed one step later;
    (live replicas, RUNNING replicas) after each step, until only version 2 runs."""
    fleet = {f"o{i}": replica(S.RUNNING, 1, float(i), f"o{i}") for i in range(target)}
    history, fresh = [], itertools.count()
    for step in range(steps):
        for key, r in list(fleet.items()):  # last step's starts become RUNNING
            if r.state is S.STARTING:
                fleet[key] = replica(S.RUNNING, r.version, r.started_at, key)
            elif r.state is S.DRAINING:
                del fleet[key]
        for action in reconcile(target, 2, list(fleet.values()), rollout=rollout):
            if isinstance(action, StartReplicas):
                for _ in range(action.count):
                    key = f"n{next(fresh)}"
                    fleet[key] = replica(S.STARTING, 2, 100.0 + step, key)
            elif isinstance(action, StopReplica):
                old = fleet[action.replica_id]
                fleet[action.replica_id] = replica(S.DRAINING, old.version, old.started_at,
                                                   action.replica_id)
        live = [r for r in fleet.values() if r.state in (S.STARTING, S.RUNNING)]
        history.append((len(live), sum(r.state is S.RUNNING for r in live)))
        if all(r.version == 2 and r.state is S.RUNNING for r in fleet.values()) \
                and len(fleet) == target:
            return history
    raise AssertionError(f"the rollout did not finish: {fleet}")


@settings(max_examples=60)
@given(st.integers(1, 12), st.sampled_from([None, 0.1, 0.2, 0.5, 1.0]),
       st.sampled_from([None, 0, 10, 25, 100]))
def test_every_rollout_finishes_within_its_bounds(target: int, percentage: float | None,
                                                  surge: int | None) -> None:
    rollout = Rollout.of(target, percentage, surge)
    history = simulate_rollout(target, rollout)
    if rollout.surge is not None:
        assert max(live for live, _ in history) <= target + rollout.surge
    if rollout.surge is None:  # surge's default: capacity never dips
        assert min(running for _, running in history) >= target
