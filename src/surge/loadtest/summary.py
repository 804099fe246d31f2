"""The report data of a pulse run (pure): its timeline, one point per 100 ms, and the
summary a post-mortem needs, read from a `Record` (loadtest/stats.py).

Phases (baseline, pulse) come from the schedule; latency percentiles are of 2xx by
scheduled send time, refusals (503/429) timed on their own; "p99 back under the SLO" is
the time from the pulse's start until every later point meets it; the node's CPU, where
the controller reported it, says whether the machine rather than the replica count was
the limit (policy.saturation.SATURATED_CPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from surge.loadtest.schedule import Schedule
from surge.loadtest.stats import (
    BEHIND_S,
    BUCKET_S,
    POINTS_PER_S,
    Record,
    ReplicaSample,
    interpolated_percentile,
    mean_std,
    merge_histograms,
    percentile,
    point_of,
    replica_points,
)
from surge.policy.saturation import SATURATED_CPU

__all__ = ["series", "summarize"]

_EPS = 1e-9  # float dust in times and SLOs (as in stats.py)


def _rate(counts: Sequence[int], point: int) -> float:
    return float(counts[point] * POINTS_PER_S) if point < len(counts) else 0.0


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def series(record: Record,
           replicas: Sequence[ReplicaSample | None] | None = None) -> list[dict[str, Any]]:
    """One point per 100 ms; rates are per second (count x 10)."""
    points = []
    for point in range(record.points):
        histogram = record.latency[point] if point < len(record.latency) else {}
        sample = replicas[point] if replicas is not None and point < len(replicas) else None
        errors = {kind: _rate(counts, point) for kind, counts in sorted(record.errors.items())
                  if point < len(counts) and counts[point]}
        lag = record.lag_max[point] if point < len(record.lag_max) else 0.0
        entry: dict[str, Any] = {}
        if record.tokens_per_request:
            ttft = record.ttft[point] if point < len(record.ttft) else {}
            tpot = record.tpot[point] if point < len(record.tpot) else {}
            entry = {"ttft_p50_ms": _ms(percentile(ttft, 0.50)),
                     "ttft_p99_ms": _ms(percentile(ttft, 0.99)),
                     "tpot_p50_ms": _ms(percentile(tpot, 0.50)),
                     "tpot_p99_ms": _ms(percentile(tpot, 0.99)),
                     "tokens_per_s": round(record.tokens[point] * POINTS_PER_S, 1)
                     if point < len(record.tokens) else 0.0}
        points.append({
            "t": round(point * BUCKET_S, 1),
            "offered": _rate(record.offered, point),
            "ok": _rate(record.ok, point),
            "errors": errors,
            "p50_ms": _ms(percentile(histogram, 0.50)),
            "p90_ms": _ms(percentile(histogram, 0.90)),
            "p99_ms": _ms(percentile(histogram, 0.99)),
            "replicas": sample.running if sample is not None else None,
            "target_replicas": sample.target if sample is not None else None,
            "node_cpu_pct": _cpu_pct(sample.node_cpu) if sample is not None else None,
            "lag_ms": round(lag * 1000, 3),
            **entry,
        })
    return points


def _stream_summary(record: Record) -> dict[str, Any] | None:
    """The run's streams as `vllm bench serve` reports them, under its JSON keys (None:
    no streams), with surge's tokens/s over time."""
    if not record.tokens_per_request:
        return None
    counts = record.tokens_per_request
    streams = sum(counts.values())
    total = sum(tokens * n for tokens, n in counts.items())
    active = [t for t in record.tokens if t > 0]
    duration = record.points * BUCKET_S
    # per-request token counts are kept exactly: keys are counts, not microseconds
    as_us = {tokens * 1000: n for tokens, n in counts.items()}
    slo = record.slo
    summary: dict[str, Any] = {
        "streams": streams, "completed": streams, "output_tokens": total,
        "total_output_tokens": total, "duration": round(duration, 1),
        "request_throughput": round(streams / duration, 3) if duration else None,
        "output_throughput": round(total / duration, 1) if duration else None,
        "goodput": slo.to_spec() if slo is not None else None,
        "good_completed": record.good if slo is not None else None,
        "request_goodput": (round(record.good / duration, 3) if slo is not None and duration
                            else None),
        "goodput_pct": round(100 * record.good / streams, 2) if slo is not None else None,
        **_shed_summary(record, streams),
        "output_tokens_p50": percentile(as_us, 0.50),
        "tokens_per_s_mean": round(total / (len(active) * BUCKET_S), 1) if active else 0.0,
        "tokens_per_s_peak": round(max(record.tokens, default=0.0) * POINTS_PER_S, 1),
    }
    for metric, histogram in (("ttft", merge_histograms(record.ttft)),
                              ("tpot", merge_histograms(record.tpot)),
                              ("itl", record.itl), ("e2el", record.e2el)):
        summary.update(_metric(metric, histogram))
    return summary


