"""Issue 34's simulator targets for LLM replicas: a 30-minute replay and a 10x step.

    .venv/bin/python bench/llm_sim_targets.py [--minutes 30] [--seed 1]

Both in `surge simulate`'s LLM model (sim/llm_flow.py: EngineModel replicas on mock-engine
timing, routed on their reported queues, autoscaled by policy.autoscale_step), on the
engine timing of bench/llm_sim_vs_real.py, replicas starting in `--startup` seconds:

* replay: a BurstGPT-shaped trace (gamma burstiness 0.25) of `--minutes`, its mean rate
  stepping LOW -> HIGH -> MID -> LOW req/s in equal parts, served by each policy: changes
  of scaling direction per 10 minutes (target <= 1) and replica-seconds against the
  trace's oracle (ceil(rate / what one replica serves at its target load) at every
  instant, no start-up; target <= 1.1x);
* step: `--step-from` req/s for 60 s, then `--step-to` (>= 10x) for 120 s, Poisson
  arrivals (burstiness 1, so the step is the only surge) and BurstGPT lengths: seconds
  from the step to the first scale-up decision, Ray's default policy (`ray_default`)
  against surge's (`proactive`), each with its defaults.

`proactive+objectives` is surge's policy with the deployment's latency objectives
(`autoscaling_config.objectives`: the TTFT and TPOT of OBJECTIVES), sized by
policy/llm_objectives.py from the engines' reports.

The report's oracle is the schedule's mean rate over what one replica serves, measured
by a probe of 300 completions on the trace's first lengths (sim/llm_replica.py): its
unit moves with the seed (0.61-0.70 req/s on seeds 1-4), and its ceil at a mean rate
of 2 req/s turns that into 3 or 4 replicas. Beside it, from the trace itself: the
*trace oracle*, which knows every request (each held for its time at a full batch,
ceil(in flight / batch) replicas at every 0.1 s, no start-up, nothing waits), and the
cheapest schedule above that need with at most 3 changes of direction (1 s steps,
dynamic programming): what a policy that knows the future and meets the direction
target without letting a request wait would cost.

Last line: `summary: ...`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import options
from bench.llm_sim_vs_real import DEPLOYMENT, ENGINE, OBJECTIVES
from surge.sim.scenario import Scenario
from surge.sim.sweep import simulate

# (row, policy, latency objectives in autoscaling_config: issue 34 item 1)
POLICIES = (("proactive", "proactive", False), ("proactive+objectives", "proactive", True),
            ("ray_default", "ray_default", False))
LOW, HIGH, MID = 2.0, 12.0, 6.0
STEP_AT_S = 60.0


def scenario(schedule: list[dict[str, float]], policy: str, burstiness: float, seed: int,
             startup_s: float, max_replicas: int, objectives: bool = False) -> Scenario:
    scaling: dict[str, Any] = {**DEPLOYMENT["autoscaling_config"],  # type: ignore[dict-item]
                               "max_replicas": max_replicas,
                               "policy": {"policy_function": policy}}
    if objectives:
        scaling["objectives"] = dict(OBJECTIVES)
    return Scenario.from_mapping({
        "name": f"llm-{policy}", "seed": seed, "slo_ms": OBJECTIVES["ttft_ms"],
        "cluster": {"nodes": 1, "replicas_per_node": max_replicas, "startup_s": startup_s},
        "traffic": {"timeout_s": 300, "schedule": schedule},
        "llm": {"engine": ENGINE, "trace": {"shape": "burstgpt", "burstiness": burstiness},
                "objectives": OBJECTIVES},
        "deployment": {"name": "LLM", **DEPLOYMENT, "autoscaling_config": scaling}})


def trace_need(sc: Scenario) -> np.ndarray:
    """ceil(requests in flight / batch) every 0.1 s, each request held for its time at
    a full batch (its output tokens at a full batch's step, its prompt's prefill)."""
    assert sc.llm is not None
    timing, batch = sc.llm.timing, int(DEPLOYMENT["autoscaling_config"]  # type: ignore[index]
                                        ["target_ongoing_requests"])
    step = timing.step_s + batch * timing.decode_s_per_seq
    ends = [r.at_s + max(1, r.output_length) * step + r.input_length * timing.prefill_s_per_token
            for r in sc.llm.requests]
    points = math.ceil(max(ends) * 10) + 1
    delta = np.zeros(points + 1)
    for r, end in zip(sc.llm.requests, ends, strict=True):
        delta[int(r.at_s * 10)] += 1
        delta[min(points, int(end * 10))] -= 1
    return np.ceil(np.cumsum(delta)[:points] / batch)


def cheapest_with_changes(need: np.ndarray, changes: int) -> float:
    """Replica-seconds of the cheapest schedule, in 1 s steps, never below `need` and
    turning from growing to shrinking or back at most `changes` times."""
    per_s = need[: len(need) // 10 * 10].reshape(-1, 10).max(axis=1)
    levels = np.arange(int(per_s.max()) + 1, dtype=float)
    inf = np.inf
    # cost[c, d, level]: c changes so far, d the last direction (0 up, 1 down)
    cost = np.full((changes + 1, 2, len(levels)), inf)
    cost[0, 0] = np.where(levels >= per_s[0], levels, inf)
    for x in per_s[1:]:
        fits = np.where(levels >= x, levels, inf)
        up = np.minimum.accumulate(np.concatenate(
            [np.full((changes + 1, 2, 1), inf), cost[:, :, :-1]], axis=2), axis=2)
        down = np.minimum.accumulate(np.concatenate(
            [cost[:, :, 1:], np.full((changes + 1, 2, 1), inf)], axis=2)[:, :, ::-1],
            axis=2)[:, :, ::-1]
        new = cost.copy()
        new[:, 0] = np.minimum(new[:, 0], up[:, 0])  # up after up
        new[1:, 0] = np.minimum(new[1:, 0], up[:-1, 1])  # up after down: a change
        new[:, 1] = np.minimum(new[:, 1], down[:, 1])
        new[1:, 1] = np.minimum(new[1:, 1], down[:-1, 0])
        cost = new + fits
    return float(cost.min())


def replay(minutes: float, seed: int, startup_s: float) -> dict[str, Any]:
    part = minutes * 60 / 4
    schedule = [{"rps": r, "for_s": part} for r in (LOW, HIGH, MID, LOW)]
    print(f"replay: {minutes:g} min, {LOW:g} -> {HIGH:g} -> {MID:g} -> {LOW:g} req/s "
          f"(burstiness 0.25), start-up {startup_s:g} s\n")
    need = trace_need(scenario(schedule, "proactive", 0.25, seed, startup_s, 64))
    trace_oracle = float(need.sum()) / 10
    bound = cheapest_with_changes(need, 3)
    print(f"trace oracle {trace_oracle:,.0f} replica-s; the cheapest schedule above its need "
          f"with <= 3 changes of direction {bound:,.0f} ({bound / trace_oracle:.3f} x the "
          "trace oracle)\n")
    print("| policy | requests | changes of direction | per 10 min | replica-s | oracle | "
          "x oracle | x trace oracle | TTFT p99 ms | TPOT p99 ms | SLO attainment |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    out: dict[str, Any] = {"trace_oracle": round(trace_oracle),
                           "cheapest_3_changes_x_trace_oracle": round(bound / trace_oracle, 3)}
    for row, policy, objectives in POLICIES:
        run = simulate(scenario(schedule, policy, 0.25, seed, startup_s, 64, objectives))
        s, m = run.summary, run.summary["llm_sim"]
        print(f"| {row} | {m['requests']:,} | {m['direction_changes']} | "
              f"{m['direction_changes_per_10min']:g} | {s['replica_seconds']:,.0f} | "
              f"{s['oracle_replica_seconds']:,.0f} | {s['oracle_ratio']:.3f} | "
              f"{s['replica_seconds'] / trace_oracle:.3f} | "
              f"{m['ttft_ms']['p99']:,.0f} | {m['tpot_ms']['p99']:,.0f} | "
              f"{100 * m['slo_attainment']:.2f}% |", flush=True)
        out[f"{row}_changes_per_10min"] = m["direction_changes_per_10min"]
        out[f"{row}_x_oracle"] = s["oracle_ratio"]
        out[f"{row}_x_trace_oracle"] = round(s["replica_seconds"] / trace_oracle, 4)
        out[f"{row}_slo"] = m["slo_attainment"]
    return out


def step(low: float, high: float, seed: int, startup_s: float) -> dict[str, Any]:
    schedule = [{"rps": low, "for_s": STEP_AT_S}, {"rps": high, "for_s": 120.0}]
    print(f"\nstep: {low:g} -> {high:g} req/s ({high / low:g}x) at t={STEP_AT_S:g} s, Poisson "
          "arrivals, BurstGPT lengths\n")
    print("| policy | first scale-up after the step | its decision |\n|---|--:|---|")
    out = {}
    for row, policy, objectives in POLICIES:
        run = simulate(scenario(schedule, policy, 1.0, seed, startup_s, 64, objectives))
        ups = [d for d in run.simulation.decisions
               if d.target > d.previous and d.t >= STEP_AT_S]
        first = ups[0] if ups else None
        print(f"| {row} | {'never' if first is None else f'{first.t - STEP_AT_S:.3f} s'} | "
              f"{'' if first is None else f'{first.previous} -> {first.target}: {first.reason}'}"
              " |", flush=True)
        out[f"{row}_first_up_s"] = None if first is None else round(first.t - STEP_AT_S, 3)
    return out


def main() -> None:
    args = options(__doc__, {"startup": "replica start-up, s", "replay_only": "skip the step"},
                   minutes=30.0, seed=1, startup=2.0, step_from=1.0, step_to=12.0,
                   replay_only=False)
    summary = replay(args.minutes, args.seed, args.startup)
    if not args.replay_only:
        summary.update(step(args.step_from, args.step_to, args.seed, args.startup))
    print("\nsummary: " + " ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
