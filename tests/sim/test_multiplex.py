"""Simulated multiplexing: whole runs of small scenarios with fixed seeds.

Four replicas of `max_ongoing_requests` 4 and 10 ms requests (400 req/s each while
models stay resident), 8 models by Zipf(1.1), 200 ms loads, 3 models per replica; the
properties hold for both routers and both replica sides unless a test says otherwise.
"""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from typing import Any

import pytest

from surge.sim.engine import Simulation
from surge.sim.mux_flow import MuxFlow
from surge.sim.report import report_text
from surge.sim.scenario import Scenario, ScenarioError
from surge.sim.sweep import Run, simulate, sweep_table

BASE: dict[str, Any] = {
    "name": "mux", "seed": 2,
    "cluster": {"nodes": 1, "replicas_per_node": 4, "startup_s": 1},
    "service": {"service_time_ms": 10},
    "traffic": {"arrivals": "poisson", "schedule": [{"rps": 100, "for_s": 10}]},
    "deployment": {"name": "M", "num_replicas": 4, "max_ongoing_requests": 4},
    "multiplex": {"models": 8, "popularity": {"distribution": "zipf", "s": 1.1},
                  "load_time_s": 0.2, "max_num_models_per_replica": 3},
}
MODES = [{"routing": "surge"}, {"routing": "ray", "loads": "serial"},
         {"routing": "surge", "loads": "serial"}, {"routing": "ray"}]
MODE_IDS = ["surge", "ray", "surge-serial", "ray-concurrent"]
# 80% of 400 req/s on one model: 320 req/s where one replica serves 2 / 10 ms = 200.
HOT = {"multiplex.models": 6, "multiplex.popularity": [80, 5, 5, 4, 3, 3],
       "deployment.max_ongoing_requests": 2,
       "traffic.schedule": [{"rps": 20, "for_s": 3}, {"rps": 400, "for_s": 10}]}


def scenario(changes: dict[str, Any] | None = None, **mux: Any) -> Scenario:
    """BASE with dotted-path `changes` and `multiplex` keys."""
    data = copy.deepcopy(BASE)
    for path, value in {**(changes or {}), **{f"multiplex.{k}": v for k, v in mux.items()}
                        }.items():
        node = data
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return Scenario.from_mapping(data)


def flow_of(run: Run) -> MuxFlow:
    flow = run.simulation.mux
    assert flow is not None
    return flow


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_every_request_is_accounted_for(mode: dict[str, Any]) -> None:
    run = simulate(scenario(**mode))
    flow, s = flow_of(run), run.summary
    t = flow.totals
    assert t["arrived"] == s["sent"] > 900
    assert t["arrived"] == t["completed"] + t["rejected"] + t["timed_out"] + flow.queued \
        + flow.ongoing
    assert flow.queued == flow.ongoing == 0  # the run ends when every request has
    m = s["multiplex"]
    assert m["hits"] + m["waited_on_load"] == m["dispatched"] == t["completed"]
    assert sum(sum(h.values()) for h in flow.latency) == t["completed"] == s["ok"]
    assert m["loads"] == len(flow.stats.spans) == sum(r.loads for r in flow.by_id.values())
    assert all(r.in_flight == 0 for r in flow.by_id.values())


def test_a_seed_gives_one_run() -> None:
    first, second = simulate(scenario()), simulate(scenario())
    assert first.summary == second.summary
    other = simulate(scenario({"seed": 3}))
    assert other.summary["multiplex"] != first.summary["multiplex"]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("per_replica", [-1, 8])
def test_with_room_for_every_model_every_request_hits_after_warm_up(
        mode: dict[str, Any], per_replica: int) -> None:
    run = simulate(scenario(max_num_models_per_replica=per_replica, **mode))
    stats = flow_of(run).stats
    assert sum(stats.waited[:30]) > 0  # the first requests of each model wait
    assert sum(stats.waited[30:]) == 0 and sum(stats.loads[30:]) == 0
    assert sum(stats.hits[30:]) > 600


def _overlap(spans: list[Any]) -> bool:
    spans = sorted(spans, key=lambda s: s.start)
    return any(b.start < a.end - 1e-12 for a, b in itertools.pairwise(spans))


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_loads_of_one_model_on_one_replica_never_overlap(mode: dict[str, Any]) -> None:
    """Many models, two places per replica: loads and evictions all the time."""
    run = simulate(scenario(models=20, max_num_models_per_replica=2, **mode))
    by_model: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for span in flow_of(run).stats.spans:
        by_model[span.replica_id, span.model].append(span)
    assert sum(len(s) for s in by_model.values()) > 100
    assert not any(_overlap(spans) for spans in by_model.values())


@pytest.mark.parametrize(("loads", "serialised"), [("serial", True), ("concurrent", False)])
def test_ray_replicas_load_one_model_at_a_time_surge_ones_several(loads: str,
                                                                  serialised: bool) -> None:
    run = simulate(scenario(models=20, max_num_models_per_replica=2, loads=loads))
    by_replica: dict[str, list[Any]] = defaultdict(list)
    for span in flow_of(run).stats.spans:
        by_replica[span.replica_id].append(span)
    assert any(_overlap(spans) for spans in by_replica.values()) is not serialised


def test_a_replica_holds_at_most_its_models_loaded_or_loading() -> None:
    sim = Simulation(scenario(models=20, max_num_models_per_replica=2))
    sim.run(until_s=3.0)
    flow = sim.mux
    assert flow is not None
    for replica in flow.replicas:
        assert len(replica.models) + replica.active_loads <= 2


