"""A/B: this checkout's surge against another revision's, measured by the same benchmark.

    python bench/ab.py --ref 9430eea [--rounds 3] -- bench/http_echo.py --systems surge

Runs the benchmark command `--rounds` times for each side, interleaved (A B, then B A, ...,
so neither side always runs first on a warmer or busier host). Both sides run this
checkout's bench/ files; side A imports surge from this checkout's src/, side B from a
`git worktree` of REF (PYTHONPATH, inherited by every process the benchmark starts:
driver, controller, proxies, replicas), so only the serving code differs. Run it from a
clean clone to measure a commit rather than a working tree. Before measuring, each
side is checked to import surge from where it should. Each run's last `summary: k=v ...`
line is read; the table gives, per key both sides print, each side's median and B/A
(ratio of medians) with every run's value, and the last line is `summary:` of the
medians (`ref_*` for side B).

The benchmark must be able to run surge alone (`--systems surge`): Ray Serve, the anchor
of the benchmarks themselves, is the same on both sides and only costs time here. A
benchmark option REF's code does not know fails side B's runs, and the table says so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.results import parse_summary  # noqa: E402


def figures_of(output: str) -> dict[str, float]:
    """The numbers of a run's last `summary:` line (none when it printed none; a text or
    nan, a system that did not run, left out)."""
    try:
        found = parse_summary(output)
    except ValueError:
        return {}
    return {key: float(value) for key, value in found.items()
            if isinstance(value, (int, float)) and value == value}


def side_env(src: Path) -> dict[str, str]:
    """Every process the bench starts imports surge from `src` (also side A: the venv's
    editable install may point at another checkout than the one this file is in)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    return env


def check_import(env: dict[str, str], expected: Path) -> None:
    where = subprocess.run([sys.executable, "-c", "import surge; print(surge.__file__)"],
                           env=env, capture_output=True, text=True, check=True).stdout
    if not Path(where.strip()).resolve().is_relative_to(expected.resolve()):
        raise SystemExit(f"ab: surge imports from {where.strip()}, not from {expected}")


def run_once(command: list[str], env: dict[str, str], label: str) -> dict[str, float]:
    print(f"-- {label}: {' '.join(command)}", flush=True)
    done = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    tail = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
    print(f"   exit {done.returncode}: {tail[0][:300]}", flush=True)
    return figures_of(done.stdout)


def table(a_runs: list[dict[str, float]], b_runs: list[dict[str, float]],
          ref: str) -> tuple[str, dict[str, float]]:
    keys = [k for k in dict.fromkeys(k for run in a_runs for k in run)
            if any(k in run for run in b_runs)]
    lines = [f"| figure | this checkout (median) | {ref} (median) | {ref} / this | "
             "runs, this | runs, ref |", "|---|---|---|---|---|---|"]
    medians: dict[str, float] = {}
    for key in keys:
        a = [run[key] for run in a_runs if key in run]
        b = [run[key] for run in b_runs if key in run]
        ma, mb = statistics.median(a), statistics.median(b)
        medians[key], medians[f"ref_{key}"] = ma, mb
        ratio = f"{mb / ma:.2f}" if ma else "-"
        lines.append(f"| {key} | {ma:.4g} | {mb:.4g} | {ratio} | "
                     f"{', '.join(f'{x:.4g}' for x in a)} | {', '.join(f'{x:.4g}' for x in b)} |")
    missing = [k for k in dict.fromkeys(k for run in a_runs + b_runs for k in run)
               if k not in keys]
    if missing:
        lines.append(f"\nprinted by one side only: {', '.join(missing)}")
    return "\n".join(lines), medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the git revision of side B")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the benchmark and its options")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the benchmark to run after --")
    with tempfile.TemporaryDirectory(prefix="surge-ab-") as tmp:
        worktree = Path(tmp) / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(worktree), args.ref],
                       cwd=ROOT, check=True)
        try:
            a_env, b_env = side_env(ROOT / "src"), side_env(worktree / "src")
            check_import(a_env, ROOT / "src")
            check_import(b_env, worktree / "src")
            a_runs: list[dict[str, float]] = []
            b_runs: list[dict[str, float]] = []
            for round_ in range(args.rounds):
                sides = [("this", a_env, a_runs), (args.ref, b_env, b_runs)]
                for label, env, runs in (sides if round_ % 2 == 0 else sides[::-1]):
                    runs.append(run_once(command, env, f"round {round_ + 1}, {label}"))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)],
                           cwd=ROOT, check=False)
    text, medians = table(a_runs, b_runs, args.ref)
    print()
    print(f"{' '.join(command)}: {args.rounds} rounds, this checkout vs {args.ref}")
    print(text)
    print("summary: " + " ".join(f"{k}={v:.4g}" for k, v in medians.items()))


if __name__ == "__main__":
    main()
