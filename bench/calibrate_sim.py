"""Calibration: the same small pulse against real surge and in `surge simulate`.

    python bench/calibrate_sim.py [--cases proactive,proactive+standby,ray-tuned]
                                  [--scenario examples/scenarios/calibration.yaml] [--reps 3]

For each case (a variant of the scenario) it starts surge on this machine with a
deployment whose handler *sleeps* a lognormal service time (no CPU burnt, so a 2-core
box stands for many GPUs) and whose constructor sleeps 1 s (the model load), offers the
scenario's pulse with `surge pulse`'s generator (open loop, Poisson arrivals), then
simulates the same scenario with two inputs measured in those runs:

* start-up: the controller's "started in X s" log lines (ask -> ready), as a constant
  (their mean) or a lognormal (their mean and p99) when they vary;
* overhead: proxy + router + loopback latency, the baseline's p50 minus the service
  time's median.

It prints measured vs simulated failed fraction (of the pulse's requests), p99 of the
pulse's 2xx, and time to capacity (sim/report.py's definition, applied to both series),
side by side with the targets: failed within +-1 percentage point, p99 within 25%, time
to capacity within max(20%, 150 ms). Each case runs `--reps` times for real and as many
times simulated, with seeds seed, seed+1, ... for the arrivals on both sides; medians are
compared and the real runs' range is shown: a small Poisson pulse varies from run to
run, and the machine is shared.
Reports go to reports/calibration/<case>/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, free_port
from surge.loadtest.options import PulseOptions
from surge.loadtest.runner import run_pulse
from surge.loadtest.schedule import Schedule
from surge.sim.report import time_to_capacity, write_sim_report
from surge.sim.scenario import Scenario, load_scenario
from surge.sim.sweep import simulate, variant_overrides

APP = Path(__file__).resolve().parent / "apps" / "calibrate_surge.py"
SCENARIO = ROOT / "examples" / "scenarios" / "calibration.yaml"
INIT_S = 1.0
STARTED = re.compile(r"started in ([\d.]+)s")


def _app_config(scenario: Scenario) -> dict[str, Any]:
    service = scenario.service.time_s.scaled(1.0)
    deployment = scenario.raw["deployment"]
    options = {k: v for k, v in deployment.items() if k not in ("name", "ray_actor_options")}
    return {"init_s": INIT_S, "mu": service.a, "sigma": service.b, "deployment": options}


def _start_app(scenario: Scenario, log: Path) -> tuple[subprocess.Popen[str], str, str]:
    port, control = free_port(), f"127.0.0.1:{free_port()}"
    env = {**os.environ, "SURGE_ADDRESS": control, "SURGE_LOG_LEVEL": "INFO",
           "PYTHONPATH": str(ROOT / "src")}
    stderr = log.open("w")
    process = subprocess.Popen(
        [sys.executable, str(APP), str(port), json.dumps(_app_config(scenario))],
        stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=ROOT,
        start_new_session=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("READY"):
        _stop(process)
        raise RuntimeError(f"the calibration app did not start: {line!r}; see {log}")
    return process, line.split()[1], control


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def measure(scenario: Scenario, out: Path,
            seed: int) -> tuple[dict[str, Any], list[float]]:
    """The real pulse's report and the start-up times the controller logged."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "surge.log"
    process, url, control = _start_app(scenario, log)
    try:
        before = len(STARTED.findall(log.read_text()))
        traffic = scenario.traffic
        options = PulseOptions(url=url, schedule=traffic.schedule, arrivals=traffic.arrivals,
                               seed=seed, slo_ms=scenario.slo_ms,
                               timeout_s=traffic.timeout_s, surge_address=control)
        result = run_pulse(options, quiet=True)
        time.sleep(0.5)
    finally:
        _stop(process)
    startups = [float(x) for x in STARTED.findall(log.read_text())[before:]]
    (out / "measured.json").write_text(json.dumps(result.report, indent=1) + "\n")
    return result.report, startups


def _startup_spec(startups: list[float], fallback: Any) -> Any:
    if not startups:
        return fallback
    ordered = sorted(startups)
    mean = sum(ordered) / len(ordered)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    if len(ordered) < 3 or p99 < mean * 1.05:
        return round(mean, 3)
    return {"distribution": "lognormal", "mean": round(mean, 3), "p99": round(p99, 3)}


def _failed(report: dict[str, Any]) -> float:
    pulse = report["summary"]["pulse"]
    return 1 - pulse["ok"] / pulse["sent"] if pulse["sent"] else 0.0


def _figures(report: dict[str, Any], schedule: Schedule,
             per_replica: float) -> tuple[float, float | None, float | None]:
    """(failed fraction, p99 ms, time to capacity s) of the pulse."""
    return (_failed(report), report["summary"]["pulse"]["p99_ms"],
            time_to_capacity(report["series"], schedule, per_replica))


