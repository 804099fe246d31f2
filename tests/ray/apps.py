"""Deployments for the ray backend's tests: each answers with where it runs."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from surge import serve


def whereami() -> dict[str, Any]:
    return {"pid": os.getpid(), "node": serve.get_replica_context().node_id,
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


def pools() -> dict[str, Any]:
    """This replica's BLAS pool and priority, asked from inside it."""
    import numpy  # noqa: F401 - the library whose pool is asked
    import threadpoolctl

    blas = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    return {"blas": blas, "omp": os.environ.get("OMP_NUM_THREADS"), "nice": os.nice(0)}


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.25})
class Where:
    async def __call__(self, request: Any) -> dict[str, Any]:
        return whereami()

    def pools(self) -> dict[str, Any]:
        return pools()


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.25, "num_gpus": 1})
class OnGpu:
    async def __call__(self, request: Any) -> dict[str, Any]:
        return whereami()


@serve.deployment(num_replicas=1, max_ongoing_requests=4,
                  ray_actor_options={"num_cpus": 0.25, "resources": {"doomed": 1}})
class Slow:
    """Pinned by a custom resource to the node the test removes (then to its spare)."""

    async def __call__(self, request: Any) -> dict[str, Any]:
        await asyncio.sleep(0.3)
        return whereami()


@serve.deployment(num_replicas=3, ray_actor_options={"num_cpus": 0.25})
class Weighted:
    """Loads a safetensors file from its node's weight store and writes what it got to
    `report_dir/<pid>.json` (every node of the test cluster is this machine)."""

    def __init__(self, source: str, report_dir: str) -> None:
        import json

        from surge import weights

        self.weights = weights.load("ray-test", source)
        info, stats = self.weights.info, weights.stats()
        report = {**whereami(), "key": info.key, "shared": info.shared, "path": info.path,
                  "store_pid": stats.pid if stats else None,
                  "sum": float(self.weights["x"].sum())}
        with open(os.path.join(report_dir, f"{os.getpid()}.json"), "w") as out:
            json.dump(report, out)

    async def __call__(self, request: Any) -> str:
        return "ok"
