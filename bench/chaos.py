"""Chaos, the long version: the scenarios of tests/chaos with longer and harder load.

    python bench/chaos.py [--quick] [--only NAME ...] [--out reports/chaos]

Runs every scenario of tests/chaos/scenarios.py (SIGKILL a replica, the proxy, the
controller; a replica that hangs; a constructor that raises; 2x and 10x overload of a
deployment with bounded capacity), each on a fresh surge instance started by this
process, under open-loop load from `surge pulse`'s generator. The long profile: 400
req/s with 10 s of warm-up and 30 s after each fault; the overloads warm up 10 s and
then run 60 s. `--quick` uses the test suite's short profile (~1 min in all).

Prints one line per scenario as it finishes, then the table (also written to
OUT/table.md), the details of each run (notes, every surviving process's RSS at the end
of the warm-up and at the end, problems), and `summary: ...`. The pulse report of
each run goes to OUT/<scenario>.json. Exit code 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos.harness import Outcome, details, table
from tests.chaos.scenarios import LONG, SHORT, all_scenarios, run_scenario

from bench.common import ROOT, exit_on_sigterm


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the test suite's short profile")
    parser.add_argument("--only", nargs="*", default=[],
                        help="scenarios whose name contains one of these words")
    parser.add_argument("--out", default=str(ROOT / "reports" / "chaos"))
    args = parser.parse_args(argv)
    exit_on_sigterm()
    profile = SHORT if args.quick else LONG
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scenarios = [s for s in all_scenarios()
                 if not args.only or any(word in s.name for word in args.only)]
    print(f"chaos, {profile.name} profile: {len(scenarios)} scenarios; fault scenarios at "
          f"{profile.rps:g} req/s, {profile.warmup_s:g} s warm-up + {profile.after_s:g} s; "
          f"overloads {profile.warmup_s:g} s + {profile.overload_s:g} s", flush=True)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    for scenario in scenarios:
        began = time.monotonic()
        outcome = run_scenario(scenario, profile)
        outcomes.append(outcome)
        (out / f"{slug(scenario.name)}.json").write_text(json.dumps(outcome.report, indent=1))
        verdict = "ok" if not outcome.problems else f"FAILED: {'; '.join(outcome.problems)}"
        print(f"{scenario.name}: {time.monotonic() - began:.0f} s, {verdict}", flush=True)
    text = table(outcomes)
    (out / "table.md").write_text(text + "\n")
    print()
    print(text)
    print()
    for outcome in outcomes:
        print(details(outcome))
    failed = [o.scenario for o in outcomes if o.problems]
    worst = max((abs(c.change) for o in outcomes for c in o.memory), default=0.0)
    print(f"\ntable written to {out / 'table.md'} ({time.monotonic() - started:.0f} s)")
    print(f"summary: profile={profile.name} scenarios={len(outcomes)} failed={len(failed)} "
          f"unanswered={sum(o.counts.unanswered for o in outcomes)} "
          f"timeouts={sum(o.counts.timeout for o in outcomes)} worst_rss_change={worst:.3f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
