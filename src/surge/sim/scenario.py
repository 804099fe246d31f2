"""Scenario files: a cluster, a service, traffic, a deployment config and an SLO, in YAML.

`load_scenario(path)` reads and validates one (every error names the file and the
field); `Scenario.from_mapping` does the same for a dict, so sweeps re-validate each
variant. Overrides use dotted paths into the YAML or short aliases (the keys, the
aliases and `apply_overrides` are sim/scenario_keys.py's). A scenario may name
`variants`: mappings of overrides, run with `--sweep variant=a,b`. The annotated
example is examples/scenarios/pulse-1m-qps.yaml.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from surge.config import AutoscalingConfig, DeploymentConfig, build_deployment_config
from surge.config.schema import FieldError, check_keys, number_in
from surge.errors import ConfigError
from surge.loadtest.schedule import ARRIVALS, Schedule
from surge.model import DeploymentId
from surge.policy.resolve import resolve_policy
from surge.sim.distributions import Distribution, parse_distribution
from surge.sim.llm_spec import LLMSpec, build_llm, llm_traffic
from surge.sim.multiplexing import Multiplexing, parse_multiplexing
from surge.sim.scenario_keys import (
    ALIASES,
    BATCHING_KEYS,
    CLUSTER_KEYS,
    CONTROL_KEYS,
    SERVICE_KEYS,
    TOP_KEYS,
    TRAFFIC_KEYS,
    ScenarioError,
    apply_overrides,
    resolve_key,
)
from surge.sim.traffic import parse_schedule

__all__ = ["ALIASES", "Batching", "Cluster", "Control", "Scenario", "ScenarioError",
           "Service", "Traffic", "WeightLoading", "apply_overrides", "load_scenario",
           "resolve_key"]

# A request unanswered this long after it arrived has timed out (the client gave up):
# `surge pulse`'s default, so a calibration run and its simulation agree.
DEFAULT_TIMEOUT_S = 10.0
# Fine steps of the request flow while queues or capacity bind: 1 ms resolves a 5 ms
# service time and a 200 ms SLO; quiet ticks are one step (see sim/flow.py).
DEFAULT_FINE_STEP_MS = 1.0
# Surge's standby activation: a route-table push, tens of milliseconds.
DEFAULT_STANDBY_ACTIVATION_S = 0.05
# A stopped replica finishes its in-flight requests, then its process exits.
DEFAULT_DRAIN_S = 1.0
# Routers push load reports this often (router/runtime.py's LOAD_REPORT_INTERVAL_S).
DEFAULT_REPORT_INTERVAL_S = 0.1
# A replica maps an entry its node's weight store holds: bench/weights.py measured the
# slowest of 7 replicas starting at once at 22-45 ms (a 2 GiB model, 256 tensors, 2 cores).
DEFAULT_STORE_LOAD_S = 0.05

# Without measured figures, the controller is assumed to act at once.
ASSUMED_CONTROL = ("assumed: a decision 5 ms after a router's queue starts to grow (its "
                   "report's delay), a ready replica routable at once")


@dataclass(frozen=True)
class WeightLoading:
    """A start-up split in two (`process_start_s` + `weight_load_s`), and whether each
    node has a weight store: then only the first replica on a node reads the weights
    (`weight_load_s`; replicas starting there meanwhile wait for it), every later one
    maps them in `store_load_s`."""

    process_start_s: Distribution
    weight_load_s: Distribution
    store: bool = False
    store_load_s: Distribution = field(
        default_factory=lambda: parse_distribution(DEFAULT_STORE_LOAD_S, "store_load_s"))


@dataclass(frozen=True)
class Cluster:
    nodes: int
    replicas_per_node: int
    proxies_per_node: int
    startup_s: Distribution  # the whole start-up, when `weights` does not split it
    standby_activation_s: float
    drain_s: float
    weights: WeightLoading | None = None

    @property
    def replica_slots(self) -> int:
        return self.nodes * self.replicas_per_node

    @property
    def proxies(self) -> int:
        return self.nodes * self.proxies_per_node


@dataclass(frozen=True)
class Batching:
    """Ray's @serve.batch: one batch at a time per replica, up to max_batch_size."""

    max_batch_size: int
    batch_wait_timeout_s: float
    per_item_s: float  # added to the batch's time per request in it, beyond the first


