"""Run Ray Serve's own test files against surge and count what passes.

    python scripts/ray_suite/run.py --tests DIR [FILE ...] [--json OUT] [-k EXPR]
    python scripts/ray_suite/run.py --tests DIR --anchor --json ray.json   # Ray itself
    python scripts/ray_suite/run.py --tests DIR --against ray.json         # surge, counted
                                                                            # where Ray passes

DIR holds Ray Serve's test files (python/ray/serve/tests of a Ray checkout at the release
surge matches; they are not in Ray's wheel and are not copied into this repository). Each
file runs in its own pytest process, with `ray.serve` pointed at surge and a real Ray
cluster underneath (surge_as_ray.py). A test whose own source reaches Ray's internals
(its controller, actors, private modules, state API) is left out of the count and listed
with the reason; the rest measure what an application that changed only its import sees.
With `--against` a run of the same files on Ray Serve itself (`--anchor`), only the tests
that pass there count: a test file of another Ray commit may test what this release lacks.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FILES = ("test_api.py", "test_batching.py", "test_multiplex.py", "test_handle_1.py",
         "test_handle_2.py", "test_handle_cancellation.py", "test_streaming_response.py",
         "test_http_routes.py", "test_websockets.py", "test_request_timeout.py",
         "test_backpressure.py", "test_fastapi.py")

# Lines of stored test files that Ray 2.60 itself cannot import (an option it renamed),
# rewritten to its spelling before both the anchor and the surge run: without them the
# whole file fails to collect on Ray too and measures nothing. Each edit is printed.
PATCHES = {
    "test_api.py": [(
        "@serve.deployment(request_router_class=FakeRequestRouter)",
        "@serve.deployment(request_router_config=__import__('ray.serve.config', "
        "fromlist=['x']).RequestRouterConfig(request_router_class=FakeRequestRouter))")],
}


def copy_test_file(tests: Path, name: str, work: Path) -> None:
    text = (tests / name).read_text()
    for old, new in PATCHES.get(name, []):
        if old in text:
            text = text.replace(old, new)
            print(f"{name}: rewrote {old!r} as Ray 2.60 spells it", file=sys.stderr)
    (work / name).write_text(text)


def run_file(tests: Path, name: str, work: Path, k: str | None, timeout_s: int,
             anchor: bool = False, file_timeout_s: int = 1800) -> list[dict]:
    junit = work / f"{name}.xml"
    env = dict(os.environ, SURGE_AS_RAY="0" if anchor else "1",
               SURGE_AS_RAY_ANCHOR="1" if anchor else "0", SURGE_AS_RAY_TESTS=str(tests),
               PYTHONPATH=os.pathsep.join([str(HERE), str(work), str(ROOT / "src")]))
    command = [sys.executable, "-m", "pytest", str(work / name), "-p", "surge_as_ray",
               "-p", "no:cacheprovider", "-q", "-o", "asyncio_mode=auto",
               # plain tracebacks: pytest's own, which parse the test's source, crashed the
               # session on one of Ray's tests (SystemError: AST constructor recursion)
               "--tb=native",
               f"--junitxml={junit}", f"--timeout={timeout_s}", "-o", "junit_family=xunit2"]
    if k:
        command += ["-k", k]
    log = work / f"{name}.log"
    late = run_bounded(command, work, env, log, file_timeout_s)
    if not junit.exists():
        return [{"file": name, "test": "<collection>", "outcome": "error", "internal": "",
                 "message": late + log.read_text()[-2000:]}]
    return [_case(name, case) for case in ET.parse(junit).getroot().iter("testcase")]


def run_bounded(command: list[str], cwd: Path, env: dict[str, str], log: Path,
                timeout_s: float) -> str:
    """Run `command` in a session of its own, output to `log`; past `timeout_s` (a hang
    pytest-timeout does not end, as in a teardown) kill its whole process group. Returns
    "" or the line that says it was stopped."""
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout_s)
            return ""
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return f"the file ran past {timeout_s:g} s and was stopped\n"


def _case(name: str, case: ET.Element) -> dict:
    outcome, message = "passed", ""
    for tag in ("failure", "error", "skipped"):
        child = case.find(tag)
        if child is not None:
            outcome = {"failure": "failed"}.get(tag, tag)
            message = (child.get("message") or "")[:300]
            break
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    return {"file": name, "test": case.get("name", ""), "outcome": outcome,
            "internal": props.get("internal") or "", "message": message}


def summarize(results: list[dict], anchor: list[dict] | None = None) -> dict:
    """Per file and overall: the tests of user-visible behaviour (not internal, not
    skipped) and how many passed. With `anchor` (the results of the same files on Ray
    Serve itself), the tests counted are those that passed there (the others test what
    this Ray release no longer has: the stored test files are not all of its commit),
    and one that did not run on surge (its file failed to import) counts as failed."""
    rows, counted_pass, counted = [], 0, 0
    for name in dict.fromkeys(r["file"] for r in results):
        mine = [r for r in results if r["file"] == name]
        if anchor is None:
            user = [r for r in mine if not r["internal"] and r["outcome"] != "skipped"]
        else:
            on_surge = {r["test"]: r for r in mine}
            user = [on_surge.get(a["test"], {**a, "outcome": "not run"}) for a in anchor
                    if a["file"] == name and a["outcome"] == "passed" and not a["internal"]]
        passed = sum(r["outcome"] == "passed" for r in user)
        rows.append({"file": name, "tests": len(mine), "internal": sum(bool(r["internal"])
                     for r in mine), "skipped": sum(r["outcome"] == "skipped" and not
                     r["internal"] for r in mine), "counted": len(user), "passed": passed})
        counted_pass += passed
        counted += len(user)
    return {"files": rows, "counted": counted, "passed": counted_pass,
            "pass_rate": counted_pass / counted if counted else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=Path, required=True,
                        help="directory of Ray Serve's test files (python/ray/serve/tests)")
    parser.add_argument("files", nargs="*", default=list(FILES))
    parser.add_argument("--json", type=Path, help="write every test's outcome here")
    parser.add_argument("-k", help="pytest -k expression")
    parser.add_argument("--timeout", type=int, default=120, help="per test, seconds")
    parser.add_argument("--file-timeout", type=int, default=1800,
                        help="per file, seconds: its process group is killed past it")
    parser.add_argument("--anchor", action="store_true",
                        help="run the files on Ray Serve itself (nothing aliased)")
    parser.add_argument("--against", type=Path, metavar="ANCHOR_JSON",
                        help="count only the tests that passed in this --anchor run")
    args = parser.parse_args()
    anchor: list[dict] | None = None
    if args.against:
        anchor = json.loads(args.against.read_text())["results"]
    # One run at a time on this machine: every run serves on Ray's port 8000 (and 9000).
    lock = open(Path(tempfile.gettempdir()) / "surge-ray-suite.lock", "w")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX)
    work = Path(tempfile.mkdtemp(prefix="surge-ray-suite-"))
    results: list[dict] = []
    for name in args.files:
        if not (args.tests / name).exists():
            print(f"{name}: not in {args.tests}, skipped", file=sys.stderr)
            continue
        copy_test_file(args.tests, name, work)
        results += run_file(args.tests, name, work, args.k, args.timeout, args.anchor,
                            args.file_timeout)
        done = summarize([r for r in results if r["file"] == name], anchor)["files"][0]
        print(f"{name:32} {done['passed']:3}/{done['counted']:3} passed "
              f"({done['internal']} internal, {done['skipped']} skipped)", flush=True)
    summary = summarize(results, anchor)
    print(f"{'all':32} {summary['passed']:3}/{summary['counted']:3} passed "
          f"({summary['pass_rate']:.1%}); logs in {work}")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "results": results}, indent=1))


if __name__ == "__main__":
    main()
