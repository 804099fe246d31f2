"""Scenario files: validation with errors naming file and field, overrides, traffic."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from surge.loadtest.schedule import Schedule, Segment
from surge.sim.distributions import parse_distribution
from surge.sim.scenario import ScenarioError, apply_overrides, load_scenario, resolve_key
from surge.sim.traffic import TrafficShape, oracle_replica_seconds, parse_schedule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"
REFERENCE = EXAMPLES / "pulse-1m-qps.yaml"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_scenarios_load(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.traffic.schedule.duration_s > 0
    for name in scenario.variants:
        scenario.with_overrides(scenario.variants[name])


def test_the_reference_scenario_is_the_issues() -> None:
    s = load_scenario(REFERENCE)
    assert (s.cluster.replica_slots, s.cluster.startup_s.mean) == (512, 20.0)
    assert s.per_replica_rps == pytest.approx(2000)
    assert s.service.time_s.quantile(0.99) == pytest.approx(0.015)
    assert s.traffic.schedule.total == pytest.approx(1.83e9, rel=0.001)
    config = s.autoscaling
    assert config is not None
    assert (config.min_replicas, config.max_replicas, config.target_ongoing_requests,
            config.upscale_delay_s, config.upscaling_factor) == (64, 512, 5, 0, 2)
    assert s.start_time_s == 23 * 3600 + 50 * 60 and s.slo_ms == 200


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    measured = EXAMPLES / "control-512.json"  # the reference reads it beside itself
    (tmp_path / measured.name).write_text(measured.read_text())
    return path


def reference_with(tmp_path: Path, path: str, value: Any) -> Path:
    data = yaml.safe_load(REFERENCE.read_text())
    return write(tmp_path, apply_overrides(data, {path: value}))


@pytest.mark.parametrize(("path", "value", "message"), [
    ("cluster.nodes", 0, r"scenario.yaml.cluster.nodes must be an integer >= 1, got 0"),
    ("cluster.gpus", 8, r"scenario.yaml.cluster: unknown key 'gpus'"),
    ("cluster.replica_per_node", 8, r"Did you mean 'replicas_per_node'\?"),
    ("cluster.startup_s", {"distribution": "gamma"},
     r"cluster.startup_s.distribution must be one of constant, exponential, uniform, lognormal"),
    ("service.service_time_ms", {"distribution": "lognormal", "mean": 5, "p99": 4},
     r"service.service_time_ms: no lognormal has mean 5 and p99 4"),
    ("traffic.schedule", {"baseline_rps": 5}, r"traffic.schedule: a pulse needs peak_rps"),
    ("traffic.arrivals", "bursty", r"traffic.arrivals must be one of uniform, poisson"),
    ("deployment.max_ongoing_requests", 0, r"deployment: max_ongoing_requests must be an "
                                           r"integer >= 1"),
    ("deployment.autoscaling_config.min_replica", 3,
     r"deployment.autoscaling_config: unknown key 'min_replica'"),
    ("deployment.autoscaling_config.policy.policy_function", "nope",
     r"scenario.yaml.deployment.autoscaling_config.policy: autoscaling policy 'nope' is "
     r"neither a built-in"),
    ("deployment.autoscaling_config.policy.policy_kwargs", {"llm_spread_sd": -1},
     r"scenario.yaml.*deployment.autoscaling_config.policy: policy_kwargs of the proactive "
     r"policy: llm_spread_sd must be a number >= 0, got -1"),
    ("variants.broken", {"min_replicas": 1000},
     r"variant 'broken'.*min_replicas \(1000\) must be <= max_replicas"),
    ("start_time", "25:00", r"start_time '25:00' is not a time of day"),
    ("slo_ms", 0, r"scenario.yaml.slo_ms must be a number > 0, got 0"),
])
def test_errors_name_the_file_and_the_field(tmp_path: Path, path: str, value: Any,
                                            message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        load_scenario(reference_with(tmp_path, path, value))


def test_missing_sections_say_what_they_hold(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"cluster.startup_s is missing"):
        load_scenario(reference_with(tmp_path, "cluster", {"nodes": 1,
                                                           "replicas_per_node": 1}))
    data = yaml.safe_load(REFERENCE.read_text())
    with pytest.raises(ScenarioError, match=r"unknown key 'slo'. Did you mean 'slo_ms'\?"):
        load_scenario(write(tmp_path, {**data, "slo": 200}))
    with pytest.raises(ScenarioError, match=r"scenario.yaml: a scenario is a mapping"):
        load_scenario(write(tmp_path, [1, 2]))
    with pytest.raises(ScenarioError, match=r"cannot read the scenario"):
        load_scenario(tmp_path / "absent.yaml")


def test_overrides_by_alias_and_dotted_path() -> None:
    assert resolve_key("min_replicas") == "deployment.autoscaling_config.min_replicas"
    assert resolve_key("policy") == "deployment.autoscaling_config.policy.policy_function"
    assert resolve_key("startup_s") == "cluster.startup_s"
    assert resolve_key("schedule") == "deployment.autoscaling_config.schedule"
    assert resolve_key("traffic.schedule") == "traffic.schedule"
    with pytest.raises(ScenarioError, match=r"Did you mean 'min_replicas'\?"):
        resolve_key("min_replica")
    data = {"deployment": {"autoscaling_config": {"min_replicas": 1}}}
    changed = apply_overrides(data, {"min_replicas": 5, "policy": "proactive",
                                     "cluster.nodes": 2})
    assert changed == {"deployment": {"autoscaling_config": {
        "min_replicas": 5, "policy": {"policy_function": "proactive"}}},
        "cluster": {"nodes": 2}}
    assert data == {"deployment": {"autoscaling_config": {"min_replicas": 1}}}
    with pytest.raises(ScenarioError, match=r"deployment.autoscaling_config.min_replicas is "
                                            r"not a mapping"):
        apply_overrides(data, {"deployment.autoscaling_config.min_replicas.x": 1})


def test_a_variant_overrides_the_base() -> None:
    scenario = load_scenario(REFERENCE)
    floor = scenario.with_overrides(scenario.variants["floor-23:58"])
    assert floor.autoscaling is not None
    assert floor.autoscaling.schedule_windows[0].min_replicas == 512
    assert floor.autoscaling.policy == {"policy_function": "proactive"}


# -- distributions ------------------------------------------------------------------------------


def test_lognormal_from_mean_and_p99() -> None:
    d = parse_distribution({"distribution": "lognormal", "mean": 5, "p99": 15}, "x")
    assert d.mean == pytest.approx(5)
    assert d.quantile(0.99) == pytest.approx(15)
    assert d.cdf(15) == pytest.approx(0.99)
    values, probs = d.points()
    assert sum(probs) == pytest.approx(1)
    assert sum(v * p for v, p in zip(values, probs, strict=True)) == pytest.approx(5, rel=0.01)
    rng = random.Random(1)
    samples = [d.sample(rng) for _ in range(20000)]
    assert sum(samples) / len(samples) == pytest.approx(5, rel=0.03)
    assert d.scaled(0.001).mean == pytest.approx(0.005)


@pytest.mark.parametrize(("spec", "mean", "p50"), [
    (3, 3.0, 3.0),
    ({"distribution": "constant", "value": 2}, 2.0, 2.0),
    ({"distribution": "exponential", "mean": 2}, 2.0, 2 * math.log(2)),
    ({"distribution": "uniform", "low": 1, "high": 3}, 2.0, 2.0),
    ({"distribution": "lognormal", "median": 4, "sigma": 0.5}, 4 * math.exp(0.125), 4.0),
])
def test_distribution_kinds(spec: Any, mean: float, p50: float) -> None:
    d = parse_distribution(spec, "x")
    assert d.mean == pytest.approx(mean)
    assert d.quantile(0.5) == pytest.approx(p50)
    assert d.cdf(d.quantile(0.3)) == pytest.approx(0.3 if d.kind != "constant" else 1.0)


@pytest.mark.parametrize(("spec", "message"), [
    ("fast", r"x must be a number or a mapping"),
    ({"distribution": "uniform", "low": 3, "high": 1}, r"x: uniform high \(1\) is below low"),
    ({"distribution": "exponential", "rate": 1}, r"x: a exponential distribution takes mean"),
    ({"distribution": "lognormal", "mean": 1}, r"x: a lognormal takes \{mean, p99\}"),
    ({"distribution": "exponential", "mean": -1}, r"x\.mean must be a number > 0, got -1\."),
])
def test_bad_distributions(spec: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_distribution(spec, "x")


# -- traffic ------------------------------------------------------------------------------------


def test_a_diurnal_day_is_linear_pieces_of_a_cosine() -> None:
    schedule = parse_schedule({"diurnal": {"min_rps": 100, "max_rps": 300, "period_s": 400,
                                           "step_s": 100}}, "traffic.schedule")
    assert [s.start_rps for s in schedule.segments] == pytest.approx([100, 200, 300, 200])
    assert schedule.duration_s == 400
    assert schedule.total == pytest.approx(200 * 400)


def test_a_trace_replays_from_csv(tmp_path: Path) -> None:
    (tmp_path / "rates.csv").write_text("t_s,rps\n5,100\n10,300\n20,300\n")
    schedule = parse_schedule({"trace": "rates.csv"}, "traffic.schedule", tmp_path)
    assert [(s.duration_s, s.start_rps, s.end_rps) for s in schedule.segments] == [
        (5, 0, 0), (5, 100, 300), (10, 300, 300)]
    steps = parse_schedule({"trace": "rates.csv", "interpolate": "step"}, "t", tmp_path)
    assert steps.segments[1].end_rps == 100
    (tmp_path / "bad.csv").write_text("0,1\n0,2\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: times must increase"):
        parse_schedule({"trace": "bad.csv"}, "t", tmp_path)
    with pytest.raises(ValueError, match=r"t.trace: cannot read"):
        parse_schedule({"trace": "absent.csv"}, "t", tmp_path)


def test_the_oracle_integrates_ceil_of_demand_exactly() -> None:
    flat = Schedule((Segment(10, 250, 250),))
    assert oracle_replica_seconds(flat, 100) == 30  # 3 replicas for 10 s
    ramp = Schedule((Segment(4, 0, 400),))  # 1 s each at 1, 2, 3, 4 replicas
    assert oracle_replica_seconds(ramp, 100) == pytest.approx(10)
    assert oracle_replica_seconds(ramp, 100, until_s=2) == pytest.approx(3)


def test_the_highest_rate_in_an_interval_sees_a_jump_inside_it() -> None:
    shape = TrafficShape(Schedule((Segment(1, 10, 10), Segment(0, 10, 500),
                                   Segment(1, 500, 500))))
    assert shape.max_rate(0.0, 0.9) == 10
    assert shape.max_rate(0.95, 1.05) == 500


def test_measured_control_figures_are_read_with_where_they_came_from(tmp_path: Path) -> None:
    (tmp_path / "control.json").write_text(
        '{"written_by": "bench/control_scale.py", "replicas": 512, "routers": 64, '
        '"date": "2026-12-01", "runs": 3, "decision_s": 0.012, "fanout_s": 0.02}')
    data = yaml.safe_load(REFERENCE.read_text())
    data["control"] = {"measured": "control.json"}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    control = load_scenario(tmp_path / "s.yaml").control
    assert (control.decision_s, control.fanout_s) == (0.012, 0.02)
    assert control.source.startswith("measured by bench/control_scale.py at 512 replicas "
                                     "x 64 routers (2026-12-01, median of 3 runs")
    data["control"] = {"measured": "control.json", "fanout_s": 0.5}  # a key wins
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    control = load_scenario(tmp_path / "s.yaml").control
    assert (control.decision_s, control.fanout_s) == (0.012, 0.5)
    assert control.source.startswith("given in the scenario (fanout_s); otherwise measured")
    data["control"] = {"measured": "missing.json"}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ScenarioError, match=r"control\.measured: cannot read"):
        load_scenario(tmp_path / "s.yaml")
    del data["control"]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    assert load_scenario(tmp_path / "s.yaml").control.source.startswith("assumed")
