"""The simulator's accounting: every request ends once, tiny scenarios give exact results.

Tiny scenarios use constant service times, uniform arrivals and 1 ms steps, so each
request's fate can be followed by hand (the docstrings do it). Their controller sees each
tick's load at the tick, decides only on ticks and has its clock at 0 (IDEAL); the
report lag and urgent decisions have tests of their own.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.config import AutoscalingConfig
from surge.policy.autoscaling import AutoscalingContext
from surge.policy.reconcile import StartReplicas
from surge.sim.cluster import ClusterState
from surge.sim.engine import Simulation, history_needed_s
from surge.sim.scenario import Scenario
from surge.sim.sweep import simulate

BASE: dict[str, Any] = {
    "name": "tiny",
    "cluster": {"nodes": 1, "replicas_per_node": 4, "startup_s": 2},
    "service": {"service_time_ms": 10},
    "traffic": {"schedule": [{"rps": 50, "for_s": 1}]},
    "deployment": {"name": "M", "num_replicas": 1, "max_ongoing_requests": 1},
    "control": {"report_interval_s": 0, "urgent_decisions": False, "clock_offset_s": 0},
}


def scenario(**changes: Any) -> Scenario:
    """BASE with dotted-path changes (`traffic.schedule=...`)."""
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = data
        *parents, last = path.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return Scenario.from_mapping(data)


def books(sim: Simulation) -> dict[str, int]:
    totals = dict(sim.flow.totals)
    totals["queued"] = sim.flow.queued
    totals["ongoing"] = sim.flow.ongoing
    return totals


def assert_conserved(sim: Simulation) -> None:
    b = books(sim)
    assert b["arrived"] == (b["completed"] + b["rejected"] + b["timed_out"] + b["queued"]
                            + b["ongoing"]), b
    flow = sim.flow
    assert sum(flow.offered) == b["arrived"]
    assert sum(flow.ok) == b["completed"]
    assert sum(flow.rejected) == b["rejected"]
    assert sum(flow.timeouts_sent) == sum(flow.timeouts_done) == b["timed_out"]
    dispatched = sum(sum(d.values()) for d in flow.delays)
    assert dispatched == b["completed"] + b["ongoing"]


# -- exact results -------------------------------------------------------------------------


def test_under_capacity_every_request_is_served_at_its_service_time() -> None:
    """50 req/s, one replica taking one 10 ms request at a time: nothing waits."""
    run = simulate(scenario())
    s = run.summary
    assert (s["sent"], s["ok"], s["errors"]["503"], s["unanswered"]) == (50, 50, 0, 0)
    assert s["p50_ms"] == s["p99_ms"] == 10.0
    assert s["slo_ok_fraction"] == 1.0
    assert s["replica_seconds"] == 1.0
    assert s["oracle_replica_seconds"] == 1.0  # ceil(50 / 100) replica for 1 s
    assert_conserved(run.simulation)


def test_without_a_queue_every_other_request_is_rejected() -> None:
    """200 req/s (one every 5 ms) on one 10 ms slot, no queue: requests 0, 2, 4, ... find
    the slot just freed (completions come before admission in a step); 1, 3, ... find it
    busy and get a 503."""
    run = simulate(scenario(traffic__schedule=[{"rps": 200, "for_s": 1}],
                            deployment__max_queued_requests=0))
    s = run.summary
    assert (s["sent"], s["ok"], s["errors"]["503"]) == (200, 100, 100)
    assert s["failed_fraction"] == 0.5
    assert s["p99_ms"] == 10.0
    assert_conserved(run.simulation)


def test_a_bounded_queue_fills_then_rejects_and_drains_after_the_schedule() -> None:
    """200 req/s on 100 req/s of capacity with 5 queue slots: the queue gains one request
    per 10 ms, is full after 50 ms, and from then on one arrival in two is rejected.
    After the schedule the 5 queued and 1 running requests finish."""
    run = simulate(scenario(traffic__schedule=[{"rps": 200, "for_s": 1}],
                            deployment__max_queued_requests=5))
    s, sim = run.summary, run.simulation
    assert s["sent"] == 200
    assert s["ok"] + s["errors"]["503"] == 200
    assert s["errors"]["503"] == 200 - 100 - 5  # served in 1 s: 100 (last at 1.0 s) + 5
    assert sim.flow.totals["timed_out"] == 0
    # a queued request waits for the 5 ahead of it: 50 ms, then 10 ms of service
    assert s["pulse"] is None
    assert s["p99_ms"] == 60.0
    assert_conserved(sim)


def test_the_queue_holds_what_drains_within_the_wait_bound() -> None:
    """max_queued_requests unset: behind the one 1 s request the queue holds one (a
    request may wait one service time); the rest are refused at once, none time out."""
    run = simulate(scenario(service__service_time_ms=1000,
                            traffic__schedule=[{"rps": 10, "for_s": 1}]))
    s = run.summary
    assert (s["sent"], s["ok"], s["errors"]["timeout"], s["errors"]["503"]) == (10, 2, 0, 8)


def test_queued_requests_time_out() -> None:
    """One 1 s request holds the only slot; those sent behind it (every 100 ms) give up
    250 ms after they arrived. When the slot frees at 1.0 s the head of the queue is the
    one sent at 0.8 s (FIFO): it is served in 1.2 s; the one sent at 0.9 s times out.
    (The queue bounded by count alone: by time, it would hold one.)"""
    run = simulate(scenario(service__service_time_ms=1000,
                            traffic__schedule=[{"rps": 10, "for_s": 1}],
                            traffic__timeout_s=0.25, deployment__max_queue_wait_s=None))
    s = run.summary
    assert (s["sent"], s["ok"], s["errors"]["timeout"], s["errors"]["503"]) == (10, 2, 8, 0)
    # 1.0 s and 1.2 s, in the report's 11 significant bits of microseconds
    assert (s["p50_ms"], s["p99_ms"]) == (999.936, 1199.104)
    timeouts = run.simulation.flow.timeouts_done
    assert [i for i, n in enumerate(timeouts) if n] == [3, 4, 5, 6, 7, 8, 9, 11]
    assert_conserved(run.simulation)


def test_requests_still_queued_when_the_run_stops_are_counted() -> None:
    sim = Simulation(scenario(service__service_time_ms=1000,
                              traffic__schedule=[{"rps": 10, "for_s": 1}],
                              deployment__max_queue_wait_s=None)).run(until_s=0.55)
    b = books(sim)
    assert (b["arrived"], b["completed"], b["ongoing"], b["queued"]) == (6, 0, 1, 5)
    assert_conserved(sim)


AUTOSCALED = {"min_replicas": 1, "max_replicas": 2, "standby_replicas": 1,
              "target_ongoing_requests": 1, "upscale_delay_s": 0, "downscale_delay_s": 600,
              "policy": {"policy_function": "proactive"}}


def test_a_standby_is_activated_on_the_first_tick_and_replaced() -> None:
    """At t=1 s the rate jumps from 50 to 150 req/s (one replica serves 100). The tick at
    1.1 s sees it: target 2; the standby runs at once and takes traffic 50 ms later; a new
    standby starts, ready 2 s later. Cost: 2 replicas for 3 s, the new one from 1.1 s."""
    run = simulate(scenario(traffic__schedule=[{"rps": 50, "for_s": 1},
                                               {"rps": 150, "for_s": 2}],
                            deployment__num_replicas=None,
                            deployment__autoscaling_config=AUTOSCALED))
    sim = run.simulation
    first = sim.decisions[0]
    assert (first.t, first.previous, first.target) == (1.1, 1, 2)
    assert first.reason.startswith("up: ")
    assert sim.replicas[11].running == 2  # the point 1.1-1.2 s
    assert run.summary["replica_seconds"] == pytest.approx(2 * 3 + (3 - 1.1))
    standby = [r for r in sim.cluster.replicas.values() if r.state.value == "STANDBY"]
    assert len(standby) == 1 and standby[0].created_at == 1.1
    # over capacity from 1.0 to 1.15 s: 100 req/s too many for 150 ms fill the queue
    assert run.summary["errors"]["503"] == 0
    assert_conserved(sim)


def test_replicas_start_after_their_start_up_time_and_placement_is_bounded() -> None:
    """A jump to 10x the capacity: the target goes to max (8) but the node has 4 slots."""
    config = {**AUTOSCALED, "standby_replicas": 0, "max_replicas": 8}
    run = simulate(scenario(traffic__schedule=[{"rps": 50, "for_s": 1},
                                               {"rps": 1000, "for_s": 4}],
                            deployment__num_replicas=None,
                            deployment__autoscaling_config=config))
    sim = run.simulation
    running = {round(sample.t - 0.05, 1): sample.running for sample in sim.replicas}
    assert running[3.0] == 1 and running[3.1] == 4  # asked for at 1.1 s, ready at 3.1 s
    assert max(sample.running for sample in sim.replicas) == 4
    assert sim.cluster.placement_refused > 0
    assert sim.cluster.startup_lead_s == 2.0  # measured, fed to the policy
    assert_conserved(sim)


# -- the production policy, as production calls it ----------------------------------------------

SEEN: list[AutoscalingContext] = []


def fixed_policy(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    SEEN.append(ctx)
    return 3, {"calls": ctx.policy_state.get("calls", 0) + 1}


def test_a_custom_policy_is_resolved_and_called_like_production() -> None:
    SEEN.clear()
    config = {**AUTOSCALED, "standby_replicas": 0, "max_replicas": 4,
              "policy": {"policy_function": f"{__name__}:fixed_policy"}}
    run = simulate(scenario(deployment__num_replicas=None,
                            deployment__autoscaling_config=config))
    assert len(SEEN) == len(run.simulation.replicas)  # once per tick
    assert SEEN[0].current_time == 0.1 and SEEN[0].deployment_name == "M"
    assert SEEN[5].policy_state == {"calls": 5}
    assert run.simulation.decisions[0].reason == "up: custom policy wants 3"


def test_a_failing_policy_keeps_the_target_as_the_controller_does() -> None:
    config = {**AUTOSCALED, "policy": {"policy_function": f"{__name__}:broken_policy"}}
    run = simulate(scenario(deployment__num_replicas=None,
                            deployment__autoscaling_config=config))
    assert run.simulation.counters.policy_errors == len(run.simulation.replicas)
    assert run.simulation.decisions == []


def broken_policy(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    raise RuntimeError("bug")


def test_the_history_kept_is_as_long_as_the_policy_reads() -> None:
    ray = AutoscalingConfig(look_back_period_s=30, metrics_interval_s=10,
                            policy={"policy_function": "ray_default"})
    assert history_needed_s(ray) == 40.5
    assert history_needed_s(AutoscalingConfig(look_back_period_s=2, metrics_interval_s=0.5,
                                              policy={"policy_function": "ray_default"})) == 3.0
    # proactive's slope is fit over up to 10 s when the start-up lead is long
    assert history_needed_s(AutoscalingConfig(look_back_period_s=2,
                                              metrics_interval_s=0.5)) == 10.5
    assert history_needed_s(AutoscalingConfig(look_back_period_s=300)) == 60.0  # the cap


@pytest.mark.parametrize("policy", ["ray_default", "proactive"])
def test_a_shorter_history_decides_exactly_as_the_controllers_minute(policy: str) -> None:
    config = {**AUTOSCALED, "standby_replicas": 0, "max_replicas": 4,
              "metrics_interval_s": 0.5, "look_back_period_s": 2, "downscale_delay_s": 1,
              "policy": {"policy_function": policy}}
    traffic = [{"rps": 50, "for_s": 2}, {"to_rps": 350, "over_s": 0.5},
               {"rps": 350, "for_s": 3}, {"rps": 20, "for_s": 4}]
    s = scenario(deployment__num_replicas=None, deployment__autoscaling_config=config,
                 traffic__schedule=traffic)
    short, full = Simulation(s).run(), Simulation(s, history_s=60.0).run()
    assert short.samples.maxlen is not None and short.samples.maxlen < 600  # buckets of 0.1 s
    assert short.decisions == full.decisions
    assert books(short) == books(full)
    assert len(short.decisions) >= 2


def test_poisson_arrivals_follow_the_seed() -> None:
    def arrived(seed: int) -> int:
        sim = Simulation(scenario(traffic__arrivals="poisson", seed=seed)).run()
        assert_conserved(sim)
        return sim.flow.totals["arrived"]

    assert arrived(1) == arrived(1)
    assert len({arrived(seed) for seed in range(5)}) > 1


def test_an_overloaded_autoscaled_run_balances_its_books() -> None:
    config = {**AUTOSCALED, "max_replicas": 4, "standby_replicas": 1}
    s = scenario(traffic__schedule=[{"rps": 50, "for_s": 1}, {"to_rps": 900, "over_s": 0.3},
                                    {"rps": 900, "for_s": 3}],
                 traffic__arrivals="poisson", traffic__timeout_s=0.5,
                 service__service_time_ms={"distribution": "lognormal", "mean": 10,
                                           "p99": 30},
                 cluster__startup_s={"distribution": "uniform", "low": 0.5, "high": 1.5},
                 deployment__num_replicas=None, deployment__max_queued_requests=50,
                 deployment__autoscaling_config=config)
    run = simulate(s)
    b = books(run.simulation)
    assert b["rejected"] > 0 and b["completed"] > 0
    assert_conserved(run.simulation)
    summary = run.summary
    assert summary["ok"] + sum(summary["errors"].values()) + summary["unanswered"] == \
        summary["sent"]


def test_an_urgent_report_brings_the_decision_forward() -> None:
    """With urgent decisions (the controller's default) the queue that starts to grow at
    the jump is reported within 5 ms and decided on at once, not at the 1.1 s tick.
    Without a standby: with one ready the policy looks only its 50 ms activation ahead,
    and the ramp's first 11 ms do not ask for a second replica yet."""
    cold = {**AUTOSCALED, "standby_replicas": 0}
    s = scenario(traffic__schedule=[{"rps": 50, "for_s": 1}, {"rps": 150, "for_s": 2}],
                 deployment__num_replicas=None, deployment__autoscaling_config=cold,
                 control__urgent_decisions=True)
    sim = Simulation(s).run()
    first = sim.decisions[0]
    assert 1.0 < first.t < 1.02 and (first.previous, first.target) == (1, 2)
    assert sim.counters.urgent_decisions >= 1
    assert_conserved(sim)


def test_reports_deliver_half_a_tick_late_on_average() -> None:
    """With 0.1 s reports a tick's sample holds half of its own load, half the tick's
    before: a jump shows in two steps."""
    s = scenario(traffic__schedule=[{"rps": 50, "for_s": 1}, {"rps": 90, "for_s": 1}],
                 deployment__num_replicas=None, deployment__autoscaling_config=AUTOSCALED,
                 control__report_interval_s=0.1, control__clock_offset_s=100)
    sim = Simulation(s).run(until_s=1.4)
    arrivals = {round(x.t - 100, 1): x.arrivals for x in sim.samples}
    assert [arrivals[t] for t in (1.0, 1.1, 1.2, 1.3)] == [5.0, 7.0, 9.0, 9.0]


def test_batching_caps_a_replica_at_batch_size_over_batch_time() -> None:
    """Batches of up to 4 taking 10 ms + 2 ms per extra request: 4 / 16 ms = 250 req/s;
    offered 400 req/s, one replica serves 250 of them, the rest wait or are rejected."""
    s = scenario(deployment__max_ongoing_requests=4, deployment__max_queued_requests=20,
                 service__batching={"max_batch_size": 4, "per_item_ms": 2},
                 traffic__schedule=[{"rps": 400, "for_s": 2}])
    assert s.per_replica_rps == 250
    run = simulate(s)
    served_per_s = sum(run.simulation.flow.ok[5:15])  # 0.5 .. 1.5 s, in saturation
    assert served_per_s == pytest.approx(250, abs=3)
    assert run.summary["errors"]["503"] == pytest.approx(2 * 400 - 2 * 250 - 20, abs=5)
    assert_conserved(run.simulation)


@settings(max_examples=25, deadline=None)
@given(rates=st.lists(st.integers(0, 2000), min_size=1, max_size=3),
       service_ms=st.sampled_from([2, 10, 50]), max_ongoing=st.integers(1, 4),
       queue=st.integers(0, 50), timeout_s=st.sampled_from([0.05, 0.5]),
       poisson=st.booleans(), autoscale=st.booleans(), until=st.sampled_from([None, 1.3]))
def test_every_request_ends_exactly_once(rates: list[int], service_ms: int, max_ongoing: int,
                                         queue: int, timeout_s: float, poisson: bool,
                                         autoscale: bool, until: float | None) -> None:
    """arrived == served + rejected + timed out + still queued + still running, always."""
    changes: dict[str, Any] = {
        "traffic__schedule": [{"rps": r, "for_s": 0.7} for r in rates],
        "traffic__timeout_s": timeout_s, "traffic__arrivals": "poisson" if poisson else "uniform",
        "service__service_time_ms": {"distribution": "exponential", "mean": service_ms},
        "deployment__max_ongoing_requests": max_ongoing,
        "deployment__max_queued_requests": queue,
        "cluster__startup_s": {"distribution": "uniform", "low": 0.1, "high": 0.4},
        "control__urgent_decisions": True, "control__report_interval_s": 0.1}
    if autoscale:
        changes.update(deployment__num_replicas=None, deployment__autoscaling_config={
            **AUTOSCALED, "max_replicas": 4})
    sim = Simulation(scenario(**changes)).run(until_s=until)
    assert_conserved(sim)
    if until is None:
        assert sim.flow.queued == sim.flow.ongoing == 0


def test_a_replica_set_fan_out_delays_when_a_ready_replica_takes_traffic() -> None:
    """A replica started at t=1 with a 2 s start-up is RUNNING at 3 s, and routable at
    once, or (control.fanout_s) once its replica set reached the routers."""
    def routable_at(fanout_s: float) -> list[int]:
        spec = scenario(**{"control__fanout_s": fanout_s})
        assert spec.control.fanout_s == fanout_s
        cluster = ClusterState(spec.cluster, random.Random(0), fanout_s=spec.control.fanout_s)
        cluster.apply([StartReplicas(1, "up")], 1.0)
        seen = []
        for t in (2.9, 3.0, 3.2, 3.3):
            cluster.advance(t, 1, 0)
            seen.append(cluster.routable)
        assert cluster.running == 1
        return seen

    assert routable_at(0.0) == [0, 1, 1, 1]
    assert routable_at(0.25) == [0, 0, 0, 1]
