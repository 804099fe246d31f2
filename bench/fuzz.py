"""The fuzz suite, longer: hostile HTTP and frames against a real instance, as a table.

    python bench/fuzz.py [--scale 10] [--seed random|derandomize]

Runs `pytest tests/fuzz` with SURGE_FUZZ_SCALE examples multiplied by `--scale` (CI runs
scale 1, derandomized) and prints, per attack, how many messages were sent and how the
proxy (or the replica/controller, for frames) ended each one: a status (or several for
pipelined requests), `closed` (no answer, connection closed), `waiting` (frames: the peer
kept reading), and the two failures: `hang` and any 5xx. Then the steady client's
requests and failures and whether every surge process is still alive.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=10.0)
    parser.add_argument("--seed", choices=("random", "derandomize"), default="random")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        report_path = Path(folder) / "fuzz.json"
        env = {**os.environ, "SURGE_FUZZ_SCALE": str(args.scale),
               "SURGE_FUZZ_REPORT": str(report_path), "SURGE_LOG_LEVEL": "WARNING",
               "CI": "true" if args.seed == "derandomize" else ""}
        start = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "pytest", "tests/fuzz", "-q", "-p",
                              "no:cacheprovider", "-o", "timeout=3600"], cwd=ROOT, env=env,
                             capture_output=True, text=True)
        elapsed = time.monotonic() - start
        summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
        if not report_path.exists():
            print(run.stdout[-4000:], run.stderr[-4000:], sep="\n")
            return 1
        report = json.loads(report_path.read_text())
    print_table(report, args.scale, elapsed, summary)
    if run.returncode != 0:
        print(run.stdout[-6000:])
    return run.returncode


def print_table(report: dict[str, object], scale: float, elapsed: float, summary: str) -> None:
    attacks = report["attacks"]
    assert isinstance(attacks, dict)
    print(f"fuzz suite at scale {scale:g}: {summary} in {elapsed:.0f} s")
    print()
    print("| attack | sent | outcomes | 5xx | hangs |")
    print("|---|---|---|---|---|")
    total = fives = hangs = 0
    for attack, outcomes in attacks.items():
        sent = sum(outcomes.values())
        five = sum(n for label, n in outcomes.items() if re.search(r"\b5\d\d\b", label))
        hang = outcomes.get("hang", 0)
        shown = ", ".join(f"{label} {n}" for label, n in
                          sorted(outcomes.items(), key=lambda item: -item[1])[:5])
        more = len(outcomes) - 5
        shown += f", +{more} more" if more > 0 else ""
        print(f"| {attack} | {sent} | {shown} | {five} | {hang} |")
        total, fives, hangs = total + sent, fives + five, hangs + hang
    processes = report["processes"]
    assert isinstance(processes, dict)
    print(f"| **all** | **{total}** | | **{fives}** | **{hangs}** |")
    print()
    print(f"steady client beside the attacks: {report['steady_ok']} requests answered 200, "
          f"{report['steady_failures']} failed; surge processes alive at the end: "
          f"{sum(processes.values())}/{len(processes)}")


if __name__ == "__main__":
    sys.exit(main())
