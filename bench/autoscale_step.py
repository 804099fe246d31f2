"""Autoscaling step: load jumps from 10% to 300% of one replica's capacity.

    python bench/autoscale_step.py [--cases ...] [--hold 15] [--slow-hold 45]

The deployment's handler sleeps 20 ms (min 1, max 8 replicas, target_ongoing_requests
2, max_ongoing_requests 5: one replica serves ~250 req/s), so the step goes from 25
to 750 req/s, offered open-loop. Cases: surge under `ray_default` (Ray's delays and
windows), `ray_default` tuned for bursts, `proactive`, `proactive` with 2 standbys,
and Ray Serve 2.60 with its defaults and with the same tuning, in the same run.

Per 100 ms it prints offered and completed rates, 503s, p99 and replicas; per case:
seconds from the step to the first scale-up decision, to capacity (the end of the
first 100 ms bucket served at >= 95% of offered that starts a 0.5 s window doing so),
the fraction of step-phase requests without a 2xx, and the p99.
The last line is `summary: policy=proactive+standby first_decision_s=... capacity_s=...
failed=... p99_ms=...`. Full series go to reports/autoscale_step.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import APPS, ROOT, free_port, ray_python, start_system
from bench.openloop import Outcome, run

CAPACITY_RPS = 250.0
BASELINE_S = 5.0
CASES = {
    "surge:ray_default": ("surge", "ray_default", True),
    "surge:ray_tuned": ("surge", "ray_tuned", False),
    "surge:proactive": ("surge", "proactive", False),
    "surge:proactive+standby": ("surge", "proactive_standby", False),
    "ray:default": ("ray", "default", True),
    "ray:tuned": ("ray", "tuned", False),
}


@dataclass
class CaseResult:
    name: str
    step_wall: float
    outcomes: list[Outcome]
    replicas: list[tuple[float, int, int]] = field(default_factory=list)
    rows: list[dict[str, float]] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def analyse(result: CaseResult, hold_s: float) -> None:
    buckets = int((BASELINE_S + hold_s) * 10)
    start = result.step_wall - BASELINE_S
    rows: list[dict[str, float]] = []
    for i in range(buckets):
        lo, hi = start + i / 10, start + (i + 1) / 10
        sent = [o for o in result.outcomes if lo <= o.scheduled < hi]
        done = [o for o in result.outcomes if 200 <= o.status < 300 and lo <= o.scheduled
                + o.latency_s < hi]
        replicas = [r for r in result.replicas if r[0] <= hi]
        rows.append({"t": round(lo - result.step_wall, 2), "offered": len(sent) * 10.0,
                     "completed": len(done) * 10.0,
                     "r503": sum(1 for o in sent if o.status == 503) * 10.0,
                     "p99_ms": _percentile([o.latency_s * 1000 for o in done], 0.99),
                     "replicas": replicas[-1][1] if replicas else float("nan"),
                     "target": replicas[-1][2] if replicas else float("nan")})
    result.rows = rows
    step = [o for o in result.outcomes if o.scheduled >= result.step_wall]
    failed = sum(1 for o in step if not 200 <= o.status < 300)
    first = next((t - result.step_wall for t, _, target in result.replicas
                  if t >= result.step_wall and target > 1), float("nan"))
    capacity = float("nan")
    after = [r for r in rows if r["t"] >= 0]
    for i in range(len(after) - 4):
        # The first bucket served at >= 95% of offered that starts a 0.5 s window doing so.
        window = after[i:i + 5]
        offered = sum(r["offered"] for r in window)
        if (after[i]["completed"] >= 0.95 * after[i]["offered"]
                and sum(r["completed"] for r in window) >= 0.95 * offered):
            capacity = after[i]["t"] + 0.1
            break
    ok_latencies = [o.latency_s * 1000 for o in step if 200 <= o.status < 300]
    result.summary = {"first_decision_s": first, "capacity_s": capacity,
                      "failed": failed / len(step) if step else float("nan"),
                      "p99_ms": _percentile(ok_latencies, 0.99),
                      "max_replicas": max((r[1] for r in result.replicas), default=0)}


def run_case(name: str, hold_s: float) -> CaseResult:
    system, case, _ = CASES[name]
    port = free_port()
    if system == "surge":
        argv = [sys.executable, str(APPS / "step_surge.py"), str(port), case]
        env = {"SURGE_ADDRESS": f"127.0.0.1:{free_port()}"}
    else:
        argv, env = [ray_python(), str(APPS / "step_ray.py"), str(port), case], {}
    replicas: list[tuple[float, int, int]] = []
    with start_system(name, argv, env) as running:
        stdout = running.process.stdout
        assert stdout is not None

        def read() -> None:
            for line in stdout:
                parts = line.split()
                if len(parts) == 4 and parts[0] == "REPLICAS":
                    replicas.append((float(parts[1]), int(parts[2]), int(parts[3])))

        threading.Thread(target=read, daemon=True).start()
        peak = 3 * CAPACITY_RPS

        def rate(t: float) -> float:
            return 0.1 * CAPACITY_RPS if t < BASELINE_S else peak

        start_wall, outcomes = asyncio.run(run("127.0.0.1", port, "/step", rate,
                                               BASELINE_S + hold_s))
    result = CaseResult(name, start_wall + BASELINE_S, outcomes, list(replicas))
    analyse(result, hold_s)
    return result


def print_case(result: CaseResult) -> None:
    print(f"\n== {result.name}")
    print("     t(s)  offered/s  completed/s  503/s   p99 ms  replicas  target")
    for row in result.rows:
        t = row["t"]
        fine = -0.5 <= t < 3.0
        if fine or abs(t * 10 % 10) < 1e-6:
            print(f"   {t:6.1f}  {row['offered']:9.0f}  {row['completed']:11.0f}  "
                  f"{row['r503']:5.0f}  {row['p99_ms']:7.1f}  {row['replicas']:8.0f}  "
                  f"{row['target']:6.0f}")
    s = result.summary
    print(f"   first decision {s['first_decision_s']:.2f}s  capacity {s['capacity_s']:.2f}s  "
          f"failed {s['failed']:.2%}  p99 {s['p99_ms']:.0f} ms  max replicas "
          f"{s['max_replicas']:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--hold", type=float, default=15.0,
                        help="seconds at peak for fast-reacting cases")
    parser.add_argument("--slow-hold", type=float, default=45.0,
                        help="seconds at peak for cases with Ray's default delays")
    args = parser.parse_args()
    results = []
    for name in [c for c in args.cases.split(",") if c]:
        hold = args.slow_hold if CASES[name][2] else args.hold
        print(f"running {name} (baseline {BASELINE_S:g}s at {0.1 * CAPACITY_RPS:g} req/s, "
              f"then {hold:g}s at {3 * CAPACITY_RPS:g} req/s) ...", flush=True)
        result = run_case(name, hold)
        print_case(result)
        results.append(result)
    print("\n| case | first decision s | capacity s | failed | p99 ms (step) | max replicas |")
    print("|---|---|---|---|---|---|")
    for r in results:
        s = r.summary
        print(f"| {r.name} | {s['first_decision_s']:.2f} | {s['capacity_s']:.2f} | "
              f"{s['failed']:.2%} | {s['p99_ms']:.0f} | {s['max_replicas']:.0f} |")
    out = ROOT / "reports" / "autoscale_step.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({r.name: {"summary": r.summary, "series": r.rows}
                               for r in results}, indent=1))
    print(f"\nseries written to {out}")
    headline = next((r for r in results if r.name == "surge:proactive+standby"), results[-1])
    s = headline.summary
    label = headline.name.split(":", 1)[-1].replace("_", "+")
    ray = next((r.summary for r in results if r.name == "ray:default"), None)
    print(f"summary: policy={label} first_decision_s={s['first_decision_s']:.2f} "
          f"capacity_s={s['capacity_s']:.2f} failed={s['failed']:.4f} "
          f"p99_ms={s['p99_ms']:.0f}"
          + (f" ray_failed={ray['failed']:.4f} ray_p99_ms={ray['p99_ms']:.0f}" if ray else ""))


if __name__ == "__main__":
    main()
