"""Handle calls from the driver: surge vs Ray Serve 2.60, in the same run.

    python bench/handles.py [--quick] [--duration 3] [--bursts 5] [--systems surge,ray]
                            [--runs 3]

A deployment `Echo` whose `__call__(self, x)` returns x (a plain method, and an
`async def` variant), max_ongoing_requests=100. Each system is measured by its own driver
subprocess (bench/apps/handles_driver.py; surge from this Python with SURGE_ADDRESS on a
free port, Ray from the Ray 2.60 virtualenv), which prints its figures as one JSON line:

  (a) sequential `handle.remote(i).result()` calls/s, ~3 s after 300 warm-up calls;
  (b) sequential `await handle.remote(i)` inside `asyncio.run`, ~3 s;
  (c) bursts of 1,000 concurrent awaited calls
      (`await asyncio.gather(*[handle.remote(i) for i in range(1000)])`), 5 times:
      min/median/max seconds, runs over 0.2 s flagged.

With `--runs N` both systems are measured N times, taking turns (surge, ray, surge, ...),
and the last `summary:` line gives the median of each figure over the N runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import APPS, driver, exit_on_sigterm, free_port, surge_env, system_python

SLOW_BURST_S = 0.2


def run_driver(system: str, args: argparse.Namespace) -> dict[str, Any]:
    argv = [system_python(system), str(APPS / "handles_driver.py"), "--system", system,
            "--port", str(free_port()), "--duration", str(args.duration),
            "--bursts", str(args.bursts), "--burst-size", str(args.burst_size)]
    env = surge_env() if system == "surge" else {}
    timeout = 120 + 2 * (2 * args.duration + args.bursts * 10 + 30)
    with driver(system, argv, env) as running:
        try:
            _, line = running.wait_line("JSON ", timeout)
        except RuntimeError as exc:
            return {"system": system, "fatal": str(exc), "variants": {}, "errors": []}
        result: dict[str, Any] = json.loads(line[5:])
        if result.get("fatal"):
            result["fatal"] += "\n" + running.stderr_tail()
        return result


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 s phases, 3 bursts")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--bursts", type=int, default=5)
    parser.add_argument("--burst-size", type=int, default=1000)
    parser.add_argument("--systems", default="surge,ray")
    parser.add_argument("--runs", type=int, default=1, help="repeat; summary of medians")
    args = parser.parse_args()
    exit_on_sigterm()
    if args.quick:
        args.duration, args.bursts = 1.0, 3
    systems = [s for s in args.systems.split(",") if s]
    summaries = []
    for run in range(args.runs):
        if args.runs > 1:
            print(f"\n=== run {run + 1} of {args.runs}", flush=True)
        summaries.append(measure_and_report(systems, args))
    if args.runs > 1:
        print(f"\nmedians of {args.runs} runs")
        print("summary: " + " ".join(
            f"{key}={_median([s[key] for s in summaries]):{spec}}" for key, spec in FIGURES))


def _median(values: list[float]) -> float:
    """Of the runs that measured it (a system that failed to start gives NaN)."""
    measured = [v for v in values if v == v]
    return statistics.median(measured) if measured else float("nan")


FIGURES = [("surge_seq_per_s", ".0f"), ("ray_seq_per_s", ".0f"), ("ratio_seq", ".2f"),
           ("surge_burst1000_s", ".3f"), ("ray_burst1000_s", ".3f"),
           ("surge_await_per_s", ".0f"), ("ray_await_per_s", ".0f"),
           ("surge_async_seq_per_s", ".0f"), ("ray_async_seq_per_s", ".0f"),
           ("surge_async_burst1000_s", ".3f"), ("ray_async_burst1000_s", ".3f")]


def measure_and_report(systems: list[str], args: argparse.Namespace) -> dict[str, float]:
    """One run of each system: the table, the flags and a `summary:` line; its figures."""
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for system in systems:
        print(f"== {system}: driver running (~{2 * (2 * args.duration + 5):.0f} s + start)",
              flush=True)
        results[system] = result = run_driver(system, args)
        if result.get("fatal"):
            print(f"   {system} FAILED: {result['fatal']}", flush=True)
        for error in result.get("errors", []):
            print(f"   {system} error: {error}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)

    def get(system: str, variant: str, key: str, sub: str | None = None) -> Any:
        value = results.get(system, {}).get("variants", {}).get(variant, {}).get(key)
        if value is not None and sub is not None:
            value = value.get(sub)
        return value

    print()
    print(f"| system | variant | start s | deploy s | .result() calls/s | await calls/s "
          f"| burst {args.burst_size} min s | median s | max s | runs > {SLOW_BURST_S} s "
          "| all burst runs s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for system in systems:
        for variant in ("sync", "async"):
            runs = get(system, variant, "burst_s") or []
            slow = sum(1 for r in runs if r > SLOW_BURST_S)
            print(f"| {system} {results[system].get('version', '')} | {variant} "
                  f"| {fmt(results[system].get('start_s'), '.2f')} "
                  f"| {fmt(get(system, variant, 'deploy_s'), '.2f')} "
                  f"| {fmt(get(system, variant, 'seq_result', 'per_s'))} "
                  f"| {fmt(get(system, variant, 'seq_await', 'per_s'))} "
                  f"| {fmt(min(runs) if runs else None, '.3f')} "
                  f"| {fmt(statistics.median(runs) if runs else None, '.3f')} "
                  f"| {fmt(max(runs) if runs else None, '.3f')} "
                  f"| {slow}/{len(runs)}{' SLOW' if slow else ''} "
                  f"| {', '.join(f'{r:.3f}' for r in runs)} |")
    print()
    for system in systems:
        for variant in ("sync", "async"):
            for key in ("seq_result", "seq_await"):
                worst = get(system, variant, key, "max_call_ms")
                if worst is not None:
                    print(f"{system} {variant} {key}: slowest single call {worst:.1f} ms")
    for system in systems:
        for variant in ("sync", "async"):
            runs = get(system, variant, "burst_s") or []
            for i, r in enumerate(runs):
                if r > SLOW_BURST_S:
                    print(f"FLAG: {system} {variant} burst run {i + 1} took {r:.3f} s "
                          f"(> {SLOW_BURST_S} s)")

    def seq(system: str, variant: str = "sync", key: str = "seq_result") -> float:
        value = get(system, variant, key, "per_s")
        return float(value) if value is not None else float("nan")

    def burst(system: str, variant: str = "sync") -> float:
        runs = get(system, variant, "burst_s")
        return statistics.median(runs) if runs else float("nan")

    ratio = seq("surge") / seq("ray") if seq("ray") else float("nan")
    print()
    print(f"surge/ray sequential .result() calls/s (sync Echo): {ratio:.2f}x")
    figures = {
        "surge_seq_per_s": seq("surge"), "ray_seq_per_s": seq("ray"), "ratio_seq": ratio,
        "surge_burst1000_s": burst("surge"), "ray_burst1000_s": burst("ray"),
        "surge_await_per_s": seq("surge", key="seq_await"),
        "ray_await_per_s": seq("ray", key="seq_await"),
        "surge_async_seq_per_s": seq("surge", "async"),
        "ray_async_seq_per_s": seq("ray", "async"),
        "surge_async_burst1000_s": burst("surge", "async"),
        "ray_async_burst1000_s": burst("ray", "async"),
    }
    print("summary: " + " ".join(f"{key}={figures[key]:{spec}}" for key, spec in FIGURES))
    return figures


if __name__ == "__main__":
    main()
