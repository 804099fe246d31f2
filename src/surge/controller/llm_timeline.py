"""The LLM deployments' points on the dashboard's timeline, from their serve.metrics.

An LLM replica records TTFT, inter-token latency and its own overhead as histograms,
prompt and generated tokens as counters and the engine's running, waiting and KV-cache
use as gauges (surge/llm/metrics.py; names in observability/llm_metrics.py), tagged
with Ray's `application`, `deployment` and `replica`. The controller holds those
series cumulatively (controller/user_metrics.py). Once a second `LLMTimeline.sample`
reads them, takes each series' difference from the previous reading, adds them up per
deployment and answers, for every deployment that has any of these series, quantiles
and rates over the last two intervals (replicas report once a second at their own
phase: one interval may hold none of a replica's reports, two always hold one) and the
gauges as they stand: running and waiting summed over replicas, KV-cache use their mean.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from surge.controller.user_metrics import UserFamily
from surge.observability import llm_metrics as names
from surge.observability.quantiles import add_counts, bucket_delta, bucket_quantile
from surge.observability.user_metrics import COUNTER, GAUGE, HISTOGRAM, Buckets, Labels

__all__ = ["LLMTimeline"]

# Quantiles and rates span this many intervals (see the module's docstring).
WINDOWS = 2
HISTOGRAMS = {names.TTFT: "ttft", names.ITL: "itl", names.OVERHEAD: "overhead"}
COUNTERS = {names.GENERATION_TOKENS: "output_tokens_s", names.PROMPT_TOKENS: "input_tokens_s"}
GAUGES = (names.RUNNING, names.WAITING, names.KV_CACHE)
SeriesKey = tuple[str, Labels]  # metric name, label values


@dataclass
class Interval:
    """One deployment's share of one interval: bucket and counter deltas."""

    seconds: float
    histograms: dict[str, list[int]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)


def _deployment_of(family: UserFamily) -> tuple[int, int] | None:
    keys = family.info.tag_keys
    if "deployment" not in keys:
        return None  # recorded outside a replica: not a deployment's
    return (keys.index("application") if "application" in keys else -1,
            keys.index("deployment"))


def _key(labels: Labels, where: tuple[int, int]) -> str:
    app, dep = where
    return f"{labels[app] if app >= 0 else ''}#{labels[dep]}"


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 3)


class LLMTimeline:
    """Per LLM deployment, what the dashboard draws; fed the controller's user metrics."""

    def __init__(self) -> None:
        self._last: dict[SeriesKey, list[int] | float] = {}
        self._intervals: dict[str, deque[Interval]] = {}
        self._last_at: float | None = None

    def __repr__(self) -> str:
        return f"<LLMTimeline deployments={sorted(self._intervals)}>"

    def sample(self, families: Mapping[str, UserFamily], now: float,
               interval_s: float) -> dict[str, dict[str, Any]]:
        """One point per LLM deployment (key `app#name`); `now` is monotonic seconds,
        `interval_s` the interval assumed before the first reading."""
        seconds = interval_s if self._last_at is None else max(1e-9, now - self._last_at)
        self._last_at = now
        current: dict[str, Interval] = {}
        seen: dict[SeriesKey, list[int] | float] = {}
        boundaries: dict[str, tuple[float, ...]] = {}
        for name in (*HISTOGRAMS, *COUNTERS):
            family = families.get(name)
            if family is not None:
                boundaries[name] = family.info.boundaries
                self._deltas(name, family, seconds, current, seen)
        self._last = seen
        gauges = self._gauges(families, current, seconds)
        for key in list(self._intervals):
            if key not in current:
                del self._intervals[key]
        out = {}
        for key, interval in sorted(current.items()):
            window = self._intervals.setdefault(key, deque(maxlen=WINDOWS))
            window.append(interval)
            out[key] = _point(window, boundaries, gauges.get(key, {}))
        return out

    def _deltas(self, name: str, family: UserFamily, seconds: float,
                current: dict[str, Interval], seen: dict[SeriesKey, list[int] | float]) -> None:
        where = _deployment_of(family)
        if where is None or family.info.kind not in (HISTOGRAM, COUNTER):
            return
        for labels, value in family.values.items():
            interval = current.setdefault(_key(labels, where), Interval(seconds))
            before = self._last.get((name, labels))
            if isinstance(value, Buckets):
                seen[(name, labels)] = list(value.counts)
                delta = bucket_delta(before if isinstance(before, list) else None,
                                     value.counts)
                interval.histograms[name] = add_counts(interval.histograms.get(name, []),
                                                       delta)
            else:
                seen[(name, labels)] = value
                previous = before if isinstance(before, float) else 0.0
                grown = value - previous if value >= previous else value
                interval.counters[name] = interval.counters.get(name, 0.0) + grown

    @staticmethod
    def _gauges(families: Mapping[str, UserFamily], current: dict[str, Interval],
                seconds: float) -> dict[str, dict[str, list[float]]]:
        out: dict[str, dict[str, list[float]]] = {}
        for name in GAUGES:
            family = families.get(name)
            where = None if family is None else _deployment_of(family)
            if family is None or where is None or family.info.kind != GAUGE:
                continue
            for labels, value in family.values.items():
                if isinstance(value, float):
                    key = _key(labels, where)
                    current.setdefault(key, Interval(seconds))
                    out.setdefault(key, {}).setdefault(name, []).append(value)
        return out


def _point(window: deque[Interval], boundaries: Mapping[str, tuple[float, ...]],
           gauges: Mapping[str, list[float]]) -> dict[str, Any]:
    seconds = sum(interval.seconds for interval in window)
    point: dict[str, Any] = {}
    for name, short in HISTOGRAMS.items():
        counts: list[int] = []
        for interval in window:
            if name in interval.histograms:
                counts = add_counts(counts, interval.histograms[name])
        bounds = boundaries.get(name, ())
        point[f"{short}_p50_ms"] = _ms(bucket_quantile(bounds, counts, 0.5))
        point[f"{short}_p99_ms"] = _ms(bucket_quantile(bounds, counts, 0.99))
    for name, short in COUNTERS.items():
        grown = sum(interval.counters.get(name, 0.0) for interval in window)
        point[short] = round(grown / seconds, 2)
    running, waiting = gauges.get(names.RUNNING), gauges.get(names.WAITING)
    kv_cache = gauges.get(names.KV_CACHE)
    point["running"] = None if running is None else sum(running)
    point["waiting"] = None if waiting is None else sum(waiting)
    point["kv_cache_pct"] = None if not kv_cache else round(
        100.0 * sum(kv_cache) / len(kv_cache), 2)
    return point
