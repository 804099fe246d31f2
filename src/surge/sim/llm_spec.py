"""A scenario's `llm:` section: engines, the trace they serve, routing and objectives.

    llm:
      engine: {step_s: 0.02, decode_s_per_seq: 0.001, max_num_seqs: 8}  # EngineTiming,
                           # as `engine_kwargs` give surge.testing's MockVLLMEngine
      trace: {shape: burstgpt, burstiness: 0.25}   # or mooncake, or {file: t.csv, speed: 1}
      routing: engine_score                        # surge's choice, or round_robin
      report_s: 0.25                               # the replicas' routing-stats period
      objectives: {ttft_ms: 2000, tpot_ms: 200}    # a request within both is within SLO

A shaped trace has the published shape (surge.loadtest.traces: BurstGPT's lengths and
gamma arrivals, or Mooncake's sessions) with its arrival rate following
`traffic.schedule`: arrivals are drawn at rate 1 and mapped through the schedule's
cumulative count (`Schedule.time_of`), so burstiness holds at every rate. A trace file
(BurstGPT `.csv` or Mooncake `.jsonl`) is replayed as `surge pulse --trace` sends it;
`traffic.schedule` is then made from it (1 s steps).

`per_replica_rps`, the unit of the report's oracle and of time to capacity, is what one
engine completes with the autoscaling target's requests in flight (its batch), measured
by running one EngineModel closed-loop on the trace's own lengths (sim/llm_probe.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from surge.config import DeploymentConfig
from surge.config.schema import check_keys, number_in
from surge.loadtest.schedule import Schedule
from surge.loadtest.traces import (
    TraceError,
    TraceRequest,
    burstgpt_shaped,
    mooncake_shaped,
    read_trace,
)
from surge.sim.engine_model import EngineTiming
from surge.sim.llm_replica import probe_capacity
from surge.sim.scenario_keys import ScenarioError

__all__ = ["LLM_KEYS", "ROUTINGS", "SHAPES", "LLMSpec", "build_llm", "llm_traffic", "parse_llm",
           "shaped_trace", "trace_schedule"]

LLM_KEYS = ("engine", "trace", "routing", "report_s", "objectives")
TRACE_KEYS = ("shape", "burstiness", "file", "speed")
OBJECTIVE_KEYS = ("ttft_ms", "tpot_ms")
SHAPES = ("burstgpt", "mooncake")
ROUTINGS = ("engine_score", "round_robin")
# LLMServer's ROUTING_STATS_PERIOD_S: how often a replica reports its engine's queue.
DEFAULT_REPORT_S = 0.25
# BurstGPT's published burstiness (gamma shape of the gaps; 1 is Poisson).
DEFAULT_BURSTINESS = 0.25
_TIMING_KEYS = tuple(f.name for f in fields(EngineTiming))


@dataclass(frozen=True)
class LLMSpec:
    timing: EngineTiming
    requests: tuple[TraceRequest, ...]  # the whole trace, arrival times in schedule seconds
    routing: str
    report_s: float
    ttft_s: float | None
    tpot_s: float | None
    source: str  # where the trace came from, for the report

    @property
    def objectives(self) -> dict[str, float]:
        out = {}
        if self.ttft_s is not None:
            out["ttft_ms"] = self.ttft_s * 1000
        if self.tpot_s is not None:
            out["tpot_ms"] = self.tpot_s * 1000
        return out


def shaped_trace(shape: str, schedule: Schedule, burstiness: float, rng: random.Random,
                 max_model_len: int | None = None) -> list[TraceRequest]:
    """A trace of `shape` whose arrival rate follows `schedule` (see the module's doc);
    prompts cut to fit `max_model_len` with their output (the log-normal tail is long)."""
    total = schedule.total
    count = math.ceil(total * 1.5) + 20  # enough for gamma's spread around `total`
    make = burstgpt_shaped if shape == "burstgpt" else mooncake_shaped
    drawn = [r for r in make(count, 1.0, rng, burstiness=burstiness) if r.at_s < total]
    times = schedule.time_of(np.array([r.at_s for r in drawn], dtype=np.float64)).tolist()
    out = []
    for t, r in zip(times, drawn, strict=True):
        output = r.output_length
        prompt = r.input_length
        if max_model_len is not None:
            output = min(output, max_model_len // 2)
            prompt = max(1, min(prompt, max_model_len - output))
        out.append(TraceRequest(t, prompt, output, r.hash_ids))
    return out


def trace_schedule(requests: Sequence[TraceRequest]) -> list[dict[str, float]]:
    """A trace's arrivals as 1 s steps (as `surge pulse` makes its schedule)."""
    seconds = [0] * (int(requests[-1].at_s) + 1)
    for r in requests:
        seconds[int(r.at_s)] += 1
    return [{"rps": float(n), "for_s": 1.0} for n in seconds]


def read_file_trace(section: Mapping[str, Any], where: str,
                    base: Path | None) -> list[TraceRequest]:
    """The trace file a section names, sped up by its `speed`."""
    path = Path(str(section["file"]))
    if not path.is_absolute() and base is not None:
        path = base / path
    speed = float(number_in(section, "speed", where, 1.0, gt=0))
    try:
        requests = read_trace(path)
    except OSError as exc:
        raise ScenarioError(f"{where}.file: cannot read {path}: {exc.strerror}") from None
    except TraceError as exc:
        raise ScenarioError(f"{where}.file: {exc}") from None
    if not requests:
        raise ScenarioError(f"{where}.file: {path} has no requests")
    return [TraceRequest(r.at_s / speed, r.input_length, r.output_length, r.hash_ids)
            for r in requests]


def _mapping(value: Any, where: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where} must be a mapping ({what}), got {value!r}")
    return value


def _timing(section: Mapping[str, Any], where: str) -> EngineTiming:
    engine = _mapping(section.get("engine", {}), f"{where}.engine",
                      "the mock engine's EngineTiming fields: " + ", ".join(_TIMING_KEYS))
    check_keys(engine, _TIMING_KEYS, f"{where}.engine")
    try:
        return EngineTiming(**dict(engine))
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{where}.engine: {exc}") from None


def _objective(section: Mapping[str, Any], key: str, where: str) -> float | None:
    value = number_in(section, key, where, None, gt=0, allow_none=True)
    return None if value is None else float(value) / 1000


def trace_section(section: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """The `trace` mapping, its keys checked, with either a shape or a file."""
    trace = _mapping(section.get("trace"), f"{where}.trace",
                     "{shape: burstgpt|mooncake, burstiness} or {file: PATH, speed}")
    check_keys(trace, TRACE_KEYS, f"{where}.trace")
    if ("file" in trace) == ("shape" in trace):
        raise ScenarioError(f"{where}.trace: give either shape ({' or '.join(SHAPES)}) or "
                            "file (a BurstGPT .csv or Mooncake .jsonl), not both or neither")
    if "shape" in trace and trace["shape"] not in SHAPES:
        raise ScenarioError(f"{where}.trace.shape must be one of {', '.join(SHAPES)}, got "
                            f"{trace['shape']!r}")
    return trace


def parse_llm(data: Mapping[str, Any], where: str, schedule: Schedule, seed: int,
              requests: Sequence[TraceRequest] | None) -> LLMSpec:
    """The `llm` section; `requests`: a trace file's (read before the schedule was made)."""
    section = _mapping(data.get("llm"), f"{where}.llm", ", ".join(LLM_KEYS))
    w = f"{where}.llm"
    check_keys(section, LLM_KEYS, w)
    trace = trace_section(section, w)
    routing = section.get("routing", "engine_score")
    if routing not in ROUTINGS:
        raise ScenarioError(f"{w}.routing must be one of {', '.join(ROUTINGS)}, got "
                            f"{routing!r}")
    objectives = _mapping(section.get("objectives", {}), f"{w}.objectives",
                          "ttft_ms, tpot_ms")
    check_keys(objectives, OBJECTIVE_KEYS, f"{w}.objectives")
    timing = _timing(section, w)
    if requests is None:
        burstiness = float(number_in(trace, "burstiness", f"{w}.trace", DEFAULT_BURSTINESS,
                                     gt=0))
        requests = shaped_trace(str(trace["shape"]), schedule, burstiness, random.Random(seed),
                                timing.max_model_len)
        source = f"{trace['shape']}-shaped, burstiness {burstiness:g}, seed {seed}"
    else:
        source = str(trace["file"])
    for index, r in enumerate(requests):
        if r.input_length < 1 or r.input_length + r.output_length > timing.max_model_len:
            raise ScenarioError(
                f"{w}.trace: request {index} ({r.input_length} prompt + {r.output_length} "
                f"output tokens) does not fit the engine's max_model_len "
                f"{timing.max_model_len} (or its prompt is empty)")
    return LLMSpec(timing, tuple(requests), str(routing),
                   float(number_in(section, "report_s", w, DEFAULT_REPORT_S, gt=0)),
                   _objective(objectives, "ttft_ms", f"{w}.objectives"),
                   _objective(objectives, "tpot_ms", f"{w}.objectives"), source)


def llm_traffic(data: Mapping[str, Any], where: str,
                 base: Path | None) -> tuple[dict[str, Any], list[Any] | None]:
    """`data` with a trace file's schedule in its traffic, and the file's requests."""
    section = data.get("llm")
    if not isinstance(section, Mapping) or not isinstance(section.get("trace"), Mapping) \
            or "file" not in section["trace"]:
        return dict(data), None
    trace_section(section, f"{where}.llm")  # shape or file, not both
    requests = read_file_trace(section["trace"], f"{where}.llm.trace", base)
    traffic = data.get("traffic") or {}
    if not isinstance(traffic, Mapping):
        raise ScenarioError(f"{where}.traffic must be a mapping")
    if "schedule" in traffic:
        raise ScenarioError(f"{where}.traffic.schedule: llm.trace.file gives the arrivals "
                            "(and the schedule); remove one of them")
    return {**data, "traffic": {**traffic, "schedule": trace_schedule(requests)}}, requests


def build_llm(data: Mapping[str, Any], where: str, schedule: Schedule,
              deployment: DeploymentConfig, seed: int, requests: list[Any] | None,
              ) -> tuple[LLMSpec | None, tuple[float, float] | None]:
    """The `llm` section (None without one) and what one replica serves at its target."""
    if data.get("llm") is None:
        return None, None
    if data.get("multiplex") is not None:
        raise ScenarioError(f"{where}: llm with multiplex is not modelled")
    spec = parse_llm(data, where, schedule, seed, requests)
    config = deployment.autoscaling_config
    load = (config.target_ongoing_requests if config is not None
            else min(spec.timing.max_num_seqs, deployment.max_ongoing_requests))
    return spec, probe_capacity(spec.timing, spec.requests, max(1, round(load)))