@dataclass(frozen=True)
class Service:
    time_s: Distribution  # one call (one batch, when batching)
    overhead_s: float  # proxy and network: latency, not replica time
    batching: Batching | None = None


@dataclass(frozen=True)
class Traffic:
    schedule: Schedule
    arrivals: str
    timeout_s: float


@dataclass(frozen=True)
class Control:
    """How the controller sees load and acts: report cadence, urgent reports, its clock's
    phase, and how long its decisions and replica-set pushes take (`decision_s`: from a
    router's queue starting to grow to the decision; `fanout_s`: from a replica being
    ready to every router routing to it), assumed or measured (`source` says which)."""

    report_interval_s: float = DEFAULT_REPORT_INTERVAL_S
    urgent_decisions: bool = True
    clock_offset_s: float | None = None  # None: drawn from the seed
    decision_s: float | None = None  # None: the urgent report's delay alone
    fanout_s: float = 0.0
    source: str = ASSUMED_CONTROL


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    start_time_s: int  # local second of day at t=0
    cluster: Cluster
    service: Service
    traffic: Traffic
    deployment: DeploymentConfig
    slo_ms: float
    fine_step_s: float
    control: Control = field(default_factory=Control)
    multiplex: Multiplexing | None = None  # many models per replica (sim/multiplexing.py)
    llm: LLMSpec | None = None  # LLM engines serving a trace (sim/llm_spec.py)
    # an LLM replica's completions per second at its target load, and its requests' mean
    # seconds then (sim/llm_replica.probe_capacity)
    llm_capacity: tuple[float, float] | None = None
    variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    description: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    source: str = "<scenario>"

    @property
    def autoscaling(self) -> AutoscalingConfig | None:
        return self.deployment.autoscaling_config

    @property
    def per_replica_rps(self) -> float:
        """What one replica serves at max_ongoing_requests in flight (the oracle's unit);
        an LLM replica: what its engine completes at its target load."""
        if self.llm_capacity is not None:
            return self.llm_capacity[0]
        mean = self.service.time_s.mean
        batching = self.service.batching
        if batching is None:
            return self.deployment.max_ongoing_requests / mean
        size = min(batching.max_batch_size, self.deployment.max_ongoing_requests)
        return size / (mean + batching.per_item_s * (size - 1))

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<scenario>",
                     base: Path | None = None) -> Scenario:
        try:
            return _build(data, source, base)
        except ScenarioError:
            raise
        except FieldError as exc:  # its message names the file already
            raise ScenarioError(str(exc)) from None
        except (ConfigError, ValueError, TypeError) as exc:
            raise ScenarioError(f"{source}: {exc}") from None

    def with_overrides(self, overrides: Mapping[str, Any]) -> Scenario:
        data = apply_overrides(self.raw, overrides, self.source)
        base = Path(self.source).parent if self.source != "<scenario>" else None
        return Scenario.from_mapping(data, self.source, base)


# -- validation -----------------------------------------------------------------------------


def _section(data: Mapping[str, Any], key: str, known: Sequence[str], where: str,
             required: bool = True) -> Mapping[str, Any]:
    section = data.get(key)
    if section is None and not required:
        return {}
    if not isinstance(section, Mapping):
        raise ScenarioError(f"{where}.{key} must be a mapping"
                            f"{'' if section is not None else ' (it is missing)'}")
    check_keys(section, known, f"{where}.{key}")
    return section


