"""Runs of a scenario: one (`simulate`), or a sweep over settings side by side.

`--sweep key=v1,v2,...` is one axis; several axes run their cartesian product. A key is
a dotted path or alias (see sim/scenario_keys.py), or `variant` (the scenario's named sets
of overrides); values are YAML scalars (`null`, `0.5`, `proactive`). Each run becomes
one row: its settings, the fraction of requests within the SLO, the failed fraction,
time to capacity, the pulse's p99, replica-seconds and their ratio to the oracle's;
multiplexed runs get a second table: hit rate, loads, p50/p99, the hot models' copies.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from surge.clock import Clock, SystemClock
from surge.config import AutoscalingConfig
from surge.sim.engine import Simulation
from surge.sim.mux_report import mux_sweep_table
from surge.sim.report import build_report, write_sim_report
from surge.sim.scenario import Scenario, ScenarioError, load_scenario
from surge.sim.scenario_keys import resolve_key

__all__ = ["Run", "SweepAxis", "describe", "parse_sweep", "plan_runs", "run_sweep",
           "simulate", "sweep_table", "variant_overrides"]


@dataclass(frozen=True)
class Run:
    """One simulated run: its label, the overrides that made it, and its report."""

    label: str
    overrides: Mapping[str, Any]
    scenario: Scenario
    report: dict[str, Any]
    simulation: Simulation = field(repr=False)

    @property
    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = self.report["summary"]
        return summary


def simulate(scenario: Scenario | str | Path, overrides: Mapping[str, Any] | None = None,
             label: str = "", clock: Clock | None = None) -> Run:
    """Run a scenario (a file or a loaded one), with overrides, and build its report."""
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    overrides = dict(overrides or {})
    variant = overrides.pop("variant", None)
    if variant is not None:
        overrides = {**variant_overrides(scenario, str(variant)), **overrides}
    if overrides:
        scenario = scenario.with_overrides(overrides)
    clock = clock or SystemClock()
    started = clock.monotonic()
    simulation = Simulation(scenario).run()
    wall = clock.monotonic() - started
    report = build_report(simulation, label or scenario.name, wall)
    return Run(label or scenario.name, overrides, scenario, report, simulation)


def variant_overrides(scenario: Scenario, name: str) -> dict[str, Any]:
    """The overrides a scenario's variant `name` stands for."""
    if name not in scenario.variants:
        raise ScenarioError(f"{scenario.source}: no variant {name!r}; the scenario has "
                            f"{', '.join(scenario.variants) or 'none'}")
    return dict(scenario.variants[name])


@dataclass(frozen=True)
class SweepAxis:
    key: str
    values: tuple[Any, ...]


def parse_sweep(texts: Sequence[str]) -> list[SweepAxis]:
    """`key=v1,v2,...` each; values as YAML scalars."""
    axes: list[SweepAxis] = []
    for text in texts:
        key, sep, values = text.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ScenarioError(f"--sweep {text!r}: expected key=v1,v2,... (e.g. "
                                "policy=ray_default,proactive)")
        if key != "variant":
            resolve_key(key)  # unknown keys fail before any run
        parsed = tuple(yaml.safe_load(v) if v.strip() else None for v in values.split(","))
        if key in {axis.key for axis in axes}:
            raise ScenarioError(f"--sweep {key} is given twice")
        axes.append(SweepAxis(key, parsed))
    return axes


def plan_runs(axes: Sequence[SweepAxis]) -> list[tuple[str, dict[str, Any]]]:
    """(label, overrides) for every combination, in the order given."""
    if not axes:
        return [("", {})]
    plans = []
    for combination in itertools.product(*(axis.values for axis in axes)):
        overrides = {axis.key: value for axis, value in zip(axes, combination, strict=True)}
        label = " ".join(str(v) if k == "variant" else f"{k}={v}" for k, v in overrides.items())
        plans.append((label, overrides))
    return plans


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+=-]+", "_", label).strip("_") or "run"


