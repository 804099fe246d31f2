"""The figures the README quotes, kept in one file: bench/results.json.

Every benchmark ends with one line `summary: key=value ...`. `record` keeps that line's
figures for a script, with the date and the commit of the run, in results.json:

    .venv/bin/python bench/handles.py --runs 3 | tee /tmp/handles.log
    .venv/bin/python bench/results.py record handles --command "bench/handles.py --runs 3" \\
        --note "a clean clone, quiet machine" < /tmp/handles.log
    .venv/bin/python bench/results.py render --write    # the README's table from the file

The README's benchmark table is written from the file by `render` (ROWS says which
figure goes in which cell) between two markers, never by hand;
tests/test_bench_results.py fails when the two disagree. Recording is a step of its
own, so a quick or partial run never replaces the figures the README quotes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
README = ROOT / "README.md"
BEGIN = "<!-- benchmark table: bench/results.json, written by `bench/results.py render --write` -->"
END = "<!-- end of benchmark table -->"

Figures = dict[str, float | int | str]


@dataclass(frozen=True)
class Row:
    what: str  # may use the run's figures too
    script: str  # the results.json entry (bench/<script>.py)
    surge: str  # str.format templates over the run's figures
    ray: str


ROWS = (
    Row("echo over HTTP, 64 connections", "http_echo",
        "{surge_rps_c64:,.0f} req/s (default); {surge_mor100_rps_c64:,.0f} "
        "(`max_ongoing_requests=100`)",
        "{ray_mor100_rps_c64:,.0f} req/s (`max_ongoing_requests=100`)"),
    Row("echo p99, 8 connections (a one-process uvloop+httptools server: "
        "{raw_p99_c8_ms:.2f} ms)", "http_echo",
        "{surge_p99_c8_ms:.2f} ms (default); {surge_mor100_p99_c8_ms:.2f} ms "
        "(`max_ongoing_requests=100`)",
        "{ray_mor100_p99_c8_ms:.2f} ms (`max_ongoing_requests=100`)"),
    Row("sequential handle calls", "handles",
        "{surge_seq_per_s:,.0f}/s (sync), {surge_async_seq_per_s:,.0f}/s (async)",
        "{ray_seq_per_s:,.0f}/s, {ray_async_seq_per_s:,.0f}/s"),
    Row("from start to the first 200", "startup",
        "{surge_first_200_s:.2f} s", "{ray_first_200_s:.2f} s"),
    Row("idle memory, all processes (PSS)", "memory",
        "{surge_pss_mib:.1f} MiB", "{ray_pss_mib:.1f} MiB"),
    Row("25 -> 750 req/s step: failed / p99", "autoscale_step",
        "{failed:.2%} / {p99_ms:,.0f} ms (`{policy}`)",
        "{ray_failed:.2%} / {ray_p99_ms:,.0f} ms (defaults)"),
)


# -- recording ----------------------------------------------------------------------------


def parse_summary(output: str) -> Figures:
    """The figures of the last `summary:` line in a script's output."""
    lines = [line.strip().strip("`") for line in output.splitlines()]
    found = [line for line in lines if line.startswith("summary:")]
    if not found:
        raise ValueError("no `summary: key=value ...` line in the output")
    figures: Figures = {}
    for pair in found[-1].removeprefix("summary:").split():
        key, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"not key=value in the summary line: {pair!r}")
        figures[key] = _number(text)
    return figures


def _number(text: str) -> float | int | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def entry(figures: Figures, *, date: str, commit: str, command: str, note: str = "") -> dict[
        str, Any]:
    return {"date": date, "commit": commit, "command": command, "note": note,
            "figures": figures}


def record(results: dict[str, Any], script: str, run: dict[str, Any]) -> dict[str, Any]:
    """results with `script`'s run replaced by `run` (the other scripts' runs kept)."""
    return {**results, script: run}


def head_commit() -> str:
    """The checkout's commit, `-dirty` when tracked files differ from it."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                             cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return commit + ("-dirty" if changed.strip() else "")


def load(path: Path = RESULTS) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def dump(results: dict[str, Any], path: Path = RESULTS) -> None:
    path.write_text(json.dumps(results, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


# -- rendering ----------------------------------------------------------------------------


def render(results: dict[str, Any]) -> str:
    """The README's table, from results.json: each row says which run it comes from."""
    lines = ["| what | surge | Ray Serve 2.60 | measured |", "|---|---|---|---|"]
    for row in ROWS:
        run = results[row.script]
        figures = run["figures"]
        try:
            cells = [row.what.format(**figures), row.surge.format(**figures),
                     row.ray.format(**figures)]
        except KeyError as missing:
            raise KeyError(f"bench/results.json: {row.script}'s run has no figure "
                           f"{missing}") from None
        when = f"`bench/{row.script}.py`, {run['date']}, {run['commit']}"
        lines.append("| " + " | ".join([*cells, when]) + " |")
    return "\n".join(lines)


def readme_table(readme: str) -> str:
    """The table between the markers in the README's text."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no benchmark table between {BEGIN!r} and {END!r}")
    return readme[start + len(BEGIN):end].strip("\n")


def with_table(readme: str, table: str) -> str:
    readme_table(readme)  # both markers are there
    start, end = readme.find(BEGIN) + len(BEGIN), readme.find(END)
    return readme[:start] + "\n" + table + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record", help="keep a run's summary line (read from stdin)")
    rec.add_argument("script", help="the bench script's name, e.g. handles")
    rec.add_argument("--command", help="how it was run (default: bench/SCRIPT.py)")
    rec.add_argument("--note", default="", help="where and how: the machine, its load")
    rec.add_argument("--commit", help="the commit measured (default: this checkout's HEAD)")
    ren = sub.add_parser("render", help="print the README's table; --write puts it there")
    ren.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    if args.action == "record":
        today = datetime.datetime.now(datetime.UTC).date().isoformat()
        run = entry(parse_summary(sys.stdin.read()), date=today,
                    commit=args.commit or head_commit(),
                    command=args.command or f"bench/{args.script}.py", note=args.note)
        dump(record(load(), args.script, run))
        print(f"recorded {args.script}: {run['date']} {run['commit']}")
    elif args.write:
        README.write_text(with_table(README.read_text(), render(load())))
    else:
        print(render(load()))


if __name__ == "__main__":
    main()