def _start_time(value: Any, where: str) -> int:
    text = "00:00" if value is None else value
    parts = text.split(":") if isinstance(text, str) else []
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise ScenarioError(f"{where}.start_time must be a time of day like '23:50', got "
                            f"{value!r}")
    hours, minutes = int(parts[0]), int(parts[1])
    seconds = int(parts[2]) if len(parts) == 3 else 0
    if hours > 23 or minutes > 59 or seconds > 59:
        raise ScenarioError(f"{where}.start_time {value!r} is not a time of day")
    return hours * 3600 + minutes * 60 + seconds


def _distribution(section: Mapping[str, Any], key: str, where: str,
                  what: str) -> Distribution:
    """A required distribution field; `what` ends the error naming it when missing."""
    if key not in section:
        raise ScenarioError(f"{where}.{key} is missing{what}")
    try:
        return parse_distribution(section[key], f"{where}.{key}")
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None


def _cluster(data: Mapping[str, Any], where: str) -> Cluster:
    section = _section(data, "cluster", CLUSTER_KEYS, where)
    w = f"{where}.cluster"
    weights = _weight_loading(section, w)
    if weights is not None:  # startup_s, if given too, is what the split replaces
        startup = weights.process_start_s
    else:
        startup = _distribution(section, "startup_s", w, ": how long a new replica takes "
                                "to serve (a number of seconds or a distribution), or "
                                "process_start_s and weight_load_s")
    return Cluster(
        nodes=number_in(section, "nodes", w, ge=1, integer=True),
        replicas_per_node=number_in(section, "replicas_per_node", w, ge=1, integer=True),
        proxies_per_node=number_in(section, "proxies_per_node", w, 1, ge=1, integer=True),
        startup_s=startup,
        standby_activation_s=float(number_in(section, "standby_activation_s", w,
                                           DEFAULT_STANDBY_ACTIVATION_S, ge=0)),
        drain_s=float(number_in(section, "drain_s", w, DEFAULT_DRAIN_S, ge=0)),
        weights=weights)


def _weight_loading(section: Mapping[str, Any], w: str) -> WeightLoading | None:
    split = ("process_start_s", "weight_load_s")
    given = [key for key in split if key in section]
    store = section.get("weight_store", False)
    if not isinstance(store, bool):
        raise ScenarioError(f"{w}.weight_store must be true or false, got {store!r}")
    if not given:
        if store or "store_load_s" in section:
            raise ScenarioError(f"{w}.weight_store needs the start-up split: give "
                                "process_start_s and weight_load_s")
        return None
    if len(given) == 1:
        missing = split[1 - split.index(given[0])]
        raise ScenarioError(f"{w}.{missing} is missing: a start-up is split into "
                            "process_start_s + weight_load_s")
    what = " (a number of seconds or a distribution)"
    store_load = (_distribution(section, "store_load_s", w, what) if "store_load_s" in section
                  else parse_distribution(DEFAULT_STORE_LOAD_S, f"{w}.store_load_s"))
    return WeightLoading(_distribution(section, "process_start_s", w, what),
                         _distribution(section, "weight_load_s", w, what), store, store_load)


def _service(data: Mapping[str, Any], where: str, llm_s: float | None = None) -> Service:
    """The `service` section; an LLM scenario's may be absent (its requests take what its
    engines make of them: `llm_s` stands for their mean where the loop asks)."""
    section = _section(data, "service", SERVICE_KEYS, where, required=llm_s is None)
    w = f"{where}.service"
    if llm_s is not None and "service_time_ms" not in section:
        section = {**section, "service_time_ms": llm_s * 1000}
    time_ms = _distribution(section, "service_time_ms", w, " (a number of ms or a "
                            "distribution like {distribution: lognormal, mean: 5, p99: 15})")
    if time_ms.mean <= 0:
        raise ScenarioError(f"{w}.service_time_ms must have a mean > 0")
    batching = None
    if section.get("batching") is not None:
        b = _section(section, "batching", BATCHING_KEYS, w)
        bw = f"{w}.batching"
        batching = Batching(
            max_batch_size=number_in(b, "max_batch_size", bw, ge=1, integer=True),
            batch_wait_timeout_s=float(number_in(b, "batch_wait_timeout_s", bw, 0.0, ge=0)),
            per_item_s=float(number_in(b, "per_item_ms", bw, 0.0, ge=0)) / 1000)
    return Service(time_s=time_ms.scaled(0.001),
                   overhead_s=float(number_in(section, "overhead_ms", w, 0.0, ge=0)) / 1000,
                   batching=batching)