def _shed_summary(record: Record, streams: int) -> dict[str, Any]:
    """An LLM run's requests by how they ended: served (2xx streams), *shed* (429: the
    server refused what its latency objective could not take, at once), failed (5xx),
    timed out or lost; and the goodput over what was served and what was shed (a shed
    request is not a good one, but neither is it a failure)."""
    errors = record.error_totals()
    shed = errors.get("429", 0)
    failed = sum(n for kind, n in errors.items() if kind.isdigit() and kind.startswith("5"))
    answered = streams + shed
    return {"shed": shed, "shed_pct": round(100 * shed / record.sent, 2) if record.sent
            else None, "failed_5xx": failed, "timeouts": errors.get("timeout", 0),
            "connection_errors": errors.get("connection", 0),
            "goodput_of_answered_pct": (round(100 * record.good / answered, 2)
                                        if record.slo is not None and answered else None)}


def _metric(name: str, histogram: Mapping[int, int]) -> dict[str, float | None]:
    """vLLM's keys for one metric: mean, median, std and the p90/p99 percentiles, ms;
    the percentiles interpolated as vLLM's (numpy's), so the two compare."""
    mean, std = mean_std(histogram)
    return {f"mean_{name}_ms": _ms(mean),
            f"median_{name}_ms": _ms(interpolated_percentile(histogram, 0.5)),
            f"std_{name}_ms": _ms(std),
            f"p90_{name}_ms": _ms(interpolated_percentile(histogram, 0.9)),
            f"p99_{name}_ms": _ms(interpolated_percentile(histogram, 0.99))}


@dataclass(frozen=True)
class _Phase:
    first: int  # points [first, last)
    last: int


def _phase_stats(record: Record, phase: _Phase) -> dict[str, Any]:
    span = range(phase.first, min(phase.last, record.points))
    histogram = merge_histograms(record.latency[i] for i in span if i < len(record.latency))
    sent = sum(record.offered[i] for i in span if i < len(record.offered))
    failed = {kind: sum(counts[i] for i in span if i < len(counts))
              for kind, counts in record.errors_sent.items()}
    refused = merge_histograms(record.refused[i] for i in span if i < len(record.refused))
    return {
        "from_s": round(phase.first * BUCKET_S, 1), "to_s": round(phase.last * BUCKET_S, 1),
        "sent": sent, "ok": sum(histogram.values()),
        "errors": {kind: n for kind, n in sorted(failed.items()) if n},
        **_percentiles(histogram),
        "refused_p99_ms": _ms(percentile(refused, 0.99)),
    }


def _percentiles(histogram: Mapping[int, int]) -> dict[str, float | None]:
    return {"p50_ms": _ms(percentile(histogram, 0.50)),
            "p90_ms": _ms(percentile(histogram, 0.90)),
            "p99_ms": _ms(percentile(histogram, 0.99)),
            "p999_ms": _ms(percentile(histogram, 0.999))}


def _point_meets_slo(record: Record, point: int, slo_s: float) -> bool | None:
    """None for a point nobody sent in; else 2xx p99 <= SLO and no timeout/lost request."""
    if point >= len(record.offered) or record.offered[point] == 0:
        return None
    for kind in ("timeout", "connection", "overflow"):
        counts = record.errors_sent.get(kind, [])
        if point < len(counts) and counts[point]:
            return False
    histogram = record.latency[point] if point < len(record.latency) else {}
    p99 = percentile(histogram, 0.99)
    return p99 is not None and p99 <= slo_s * 1000 + _EPS


@dataclass(frozen=True)
class _Recovery:
    recovery_s: float | None  # pulse start -> p99 back under the SLO for good
    over_slo_s: float  # time (in points) the pulse spent over the SLO


def _recovery(record: Record, pulse: _Phase, slo_s: float) -> _Recovery:
    verdicts = [(point, _point_meets_slo(record, point, slo_s))
                for point in range(pulse.first, pulse.last)]
    judged = [(point, good) for point, good in verdicts if good is not None]
    over = sum(1 for _, good in judged if not good) * BUCKET_S
    if not judged or not judged[-1][1]:
        return _Recovery(None, round(over, 1))
    back = pulse.first
    for point, good in judged:
        if not good:
            back = point + 1
    return _Recovery(round((back - pulse.first) * BUCKET_S, 1), round(over, 1))


