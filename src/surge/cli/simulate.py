"""`surge simulate SCENARIO.yaml`: the pulse on a simulated cluster, and sweeps of it.

    surge simulate examples/scenarios/pulse-1m-qps.yaml --out reports/sim
    surge simulate pulse.yaml --variant proactive --set startup_s=30
    surge simulate pulse.yaml --sweep variant=ray-tuned,proactive --sweep startup_s=10,20

One run writes DIR/report.json, DIR/report.html and plots (the `surge pulse` format) and
prints its tables; a sweep writes one such directory per run plus DIR/sweep.md and
DIR/sweep.json, and prints one row per run. Exit status 2 for a bad scenario.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "simulate_command"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "simulate", help="simulate a pulse on a cluster of any size, with a report",
        description="Run a scenario (cluster, service, traffic, deployment config, SLO) "
                    "on virtual time with the production autoscaling, routing and "
                    "admission policies, and write the `surge pulse` report.")
    parser.add_argument("scenario", help="scenario YAML (see examples/scenarios/)")
    parser.add_argument("--out", metavar="DIR",
                        help="report directory (default reports/simulate-TIME)")
    parser.add_argument("--variant", metavar="NAME", help="run one of the scenario's variants")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario value (dotted path or alias; repeatable)")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="run every value (repeatable: the cartesian product); "
                             "KEY may be `variant`")
    parser.add_argument("--no-html", action="store_true",
                        help="write report.json only (no HTML, no plots)")


def _sets(args: argparse.Namespace) -> dict[str, Any]:
    import yaml

    from surge.sim.scenario import ScenarioError

    overrides: dict[str, Any] = {}
    for text in args.set:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ScenarioError(f"--set {text!r}: expected KEY=VALUE")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def simulate_command(args: argparse.Namespace) -> int:
    """Base scenario <- --variant <- --set; a sweep's axes go over that."""
    from surge.sim.report import report_text, write_sim_report
    from surge.sim.scenario import ScenarioError, load_scenario
    from surge.sim.sweep import parse_sweep, run_sweep, simulate, sweep_table, variant_overrides

    out = Path(args.out or f"reports/simulate-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        scenario = load_scenario(args.scenario)
        overrides = variant_overrides(scenario, args.variant) if args.variant else {}
        overrides.update(_sets(args))
        if overrides:
            scenario = scenario.with_overrides(overrides)
        axes = parse_sweep(args.sweep)
        if axes:
            runs = run_sweep(scenario, axes, out, not args.no_html, progress=_progress)
            print(sweep_table(runs))
            print(f"\nreports: {out.resolve()}/*/report.html\ntable:   "
                  f"{(out / 'sweep.md').resolve()}")
            return 0
        run = simulate(scenario, label=args.variant or "")
    except ScenarioError as exc:
        print(f"surge simulate: {exc}", file=sys.stderr)
        return 2
    if args.no_html:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(run.report, indent=1) + "\n")
        shown = out / "report.json"
    else:
        shown = write_sim_report(run.report, out)["html"]
    print(report_text(run.report))
    print(f"\nreport: {shown.resolve()}")
    return 0


def _progress(run: Any) -> None:
    s = run.summary
    print(f"surge simulate: {run.label}: {100 * (s['slo_ok_fraction'] or 0):.3f}% within SLO, "
          f"{s['oracle_ratio']:.3f}x oracle ({run.report['simulation']['wall_s']} s)",
          file=sys.stderr, flush=True)
