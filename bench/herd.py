"""Admission of the herd: start and delete hundreds of real local replicas at once.

    python bench/herd.py [--replicas 200,512] [--reps 3] [--proxy-workers 8] [--idle-s 10]

Each repetition runs a fresh driver (bench/apps/herd_driver.py): serve.start with
`proxy_workers` proxy processes, serve.run of an echo deployment with N replicas (local
backend, fork server), an idle window, serve.delete, shutdown. From its timestamps and
from the instance's log (everything it prints on stderr at SURGE_LOG_LEVEL=WARNING):

* start: serve.run until it returned with every replica RUNNING; delete: serve.delete
  until every replica is gone;
* `timeouts`: log lines "did not accept the connection" (a member whose control
  connection's handshake timed out); `proxy_restarts`: "proxy-... exited with code";
  `replica_exits`: replicas that exited before they were ready or died;
* the controller's CPU share during the idle window (/proc/PID/stat) and its RSS.

The median of the repetitions is printed per N, then `summary: ...`.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    APPS,
    cmdline,
    cpu_seconds,
    driver,
    exit_on_sigterm,
    free_port,
    rss_kib,
    surge_env,
)

TIMEOUT_LINE = "did not accept the connection"
CONNECT_LINE = "no surge instance answers at"
PROXY_EXIT = re.compile(r"proxy-\S+ exited with code")
REPLICA_EXIT = re.compile(r"exited with code \S+ before it was ready|replica \S+ of \S+ died")


def one_run(replicas: int, proxy_workers: int, idle_s: float,
            log_path: Path | None) -> dict[str, Any]:
    argv = [sys.executable, str(APPS / "herd_driver.py"), "--replicas", str(replicas),
            "--port", str(free_port()), "--proxy-workers", str(proxy_workers),
            "--idle-s", str(idle_s)]
    timeout = 300.0
    stamps: dict[str, float] = {}
    result: dict[str, Any] = {"replicas": replicas, "error": ""}
    with driver(f"herd-{replicas}", argv, surge_env()) as run:
        try:
            for key in ("T_START", "T_STARTED", "T_RUN", "T_RUN_DONE", "IDLE_FROM"):
                stamps[key] = float(run.wait_line(key + " ", timeout)[1].split()[1])
            controller = [p for p in run.remember_tree() if "surge:controller" in cmdline(p)]
            cpu_from = cpu_seconds(controller)
            stamps["IDLE_TO"] = float(run.wait_line("IDLE_TO ", idle_s + 60)[1].split()[1])
            result["idle_cpu_pct"] = 100.0 * (cpu_seconds(controller) - cpu_from) / (
                stamps["IDLE_TO"] - stamps["IDLE_FROM"])
            result["controller_rss_mib"] = sum(rss_kib(p) for p in controller) / 1024
            for key in ("T_DELETE", "T_DELETE_DONE"):
                stamps[key] = float(run.wait_line(key + " ", timeout)[1].split()[1])
            run.wait_line("DONE", 120)
            result["states"] = run.wait_line("STATES ", 1)[1].split(" ", 1)[1]
        except RuntimeError as exc:
            result["error"] = str(exc).splitlines()[0]
        log = run.stderr_tail(10**7)
    if log_path is not None:
        log_path.write_text(log)
    if "T_RUN_DONE" in stamps:
        result["start_s"] = stamps["T_RUN_DONE"] - stamps["T_RUN"]
    if "T_DELETE_DONE" in stamps:
        result["delete_s"] = stamps["T_DELETE_DONE"] - stamps["T_DELETE"]
    result.update(timeouts=log.count(TIMEOUT_LINE), connect_failures=log.count(CONNECT_LINE),
                  proxy_restarts=len(PROXY_EXIT.findall(log)),
                  replica_exits=len(REPLICA_EXIT.findall(log)))
    return result


def cell(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="200,512")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--proxy-workers", type=int, default=8)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--logs", default="", help="a directory for each run's log")
    args = parser.parse_args()
    counts = [int(n) for n in args.replicas.split(",")]
    logs = Path(args.logs) if args.logs else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    print("| replicas | rep | start s | delete s | handshake timeouts | connect failures | "
          "proxy restarts | replica exits | idle controller CPU % | controller RSS MiB | "
          "error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    medians: dict[int, dict[str, float]] = {}
    counted = ("timeouts", "connect_failures", "proxy_restarts", "replica_exits")
    for n in counts:
        runs = []
        for rep in range(args.reps):
            r = one_run(n, args.proxy_workers, args.idle_s,
                        logs / f"herd-{n}-{rep + 1}.log" if logs else None)
            runs.append(r)
            print(f"| {n} | {rep + 1} | {cell(r.get('start_s'))} | {cell(r.get('delete_s'))} | "
                  + " | ".join(str(r[k]) for k in counted)
                  + f" | {cell(r.get('idle_cpu_pct'), 1)} | "
                  f"{cell(r.get('controller_rss_mib'), 0)} | {r['error'][:80]} |", flush=True)
        m: dict[str, float] = {}
        for key in ("start_s", "delete_s", "idle_cpu_pct", "controller_rss_mib"):
            values = [r[key] for r in runs if key in r]
            m[key] = statistics.median(values) if values else float("nan")
        for key in counted:
            m[key] = sum(r[key] for r in runs)
        m["failed_runs"] = sum(1 for r in runs if r["error"])
        medians[n] = m
        print(f"| **{n}, median** | | **{m['start_s']:.2f}** | **{m['delete_s']:.2f}** | "
              + " | ".join(f"{m[k]:.0f} (all)" for k in counted)
              + f" | {m['idle_cpu_pct']:.1f} | {m['controller_rss_mib']:.0f} | "
              f"{m['failed_runs']:.0f} of {len(runs)} failed |", flush=True)
    parts = []
    for n, m in medians.items():
        parts += [f"start_s_{n}={m['start_s']:.2f}", f"delete_s_{n}={m['delete_s']:.2f}",
                  f"timeouts_{n}={m['timeouts']:.0f}",
                  f"connect_failures_{n}={m['connect_failures']:.0f}",
                  f"proxy_restarts_{n}={m['proxy_restarts']:.0f}",
                  f"failed_runs_{n}={m['failed_runs']:.0f}",
                  f"idle_cpu_pct_{n}={m['idle_cpu_pct']:.1f}"]
    if len(counts) >= 2:
        small, big = counts[0], counts[-1]
        scale = big / small
        for key in ("start_s", "delete_s"):
            ratio = medians[big][key] / (scale * medians[small][key])
            parts.append(f"{key.split('_')[0]}_vs_scaled_{small}={ratio:.2f}")
    print("summary: " + " ".join(parts))


if __name__ == "__main__":
    main()
