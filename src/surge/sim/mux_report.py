"""What a multiplexed run adds to the report: cache hits, loads, the hot models' copies.

`summary["multiplex"]`: routing and replica side, requests dispatched, the hit rate
(requests whose model was held when they reached their replica), requests that waited
on a load and how long (p50/p99 of the wait), loads per minute, evictions, and for each
of the three most requested models its share of requests and how many replicas held
or loaded it (mean and max over the schedule's ticks, the share of ticks on two or
more). Each series point gains `hits`, `load_waits`, `loads` and `top_replicas`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from surge.loadtest.stats import percentile
from surge.sim.event_flow import EventFlow
from surge.sim.mux_flow import MuxFlow

__all__ = ["mux_histograms", "mux_series", "mux_summary", "mux_sweep_table", "mux_table"]


def mux_histograms(flow: EventFlow, points: int,
                   pulse: tuple[int, int]) -> tuple[list[dict[int, int]], int, int]:
    """Exact latency histograms per arrival point; (histograms, within SLO, in the pulse)
    (any single-request flow's: multiplexed or LLM)."""
    within = sum(flow.within[:points])
    within_pulse = sum(flow.within[pulse[0]:min(pulse[1], points)])
    return [dict(h) for h in flow.latency[:points]], within, within_pulse


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def mux_summary(flow: MuxFlow, end_s: float, schedule_points: int) -> dict[str, Any]:
    mux, stats = flow.mux, flow.stats
    hits, waited = sum(stats.hits), sum(stats.waited)
    dispatched = hits + waited
    loads = sum(stats.loads)
    holders = stats.top_holders[:schedule_points]
    top = []
    for index, model in enumerate(flow.top):
        counts = [h[index] for h in holders]
        top.append({
            "model": f"m{model}",
            "share": round(mux.popularity.probabilities[model], 4),
            "replicas_mean": round(sum(counts) / len(counts), 2) if counts else None,
            "replicas_max": max(counts, default=0),
            "share_on_2_or_more": _round(sum(c >= 2 for c in counts) / len(counts)
                                         if counts else None),
        })
    return {
        "routing": mux.routing, "loads_mode": mux.loads, "models": mux.models,
        "popularity": mux.popularity.kind if mux.popularity.kind != "zipf"
        else f"zipf({mux.popularity.s:g})",
        "max_num_models_per_replica": mux.max_num_models_per_replica,
        "max_replicas_per_model": mux.max_replicas_per_model,
        "load_time_s_mean": round(mux.load_time_s.mean, 4),
        "dispatched": dispatched, "hits": hits,
        "hit_rate": _round(hits / dispatched if dispatched else None),
        "waited_on_load": waited,
        "waited_fraction": _round(waited / dispatched if dispatched else None),
        "load_wait_p50_ms": percentile(stats.load_wait, 0.5),
        "load_wait_p99_ms": percentile(stats.load_wait, 0.99),
        "loads": loads, "loads_per_min": round(loads / (end_s / 60), 1) if end_s else None,
        "evictions": flow.evictions,
        "top_models": top,
    }


def mux_series(flow: MuxFlow, points: list[dict[str, Any]]) -> None:
    """Adds per-point multiplexing counts to the report's series, in place."""
    stats = flow.stats
    for index, point in enumerate(points):
        point["hits"] = stats.hits[index] if index < len(stats.hits) else 0
        point["load_waits"] = stats.waited[index] if index < len(stats.waited) else 0
        point["loads"] = stats.loads[index] if index < len(stats.loads) else 0
        point["top_replicas"] = (list(stats.top_holders[index])
                                 if index < len(stats.top_holders) else None)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _top(m: dict[str, Any]) -> str:
    return ", ".join(f"{t['model']} {t['replicas_mean']:.2f} (max {t['replicas_max']})"
                     for t in m["top_models"] if t["replicas_mean"] is not None)


def mux_table(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows for the simulation's table."""
    m = summary["multiplex"]
    cap = m["max_num_models_per_replica"]
    spread = m["max_replicas_per_model"] or "no bound"
    return [
        ("multiplexing", f"{m['routing']} routing, {m['loads_mode']} loads, {m['models']} "
                         f"models {m['popularity']}, {cap if cap > 0 else 'unlimited'} per "
                         f"replica, copies per model: "
                         f"{spread if m['routing'] == 'surge' else '-'}"),
        ("cache hit rate", f"{_pct(m['hit_rate'])} of {m['dispatched']:,} requests"),
        ("waited on a load", f"{m['waited_on_load']:,} ({_pct(m['waited_fraction'])}), "
                             f"wait p50 {_ms(m['load_wait_p50_ms'])}, "
                             f"p99 {_ms(m['load_wait_p99_ms'])}"),
        ("model loads", f"{m['loads']:,} ({m['loads_per_min']} per minute), "
                        f"{m['evictions']:,} evictions"),
        ("latency", f"p50 {_ms(summary['p50_ms'])}, p99 {_ms(summary['p99_ms'])}"),
        ("replicas holding top-3", f"{_top(m)} (mean over time)"),
    ]


def mux_sweep_table(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """(label, summary) per run: the multiplexing figures side by side, as Markdown."""
    lines = ["| run | routing | hit rate | waited on a load | loads/min | p50 | p99 | "
             "failed | replicas holding top-3 (mean, max) |",
             "|---|---|--:|--:|--:|--:|--:|--:|---|"]
    for label, s in rows:
        m = s["multiplex"]
        failed = s.get("failed_fraction")
        lines.append(
            f"| {label} | {m['routing']}, {m['loads_mode']} loads | {_pct(m['hit_rate'])} | "
            f"{_pct(m['waited_fraction'])} | {m['loads_per_min']} | {_ms(s['p50_ms'])} | "
            f"{_ms(s['p99_ms'])} | {_pct(failed)} | {_top(m)} |")
    return "\n".join(lines)
