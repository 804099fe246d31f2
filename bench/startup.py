"""Startup and scale-up latency: surge vs Ray Serve 2.60.

    python bench/startup.py [--quick] [--reps 3] [--systems surge,ray]

Each repetition starts a fresh driver (bench/apps/pid_echo_driver.py; nothing of the
system running before) whose echo app answers with its replica's PID, and polls its URL
over HTTP every 10 ms from this process:

  (a) first HTTP 200: measured from the driver process's spawn, from its first serve call
      (`serve.start(http_options=...)` -- which starts the instance, as `serve.run` does
      when nothing was started -- immediately followed by `serve.run`), and from the
      `serve.run` call itself;
  (b) one more replica: the driver redeploys with `.options(num_replicas=2)` via
      `serve.run`; the time from that call until a response reports a new PID; also when
      serve.run returned and whether the first replica kept serving.

The median of the repetitions is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import APPS, driver, exit_on_sigterm, free_port, surge_env, system_python

POLL_S = 0.01
START_TIMEOUT_S = 180.0
SCALE_TIMEOUT_S = 120.0


def get(url: str) -> tuple[int, int | None]:
    """(status, pid in the body) of one GET; status 0 when it did not connect."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body = response.read()
            try:
                return response.status, int(json.loads(body)["pid"])
            except (ValueError, KeyError, TypeError):
                return response.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError):
        return 0, None


def wait_first_200(url: str, timeout_s: float,
                   alive: Any) -> tuple[float, int | None, dict[int, int]]:
    """Poll until a 200; (when it came, its PID, count of each non-200 status seen)."""
    deadline = time.monotonic() + timeout_s
    others: dict[int, int] = {}
    while time.monotonic() < deadline:
        status, pid = get(url)
        if status == 200:
            return time.time(), pid, others
        others[status] = others.get(status, 0) + 1
        if not alive():
            raise RuntimeError("the driver exited before serving")
        time.sleep(POLL_S)
    raise RuntimeError(f"no HTTP 200 from {url} within {timeout_s:.0f} s (saw {others})")


class PidWatcher(threading.Thread):
    """Polls `url` and notes when a PID other than `first` answers, and who answers."""

    def __init__(self, url: str, first: int) -> None:
        super().__init__(daemon=True)
        self.url, self.first = url, first
        self.new_at: float | None = None
        self.new_pid: int | None = None
        self.errors: dict[int, int] = {}
        self.first_after_new = 0
        self.requests_after_new = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            status, pid = get(self.url)
            at = time.time()
            if status != 200:
                self.errors[status] = self.errors.get(status, 0) + 1
            elif pid is not None and pid != self.first and self.new_at is None:
                self.new_at, self.new_pid = at, pid
            elif self.new_at is not None:
                self.requests_after_new += 1
                self.first_after_new += pid == self.first
            time.sleep(POLL_S)


def stamp(running: Any, prefix: str, timeout_s: float) -> float:
    return float(running.wait_line(prefix + " ", timeout_s)[1].split()[1])


