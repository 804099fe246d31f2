"""Ray Serve's `AutoscalingConfig` (and surge's standbys, daily schedule floors and LLM
latency objectives)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from surge.config.defaults import AUTO_MAX_REPLICAS
from surge.config.schema import check_keys, number, number_in, require
from surge.errors import ConfigError


@dataclass(frozen=True)
class ScheduleWindow:
    start_s: int  # seconds after local midnight
    end_s: int
    min_replicas: int | None = None
    standby_replicas: int | None = None

    def covers(self, second_of_day: float) -> bool:
        if self.start_s <= self.end_s:
            return self.start_s <= second_of_day < self.end_s
        return second_of_day >= self.start_s or second_of_day < self.end_s


def _clock(text: Any, where: str) -> int:
    if not isinstance(text, str) or text.count(":") != 1:
        raise ConfigError(f"{where} must be a time of day like '23:50', got {text!r}")
    hours, minutes = text.split(":")
    if not (hours.isdigit() and minutes.isdigit() and int(hours) < 24 and int(minutes) < 60):
        raise ConfigError(f"{where} must be a time of day like '23:50', got {text!r}")
    return int(hours) * 3600 + int(minutes) * 60


def parse_schedule(windows: Sequence[Mapping[str, Any]]) -> tuple[ScheduleWindow, ...]:
    parsed = []
    for index, window in enumerate(windows):
        where = f"schedule[{index}]"
        if not isinstance(window, Mapping):
            raise ConfigError(f"{where} must be a mapping with start, end and floors")
        check_keys(window, ("start", "end", "min_replicas", "standby_replicas"), where)
        floors = {k: number_in(window, k, where, ge=0, integer=True, allow_none=True)
                  for k in ("min_replicas", "standby_replicas")}
        if floors["min_replicas"] is None and floors["standby_replicas"] is None:
            raise ConfigError(f"{where} sets no floor; give min_replicas or standby_replicas")
        start = _clock(window.get("start"), f"{where}.start")
        end = _clock(window.get("end"), f"{where}.end")
        if start == end:
            raise ConfigError(f"{where} is empty: start and end are both {window['start']}")
        parsed.append(ScheduleWindow(start, end, floors["min_replicas"],
                                     floors["standby_replicas"]))
    return tuple(parsed)


OBJECTIVE_KEYS = ("ttft_ms", "tpot_ms", "shed")


@dataclass(frozen=True)
class Objectives:
    """An LLM deployment's latency objectives (p99 targets, seconds here): the proactive
    policy sizes for them (policy/llm_objectives.py), and with `shed` a replica answers
    429 to what its engine could not start within the TTFT target (policy/llm_shedding.py)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    shed: bool = True


def parse_objectives(data: Any) -> Objectives:
    """`objectives: {ttft_ms: 500, tpot_ms: 50, shed: true}` -> Objectives (ConfigError)."""
    where = "autoscaling_config.objectives"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping like {{ttft_ms: 500, tpot_ms: 50}}, "
                          f"got {data!r}")
    check_keys(data, OBJECTIVE_KEYS, where)
    ttft = number_in(data, "ttft_ms", where, gt=0, allow_none=True)
    tpot = number_in(data, "tpot_ms", where, gt=0, allow_none=True)
    if ttft is None and tpot is None:
        raise ConfigError(f"{where} states no objective; give ttft_ms, tpot_ms or both "
                          "(p99 targets in milliseconds)")
    shed = data.get("shed", True)
    if not isinstance(shed, bool):
        raise ConfigError(f"{where}.shed must be true or false, got {shed!r}")
    if shed and ttft is None:
        shed = False  # shedding is against the TTFT target: without one there is none
    return Objectives(None if ttft is None else ttft / 1000,
                      None if tpot is None else tpot / 1000, shed)


