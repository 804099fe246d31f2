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
3. steady load (every router reporting every 0.1 s), the same figures;
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
import math
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cloudpickle

from bench.common import cpu_seconds, free_port, rss_kib
from bench.scale.procs import BenchProcess, percentile
from surge.config import (
    AppSpec,
    AutoscalingConfig,
    DeploymentConfig,
    DeploymentSpec,
    HTTPOptions,
)
from surge.launch import ControllerProcessSpec, Lifetime, await_ready, encode, start_process
from surge.model import DeploymentId
from surge.observability.config import DashboardOptions, LoggingConfig
from surge.transport.rpc import RpcPeer, connect_rpc

HERE = Path(__file__).resolve().parent / "scale"
REPLICAS_PER_HOST = 2500
ROUTERS_PER_HOST = 250
TARGET_ONGOING = 2.0
SERVICE_S = 0.01  # what the reported rates imply: in flight / rate
STEADY_LOAD = 0.6  # of the replicas' target load, reached in a slow ramp: no scaling
STEP_LOAD = 1.75  # a surge: proactive scales up at once (to max_replicas)
DID = DeploymentId("scale", "Model")


class Fake:
    """Any class: the controller never unpickles a replica's code; fake replicas
    never build it."""


def app_spec(replicas: int) -> AppSpec:
    scaling = AutoscalingConfig(min_replicas=replicas, max_replicas=replicas + replicas // 8,
                                target_ongoing_requests=TARGET_ONGOING, upscale_delay_s=0.0)
    config = DeploymentConfig(name=DID.name, max_ongoing_requests=8,
                              autoscaling_config=scaling)
    spec = DeploymentSpec(config=config, target_blob=cloudpickle.dumps(Fake),
                          init_blob=cloudpickle.dumps(((), {})))
    return AppSpec(name=DID.app, route_prefix="/", ingress=DID.name, deployments=(spec,))


class Cluster:
    """One configuration's processes, and the driver's control connection."""

    def __init__(self, replicas: int, routers: int, startup_s: float) -> None:
        self.replicas, self.routers, self.startup_s = replicas, routers, startup_s
        self.directory = tempfile.mkdtemp(prefix="surge-scale-")
        self.token = secrets.token_hex(16)
        self.address = f"127.0.0.1:{free_port()}"
        self.hosts: list[BenchProcess] = []
        self.router_hosts: list[BenchProcess] = []
        self.controller: subprocess.Popen[bytes] | None = None
        self.driver: RpcPeer | None = None

    async def start(self) -> None:
        python = sys.executable
        for i in range(max(2, math.ceil(self.replicas / REPLICAS_PER_HOST))):
            host = await BenchProcess.start([python, str(HERE / "replica_host.py")], {
                "controller": self.address, "token": self.token, "startup_s": self.startup_s,
                "socket": os.path.join(self.directory, f"host-{i}.sock")})
            await host.expect("listening", 60)
            self.hosts.append(host)
        state = os.path.join(self.directory, "state")
        os.makedirs(state, mode=0o700)
        spec = ControllerProcessSpec(
            address=self.address, http=HTTPOptions(location="NoServer"), token=self.token,
            state_dir=state, lifetime=Lifetime(parent_pid=os.getpid()),
            logging=LoggingConfig(log_level="WARNING"),
            dashboard=DashboardOptions(host="127.0.0.1", port=0))
        argv = [python, str(HERE / "controller_main.py"),
                *[os.path.join(self.directory, f"host-{i}.sock") for i in range(len(self.hosts))]]
        with open(os.path.join(self.directory, "controller.log"), "wb") as log:
            self.controller = start_process(argv, encode(spec), dict(os.environ),
                                            stdout=subprocess.PIPE, stderr=log,
                                            start_new_session=True)
        await asyncio.to_thread(await_ready, self.controller, 60.0)
        self.driver = await connect_rpc(self.address, None, token=self.token)
        for _ in range(max(1, math.ceil(self.routers / ROUTERS_PER_HOST))):
            share = math.ceil(self.routers / max(1, math.ceil(self.routers / ROUTERS_PER_HOST)))
            count = min(share, self.routers - ROUTERS_PER_HOST * len(self.router_hosts))
            host = await BenchProcess.start([python, str(HERE / "router_host.py")], {
                "controller": self.address, "token": self.token, "routers": count})
            await host.expect("started", 60)
            self.router_hosts.append(host)

    @property
    def pid(self) -> int:
        assert self.controller is not None
        return self.controller.pid

    async def call(self, method: str, **kwargs: Any) -> Any:
        assert self.driver is not None
        return await self.driver.call(method, timeout=120.0, **kwargs)

    async def routers_ask(self, command: dict[str, Any], event: str) -> list[dict[str, Any]]:
        for host in self.router_hosts:
            host.send(command)
        return [await host.expect(event, 120) for host in self.router_hosts]

    async def router_status(self) -> tuple[int, int, int]:
        """(routers connected, the smallest set a router holds, routers holding one)."""
        answers = await self.routers_ask({"cmd": "status"}, "status")
        return (sum(a["connected"] for a in answers),
                min((a["smallest"] for a in answers if a["with_set"]), default=0),
                sum(a["with_set"] for a in answers))

    async def seen(self, ids: list[str], kind: str = "seen") -> dict[str, tuple[int, float]]:
        """Per id: how many routers saw it (or saw it leave), and the latest time."""
        total: dict[str, list[float]] = {i: [0, 0.0] for i in ids}
        for answer in await self.routers_ask({"cmd": kind, "ids": ids}, kind):
            for replica_id, (count, latest) in answer["result"].items():
                total[replica_id][0] += count
                total[replica_id][1] = max(total[replica_id][1], latest)
        return {i: (int(c), t) for i, (c, t) in total.items()}

    async def dropped(self, replica_id: str) -> bool:
        count, _ = (await self.seen([replica_id], "gone"))[replica_id]
        return count >= self.routers

    async def set_load(self, fraction: float, queued: int) -> float:
        """Every router reports this fraction of the replicas' target load; when the
        first router host applied it."""
        in_flight = round(fraction * self.replicas * TARGET_ONGOING / self.routers)
        answers = await self.routers_ask({"cmd": "load", "rps": in_flight / SERVICE_S,
                                          "in_flight": in_flight, "queued": queued}, "applied")
        return min(a["t"] for a in answers)

    async def stop(self) -> None:
        if self.driver is not None:
            self.driver.close()
        if self.controller is not None and self.controller.poll() is None:
            os.killpg(self.controller.pid, signal.SIGKILL)
            self.controller.wait()
        for host in self.router_hosts + self.hosts:
            await host.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