def _replica_summary(samples: Sequence[ReplicaSample],
                     pulse_start: float | None) -> dict[str, Any]:
    if not samples:
        return {"max_replicas": None, "start_replicas": None, "replicas_added_after_s": None,
                "max_replicas_after_s": None}
    ordered = sorted(samples)
    start_at = pulse_start if pulse_start is not None else 0.0
    before = [s for s in ordered if s.t <= start_at] or ordered[:1]
    start = before[-1].running
    peak = max(s.running for s in ordered)
    added = next((s.t for s in ordered if s.t > start_at and s.running > start), None)
    peaked = next(s.t for s in ordered if s.running == peak)
    return {"max_replicas": peak, "start_replicas": start,
            "replicas_added_after_s": None if added is None else round(added - start_at, 2),
            "max_replicas_after_s": round(max(peaked - start_at, 0.0), 2)}


def _cpu_pct(share: float | None) -> float | None:
    return None if share is None else round(100 * share, 1)


def _refused_or_slow(record: Record, point: int, slo_s: float) -> bool:
    """A point some request of which was refused (503) or missed the SLO."""
    refused = any(point < len(counts) and counts[point] > 0
                  for counts in (record.errors_sent.get(code, []) for code in ("503", "429")))
    return refused or \
        _point_meets_slo(record, point, slo_s) is False


def _node_summary(record: Record, samples: Sequence[ReplicaSample],
                  slo_s: float) -> dict[str, Any]:
    """The node's CPU peak, and how long it was saturated while requests were refused
    or slow: then the machine, not the replica count, was the limit."""
    shares = [s.node_cpu for s in samples if s.node_cpu is not None]
    if not shares:
        return {"node_cpu_peak_pct": None, "node_saturated_s": None, "machine_limited": None}
    points = replica_points(samples, record.points)
    limited = sum(1 for point, sample in enumerate(points)
                  if sample is not None and sample.node_cpu is not None
                  and sample.node_cpu >= SATURATED_CPU
                  and _refused_or_slow(record, point, slo_s))
    return {"node_cpu_peak_pct": _cpu_pct(max(shares)),
            "node_saturated_s": round(limited * BUCKET_S, 1), "machine_limited": limited > 0}


def _generator_summary(record: Record) -> dict[str, Any]:
    behind = [p for p, lag in enumerate(record.lag_max) if lag > BEHIND_S]
    return {
        "lag_p50_ms": _ms(percentile(record.lag, 0.50)),
        "lag_p99_ms": _ms(percentile(record.lag, 0.99)),
        "lag_max_ms": round(max(record.lag_max, default=0.0) * 1000, 3),
        "behind": bool(behind),
        "behind_s": round(len(behind) * BUCKET_S, 1),
        "waited_for_connection": record.waited,
        "connections_opened": record.connections_opened,
        "connections_peak": record.connections_peak,
    }


def summarize(record: Record, schedule: Schedule, slo_ms: float,
              replicas: Sequence[ReplicaSample] = ()) -> dict[str, Any]:
    """The post-mortem numbers: totals, peaks, percentiles per phase, recovery, replicas."""
    record.check()
    window = schedule.pulse_window()
    pulse_start = window[0] if window is not None else None
    if window is not None:
        baseline = _Phase(0, point_of(window[0]))
        pulse = _Phase(point_of(window[0]), max(point_of(window[1] - _EPS) + 1,
                                                point_of(window[0]) + 1))
    else:
        baseline = _Phase(0, point_of(schedule.duration_s - _EPS) + 1)
        pulse = _Phase(baseline.last, baseline.last)
    errors = record.error_totals()
    sent = record.sent
    recovery = _recovery(record, pulse, slo_ms / 1000)
    everything = merge_histograms(record.latency)
    return {
        "sent": sent, "ok": record.total_ok, "unanswered": record.unanswered,
        "errors": errors,
        "success_pct": round(100 * record.total_ok / sent, 3) if sent else None,
        "rate_503_pct": round(100 * errors["503"] / sent, 3) if sent else None,
        "peak_offered_rps": max((_rate(record.offered, p) for p in range(record.points)),
                                default=0.0),
        "peak_served_rps": max((_rate(record.ok, p) for p in range(record.points)),
                               default=0.0),
        **_percentiles(everything),
        "refused_p99_ms": _ms(percentile(merge_histograms(record.refused), 0.99)),
        "baseline": _phase_stats(record, baseline),
        "pulse": _phase_stats(record, pulse) if pulse.last > pulse.first else None,
        "slo_ms": slo_ms,
        "recovery_s": recovery.recovery_s,
        "over_slo_s": recovery.over_slo_s,
        **_replica_summary(replicas, pulse_start),
        **_node_summary(record, replicas, slo_ms / 1000),
        "duration_s": round(record.points * BUCKET_S, 1),
        "generator": _generator_summary(record),
        "llm": _stream_summary(record),
    }