def one_rep(system: str) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/echo"
    argv = [system_python(system), str(APPS / "pid_echo_driver.py"), "--system", system,
            "--port", str(port)]
    env = surge_env() if system == "surge" else {}
    out: dict[str, Any] = {}
    with driver(system, argv, env) as running:
        spawned = running.spawned_at
        try:
            ok_at, first_pid, before = wait_first_200(url, START_TIMEOUT_S,
                                                      lambda: running.process.poll() is None)
        except RuntimeError as exc:
            fatal = [line for _, line in running.lines if line.startswith("FATAL")]
            raise RuntimeError(f"{system}: {exc} {' '.join(fatal)}\n--- driver stderr tail:\n"
                               f"{running.stderr_tail()}") from None
        t_start = stamp(running, "T_START", 10)
        t_serve = stamp(running, "T_SERVE_START", 10)
        t_run = stamp(running, "T_RUN", 10)
        t_run_done = stamp(running, "T_RUN_DONE", 30)
        out.update(
            spawn_to_200=ok_at - spawned, serve_start_to_200=ok_at - t_serve,
            run_to_200=ok_at - t_run, run_returned=t_run_done - t_run,
            interpreter_s=t_start - spawned, imports_s=t_serve - t_start,
            serve_start_s=t_run - t_serve, non_200_before=before)
        if first_pid is None:
            raise RuntimeError(f"{system}: the echo app's body has no pid")
        watcher = PidWatcher(url, first_pid)
        watcher.start()
        time.sleep(0.1)
        running.send("SCALE 2")
        t_scale = stamp(running, "T_SCALE", 10)
        deadline = time.monotonic() + SCALE_TIMEOUT_S
        while watcher.new_at is None and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            t_scaled = stamp(running, "SCALED", max(1.0, deadline - time.monotonic()))
        except RuntimeError:
            t_scaled = float("nan")
        time.sleep(0.5)  # see who answers once both serve
        watcher.stop.set()
        watcher.join(5)
        out.update(
            add_replica=(watcher.new_at - t_scale) if watcher.new_at else float("nan"),
            scale_run_returned=t_scaled - t_scale,
            old_replica_served_after=f"{watcher.first_after_new}/{watcher.requests_after_new}",
            non_200_during_scale=watcher.errors)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--systems", default="surge,ray")
    args = parser.parse_args()
    exit_on_sigterm()
    reps = 1 if args.quick else args.reps
    systems = [s for s in args.systems.split(",") if s]
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    failures: dict[str, list[str]] = {s: [] for s in systems}
    for rep in range(reps):
        for system in systems:
            try:
                result = one_rep(system)
            except RuntimeError as exc:
                failures[system].append(str(exc))
                print(f"== {system} rep {rep + 1}: FAILED: {exc}", flush=True)
                continue
            runs[system].append(result)
            print(f"== {system} rep {rep + 1}: first 200 {result['spawn_to_200']:.2f} s from "
                  f"spawn, {result['serve_start_to_200']:.2f} s from serve.start, "
                  f"{result['run_to_200']:.2f} s from serve.run; +1 replica "
                  f"{result['add_replica']:.2f} s (serve.run returned after "
                  f"{result['scale_run_returned']:.2f} s; old replica answered "
                  f"{result['old_replica_served_after']} after; non-200 during scale "
                  f"{result['non_200_during_scale'] or 'none'}; before first 200 "
                  f"{result['non_200_before']})", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)

    def med(system: str, key: str) -> float:
        values = [r[key] for r in runs[system] if r[key] == r[key]]
        return statistics.median(values) if values else float("nan")

    columns = [
        ("spawn_to_200", "first 200 from process spawn s"),
        ("serve_start_to_200", "first 200 from first serve call s"),
        ("run_to_200", "first 200 from serve.run call s"),
        ("run_returned", "serve.run returned after s"),
        ("interpreter_s", "interpreter start s"),
        ("imports_s", "import serve s"),
        ("serve_start_s", "serve.start s"),
        ("add_replica", "+1 replica serving s"),
        ("scale_run_returned", "+1 replica serve.run returned s"),
    ]
    print()
    print(f"median of {reps} repetition(s):")
    print("| system | reps ok | " + " | ".join(title for _, title in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for system in systems:
        print(f"| {system} | {len(runs[system])}/{reps} | "
              + " | ".join(f"{med(system, key):.2f}" for key, _ in columns) + " |")
    print()
    print("all repetitions (first 200 from first serve call / +1 replica serving), s:")
    for system in systems:
        values = ", ".join(f"{r['serve_start_to_200']:.2f}/{r['add_replica']:.2f}"
                           for r in runs[system])
        print(f"  {system}: {values or 'none'}")
        for failure in failures[system]:
            print(f"  {system} FAILED: {failure}")
    for system in systems:
        kept = [r["old_replica_served_after"] for r in runs[system]]
        if kept and all(k.startswith("0/") for k in kept):
            print(f"note: {system}'s first replica answered nothing once the new PID appeared "
                  f"({', '.join(kept)}): the redeploy replaced it rather than adding one"
                  + (" (Ray's serve.run gives every call a new random code version: "
                     "ray/serve/_private/client.py `version=deployment._version or "
                     "get_random_string()`, hence a rolling update of all replicas)"
                     if system == "ray" else ""))
    print("summary: " + " ".join([
        f"surge_first_200_s={med('surge', 'serve_start_to_200'):.3f}" if "surge" in runs
        else "surge_first_200_s=nan",
        f"ray_first_200_s={med('ray', 'serve_start_to_200'):.3f}" if "ray" in runs
        else "ray_first_200_s=nan",
        f"surge_add_replica_s={med('surge', 'add_replica'):.3f}" if "surge" in runs
        else "surge_add_replica_s=nan",
        f"ray_add_replica_s={med('ray', 'add_replica'):.3f}" if "ray" in runs
        else "ray_add_replica_s=nan",
        *(f"{s}_first_200_from_spawn_s={med(s, 'spawn_to_200'):.3f}" for s in systems),
        *(f"{s}_first_200_from_run_s={med(s, 'run_to_200'):.3f}" for s in systems),
    ]))


if __name__ == "__main__":
    main()