def test_surge_spreads_a_model_one_replica_cannot_carry_to_two_replicas() -> None:
    """The hot model needs 1.6 replicas: with max_replicas_per_model 2 (the default) it is
    on two for nearly the whole run and everything is served within 100 ms."""
    run = simulate(scenario(HOT))
    hot = run.summary["multiplex"]["top_models"][0]
    assert (hot["model"], hot["replicas_max"]) == ("m0", 2)
    assert hot["share_on_2_or_more"] > 0.9
    assert run.summary["failed_fraction"] == 0.0 and run.summary["p99_ms"] < 100


def test_pinned_to_one_replica_the_hot_model_queues() -> None:
    """One copy and no fallback, as a hot model pinned to its replica: it queues."""
    run = simulate(scenario(HOT, max_replicas_per_model=1, matching_timeout_s=None))
    hot = run.summary["multiplex"]["top_models"][0]
    assert hot["replicas_max"] == 1
    assert run.summary["p99_ms"] > 1000


@pytest.mark.parametrize("mode", [{"routing": "ray", "loads": "serial"},
                                  {"routing": "surge", "max_replicas_per_model": 0}],
                         ids=["ray", "surge-unbounded"])
def test_unbounded_spreading_puts_the_hot_model_everywhere_and_thrashes(
        mode: dict[str, Any]) -> None:
    """Ray's retry goes to the replicas with the fewest models: with every cache full
    that is every replica, so the hot model spreads to all four, evicting the others'
    models, as surge's policy does without a bound on copies."""
    bounded = simulate(scenario(HOT)).summary["multiplex"]
    run = simulate(scenario(HOT, **mode))
    m = run.summary["multiplex"]
    assert m["top_models"][0]["replicas_max"] == 4
    assert m["top_models"][0]["replicas_mean"] > 3
    assert m["hit_rate"] < bounded["hit_rate"] - 0.05
    assert m["loads"] > 5 * bounded["loads"]


def test_new_replicas_start_empty_and_take_models() -> None:
    autoscaled = {"deployment.num_replicas": None,
                  "deployment.autoscaling_config": {
                      "min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1,
                      "upscale_delay_s": 0, "policy": {"policy_function": "proactive"}},
                  "traffic.schedule": [{"rps": 20, "for_s": 2}, {"rps": 300, "for_s": 6}]}
    run = simulate(scenario(autoscaled))
    flow = flow_of(run)
    assert len(flow.by_id) == 4 and run.summary["max_replicas"] == 4
    assert all(r.loads > 0 for r in flow.by_id.values())
    t = flow.totals
    assert t["arrived"] == t["completed"] + t["rejected"] + t["timed_out"]


def test_the_report_carries_the_multiplexing_figures() -> None:
    run = simulate(scenario())
    m = run.summary["multiplex"]
    assert (m["routing"], m["loads_mode"], m["models"], m["popularity"]) == (
        "surge", "concurrent", 8, "zipf(1.1)")
    assert 0 < m["hit_rate"] < 1 and m["waited_fraction"] == pytest.approx(1 - m["hit_rate"],
                                                                          abs=1e-4)
    assert m["loads_per_min"] == pytest.approx(m["loads"] / (run.simulation.end_s / 60), 0.01)
    # joined a load under way (< 200 ms), started one, or waited for room (> 200 ms)
    assert m["load_wait_p50_ms"] < 200 < m["load_wait_p99_ms"]
    assert [t["model"] for t in m["top_models"]] == ["m0", "m1", "m2"]
    point = run.report["series"][50]
    assert {"hits", "load_waits", "loads", "top_replicas"} <= set(point)
    assert sum(p["hits"] for p in run.report["series"]) == m["hits"]
    text = report_text(run.report)
    assert "cache hit rate" in text and "replicas holding top-3" in text


def test_a_sweep_of_routings_has_a_multiplexing_table() -> None:
    runs = [simulate(scenario(), label="surge"),
            simulate(scenario(routing="ray", loads="serial"), label="ray")]
    table = sweep_table(runs)
    assert "| run | routing | hit rate |" in table
    assert "| surge | surge, concurrent loads |" in table
    assert "| ray | ray, serial loads |" in table


@pytest.mark.parametrize(("change", "message"), [
    ({"multiplex.modles": 3}, r"multiplex: unknown key 'modles'. Did you mean 'models'\?"),
    ({"multiplex.models": 0}, r"multiplex.models must be an integer >= 1, got 0"),
    ({"multiplex.max_num_models_per_replica": 0},
     r"max_num_models_per_replica must be a positive integer or -1"),
    ({"multiplex.routing": "random"}, r"multiplex.routing must be one of surge, ray"),
    ({"multiplex.popularity": {"distribution": "zipf"}}, r"multiplex.popularity must be"),
    ({"multiplex.popularity": [1, 2]}, r"needs 8 numbers >= 0"),
    ({"multiplex.load_time_s": {"distribution": "gamma"}}, r"multiplex.load_time_s"),
    ({"multiplex.routing": "ray", "multiplex.matching_timeout_s": None},
     r"Ray's routing always has one"),
    ({"service.batching": {"max_batch_size": 4}}, r"multiplex with service.batching"),
])
def test_a_bad_multiplex_section_names_its_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario(change)


def test_multiplexing_keys_have_short_aliases() -> None:
    varied = scenario().with_overrides({"routing": "ray", "max_num_models_per_replica": 5,
                                        "loads": "serial"})
    assert varied.multiplex is not None
    assert (varied.multiplex.routing, varied.multiplex.capacity,
            varied.multiplex.loads) == ("ray", 5, "serial")