def _traffic(data: Mapping[str, Any], where: str, base: Path | None) -> Traffic:
    section = _section(data, "traffic", TRAFFIC_KEYS, where)
    w = f"{where}.traffic"
    if "schedule" not in section:
        raise ScenarioError(f"{w}.schedule is missing (the `surge pulse` format: "
                            "{baseline_rps, peak_rps, ...} or a list of steps)")
    try:
        schedule = parse_schedule(section["schedule"], f"{w}.schedule", base)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    arrivals = section.get("arrivals", "uniform")
    if arrivals not in ARRIVALS:
        raise ScenarioError(f"{w}.arrivals must be one of {', '.join(ARRIVALS)}, got "
                            f"{arrivals!r}")
    return Traffic(schedule, arrivals,
                   float(number_in(section, "timeout_s", w, DEFAULT_TIMEOUT_S, gt=0)))


def _deployment(data: Mapping[str, Any], where: str) -> DeploymentConfig:
    section = data.get("deployment")
    if not isinstance(section, Mapping):
        raise ScenarioError(f"{where}.deployment must be a mapping (a Ray Serve config "
                            "`deployments:` entry)")
    options = dict(section)
    name = options.pop("name", "Model")
    try:
        config = build_deployment_config(str(name), options, f"{where}.deployment")
    except ConfigError as exc:
        raise ScenarioError(str(exc)) from None
    if config.autoscaling_config is None and config.num_replicas is None:
        raise ScenarioError(f"{where}.deployment: give num_replicas or autoscaling_config")
    if config.autoscaling_config is not None:  # as a deploy fails on a bad policy
        try:
            resolve_policy(config.autoscaling_config, DeploymentId("sim", config.name))
        except Exception as exc:
            raise ScenarioError(f"{where}.deployment.autoscaling_config.policy: "
                                f"{exc}") from None
    return config


