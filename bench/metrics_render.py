"""What one /metrics scrape costs the controller, and how much of it Ray's names add.

    python bench/metrics_render.py [--deployments 20] [--replicas 4] [--routes 3] [--n 50]

Renders one snapshot the size of a busy instance (per deployment: routes x 3 status
codes at the proxy, replicas x routes at the replicas, and two user metrics per
replica), then the `ray_serve_*` families alone and the users' `ray_*` families alone
from the same snapshot, and prints the CPU time per scrape of each (best of --n: the
machine is shared), and what a scrape cost before Ray's names (surge's names alone,
written by prometheus_client's generate_latest).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from surge.controller.metrics import exposition, render, surge_families
from surge.controller.observer import MetricsSnapshot
from surge.controller.ray_metrics import ray_families, user_families
from surge.controller.user_metrics import UserMetrics
from surge.observability.recorder import Histogram
from surge.observability.user_metrics import Buckets, MetricInfo


def histogram(n: int) -> Histogram:
    h = Histogram()
    for value in range(n):
        h.observe(value * 0.7)
    return h


def snapshot(deployments: int, replicas: int, routes: int) -> MetricsSnapshot:
    http, processing, healthy, per_replica = {}, {}, {}, {}
    user = UserMetrics()
    requests = MetricInfo("requests", "counter", "", ("application", "deployment", "model",
                                                     "replica"))
    sizes = MetricInfo("sizes", "histogram", "", ("application", "deployment", "replica"),
                       (10.0, 100.0, 1000.0, 10000.0))
    for d in range(deployments):
        app, dep = f"app{d}", f"Model{d}"
        for r in range(routes):
            for code in (200, 500, 503):
                http[(app, dep, f"/r{r}", "GET", code)] = histogram(40)
        for i in range(replicas):
            replica = f"{dep}-{i}"
            healthy[(app, dep, replica)] = 1
            per_replica[(app, dep, replica)] = 2.0
            for r in range(routes):
                processing[(app, dep, replica, f"/r{r}")] = histogram(40)
            user.add(replica, {
                requests: {(app, dep, "m", replica): 5.0},
                sizes: {(app, dep, replica): Buckets(4, [1, 2, 3, 4, 5], 12345.0)}})
    apps = {(f"app{d}", f"Model{d}"): 2 for d in range(deployments)}
    return MetricsSnapshot(http=http, processing=processing, replica_healthy=healthy,
                           replica_processing=per_replica, replica_started=per_replica,
                           target_replicas=apps, queued=apps, ongoing=apps, offered=apps,
                           user=user.families)


class _Only:
    def __init__(self, families: Callable[[], Iterator[Metric]]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return self.families()


def text_of(families: Callable[[], Iterator[Metric]]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Only(families))
    return generate_latest(registry)


def best_ms(fn: Callable[[], bytes], n: int) -> tuple[float, int]:
    """The least CPU time of n calls (the machine is shared: CPU time, not wall time, and
    the minimum is the cost), and the bytes."""
    size, best = len(fn()), float("inf")
    for _ in range(n):
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best * 1000, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=int, default=20)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--routes", type=int, default=3)
    parser.add_argument("--n", type=int, default=30)
    args = parser.parse_args()
    s = snapshot(args.deployments, args.replicas, args.routes)
    before, _ = best_ms(lambda: text_of(lambda: surge_families(s)), args.n)
    full, full_bytes = best_ms(lambda: render(s), args.n)
    own, own_bytes = best_ms(lambda: exposition(surge_families(s)), args.n)
    ray, ray_bytes = best_ms(lambda: exposition(ray_families(s)), args.n)
    users, user_bytes = best_ms(lambda: exposition(user_families(s.user)), args.n)
    print(f"{args.deployments} deployments x {args.replicas} replicas x {args.routes} routes, "
          f"best of {args.n}")
    print(f"before: surge's names, generate_latest  {before:7.2f} ms  "
          f"{own_bytes / 1024:6.0f} KiB")
    print(f"render /metrics now                     {full:7.2f} ms  {full_bytes / 1024:6.0f} KiB"
          f"  ({full / own:.2f}x surge's names alone, {full / before:.2f}x before)")
    print(f"  surge's names                         {own:7.2f} ms  {own_bytes / 1024:6.0f} KiB")
    print(f"  ray_serve_* names                     {ray:7.2f} ms  {ray_bytes / 1024:6.0f} KiB")
    print(f"  user metrics                          {users:7.2f} ms  "
          f"{user_bytes / 1024:6.0f} KiB")

if __name__ == "__main__":
    main()