def run_sweep(scenario: Scenario, axes: Sequence[SweepAxis], out_dir: Path | None = None,
              html: bool = True, progress: Callable[[Run], None] | None = None,
              clock: Clock | None = None) -> list[Run]:
    """Every planned run, each report written under out_dir/<label>/ when given."""
    runs = []
    for label, overrides in plan_runs(axes):
        run = simulate(scenario, overrides, label or scenario.name, clock)
        if out_dir is not None:
            target = out_dir / _slug(run.label) if len(axes) else out_dir
            if html:
                write_sim_report(run.report, target)
            else:
                target.mkdir(parents=True, exist_ok=True)
                (target / "report.json").write_text(json.dumps(run.report, indent=1) + "\n")
        if progress is not None:
            progress(run)
        runs.append(run)
    if out_dir is not None and axes:
        (out_dir / "sweep.md").write_text(sweep_table(runs) + "\n")
        (out_dir / "sweep.json").write_text(json.dumps(
            [{"run": r.label, "overrides": r.overrides, "settings": describe(r.scenario),
              **_row(r)} for r in runs], indent=1) + "\n")
    return runs


# -- the table -------------------------------------------------------------------------------


def describe(scenario: Scenario) -> str:
    """Policy and the settings that tell runs apart, in a few words."""
    config = scenario.autoscaling
    mux = scenario.multiplex
    models = "" if mux is None else (
        f", {mux.routing} routing, {mux.loads} loads, "
        f"{mux.max_num_models_per_replica if mux.capacity else 'unlimited'} models/replica")
    weights = scenario.cluster.weights
    if weights is not None:
        split = f"start {weights.process_start_s.mean:g}s + weights {weights.weight_load_s.mean:g}s"
        if weights.store:
            split += f", store (then {weights.store_load_s.mean:g}s)"
        models = f", {split}{models}"
    if config is None:
        return f"{scenario.deployment.num_replicas} fixed replicas{models}"
    spec = config.policy or {}
    function = spec.get("policy_function") or "proactive"
    name = function if isinstance(function, str) else getattr(function, "__name__", "custom")
    parts = [name, f"min {config.min_replicas}"]
    if config.standby_replicas:
        parts.append(f"+{config.standby_replicas} standby")
    for window in config.schedule_windows:
        start = f"{window.start_s // 3600:02d}:{window.start_s % 3600 // 60:02d}"
        floors = [f"min {window.min_replicas}" if window.min_replicas else "",
                  f"standby {window.standby_replicas}" if window.standby_replicas else ""]
        parts.append(f"floor {' '.join(f for f in floors if f)} from {start}")
    if name != "proactive":
        parts.append(_ray_settings(config))
    return ", ".join(parts) + models


def _ray_settings(config: AutoscalingConfig) -> str:
    factor = config.upscaling_factor or config.upscale_smoothing_factor or \
        config.smoothing_factor
    return (f"delay {config.upscale_delay_s:g}s, metrics {config.metrics_interval_s:g}s/"
            f"{config.look_back_period_s:g}s, x{factor:g}")


def _row(run: Run) -> dict[str, Any]:
    s = run.summary
    pulse = s.get("pulse") or {}
    row = {"slo_ok_fraction": s["slo_ok_fraction"], "failed_fraction": s["failed_fraction"],
           "time_to_capacity_s": s["time_to_capacity_s"], "p99_pulse_ms": pulse.get("p99_ms"),
           "replica_seconds": s["replica_seconds"], "oracle_ratio": s["oracle_ratio"],
           "max_replicas": s["max_replicas"], "wall_s": run.report["simulation"]["wall_s"]}
    if "multiplex" in s:
        row.update(p50_ms=s["p50_ms"], p99_ms=s["p99_ms"], multiplex=s["multiplex"])
    return row


def _pct(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def sweep_table(runs: Sequence[Run]) -> str:
    """One row per run, as a Markdown table."""
    lines = ["| run | policy and settings | within SLO | failed | time to capacity | "
             "p99 (pulse) | replica-s | x oracle |",
             "|---|---|--:|--:|--:|--:|--:|--:|"]
    for run in runs:
        row = _row(run)
        ttc = row["time_to_capacity_s"]
        p99 = row["p99_pulse_ms"]
        lines.append(
            f"| {run.label} | {describe(run.scenario)} | {_pct(row['slo_ok_fraction'])} | "
            f"{_pct(row['failed_fraction'])} | {'never' if ttc is None else f'{ttc:.1f} s'} | "
            f"{'-' if p99 is None else f'{p99:.1f} ms'} | {row['replica_seconds']:,.0f} | "
            f"{row['oracle_ratio']:.3f} |")
    multiplexed = [(run.label, run.summary) for run in runs if "multiplex" in run.summary]
    if multiplexed:
        lines += ["", mux_sweep_table(multiplexed)]
    return "\n".join(lines)