async def until(check: Any, timeout_s: float, poll_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(poll_s)
    return False


async def window(cluster: Cluster, seconds: float) -> dict[str, float]:
    """The controller's CPU share and ticks over `seconds` from now."""
    started, cpu = time.monotonic(), cpu_seconds([cluster.pid])
    await asyncio.sleep(seconds)
    spent, elapsed = cpu_seconds([cluster.pid]) - cpu, time.monotonic() - started
    ticks = (await cluster.call("loop_stats", since=started))["ticks"]
    wall = [w * 1e3 for w in ticks["wall_s"]]
    return {"cpu_pct": 100.0 * spent / elapsed, "tick_p50_ms": percentile(wall, 50),
            "tick_p99_ms": percentile(wall, 99), "tick_max_ms": max(wall, default=math.nan),
            "tick_cpu_p99_ms": percentile([c * 1e3 for c in ticks["cpu_s"]], 99),
            "lag_p99_ms": percentile([lag * 1e3 for lag in ticks["lag_s"]], 99),
            "rss_mib": rss_kib(cluster.pid) / 1024, "ticks": len(wall)}


async def herd(cluster: Cluster, timeout_s: float) -> dict[str, float]:
    started = time.monotonic()
    await cluster.call("deploy", app=app_spec(cluster.replicas))

    async def everyone() -> bool:
        connected, smallest, holding = await cluster.router_status()
        return (connected, holding, smallest) == (cluster.routers, cluster.routers,
                                                   cluster.replicas)

    done = await until(everyone, timeout_s, 0.2)
    failed = sum(len(h.events("failed")) for h in cluster.hosts + cluster.router_hosts)
    connected, smallest, _ = await cluster.router_status()
    return {"herd_s": time.monotonic() - started if done else math.nan,
            "member_failures": failed, "routers_connected": connected,
            "smallest_set": smallest}


async def one_change(cluster: Cluster, changes: int) -> dict[str, float]:
    """Cut one replica's connection; until every router's set lacks it."""
    times = []
    for i in range(changes):
        host = cluster.hosts[i % len(cluster.hosts)]
        host.send({"cmd": "crash"})
        crash = await host.expect("crash", 10)
        victim: str = crash["id"]
        if await until(lambda v=victim: cluster.dropped(v), 30, 0.05):  # type: ignore[misc]
            _, latest = (await cluster.seen([victim], "gone"))[victim]
            times.append((latest - crash["t"]) * 1e3)
        await asyncio.sleep(1.0)  # its replacement starts and is published meanwhile
    return {"fanout_change_ms": statistics.median(times) if times else math.nan,
            "fanout_change_max_ms": max(times, default=math.nan)}


async def _async(value: bool) -> bool:
    return value


async def step(cluster: Cluster, timeout_s: float) -> dict[str, float]:
    started_before = {e["id"] for h in cluster.hosts for e in h.events("start")}
    at = await cluster.set_load(STEP_LOAD, queued=2)
    wanted = cluster.replicas // 8
    decision: dict[str, Any] = {}

    async def decided() -> bool:
        found = [d for d in (await cluster.call("loop_stats", since=at))["decisions"]
                 if d["kind"] == "up"]
        if found:
            decision.update(found[0])
        return bool(found)

    if not await until(decided, 30, 0.01):
        print("no decision; the last ones:", (await cluster.call("loop_stats"))["decisions"][-3:],
              (await cluster.call("status")).applications, flush=True)

    def new_starts() -> list[dict[str, Any]]:
        return sorted((e for h in cluster.hosts for e in h.events("start")
                       if e["id"] not in started_before), key=lambda e: e["t"])

    await until(lambda: _async(len(new_starts()) >= wanted), 30, 0.02)
    starts = new_starts()
    ids = [e["id"] for e in starts]

    async def all_routed() -> bool:
        seen = await cluster.seen(ids)
        return all(count >= cluster.routers for count, _ in seen.values())

    routed = await until(all_routed, timeout_s, 0.2)
    ready = {e["id"]: e["t"] for h in cluster.hosts for e in h.events("ready")}
    seen = await cluster.seen(ids)
    fanouts = [(seen[i][1] - ready[i]) * 1e3 for i in ids if i in ready and
               seen[i][0] >= cluster.routers]
    load = await window(cluster, 2.0)  # the ticks while the new replicas settle
    return {
        "decision_ms": (decision["at"] - at) * 1e3 if decision else math.nan,
        "decided_target": decision.get("target", math.nan),
        "first_start_ms": (starts[0]["t"] - at) * 1e3 if starts else math.nan,
        "last_start_ms": (starts[-1]["t"] - at) * 1e3 if len(starts) >= wanted else math.nan,
        "scaleup_fanout_p50_ms": percentile(fanouts, 50),
        "scaleup_fanout_max_ms": max(fanouts, default=math.nan),
        "scaleup_routed": float(routed),
        "step_tick_p99_ms": load["tick_p99_ms"],
    }


async def pushes(cluster: Cluster) -> dict[str, float]:
    totals: dict[str, list[float]] = {}
    for answer in await cluster.routers_ask({"cmd": "pushes", "reset": True}, "pushes"):
        for topic, (count, size, largest, median) in answer["result"].items():
            t = totals.setdefault(topic, [0, 0, 0, 0])
            t[0] += count
            t[1] += size
            t[2] = max(t[2], largest)
            t[3] = max(t[3], median)
    sets = totals.get("replica_set", [0, 0, 0, 0])
    return {"replica_set_pushes": sets[0], "replica_set_bytes": sets[1],
            "replica_set_max_bytes": sets[2], "replica_set_p50_bytes": sets[3]}


async def run_config(replicas: int, routers: int, args: argparse.Namespace) -> dict[str, float]:
    cluster = Cluster(replicas, routers, args.startup_s)
    result: dict[str, float] = {"replicas": replicas, "routers": routers}
    try:
        await cluster.start()
        result.update(await herd(cluster, args.herd_timeout_s))
        if math.isnan(result["herd_s"]):
            return result
        await pushes(cluster)  # the herd's pushes are not counted below
        await asyncio.sleep(args.settle_s)
        result.update({f"idle_{k}": v for k, v in (await window(cluster, args.window_s)).items()})
        for i in range(1, 11):  # slowly: the proactive policy must see no surge
            await cluster.set_load(STEADY_LOAD * i / 10, queued=0)
            await asyncio.sleep(0.3)
        await asyncio.sleep(args.settle_s)
        result.update({f"load_{k}": v for k, v in (await window(cluster, args.window_s)).items()})
        await pushes(cluster)
        result.update(await one_change(cluster, args.changes))
        result.update({f"change_{k}": v for k, v in (await pushes(cluster)).items()})
        result.update(await step(cluster, args.herd_timeout_s))
        result.update({f"step_{k}": v for k, v in (await pushes(cluster)).items()})
    finally:
        await cluster.stop()
    return result


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
          "| load loop lag p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (n, r), m in results.items():
        print(f"| {n:,} x {r:,} | " + cells(
            m, ("herd_s", 1), ("member_failures", 0), ("idle_cpu_pct", 1), ("idle_rss_mib", 0),
            ("idle_tick_p50_ms", "idle_tick_p99_ms", 2), ("load_cpu_pct", 1),
            ("load_tick_p50_ms", "load_tick_p99_ms", 2), ("load_tick_cpu_p99_ms", 2),
            ("load_lag_p99_ms", 1)) + " |")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="512x64,2000x250,10000x1000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--changes", type=int, default=5)
    parser.add_argument("--startup-s", type=float, default=0.2,
                        help="how long a fake replica 'builds' before it is ready")
    parser.add_argument("--herd-timeout-s", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="1 rep, 4 s windows, 2 changes")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
