"""What an LLM run adds to the simulation's report: TTFT/TPOT, objectives, scaling's path.

`summary["llm_sim"]`: the trace (its source, requests, routing, the engine's timing),
TTFT and TPOT p50/p90/p99 over every finished request, the requests served (2xx) and
shed (429 against the deployment's TTFT objective, sim/llm_flow.py: `shed`, and
`shed_pct` of those sent, as `surge pulse` counts a 429; `shedding` says whether the
deployment sheds), the share of requests within the objectives (SLO attainment over all
sent; not finished, shed included, counts as missed; `slo_attainment_of_answered` over
the served + shed, as pulse's `goodput_of_answered_pct`), what one replica serves
at its target load (the oracle's unit), and how scaling moved: the time of the first
scale-up decision, changes of scaling direction (per 10 minutes of the trace), and the
running replicas per `TIMELINE_S` window (their mean), which bench/llm_sim_vs_real.py
sets beside a real run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from surge.loadtest.stats import ReplicaSample
from surge.sim.engine import DecisionLog, Simulation
from surge.sim.llm_flow import LLMFlow

__all__ = ["TIMELINE_S", "direction_changes", "llm_summary", "llm_table", "replica_timeline"]

TIMELINE_S = 30.0  # the replica timeline's window


def direction_changes(decisions: Sequence[DecisionLog]) -> int:
    """How often the target turned from growing to shrinking or back."""
    changes, last = 0, 0
    for d in decisions:
        sign = (d.target > d.previous) - (d.target < d.previous)
        if sign and last and sign != last:
            changes += 1
        last = sign or last
    return changes


def replica_timeline(samples: Sequence[ReplicaSample], end_s: float,
                     window_s: float = TIMELINE_S) -> list[float]:
    """Mean running replicas in each window of `window_s` from 0 to `end_s`."""
    sums = [0.0] * max(1, -int(-end_s // window_s))
    counts = [0] * len(sums)
    for s in samples:
        index = int(s.t // window_s)
        if 0 <= index < len(sums):
            sums[index] += s.running
            counts[index] += 1
    return [round(total / n, 2) if n else 0.0 for total, n in zip(sums, counts, strict=True)]


def llm_summary(sim: Simulation, sent: int) -> dict[str, Any]:
    flow = sim.llm
    assert isinstance(flow, LLMFlow)
    spec = flow.spec
    duration = sim.duration_s
    within = sum(row[3] for row in flow.finished)
    shed = flow.totals["shed"]
    first_up = next((d.t for d in sim.decisions if d.target > d.previous), None)
    capacity = sim.scenario.llm_capacity
    return {
        "trace": spec.source, "requests": len(spec.requests), "routing": spec.routing,
        "engine": dataclasses.asdict(spec.timing), "report_s": spec.report_s,
        "objectives": spec.objectives or {"e2e_ms": sim.scenario.slo_ms},
        "finished": len(flow.finished),
        "served": len(flow.finished), "shed": shed,
        "shed_pct": round(100 * shed / sent, 2) if sent else None,
        "shedding": (None if flow.shed_ttft_s is None
                     else {"ttft_ms": round(1000 * flow.shed_ttft_s, 3)}),
        "ttft_ms": flow.percentiles(1), "tpot_ms": flow.percentiles(2),
        "slo_attainment": round(within / sent, 5) if sent else None,
        "slo_attainment_of_answered": (round(within / (len(flow.finished) + shed), 5)
                                       if flow.finished or shed else None),
        "per_replica_rps": round(capacity[0], 4) if capacity else None,
        "request_s_at_target": round(capacity[1], 3) if capacity else None,
        "first_scale_up_s": None if first_up is None else round(first_up, 3),
        "direction_changes": direction_changes(sim.decisions),
        "direction_changes_per_10min": round(direction_changes(
            [d for d in sim.decisions if d.t <= duration]) / (duration / 600), 3),
        "decisions": len(sim.decisions),
        "timeline_s": TIMELINE_S,
        "replica_timeline": replica_timeline(sim.replicas, duration),
    }


def _ms(values: dict[str, float | None]) -> str:
    return " / ".join("-" if v is None else f"{v:,.1f}" for v in values.values()) + " ms"


def llm_table(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows for the simulation's table."""
    m = summary["llm_sim"]
    objectives = ", ".join(f"{k} <= {v:g}" for k, v in m["objectives"].items())
    first = m["first_scale_up_s"]
    return [
        ("LLM trace", f"{m['trace']}: {m['requests']:,} requests, {m['routing']} routing"),
        ("TTFT p50 / p90 / p99", _ms(m["ttft_ms"])),
        ("TPOT p50 / p90 / p99", _ms(m["tpot_ms"])),
        ("served / shed (429)", f"{m['served']:,} / {m['shed']:,} ({m['shed_pct'] or 0:g}% "
                                "of those sent; " + (
                                    "no objectives to shed against)" if m["shedding"] is None
                                    else f"against a {m['shedding']['ttft_ms']:g} ms TTFT "
                                         "target)")),
        ("SLO attainment", "-" if m["slo_attainment"] is None else
         f"{100 * m['slo_attainment']:.2f}% within {objectives}"
         + ("" if not m["shed"] or m["slo_attainment_of_answered"] is None else
            f" ({100 * m['slo_attainment_of_answered']:.2f}% of served + shed)")),
        ("one replica at target", f"{m['per_replica_rps']} req/s, "
                                  f"{m['request_s_at_target']} s a request"),
        ("scaling", f"first scale-up {'never' if first is None else f'at {first:.2f} s'}, "
                    f"{m['decisions']} decisions, {m['direction_changes']} changes of "
                    f"direction ({m['direction_changes_per_10min']:g} per 10 min)"),
    ]