def _measured(section: Mapping[str, Any], w: str, base: Path | None) -> dict[str, Any]:
    """The figures bench/control_scale.py wrote (`--sim-out`), and where they came from."""
    name = section.get("measured")
    if name is None:
        return {}
    path = Path(str(name))
    if not path.is_absolute() and base is not None:
        path = base / path
    try:
        figures = json.loads(path.read_text())
        decision, fanout = float(figures["decision_s"]), float(figures["fanout_s"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ScenarioError(f"{w}.measured: cannot read the measured control figures from "
                            f"{path} ({exc!r}); bench/control_scale.py --sim-out writes "
                            "them") from None
    source = (f"measured by {figures.get('written_by', 'bench/control_scale.py')} at "
              f"{figures.get('replicas', '?')} replicas x {figures.get('routers', '?')} "
              f"routers ({figures.get('date', '?')}, median of {figures.get('runs', '?')} "
              f"runs; {name})")
    return {"decision_s": decision, "fanout_s": fanout, "source": source}


def _control(data: Mapping[str, Any], where: str, base: Path | None = None) -> Control:
    section = _section(data, "control", CONTROL_KEYS, where, required=False)
    w = f"{where}.control"
    measured = _measured(section, w, base)
    explicit = [k for k in ("decision_s", "fanout_s") if section.get(k) is not None]
    decision = section.get("decision_s", measured.get("decision_s"))
    if decision is not None:
        decision = float(number_in({"decision_s": decision}, "decision_s", w, ge=0))
    source = measured.get("source", ASSUMED_CONTROL)
    if explicit:
        source = f"given in the scenario ({', '.join(explicit)})" + (
            f"; otherwise {source}" if measured else "")
    urgent = section.get("urgent_decisions", True)
    if not isinstance(urgent, bool):
        raise ScenarioError(f"{w}.urgent_decisions must be true or false, got {urgent!r}")
    offset = section.get("clock_offset_s")
    return Control(
        report_interval_s=float(number_in(section, "report_interval_s", w,
                                        DEFAULT_REPORT_INTERVAL_S, ge=0)),
        urgent_decisions=urgent,
        clock_offset_s=None if offset is None else float(
            number_in(section, "clock_offset_s", w, ge=0)),
        decision_s=decision,
        fanout_s=float(number_in({"fanout_s": section.get("fanout_s", measured.get(
            "fanout_s", 0.0))}, "fanout_s", w, ge=0)),
        source=source)


def _multiplex(data: Mapping[str, Any], service: Service, where: str) -> Multiplexing | None:
    section = data.get("multiplex")
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ScenarioError(f"{where}.multiplex must be a mapping (models, popularity, "
                            "load_time_s, max_num_models_per_replica, routing, ...)")
    if service.batching is not None:
        raise ScenarioError(f"{where}: multiplex with service.batching is not modelled")
    try:
        return parse_multiplexing(section, f"{where}.multiplex")
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None


def _variants(data: Mapping[str, Any], where: str) -> dict[str, Mapping[str, Any]]:
    variants = data.get("variants") or {}
    if not isinstance(variants, Mapping):
        raise ScenarioError(f"{where}.variants must map names to override mappings")
    for name, overrides in variants.items():
        if not isinstance(overrides, Mapping):
            raise ScenarioError(f"{where}.variants.{name} must be a mapping of overrides "
                                "like {policy: proactive, standby_replicas: 64}")
    return {str(name): dict(overrides) for name, overrides in variants.items()}


def _build(data: Any, source: str, base: Path | None) -> Scenario:
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: a scenario is a mapping (cluster, service, traffic, "
                            "deployment, ...)")
    check_keys(data, TOP_KEYS, source)
    where = source
    variants = _variants(data, where)
    original, (data, requests) = data, llm_traffic(data, where, base)
    seed = number_in(data, "seed", where, 0, ge=0, integer=True)
    traffic, deployment = _traffic(data, where, base), _deployment(data, where)
    llm, capacity = build_llm(data, where, traffic.schedule, deployment, seed, requests)
    service = _service(data, where, None if capacity is None else capacity[1])
    scenario = Scenario(
        name=str(data.get("name") or Path(source).stem),
        seed=seed,
        start_time_s=_start_time(data.get("start_time"), where),
        cluster=_cluster(data, where), service=service,
        traffic=traffic, deployment=deployment,
        slo_ms=float(number_in(data, "slo_ms", where, 200.0, gt=0)),
        fine_step_s=float(number_in(data, "fine_step_ms", where, DEFAULT_FINE_STEP_MS,
                                    gt=0)) / 1000,
        control=_control(data, where, base), multiplex=_multiplex(data, service, where),
        llm=llm, llm_capacity=capacity, variants=variants,
        description=str(data.get("description") or ""),
        raw=copy.deepcopy(dict(original)), source=source)
    for name, overrides in variants.items():  # a bad variant fails now, not mid-sweep
        varied = apply_overrides(original, overrides, f"{source}: variant {name!r}")
        varied.pop("variants", None)
        _build(varied, f"{source} (variant {name!r})", base)
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise ScenarioError(f"{source}: cannot read the scenario: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: not valid YAML: {exc}") from None
    return Scenario.from_mapping(data, str(source), source.parent)
