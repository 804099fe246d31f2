"""A simulation as a `surge pulse` report: report.json, report.html, plots, the table.

The flow's per-point counts fill a loadtest `Record` (offered by arrival point, 2xx by
completion point, 503s, an LLM replica's 429s (shed) and timeouts, latency histograms
by arrival point), so `summarize` and `series` compute phases, percentiles and recovery
exactly as for a real pulse, and `write_report` draws it. Latencies: each point holds
how many requests were dispatched after each delay; each such group draws its service
times from the distribution's discretisation (a multinomial over its ~50 bins, seeded),
so a point's histogram is what that many sampled requests would give.

The summary adds what only a simulation knows: `replica_seconds` (alive replicas,
standbys included, over the schedule), the oracle's (`ceil(rate / per-replica
capacity)` at every instant, no start-up) and their ratio, `slo_ok_fraction` (2xx
within the SLO over all requests sent), `failed_fraction`, and `time_to_capacity_s`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from surge.loadtest.report import summary_table, write_report
from surge.loadtest.schedule import Schedule
from surge.loadtest.stats import Record, latency_key, replica_points
from surge.loadtest.summary import series, summarize
from surge.sim.engine import TICK_S, Simulation
from surge.sim.flow import Flow
from surge.sim.llm_report import llm_summary, llm_table
from surge.sim.mux_report import mux_histograms, mux_series, mux_summary, mux_table
from surge.sim.traffic import oracle_replica_seconds

__all__ = ["build_report", "report_text", "sim_table", "time_to_capacity",
           "write_sim_report"]

# Time to capacity: from the pulse's start until both (a) the running replicas could serve
# the schedule's peak rate and (b) a window of WINDOW points, starting once the scheduled
# rate is near its peak, has 2xx >= SERVED of its offered requests. (b) alone is fooled
# by a backlog draining in a burst; (a) alone by capacity that does not serve (a
# saturated proxy). A window, not a point: a point of a small Poisson pulse varies > 5%.
PEAK_FRACTION = 0.95
SERVED_FRACTION = 0.95
WINDOW_POINTS = 5
# Decisions shown in the report: those of the first seconds of the pulse decide.
DECISIONS_SHOWN = 12


def _histograms(sim: Simulation, points: int) -> tuple[list[dict[int, int]], int, int]:
    """Latency histograms per arrival point; (histograms, within SLO, in the pulse)."""
    scenario = sim.scenario
    assert isinstance(sim.flow, Flow)
    values, probs = scenario.service.time_s.points()
    overhead = scenario.service.overhead_s
    slo_s = scenario.slo_ms / 1000
    window = scenario.traffic.schedule.pulse_window()
    pulse = (round(window[0] / TICK_S), round(window[1] / TICK_S)) if window else (0, 0)
    cache: dict[int, tuple[list[int], list[bool]]] = {}
    rng = sim.report_rng
    histograms: list[dict[int, int]] = []
    within = within_pulse = 0
    for point in range(points):
        histogram: dict[int, int] = {}
        for delay_us, count in sorted(sim.flow.delays[point].items()):
            if delay_us not in cache:
                base = overhead + delay_us / 1e6
                cache[delay_us] = ([latency_key(base + v) for v in values],
                                   [base + v <= slo_s + 1e-12 for v in values])
            keys, ok = cache[delay_us]
            counts = rng.multinomial(count, probs).tolist() if len(values) > 1 else [count]
            for key, good, n in zip(keys, ok, counts, strict=True):
                if n:
                    histogram[key] = histogram.get(key, 0) + n
                    if good:
                        within += n
                        if pulse[0] <= point < pulse[1]:
                            within_pulse += n
        histograms.append(histogram)
    return histograms, within, within_pulse


def _record(sim: Simulation) -> tuple[Record, int, int]:
    flow = sim.flow
    points = round(sim.end_s / TICK_S)
    record = Record()
    record.offered = flow.offered[:points]
    record.ok = flow.ok[:points]
    record.errors = {"503": flow.rejected[:points], "timeout": flow.timeouts_done[:points]}
    record.errors_sent = {"503": flow.rejected[:points],
                          "timeout": flow.timeouts_sent[:points]}
    if sim.llm is not None:  # answered 429 by a replica (shed against the TTFT objective)
        record.errors["429"] = sim.llm.shed[:points]
        record.errors_sent["429"] = sim.llm.shed_sent[:points]
    if sim.events is not None:
        window = sim.scenario.traffic.schedule.pulse_window()
        pulse = (round(window[0] / TICK_S), round(window[1] / TICK_S)) if window else (0, 0)
        record.latency, within, within_pulse = mux_histograms(sim.events, points, pulse)
    else:
        record.latency, within, within_pulse = _histograms(sim, points)
    record.unanswered = flow.queued + flow.ongoing
    return record, within, within_pulse


def time_to_capacity(points: Sequence[dict[str, Any]], schedule: Schedule,
                     per_replica_rps: float | None = None) -> float | None:
    """Seconds from the pulse's start until capacity caught up (see above), or None.

    Works on any report's series (a real `surge pulse` too; without replica counts or
    `per_replica_rps` only (b) is judged).
    """
    window = schedule.pulse_window()
    if window is None:
        return None
    peak = max(max(s.start_rps, s.end_rps) for s in schedule.segments)
    during = [p for p in points if window[0] - 1e-9 <= p["t"] < window[1] - 1e-9]
    capacity = 0.0
    if per_replica_rps and any(p.get("replicas") is not None for p in during):
        reached = next((float(p["t"]) + TICK_S - window[0] for p in during
                        if (p.get("replicas") or 0) * per_replica_rps >= peak), None)
        if reached is None:
            return None
        capacity = reached
    begin = _near_peak(schedule, window[0], peak)
    served = [p for p in during if p["t"] >= begin - TICK_S + 1e-9]
    for index in range(len(served) - WINDOW_POINTS + 1):
        span = served[index:index + WINDOW_POINTS]
        if sum(p["ok"] for p in span) >= SERVED_FRACTION * sum(p["offered"] for p in span):
            caught_up = float(served[index]["t"]) + TICK_S - window[0]
            return round(max(caught_up, capacity), 2)
    return None


def _near_peak(schedule: Schedule, start: float, peak: float) -> float:
    """When the scheduled rate first reaches PEAK_FRACTION of its peak, after `start`."""
    t, level = 0.0, PEAK_FRACTION * peak
    for segment in schedule.segments:
        end = t + segment.duration_s
        if end > start and max(segment.start_rps, segment.end_rps) >= level:
            rise = segment.end_rps - segment.start_rps
            share = ((level - segment.start_rps) / rise
                     if segment.start_rps < level and rise > 0 else 0.0)
            return max(start, t + share * segment.duration_s)
        t = end
    return start


def _run_block(sim: Simulation, label: str) -> dict[str, Any]:
    scenario = sim.scenario
    schedule = scenario.traffic.schedule
    return {"url": f"sim:{scenario.name}", "method": "SIMULATE",
            "arrivals": scenario.traffic.arrivals, "seed": scenario.seed,
            "slo_ms": scenario.slo_ms, "timeout_s": scenario.traffic.timeout_s,
            "connections": 0, "max_time_s": None, "workers": 1,
            "schedule": schedule.to_spec(), "schedule_duration_s": schedule.duration_s,
            "expected_requests": round(schedule.total), "stopped_early": False,
            "replicas_sampled": True, "scenario": scenario.source, "run": label,
            "control": {"decision_s": sim.decision_delay_s,
                        "fanout_s": scenario.control.fanout_s,
                        "source": scenario.control.source}}


def _fraction(part: float, whole: float) -> float | None:
    return round(part / whole, 7) if whole else None


def build_report(sim: Simulation, label: str = "", wall_s: float | None = None
                 ) -> dict[str, Any]:
    """report.json's content, in `surge pulse`'s format plus the simulation's figures."""
    scenario = sim.scenario
    schedule = scenario.traffic.schedule
    record, within, within_pulse = _record(sim)
    summary = summarize(record, schedule, scenario.slo_ms, sim.replicas)
    points = series(record, replica_points(sim.replicas, record.points))
    cost = sim.replica_seconds()
    oracle = oracle_replica_seconds(schedule, scenario.per_replica_rps)
    pulse = summary["pulse"]
    sent = summary["sent"]
    summary.update({
        "replica_seconds": round(cost, 1),
        "oracle_replica_seconds": round(oracle, 1),
        "oracle_ratio": round(cost / oracle, 4) if oracle else None,
        "per_replica_rps": round(scenario.per_replica_rps, 3),
        "slo_ok_fraction": _fraction(within, sent),
        "slo_ok_fraction_pulse": _fraction(within_pulse, pulse["sent"]) if pulse else None,
        "failed_fraction": _fraction(sent - summary["ok"], sent),
        "failed_fraction_pulse": (_fraction(pulse["sent"] - pulse["ok"], pulse["sent"])
                                  if pulse else None),
        "time_to_capacity_s": time_to_capacity(points, schedule, scenario.per_replica_rps),
    })
    if sim.mux is not None:
        summary["multiplex"] = mux_summary(sim.mux, sim.end_s, sim.points)
        mux_series(sim.mux, points)
    if sim.llm is not None:
        summary["llm_sim"] = llm_summary(sim, sent)
    counters = sim.counters
    simulation = {
        "wall_s": None if wall_s is None else round(wall_s, 2),
        "ticks": len(sim.replicas), "quiet_ticks": counters.quiet_ticks,
        "fine_steps": counters.fine_steps, "fine_step_ms": round(sim.dt * 1000, 4),
        "reconciles": counters.reconciles, "policy_errors": counters.policy_errors,
        "placement_refused": sim.cluster.placement_refused,
        "startup_lead_s": round(sim.cluster.startup_lead_s, 3),
        "totals": dict(sim.flow.totals),
        "decisions": [{"t": round(d.t, 2), "from": d.previous, "to": d.target,
                       "reason": d.reason} for d in _shown_decisions(sim)],
    }
    return {"version": 1, "run": _run_block(sim, label), "summary": summary,
            "series": points, "simulation": simulation}


