"""The control plane at scale: the real controller against thousands of fake members.

    python bench/control_scale.py [--configs 512x64,2000x250,10000x1000] [--quick]

Per configuration (REPLICASxROUTERS) it starts, on 127.0.0.1:

* replica hosts (bench/scale/replica_host.py): fake replicas, ~2,500 per process, each
  with its own control connection, speaking surge's control protocol as a real replica
  does (handshake, hello, spec, ready, health checks, drain, telemetry every second);
* the controller, as surge starts it (`ControllerProcessSpec` on stdin, its ready line on
  stdout; bench/scale/controller_main.py is surge.controller.main with a backend whose
  replicas live in the replica hosts);
* router hosts (bench/scale/router_host.py): fake routers, ~250 per process, each a
  proxy's control connection (routes, replica sets, a load report every 0.1 s when
  something changed, an urgent one within 5 ms when a queue starts to grow, telemetry
  every second).

Then it deploys one autoscaled deployment (min = REPLICAS, max = REPLICAS * 9/8) and
measures, in order:

1. herd: deploy -> every replica RUNNING and every router holding all of them;
2. idle (no traffic) for `--window-s`: the controller's CPU share (/proc), RSS, and its
   ticks (`loop_stats`, controller/pace.py): wall duration p50/p99, CPU p99, loop lag;
3. steady load (every router reporting every 0.1 s, or as often as the controller says),
   the same figures, the RUNNING replicas against the target, and how many ready
   replicas lost their control connection (or were killed by the controller) from the
   deploy until the window's end;
4. one replica-set change, `--changes` times: a replica's connection is cut (as a
   SIGKILL); fan-out = from the cut until every router's set lacks it;
5. a load step (in-flight x1.75, queues start to grow): time to the scale-up decision,
   to the first and last start action (the replica host receiving it), and per new
   replica from its ready report until every router holds it (fan-out);
6. push sizes (replica_set, routes) as the routers received them.

Timestamps are CLOCK_MONOTONIC (time.monotonic), the same clock in every process of the
machine. Each configuration runs `--reps` times; the table has the medians. Ends with
`summary: tick_p99_ms_512=... tick_p99_ms_2000=... tick_p99_ms_10000=...
decision_ms_512=... fanout_ms_1000=... idle_cpu_pct_512=...` (fanout_ms_1000: the
single-change fan-out with 1,000 routers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import options
from bench.scale.cluster import DID, STEADY_LOAD, Cluster
from bench.scale.measure import herd, lost_since, one_change, pushes, step, window

RAMP_MIN_S, RAMP_MAX_S, RAMP_STEP_S = 3.0, 60.0, 0.25  # the ramp to steady load


async def run_config(replicas: int, routers: int, args: argparse.Namespace) -> dict[str, float]:
    cluster = Cluster(replicas, routers, args.startup_s, not args.full_sets)
    result: dict[str, float] = {"replicas": replicas, "routers": routers}
    try:
        await cluster.start()
        result.update(await herd(cluster, args.herd_timeout_s))
        if math.isnan(result["herd_s"]):
            return result
        await pushes(cluster)  # the herd's pushes are not counted below
        await asyncio.sleep(args.settle_s)
        phase(replicas, routers, f"idle window ({args.window_s:.0f} s)")
        result.update({f"idle_{k}": v for k, v in (await window(cluster, args.window_s)).items()})
        # Slowly: the proactive policy should see no surge. It projects the rate's slope
        # (over the last second) over the start-up lead it measured (on a busy machine,
        # up to ~1.5x the herd's time): a ramp of 4x the herd keeps the projection near
        # 0.6 * 1.4 of capacity, if the load rises as smoothly as the ramp says. So it
        # rises every RAMP_STEP_S by that time's share of the ramp, spread over the
        # routers in whole requests (bench/scale/router_host.py): the total moves by
        # ~0.25% of capacity at a time. (Until 2026-12-05 it was 40 steps with every
        # router's in-flight count rounded on its own: 12 jumps of 5% of capacity at all
        # routers at once.) At 10,000 x 1,000 the routers' reports, every 0.5 s each,
        # landed bunched in the controller's 0.1 s buckets and it read a surge (a slope
        # of 150,000-560,000 req/s per s against the ramp's 20,000) and scaled to
        # max_replicas; since 2026-12-06 each report is spread over the time it covers
        # and the slope is fit over a quarter of the lead, but a controller whose loop
        # stalls (a busy shared machine) can still over-read the rate right after:
        # `ramp_target` and `load_target` say what the load window ran at.
        ramp_s = min(RAMP_MAX_S, max(RAMP_MIN_S, 4.0 * result["herd_s"]))
        phase(replicas, routers, f"ramp to steady load ({ramp_s:.0f} s)")
        ramp_started = time.monotonic()
        while (elapsed := time.monotonic() - ramp_started) < ramp_s:
            await cluster.set_load(STEADY_LOAD * elapsed / ramp_s, queued=0)
            await asyncio.sleep(RAMP_STEP_S)
        await cluster.set_load(STEADY_LOAD, queued=0)
        result["ramp_target"] = float((await cluster.call("status")).applications[
            DID.app].deployments[DID.name].target_replicas)
        await asyncio.sleep(args.settle_s)
        phase(replicas, routers, f"load window ({args.window_s:.0f} s)")
        result.update({f"load_{k}": v for k, v in (await window(cluster, args.window_s)).items()})
        result["lost_until_load"] = lost_since(cluster, 0.0)  # from the deploy on
        await pushes(cluster)
        phase(replicas, routers, f"{args.changes} replica-set changes")
        result.update(await one_change(cluster, args.changes))
        result.update({f"change_{k}": v for k, v in (await pushes(cluster)).items()})
        phase(replicas, routers, "load step")
        result.update(await step(cluster, args.herd_timeout_s))
        result.update({f"step_{k}": v for k, v in (await pushes(cluster)).items()})
    finally:
        await cluster.stop()
    return result


def phase(replicas: int, routers: int, what: str) -> None:
    """Progress of a long run, with the time (and a mark a profiler can wait for)."""
    print(f"  {replicas}x{routers} {time.strftime('%H:%M:%S')}: {what}", flush=True)


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in runs for k in r}
    out = {}
    for key in keys:
        values = [r[key] for r in runs if key in r and not math.isnan(r[key])]
        out[key] = statistics.median(values) if values else math.nan
    return out


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def cells(m: dict[str, float], *columns: tuple[str, int] | tuple[str, str, int]) -> str:
    """Table cells: (key, digits) or (key, other key, digits) for "a / b"."""
    out = []
    for column in columns:
        *keys, digits = column
        out.append(" / ".join(fmt(m.get(str(k), math.nan), int(digits)) for k in keys))
    return " | ".join(out)


def print_tables(results: dict[tuple[int, int], dict[str, float]]) -> None:
    print("\n| replicas x routers | herd s | member failures | idle CPU % | idle RSS MiB | "
          "idle tick p50 / p99 ms | load CPU % | load tick p50 / p99 ms | load tick CPU p99 ms "
          "| load loop lag p99 ms | load running / target | replicas lost |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (n, r), m in results.items():
        print(f"| {n:,} x {r:,} | " + cells(
            m, ("herd_s", 1), ("member_failures", 0), ("idle_cpu_pct", 1), ("idle_rss_mib", 0),
            ("idle_tick_p50_ms", "idle_tick_p99_ms", 2), ("load_cpu_pct", 1),
            ("load_tick_p50_ms", "load_tick_p99_ms", 2), ("load_tick_cpu_p99_ms", 2),
            ("load_lag_p99_ms", 1), ("load_running", "load_target", 0),
            ("lost_until_load", 0)) + " |")
    print("\n| replicas x routers | step -> decision ms | step -> first / last start ms | "
          "change fan-out p50 / max ms | scale-up fan-out p50 / max ms | step tick p99 ms | "
          "replica_set push p50 / max bytes | bytes pushed per change |")
    print("|---|---|---|---|---|---|---|---|")
    for (n, r), m in results.items():
        m = {**m, "per_change": m.get("change_replica_set_bytes", math.nan)
             / max(1.0, m.get("changes", 1.0))}
        print(f"| {n:,} x {r:,} | " + cells(
            m, ("decision_ms", 1), ("first_start_ms", "last_start_ms", 1),
            ("fanout_change_ms", "fanout_change_max_ms", 1),
            ("scaleup_fanout_p50_ms", "scaleup_fanout_max_ms", 1), ("step_tick_p99_ms", 2),
            ("change_replica_set_p50_bytes", "change_replica_set_max_bytes", 0),
            ("per_change", 0)) + " |")


def summary(results: dict[tuple[int, int], dict[str, float]]) -> str:
    by_replicas = {n: m for (n, _), m in results.items()}
    by_routers = {r: m for (_, r), m in results.items()}

    def get(table: dict[int, dict[str, float]], size: int, key: str, digits: int) -> str:
        return fmt(table.get(size, {}).get(key, math.nan), digits).replace(",", "")

    parts = [f"tick_p99_ms_{n}={get(by_replicas, n, 'load_tick_p99_ms', 2)}"
             for n in (512, 2000, 10000)]
    parts += [f"decision_ms_512={get(by_replicas, 512, 'decision_ms', 1)}",
              f"fanout_ms_1000={get(by_routers, 1000, 'fanout_change_ms', 1)}",
              f"idle_cpu_pct_512={get(by_replicas, 512, 'idle_cpu_pct', 2)}",
              f"fanout_ms_512={get(by_replicas, 512, 'fanout_change_ms', 1)}"]
    return "summary: " + " ".join(parts)


def write_sim_figures(path: Path, replicas: int, routers: int, m: dict[str, float],
                      runs: int) -> None:
    """What `surge simulate` reads (control.measured): this run's medians."""
    figures = {
        "written_by": "bench/control_scale.py", "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, shared with the fake members", "runs": runs,
        "replicas": replicas, "routers": routers,
        "decision_s": round(m["decision_ms"] / 1e3, 4),
        "fanout_s": round(m["scaleup_fanout_p50_ms"] / 1e3, 4),
        "what": {"decision_s": "a load step (queues start to grow) -> the scale-up decision",
                 "fanout_s": "a new replica reports ready -> every router's set holds it "
                             "(median over the step's new replicas)"},
        "also": {"fanout_change_s": round(m["fanout_change_ms"] / 1e3, 4),
                 "tick_p99_s": round(m["load_tick_p99_ms"] / 1e3, 5),
                 "first_start_s": round(m["first_start_ms"] / 1e3, 4)},
        "command": " ".join(["python", "bench/control_scale.py", *sys.argv[1:]]),
    }
    path.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {path}")


