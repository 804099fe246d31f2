"""How fast can `surge pulse` offer load? Constant-rate runs against the raw server.

    python bench/pulse_generator.py [--rates 10000,20000,30000] [--seconds 5] [--workers 1]
                                    [--reps 3] [--url http://127.0.0.1:PORT/ --server-pid PID]

Starts bench/apps/raw_server.py (one uvloop+httptools process) on a free port, then for
each rate runs the generator (no report) for `--seconds` at a constant rate and prints
the best of `--reps` runs (lowest send-lag p99): requests/s sent and answered 2xx, the
send lag (how late requests were handed to a connection, p50/p99/max), points where it
fell behind (lag over 10 ms), requests that waited for a connection (the *server* was
behind: all connections busy), p50/p99 latency, and CPU microseconds per request of the
generator (its start-up, measured on a 1-request run, subtracted) and of the server.

"Keeps up" = sent the whole schedule with send-lag p99 <= 5 ms and every answer a 2xx.
Generator and server share the machine's cores, as they do for a user on one box.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port
from surge.loadtest.options import PulseOptions
from surge.loadtest.runner import run_pulse
from surge.loadtest.schedule import Schedule, Segment

APPS = Path(__file__).resolve().parent / "apps"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = os.times()
    return usage.children_user + usage.children_system


def _run(url: str, rate: float, seconds: float, workers: int,
         connections: int) -> tuple[dict[str, object], float]:
    """(report, generator CPU seconds: this process and its worker processes)."""
    options = PulseOptions(url=url, schedule=Schedule((Segment(seconds, rate, rate),)),
                           workers=workers, connections=connections, timeout_s=5.0)
    own_before, children_before = time.process_time(), _children_cpu()
    with open(os.devnull, "w") as quiet:
        result = run_pulse(options, quiet=True, stream=quiet)
    return result.report, time.process_time() - own_before + _children_cpu() - children_before


def measure(url: str, server_pid: int | None, rate: float, seconds: float, workers: int,
            connections: int, overhead_s: float) -> dict[str, float | bool]:
    server_before = _cpu_seconds(server_pid) if server_pid else 0.0
    report, cpu = _run(url, rate, seconds, workers, connections)
    generator_cpu = max(cpu - overhead_s, 0.0)
    server_cpu = _cpu_seconds(server_pid) - server_before if server_pid else 0.0
    s: dict[str, Any] = report["summary"]  # type: ignore[assignment]
    sent = max(s["sent"], 1)
    return {"rate": rate, "sent_per_s": s["sent"] / seconds, "ok_per_s": s["ok"] / seconds,
            "ok_pct": s["success_pct"] or 0.0, "lag_p50_ms": s["generator"]["lag_p50_ms"] or 0,
            "lag_p99_ms": s["generator"]["lag_p99_ms"] or 0,
            "lag_max_ms": s["generator"]["lag_max_ms"], "behind": s["generator"]["behind"],
            "waited": s["generator"]["waited_for_connection"],
            "p50_ms": s["p50_ms"] or 0, "p99_ms": s["p99_ms"] or 0,
            "gen_us": 1e6 * generator_cpu / sent, "server_us": 1e6 * server_cpu / sent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10000,20000,30000,40000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--connections", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--url", help="load this server instead of starting the raw one "
                                      "(e.g. nginx on 127.0.0.1); give --server-pid too")
    parser.add_argument("--server-pid", type=int, help="the --url server's pid, for its CPU")
    args = parser.parse_args()
    port = free_port()
    if args.url:
        server = None
        url, server_pid = args.url, args.server_pid
    else:
        server = subprocess.Popen([sys.executable, str(APPS / "raw_server.py"), str(port)],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        server.stdout.readline()  # READY
        url, server_pid = f"http://127.0.0.1:{port}/echo?value=x", server.pid
    try:
        print(f"{url} (server pid {server_pid}), {args.workers} generator worker(s), "
              f"{args.seconds:g} s per rate, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.2f}")
        print(f"{'rate/s':>8} {'sent/s':>8} {'ok/s':>8} {'ok%':>7} {'lag p50':>8} "
              f"{'lag p99':>8} {'lag max':>8} {'behind':>6} {'waited':>7} {'p50':>7} "
              f"{'p99':>8} {'gen us':>7} {'srv us':>7}")
        print("(best of each rate's runs; 'behind' = some 100 ms point had a send lag over "
              "10 ms)")
        _, overhead = _run(url, 10.0, 0.1, args.workers, args.connections)
        for rate in (float(r) for r in args.rates.split(",")):
            runs = []
            for _ in range(args.reps):
                runs.append(measure(url, server_pid, rate, args.seconds, args.workers,
                                    args.connections, overhead))
                time.sleep(1.0)
            m = min(runs, key=lambda run: float(run["lag_p99_ms"]))
            keeps_up = (m["lag_p99_ms"] <= 5 and m["ok_pct"] == 100
                        and m["sent_per_s"] >= 0.999 * rate)
            print(f"{m['rate']:>8,.0f} {m['sent_per_s']:>8,.0f} {m['ok_per_s']:>8,.0f} "
                  f"{m['ok_pct']:>6.2f}% {m['lag_p50_ms']:>6.2f}ms {m['lag_p99_ms']:>6.2f}ms "
                  f"{m['lag_max_ms']:>6.1f}ms {'YES' if m['behind'] else 'no':>6} "
                  f"{m['waited']:>7,} {m['p50_ms']:>5.2f}ms {m['p99_ms']:>6.1f}ms "
                  f"{m['gen_us']:>7.1f} {m['server_us']:>7.1f}  "
                  f"{'keeps up' if keeps_up else 'NO'}", flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=5)
            assert server.stdout is not None
            server.stdout.close()


if __name__ == "__main__":
    main()