def _median(values: list[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    if len(known) * 2 <= len(values):  # "never" in most runs
        return None
    middle = len(known) // 2
    return known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2


def compare(case: str, base: Scenario, out: Path, reps: int = 1) -> dict[str, Any]:
    """Median figures of `reps` real runs and of `reps` simulations (seeds seed..)."""
    scenario = base.with_overrides(variant_overrides(base, case))
    schedule, per_replica = scenario.traffic.schedule, scenario.per_replica_rps
    measured = [measure(scenario, out / f"rep{rep}", scenario.seed + rep)
                for rep in range(reps)]
    startups = [t for _, seen in measured for t in seen]
    service_p50_ms = scenario.service.time_s.quantile(0.5) * 1000
    overhead_ms = round(_median([max(0.0, (r["summary"]["baseline"]["p50_ms"] or 0.0)
                                     - service_p50_ms) for r, _ in measured]) or 0.0, 2)
    startup = _startup_spec(startups, scenario.raw["cluster"]["startup_s"])
    real = [_figures(report, schedule, per_replica) for report, _ in measured]
    simulated = []
    for rep in range(reps):
        run = simulate(scenario, {"startup_s": startup, "overhead_ms": overhead_ms,
                                  "seed": scenario.seed + rep}, case)
        write_sim_report(run.report, out / f"simulated{rep}")
        simulated.append(_figures(run.report, schedule, per_replica))
    row: dict[str, Any] = {"case": case, "startup": startup, "startups_seen": len(startups),
                           "overhead_ms": overhead_ms, "reps": reps,
                           "behind": sum(r["summary"]["generator"]["behind"]
                                         for r, _ in measured)}
    for index, name in enumerate(("failed", "p99_ms", "ttc_s")):
        row[name] = (_median([r[index] for r in real]),
                     _median([r[index] for r in simulated]))
        row[f"{name}_range"] = [r[index] for r in real]
    return row


def _verdicts(row: dict[str, Any]) -> tuple[bool, bool, bool]:
    (fm, fs), (pm, ps), (tm, ts) = row["failed"], row["p99_ms"], row["ttc_s"]
    failed_ok = fm is not None and fs is not None and abs(fm - fs) <= 0.01
    p99_ok = pm is not None and ps is not None and abs(ps - pm) <= 0.25 * pm
    ttc_ok = (tm is None and ts is None) or (
        tm is not None and ts is not None and abs(ts - tm) <= max(0.2 * tm, 0.15))
    return failed_ok, p99_ok, ttc_ok


def _fmt_s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _spread(values: list[float | None], fmt: str) -> str:
    known = [v for v in values if v is not None]
    if len(values) < 2 or not known:
        return ""
    return f" [{fmt.format(min(known))}..{fmt.format(max(known))}]"


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\nmedians of {rows[0]['reps']} real runs [their range] / of as many simulations")
    print("\n| case | failed | p99 (pulse) | time to capacity | start-up (measured) | "
          "overhead |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        ok = ["ok" if v else "MISS" for v in _verdicts(row)]
        (fm, fs), (pm, ps), (tm, ts) = row["failed"], row["p99_ms"], row["ttc_s"]
        startup = row["startup"]
        startup_text = (f"{startup:g} s" if isinstance(startup, int | float)
                        else f"mean {startup['mean']:g} s, p99 {startup['p99']:g} s")
        failed_range = _spread([100 * v for v in row["failed_range"]], "{:.2f}%")
        p99_range = _spread(row["p99_ms_range"], "{:.0f}")
        ttc_range = _spread(row["ttc_s_range"], "{:.2f}")
        print(f"| {row['case']} | {100 * (fm or 0):.2f}%{failed_range} / "
              f"{100 * (fs or 0):.2f}% ({ok[0]}) | {pm or 0:.0f}{p99_range} / {ps or 0:.0f} ms "
              f"({ok[1]}) | {_fmt_s(tm)}{ttc_range} / {_fmt_s(ts)} ({ok[2]}) | "
              f"{startup_text} ({row['startups_seen']} seen) | {row['overhead_ms']:g} ms |")
    behind = [f"{row['case']} ({row['behind']} of {row['reps']})" for row in rows
              if row["behind"]]
    if behind:
        print(f"\nWARNING: the generator fell behind its schedule (the machine stalled) in "
              f"{', '.join(behind)}: those measured latencies and 503s include the stall.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=str(SCENARIO))
    parser.add_argument("--cases", help="variants to run (default: all of the scenario's)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "calibration"))
    parser.add_argument("--reps", type=int, default=3,
                        help="real runs (and simulations) per case; medians are compared")
    args = parser.parse_args()
    base = load_scenario(args.scenario)
    cases = args.cases.split(",") if args.cases else list(base.variants)
    rows = []
    for case in cases:
        print(f"calibrating {case}: real surge, then the simulator ...", flush=True)
        row = compare(case, base, Path(args.out) / case, args.reps)
        rows.append(row)
        (fm, fs), (pm, ps), (tm, ts) = row["failed"], row["p99_ms"], row["ttc_s"]
        print(f"  medians: failed {100 * (fm or 0):.2f}% / {100 * (fs or 0):.2f}%  p99 {pm} / "
              f"{ps} ms  time to capacity {_fmt_s(tm)} / {_fmt_s(ts)}", flush=True)
    print_table(rows)


if __name__ == "__main__":
    main()
