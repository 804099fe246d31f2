"""The measurements of bench/control_scale.py, each on a running `Cluster`."""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
import time
from typing import Any

from bench.common import cpu_seconds, rss_kib
from bench.scale.cluster import DID, STEP_LOAD, Cluster, app_spec
from bench.scale.procs import percentile

__all__ = ["herd", "lost_since", "one_change", "pushes", "step", "until", "window"]


HERD_PROGRESS_S = 10.0


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
    status = (await cluster.call("status")).applications[DID.app].deployments[DID.name]
    return {"running": status.replica_states.get("RUNNING", 0),
            "target": float(status.target_replicas),
            "lost": lost_since(cluster, started),
            "cpu_pct": 100.0 * spent / elapsed, "tick_p50_ms": percentile(wall, 50),
            "tick_p99_ms": percentile(wall, 99), "tick_max_ms": max(wall, default=math.nan),
            "tick_cpu_p99_ms": percentile([c * 1e3 for c in ticks["cpu_s"]], 99),
            "lag_p99_ms": percentile([lag * 1e3 for lag in ticks["lag_s"]], 99),
            "rss_mib": rss_kib(cluster.pid) / 1024, "ticks": len(wall)}


def lost_since(cluster: Cluster, since: float) -> int:
    """Ready replicas that lost their connection or were killed by the controller (it
    fails a running replica whose connection closed) since `since`; the deliberate
    cuts of `one_change` are neither."""
    return len({e["id"] for h in cluster.hosts for kind in ("lost", "killed")
                for e in h.events(kind) if e["t"] >= since})


async def herd(cluster: Cluster, timeout_s: float) -> dict[str, float]:
    started = time.monotonic()
    await cluster.call("deploy", app=app_spec(cluster.replicas))

    said = [started]

    async def everyone() -> bool:
        connected, smallest, holding = await cluster.router_status()
        if time.monotonic() - said[0] >= HERD_PROGRESS_S:  # a long herd says how it goes
            said[0] = time.monotonic()
            pushes = await cluster.routers_ask({"cmd": "pushes"}, "pushes")
            count = sum(p["result"].get(t, [0])[0] for p in pushes
                        for t in ("replica_set", "replica_set_delta"))
            print(f"  herd at {said[0] - started:.0f} s: {connected} routers connected, "
                  f"{holding} holding a set, the smallest {smallest} of {cluster.replicas}; "
                  f"{count:,} replica-set pushes received", file=sys.stderr, flush=True)
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
    topics = [totals[t] for t in ("replica_set", "replica_set_delta") if t in totals]
    if not topics:
        return {"replica_set_pushes": 0, "replica_set_bytes": 0}
    busiest = max(topics, key=lambda t: t[0])  # its median stands for the pushes' size
    return {"replica_set_pushes": sum(t[0] for t in topics),
            "replica_set_bytes": sum(t[1] for t in topics),
            "replica_set_max_bytes": max(t[2] for t in topics),
            "replica_set_p50_bytes": busiest[3],
            "whole_set_pushes": totals.get("replica_set", [0])[0]}
