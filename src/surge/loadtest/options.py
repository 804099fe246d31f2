"""`surge pulse` options: one frozen, validated record, from flags or a scenario YAML.

A scenario file holds the same options as the flags (flags given on the command line
win), with the traffic under `schedule` in the format `surge simulate` shares:

    url: http://127.0.0.1:8000/mlp
    method: POST
    body: '{"features": [0.1, 0.2]}'
    headers: {content-type: application/json}
    arrivals: poisson
    seed: 7
    slo_ms: 100
    schedule: {baseline_rps: 100, peak_rps: 2000, baseline_s: 5, ramp_s: 0.5, hold_s: 20}
    # or steps: [{rps: 100, for_s: 5}, {to_rps: 2000, over_s: 0.5}, {rps: 2000, for_s: 20}]

An `llm:` mapping (or `--preset chat|completions`) loads an OpenAI endpoint with
streamed requests instead of one fixed body (surge.loadtest.llm):

    url: http://127.0.0.1:8000            # /v1/chat/completions is added
    llm: {kind: chat, model: tiny, prompt_words: [16, 64], max_tokens: [16, 64]}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

from surge.config.schema import FieldError, at_line, choice, decode, load_yaml, number
from surge.loadtest.generator import Plan
from surge.loadtest.llm import LLMPreset
from surge.loadtest.schedule import ARRIVALS, Schedule

__all__ = ["DEFAULT_CONNECTIONS", "DEFAULT_SLO_MS", "DEFAULT_TIMEOUT_S", "PulseOptions",
           "load_scenario", "parse_header"]

# An SLO a person notices: p99 above 100 ms is a slow page.
DEFAULT_SLO_MS = 100.0
# Long enough that a queue that drains is measured, short enough that a stuck request
# does not hold the run: a request unanswered 10 s after its scheduled time is a timeout.
DEFAULT_TIMEOUT_S = 10.0
# Open connections at most (per run, split across workers): one request in flight per
# connection, so this bounds concurrency: 20k req/s at 50 ms, or a 0.5 s backlog of
# 2k req/s. The generator raises its descriptor limit to fit.
DEFAULT_CONNECTIONS = 1024



class _ScenarioFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The keys a scenario file may set; an unset one is left to the flag or default.
    `schedule` and `llm` are checked by Schedule.from_spec and LLMPreset.from_spec."""

    url: str | UnsetType = UNSET
    schedule: Any = UNSET
    method: str | UnsetType = UNSET
    headers: dict[str, Any] | list[str] | UnsetType = UNSET
    body: str | int | float | UnsetType = UNSET
    arrivals: str | UnsetType = UNSET
    seed: int | UnsetType = UNSET
    slo_ms: Annotated[float, msgspec.Meta(gt=0)] | UnsetType = UNSET
    timeout_s: float | UnsetType = UNSET
    connections: int | UnsetType = UNSET
    max_time_s: float | UnsetType | None = UNSET
    workers: Annotated[int, msgspec.Meta(ge=1)] | UnsetType = UNSET
    surge_address: str | UnsetType | None = UNSET
    llm: dict[str, Any] | UnsetType = UNSET


@dataclass(frozen=True, kw_only=True)
class PulseOptions:
    url: str
    schedule: Schedule
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    arrivals: str = "uniform"
    seed: int = 0
    slo_ms: float = DEFAULT_SLO_MS
    timeout_s: float = DEFAULT_TIMEOUT_S
    connections: int = DEFAULT_CONNECTIONS
    max_time_s: float | None = None
    workers: int = 1
    surge_address: str | None = None
    llm: LLMPreset | None = None

    def __post_init__(self) -> None:
        if self.llm is not None:  # an OpenAI endpoint: POST JSON to the preset's path
            url = self.url.rstrip("/")
            if url.endswith("/v1"):
                url = url[:-3]
            if not url.endswith(self.llm.path):
                url += self.llm.path
            object.__setattr__(self, "url", url)
            object.__setattr__(self, "method", "POST")
            if not any(name.lower() == "content-type" for name, _ in self.headers):
                object.__setattr__(self, "headers",
                                   (*self.headers, ("content-type", "application/json")))
        choice("arrivals", self.arrivals, ARRIVALS)
        number("slo_ms", self.slo_ms, gt=0)
        number("workers", self.workers, ge=1, integer=True)
        if self.connections < self.workers:
            raise ValueError("connections must be >= workers (each worker needs one)")
        self.plan()  # validates url, method, timeout, connections, max_time

    def plan(self, worker: int = 0) -> Plan:
        """What worker `worker` of `workers` sends (its share of the connections)."""
        return Plan(url=self.url, schedule=self.schedule, method=self.method.upper(),
                    headers=self.headers, body=self.body, arrivals=self.arrivals,
                    seed=self.seed, timeout_s=self.timeout_s,
                    connections=self.connections // self.workers, max_time_s=self.max_time_s,
                    worker=worker, workers=self.workers, llm=self.llm)

    def describe(self) -> dict[str, Any]:
        """The run's parameters, as written into report.json."""
        return {"url": self.url, "method": self.method.upper(), "arrivals": self.arrivals,
                "seed": self.seed, "slo_ms": self.slo_ms, "timeout_s": self.timeout_s,
                "connections": self.connections, "max_time_s": self.max_time_s,
                "workers": self.workers, "schedule": self.schedule.to_spec(),
                "schedule_duration_s": self.schedule.duration_s,
                "expected_requests": round(self.schedule.total),
                "llm": self.llm.to_spec() if self.llm is not None else None}


def _headers(value: dict[str, Any] | list[str]) -> tuple[tuple[str, str], ...]:
    if isinstance(value, Mapping):
        return tuple((str(k), str(v)) for k, v in value.items())
    return tuple(parse_header(item) for item in value)


def parse_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ValueError(f"a header is 'name: value', got {text!r}")
    return name.strip(), value.strip()


def load_scenario(path: str | Path) -> dict[str, Any]:
    """The scenario file as PulseOptions keyword arguments; a bad key or value is an error
    at its FILE:LINE (config/schema.py, as `surge run`'s config)."""
    source = str(path)
    data, lines = load_yaml(Path(path).read_text(), source)
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: a scenario is a mapping of options")
    try:
        return _options(decode(_ScenarioFile, data, source))
    except FieldError as exc:
        raise at_line(source, lines, exc) from None


def _options(scenario: _ScenarioFile) -> dict[str, Any]:
    options = {f: getattr(scenario, f) for f in scenario.__struct_fields__
               if getattr(scenario, f) is not UNSET}
    for key, convert in (("schedule", Schedule.from_spec), ("headers", _headers),
                         ("body", lambda body: str(body).encode()),
                         ("llm", LLMPreset.from_spec)):
        if key in options:
            try:
                options[key] = convert(options[key])
            except FieldError as exc:
                raise exc.within(key, (key,)) from None
            except ValueError as exc:
                raise FieldError(f"{key}: {exc}", (key,), str(exc)) from None
    return options