def main() -> None:
    args = options(__doc__, {
        "startup_s": "how long a fake replica 'builds' before it is ready",
        "full_sets": "routers ask for whole replica sets only (as surge's own routers do "
                     "until they apply deltas)",
        "quick": "1 rep, 4 s windows, 2 changes",
        "sim_out": "write the first configuration's decision and fan-out times here, for "
                   "`surge simulate` (its scenario's control.measured)"},
        configs="512x64,2000x250,10000x1000", reps=3, window_s=10.0, settle_s=3.0, changes=5,
        startup_s=0.2, herd_timeout_s=300.0, full_sets=False, quick=False, sim_out="")
    if args.quick:
        args.reps, args.window_s, args.settle_s, args.changes = 1, 4.0, 1.5, 2
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    results: dict[tuple[int, int], dict[str, float]] = {}
    for replicas, routers in configs:
        runs = []
        for rep in range(args.reps):
            run = asyncio.run(run_config(replicas, routers, args))
            run["changes"] = args.changes
            runs.append(run)
            print(f"{replicas}x{routers} rep {rep + 1}: " + " ".join(
                f"{k}={fmt(v, 2)}" for k, v in sorted(run.items())), flush=True)
        results[(replicas, routers)] = medians(runs)
    print_tables(results)
    print(summary(results))
    if args.sim_out and results:
        (replicas, routers), m = next(iter(results.items()))
        if math.isnan(m.get("decision_ms", math.nan)) or math.isnan(
                m.get("scaleup_fanout_p50_ms", math.nan)):
            print(f"not writing {args.sim_out}: the step measured no decision or fan-out")
            sys.exit(1)
        write_sim_figures(Path(args.sim_out), replicas, routers, m, args.reps)


if __name__ == "__main__":
    main()
