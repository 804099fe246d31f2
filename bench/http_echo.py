"""HTTP echo: surge vs Ray Serve 2.60 vs a raw uvloop+httptools server, driven by wrk.

    python bench/http_echo.py [--duration 10] [--reps 3] [--systems raw,surge,...]
    python bench/http_echo.py --systems surge_nometrics,surge,surge_access,surge_access_all
        # what metrics recording and access logs cost (req/s with and without them)
    python bench/http_echo.py --systems surge,surge_tls --wrk-threads 1 --rounds 3
        # what TLS costs (HTTPS with a throwaway certificate; wrk keeps connections open;
        # this machine's wrk sometimes makes no HTTPS request at all with 2 threads)
    python bench/http_echo.py --systems surge,surge_ray
        # one proxy on the ray backend vs the local backend (needs surge[ray])

Each system serves the same echo app (`{"echo": value}` from a query parameter) on
127.0.0.1 and is loaded by wrk at c=8 and c=64; the median of the repetitions is
reported with p50/p99, non-2xx, socket errors and CPU microseconds per request of the
serving processes (proxy + replicas, from /proc) and of the whole process tree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    APPS,
    System,
    WrkResult,
    free_port,
    median_result,
    ray_python,
    run_wrk,
    start_system,
)

SYSTEMS = {
    "raw": "raw uvloop+httptools (1 process)",
    "surge": "surge, default config",
    "surge_mor100": "surge, max_ongoing_requests=100",
    # The cost of observability (metrics are on by default; see docs/observability.md):
    "surge_nometrics": "surge, metrics off (SURGE_DASHBOARD=off), no access log",
    "surge_access": "surge, metrics + access log at INFO (default sampling: <=10 lines/s)",
    "surge_access_all": "surge, metrics + an access-log line for every request",
    "surge_tls": "surge, default config, HTTPS (TLS 1.3, ECDSA P-256 certificate)",
    "surge_ray": "surge on the ray backend (1 Ray node; proxy, replica in Ray actors)",
    "ray": "Ray Serve, default config (max_ongoing_requests=5)",
    "ray_mor100": "Ray Serve, max_ongoing_requests=100",
    "ray_direct": "Ray Serve, RAY_SERVE_THROUGHPUT_OPTIMIZED=1 (direct ingress), mor=100",
}


OBSERVABILITY = {  # environment of each surge variant (the app logs at WARNING otherwise);
    # SURGE_BENCH_LOGGING is the logging_config the app passes to serve.start
    "surge_nometrics": {"SURGE_DASHBOARD": "off",
                        "SURGE_BENCH_LOGGING": json.dumps({"enable_access_log": False})},
    "surge_access": {"SURGE_BENCH_LOGGING": json.dumps({"log_level": "INFO"})},
    "surge_access_all": {"SURGE_BENCH_LOGGING": json.dumps(
        {"log_level": "INFO", "access_log_max_per_s": 0, "encoding": "JSON"})},
}


def _argv(system: str, port: int) -> tuple[list[str], dict[str, str]]:
    if system == "raw":
        return [sys.executable, str(APPS / "raw_server.py"), str(port)], {}
    if system.startswith("surge"):
        env = {"SURGE_ADDRESS": f"127.0.0.1:{free_port()}", **OBSERVABILITY.get(system, {})}
        if system == "surge_tls":
            env["SURGE_BENCH_TLS"] = _throwaway_certificate()
        if system == "surge_ray":
            env["SURGE_BENCH_RAY"] = "1"
        mor = ["100"] if system == "surge_mor100" else []
        return [sys.executable, str(APPS / "surge_echo.py"), str(port), *mor], env
    ray = ray_python()
    script = str(APPS / "ray_echo.py")
    if system == "ray":
        return [ray, script, str(port), "-"], {}
    if system == "ray_mor100":
        return [ray, script, str(port), "100"], {}
    return [ray, script, str(port), "100"], {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def _throwaway_certificate() -> str:
    """'CERT:KEY' of a certificate for 127.0.0.1 made for this run (tests/certs.py)."""
    import tempfile

    from tests.certs import make_pki

    pki = make_pki(Path(tempfile.mkdtemp(prefix="surge-bench-tls-")))
    return f"{pki.cert}:{pki.key}"


def measure(system: System, connections: int, duration: float,
            reps: int, threads: int = 2, profile: bool = False) -> tuple[WrkResult, float]:
    serving, everything = system.serving_pids(), system.pids()
    runs, totals = [], []
    for rep in range(reps):
        from bench.common import cpu_seconds

        profiler = None
        if profile and rep == reps - 1:  # the last run, sampled by py-spy
            from bench.common import cmdline
            from bench.profile import Profiler

            names = {pid: cmdline(pid).split()[0] for pid in serving}
            profiler = Profiler({f"{title} #{i}": pid
                                 for i, (pid, title) in enumerate(sorted(names.items()))},
                                duration)
        before = cpu_seconds(everything)
        result = run_wrk(system.url, connections, duration, serving, threads)
        if profiler is not None:
            print(profiler.report(), flush=True)
        totals.append((cpu_seconds(everything) - before) / max(result.requests, 1) * 1e6)
        runs.append(result)
    totals.sort()
    return median_result(runs), totals[len(totals) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--concurrency", default="8,64")
    parser.add_argument("--wrk-threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true",
                        help="sample each serving process with py-spy during the last run at "
                             "the highest concurrency and print its top functions")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the systems in turn this many times and report medians: "
                             "interleaving evens out a noisy machine for A/B comparisons")
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    levels = [int(c) for c in args.concurrency.split(",")]
    rounds: dict[tuple[str, int], list[tuple[WrkResult, float]]] = {}
    for _ in range(args.rounds):
        for name in systems:
            argv, env = _argv(name, free_port())
            print(f"== {SYSTEMS[name]}", flush=True)
            with start_system(name, argv, env) as system:
                run_wrk(system.url, 8, 1.0, [])  # warm-up
                for c in levels:
                    profile = args.profile and c == max(levels) and name != "raw" \
                        and not name.startswith("ray")
                    r, total = measure(system, c, args.duration, args.reps,
                                       args.wrk_threads, profile)
                    rounds.setdefault((name, c), []).append((r, total))
                    print(f"   c={c:<3} {r.rps:>9,.0f} req/s  p50 {r.p50_ms:7.2f} ms  "
                          f"p99 {r.p99_ms:8.2f} ms  non-2xx {r.non_2xx}  errors {r.errors}  "
                          f"cpu/req {r.cpu_us_per_request:7.0f} us (all {total:7.0f} us)",
                          flush=True)
    for key, runs in rounds.items():  # a round where wrk made no request says nothing
        rounds[key] = [run for run in runs if run[0].requests > 0] or runs
    table: dict[tuple[str, int], tuple[WrkResult, float]] = {
        key: (median_result([r for r, _ in runs]), sorted(t for _, t in runs)[len(runs) // 2])
        for key, runs in rounds.items()}
    print()
    print("| system | c | req/s | p50 ms | p99 ms | non-2xx | socket errors "
          "| CPU µs/req (proxy+replica) | CPU µs/req (all processes) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, c), (r, total) in table.items():
        print(f"| {SYSTEMS[name]} | {c} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
              f"{r.non_2xx} | {r.errors} | {r.cpu_us_per_request:,.0f} | {total:,.0f} |")

    def rps(name: str, c: int) -> float:
        entry = table.get((name, c))
        return entry[0].rps if entry else float("nan")

    c_hi, c_lo = max(levels), min(levels)
    surge = rps("surge", c_hi)
    ratios = {
        "vs_ray_mor100": surge / rps("ray_mor100", c_hi),
        "vs_ray_direct": surge / rps("ray_direct", c_hi),
        "vs_ray_default": surge / rps("ray", c_hi),
        "vs_raw": surge / rps("raw", c_hi),
    }
    if ("surge_tls", c_hi) in table and ("surge", c_hi) in table:
        print()
        for c in levels:
            plain, tls = table[("surge", c)][0], table[("surge_tls", c)][0]
            print(f"TLS cost at c={c}: {tls.rps:,.0f} vs {plain.rps:,.0f} req/s = "
                  f"{tls.rps / plain.rps - 1:+.1%}; CPU/req {tls.cpu_us_per_request:,.0f} vs "
                  f"{plain.cpu_us_per_request:,.0f} us")
    base = rps("surge_nometrics", c_hi)
    if base == base:  # measured: what metrics and access logs cost, relative to none
        print()
        for name in ("surge", "surge_access", "surge_access_all"):
            if (name, c_hi) in table:
                cpu = table[(name, c_hi)][0].cpu_us_per_request
                cpu_base = table[("surge_nometrics", c_hi)][0].cpu_us_per_request
                print(f"observability cost at c={c_hi}: {name} {rps(name, c_hi):,.0f} req/s "
                      f"vs {base:,.0f} without metrics = {1 - rps(name, c_hi) / base:+.1%} "
                      f"throughput; CPU {cpu:.0f} vs {cpu_base:.0f} us/req "
                      f"= {cpu / cpu_base - 1:+.1%}")
    print()
    for key, value in ratios.items():
        print(f"surge/{key[3:]} at c={c_hi}: {value:.2f}x")
    s_lo = table.get(("surge", c_lo))
    s_hi = table.get(("surge", c_hi))
    print("summary: " + " ".join([
        f"surge_rps_c{c_hi}={surge:.0f}",
        f"ray_mor100_rps_c{c_hi}={rps('ray_mor100', c_hi):.0f}",
        f"ray_direct_rps_c{c_hi}={rps('ray_direct', c_hi):.0f}",
        f"raw_rps_c{c_hi}={rps('raw', c_hi):.0f}",
        f"surge_mor100_rps_c{c_hi}={rps('surge_mor100', c_hi):.0f}",
        f"ratio_mor5_vs_mor100={surge / rps('surge_mor100', c_hi):.2f}",
        *(f"ratio_{k}={v:.2f}" for k, v in ratios.items()),
        f"surge_cpu_us={s_hi[0].cpu_us_per_request:.0f}" if s_hi else "surge_cpu_us=nan",
        f"surge_p50_c{c_lo}_ms={s_lo[0].p50_ms:.2f}" if s_lo else "",
        f"surge_p99_c{c_lo}_ms={s_lo[0].p99_ms:.2f}" if s_lo else "",
        *(f"{name}_p99_c{c_lo}_ms={table[(name, c_lo)][0].p99_ms:.2f}"
          for name in ("surge_mor100", "ray_mor100", "raw") if (name, c_lo) in table),
    ]))


if __name__ == "__main__":
    main()