@dataclass(frozen=True, kw_only=True)
class AutoscalingPolicy:
    """Ray Serve's `AutoscalingPolicy`: which policy decides (a built-in name such as
    "proactive" or "ray_default", a `module:attr` path, or a callable / class) and the
    keyword arguments for it. Ray's own default path is surge's `ray_default`."""

    policy_function: Any = "proactive"
    policy_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(isinstance(self.policy_function, str) or callable(self.policy_function),
                "policy_function must be an import path ('module:function') or a callable.")
        require(isinstance(self.policy_kwargs, Mapping),
                "policy_kwargs must be a mapping of keyword arguments.")

    def as_mapping(self) -> dict[str, Any]:
        return {"policy_function": self.policy_function,
                "policy_kwargs": dict(self.policy_kwargs)}


@dataclass(frozen=True, kw_only=True)
class AutoscalingConfig:
    """Ray Serve's `AutoscalingConfig` with Ray's defaults (min 1, max 1, target 2)."""

    min_replicas: int = 1
    initial_replicas: int | None = None
    max_replicas: int = 1
    target_ongoing_requests: float = 2.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    smoothing_factor: float = 1.0
    upscale_smoothing_factor: float | None = None
    downscale_smoothing_factor: float | None = None
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    upscale_delay_s: float = 30.0
    aggregation_function: str = "mean"
    policy: Mapping[str, Any] | None = None  # or an AutoscalingPolicy (made a mapping)
    standby_replicas: int = 0
    schedule: tuple[Mapping[str, Any], ...] = ()
    # surge: an LLM deployment's p99 TTFT / TPOT targets (see Objectives)
    objectives: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        number("min_replicas", self.min_replicas, ge=0, integer=True)
        number("max_replicas", self.max_replicas, ge=1, integer=True)
        require(self.min_replicas <= self.max_replicas,
                f"min_replicas ({self.min_replicas}) must be <= max_replicas "
                f"({self.max_replicas}).")
        if self.initial_replicas is not None:
            number("initial_replicas", self.initial_replicas, ge=0, integer=True)
            require(self.min_replicas <= self.initial_replicas <= self.max_replicas,
                    "initial_replicas must lie within [min_replicas, max_replicas].")
        number("target_ongoing_requests", self.target_ongoing_requests, gt=0)
        for name in ("metrics_interval_s", "look_back_period_s", "downscale_delay_s",
                     "upscale_delay_s"):
            number(name, getattr(self, name), ge=0)
        number("downscale_to_zero_delay_s", self.downscale_to_zero_delay_s, ge=0,
               allow_none=True)
        for name in ("smoothing_factor", "upscale_smoothing_factor",
                     "downscale_smoothing_factor", "upscaling_factor", "downscaling_factor"):
            number(name, getattr(self, name), gt=0, allow_none=True)
        require(self.aggregation_function in ("mean", "max", "min"),
                "aggregation_function must be one of 'mean', 'max', 'min'.")
        number("standby_replicas", self.standby_replicas, ge=0, integer=True)
        require(isinstance(self.schedule, list | tuple),
                "schedule must be a list of windows like "
                "{start: '23:50', end: '00:30', min_replicas: 8}.")
        object.__setattr__(self, "schedule", tuple(self.schedule))
        parse_schedule(self.schedule)
        if self.objectives is not None:
            parse_objectives(self.objectives)
        if isinstance(self.policy, AutoscalingPolicy):
            object.__setattr__(self, "policy", self.policy.as_mapping())
        if self.policy is not None:
            require(isinstance(self.policy, Mapping) and set(self.policy) <= {
                "policy_function", "policy_kwargs"},
                "policy must be a mapping with policy_function and optional policy_kwargs.")

    @property
    def schedule_windows(self) -> tuple[ScheduleWindow, ...]:
        return parse_schedule(self.schedule)

    @property
    def latency_objectives(self) -> Objectives | None:
        return None if self.objectives is None else parse_objectives(self.objectives)

    @classmethod
    def default(cls) -> AutoscalingConfig:
        """What `num_replicas="auto"` means: 1 to 100 replicas."""
        return cls(min_replicas=1, max_replicas=AUTO_MAX_REPLICAS)

    @property
    def start_replicas(self) -> int:
        return self.initial_replicas if self.initial_replicas is not None else self.min_replicas