def _shown_decisions(sim: Simulation) -> list[Any]:
    window = sim.scenario.traffic.schedule.pulse_window()
    start = window[0] if window else 0.0
    before = [d for d in sim.decisions if d.t < start][-3:]
    return before + [d for d in sim.decisions if d.t >= start][:DECISIONS_SHOWN]


def sim_table(report: dict[str, Any]) -> str:
    """The simulation's own figures, as aligned text (after the pulse table)."""
    s, sim = report["summary"], report["simulation"]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.3f}%"

    ttc = s["time_to_capacity_s"]
    control = report["run"].get("control")
    rows = [
        ("within SLO (2xx <= SLO)", f"{pct(s['slo_ok_fraction'])} of all requests, "
                                    f"{pct(s['slo_ok_fraction_pulse'])} of the pulse's"),
        ("failed (not 2xx)", f"{pct(s['failed_fraction'])} of all, "
                             f"{pct(s['failed_fraction_pulse'])} of the pulse's"),
        ("time to capacity", "never" if ttc is None else f"{ttc:.2f} s after the pulse began"),
        ("replica-seconds", f"{s['replica_seconds']:,.0f} = {s['oracle_ratio']:.3f} x the "
                            f"oracle's {s['oracle_replica_seconds']:,.0f}"),
        *(mux_table(s) if s.get("multiplex") else []),
        *(llm_table(s) if s.get("llm_sim") else []),
        ("simulated in", f"{sim['wall_s']} s ({sim['ticks']:,} ticks, {sim['quiet_ticks']:,} "
                         f"quiet, {sim['fine_steps']:,} fine steps of {sim['fine_step_ms']} "
                         "ms)"),
    ]
    if control:
        rows.append(("control plane", f"decision {control['decision_s'] * 1e3:.1f} ms after "
                                      f"a queue starts to grow, fan-out "
                                      f"{control['fanout_s'] * 1e3:.1f} ms: "
                                      f"{control['source']}"))
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{label:<{width}}{value}" for label, value in rows]
    if sim["decisions"]:
        lines.append("decisions around the pulse:")
        lines += [f"  t={d['t']:>8.1f}s  {d['from']:>4} -> {d['to']:<4} {d['reason']}"
                  for d in sim["decisions"]]
    return "\n".join(lines)


def write_sim_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """`surge pulse`'s files, the title made a simulation's, its figures added."""
    paths = write_report(report, out_dir)
    page = paths["html"].read_text()
    block = (f"<h2>simulation</h2><pre>{html.escape(sim_table(report))}</pre>"
             "<p style='color:#666;font-size:0.85em'>A simulation: latencies are modelled "
             "(see surge/sim), not measured; the generator lines do not apply.</p>")
    page = page.replace("surge pulse report", "surge simulate report", 1)
    marker = "<h2>summary</h2>"
    page = page.replace(marker, block + marker, 1) if marker in page else page + block
    paths["html"].write_text(page)
    return paths


def report_text(report: dict[str, Any]) -> str:
    """The pulse table and the simulation's figures, for the terminal."""
    return summary_table(report) + "\n\n" + sim_table(report)
