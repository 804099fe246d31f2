"""The HTTP/2 conformance table of surge's gRPC port, by section.

    python bench/h2_conformance.py [--target HOST:PORT] [--against REF] [--codec hyper]

Runs every case of tests/proxy/h2_conformance.py (h2spec 2.6's 147 cases for RFC 9113
and RFC 7541, written again as gRPC calls, and surge's own extra rules) and prints, per
group and section, how many passed and failed, then each failure and why. Without
`--target` it starts the gRPC ingress this checkout ships on a loopback port in this
process (the same port the tests use); with it, it runs against any gRPC server that
answers Ray's `/ray.serve.RayServeAPIService/Healthz` (a running `surge run`, or Ray
Serve's own gRPC proxy). `--against REF` runs the same table, in a child process, against
the ingress of git revision REF too (its `src/`, extracted to a temporary directory), so
a change's before and after come from one run. `--codec hyper` runs the ingress with
python-hyper's h2 behind its gRPC core instead of surge's own HTTP/2 (bench/h2_hyper.py).
The last line is `summary: ...`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.proxy.h2_client import serving  # noqa: E402
from tests.proxy.h2_conformance import CASES, run_case  # noqa: E402


def run_table(port: int, host: str) -> dict[str, str | None]:
    return {item.id: run_case(item, port, host) for item in CASES}


def report(results: dict[str, str | None], label: str) -> str:
    passed: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for item in CASES:
        key = f"{item.group} {item.section}"
        (failed if results[item.id] else passed)[key] += 1
    lines = [f"#### {label}", "", "| group | section | passed | failed |", "|---|---|---|---|"]
    for key in dict.fromkeys(f"{item.group} {item.section}" for item in CASES):
        group, section = key.split(" ")
        lines.append(f"| {group} | {section} | {passed[key]} | {failed[key]} |")
    for group in ("generic", "http2", "hpack", "surge"):
        ids = [item.id for item in CASES if item.group == group]
        bad = sum(1 for case_id in ids if results[case_id])
        lines.append(f"| **{group}** | all | **{len(ids) - bad}** | **{bad}** |")
    failures = [(case_id, why) for case_id, why in results.items() if why]
    if failures:
        lines += ["", "Failed:", ""]
        lines += [f"- `{case_id}`: {why}" for case_id, why in failures]
    return "\n".join(lines)


def summary(results: dict[str, str | None], prefix: str) -> str:
    h2spec = [item.id for item in CASES if item.group != "surge"]
    extra = [item.id for item in CASES if item.group == "surge"]
    return (f"{prefix}h2spec_passed={sum(not results[i] for i in h2spec)} "
            f"{prefix}h2spec_cases={len(h2spec)} "
            f"{prefix}surge_passed={sum(not results[i] for i in extra)} "
            f"{prefix}surge_cases={len(extra)}")


def against(ref: str) -> str:
    """The table's report for git revision `ref`'s ingress, from a child process."""
    with tempfile.TemporaryDirectory(prefix="surge-h2-ref-") as directory:
        archive = subprocess.run(["git", "archive", ref, "src"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        archive_path = Path(directory) / "src.tar"
        archive_path.write_bytes(archive)
        with tarfile.open(archive_path) as tar:
            tar.extractall(directory, filter="data")
        env = {**os.environ, "PYTHONPATH": f"{directory}/src:{ROOT}"}
        child = subprocess.run([sys.executable, __file__, "--label", ref], env=env,
                               capture_output=True, text=True, timeout=1800)
        return child.stdout.strip() or child.stderr.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="HOST:PORT of a running gRPC server")
    parser.add_argument("--against", help="a git revision whose ingress runs the table too")
    parser.add_argument("--codec", choices=("surge", "hyper"), default="surge",
                        help="the HTTP/2 stack of the in-process ingress")
    parser.add_argument("--label", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.codec == "hyper":
        from bench.h2_hyper import install

        install()
    started = time.monotonic()
    if args.target:
        host, port = args.target.rsplit(":", 1)
        results = run_table(int(port), host)
        label = f"the server at {args.target}"
    else:
        with serving() as port:
            results = run_table(port, "127.0.0.1")
        label = f"surge's gRPC ingress at {args.label or 'this checkout'}" + (
            ", on python-hyper's h2" if args.codec == "hyper" else "")
    print(report(results, f"{label} ({len(CASES)} cases, {time.monotonic() - started:.1f} s)"))
    line = summary(results, "")
    if args.against:
        print()
        before = against(args.against)
        print(before.rsplit("\nsummary: ", 1)[0])
        line += " " + summary_of(before, "before_")
    print()
    print(f"summary: {line}")
    return 0 if all(why is None for why in results.values()) else 1


def summary_of(report_text: str, prefix: str) -> str:
    last = report_text.rsplit("summary: ", 1)[-1]
    return " ".join(prefix + pair for pair in last.split())


if __name__ == "__main__":
    sys.exit(main())
