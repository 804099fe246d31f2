"""The apps of bench/overload.py, on surge or Ray Serve 2.60 (run with that system's Python).

    python overload_app.py surge|ray PORT sleep            # 2 replicas x 5 ongoing x 20 ms
    python overload_app.py surge|ray PORT matmul REPLICAS [ENV_JSON]

`sleep`: 20 ms awaited per request, num_replicas=2, max_ongoing_requests=5 (500 req/s of
capacity), queue settings left at their defaults. `matmul`: a float64 matmul of a few ms
per request (CPU-bound) on REPLICAS replicas, max_ongoing_requests left at its default;
ENV_JSON goes to `runtime_env.env_vars` (e.g. {"OPENBLAS_NUM_THREADS": "2"}).
`GET ...?info=1` on the matmul route answers what the replica runs with: its pid,
threadpoolctl's `threadpool_info()` (where installed), its thread count and BLAS variables.
Ray's replicas ask for num_cpus=2/REPLICAS (at most 1) so that they fit on 2 cores; surge's
keep its default. Prints `READY url` once serving; SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from typing import Any

from until_sigterm import serve_until_sigterm

MATMUL_N = 300  # ~2 ms for one thread on the reference machine
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class Sleep:
    async def __call__(self, request: Any) -> str:
        await asyncio.sleep(0.02)
        return "ok"


def replica_info() -> dict[str, Any]:
    try:
        from threadpoolctl import threadpool_info
        pools: Any = [{k: p.get(k) for k in ("internal_api", "num_threads")}
                      for p in threadpool_info()]
    except ImportError:
        pools = "threadpoolctl not installed"
    with open("/proc/self/status") as status:
        threads = next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    return {"pid": os.getpid(), "threadpool_info": pools, "threads": threads,
            "env": {k: os.environ[k] for k in THREAD_VARS if k in os.environ}}


class Matmul:
    def __init__(self) -> None:
        import numpy as np

        rng = np.random.default_rng(0)
        self.a, self.b = rng.random((MATMUL_N, MATMUL_N)), rng.random((MATMUL_N, MATMUL_N))

    def __call__(self, request: Any) -> Any:
        if request.query_params.get("info"):
            return replica_info()
        return {"sum": float((self.a @ self.b).sum())}


def main() -> None:
    system, port, app = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    serve: Any = importlib.import_module("surge.serve" if system == "surge" else "ray.serve")
    os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")
    http: dict[str, Any] = {"port": port}
    if system == "ray":
        http["host"] = "127.0.0.1"
    serve.start(http_options=http)
    if app == "sleep":
        deployment = serve.deployment(num_replicas=2, max_ongoing_requests=5)(Sleep)
    else:
        replicas = int(sys.argv[4])
        env = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
        actor: dict[str, Any] = {"runtime_env": {"env_vars": env}} if env else {}
        if system == "ray":
            actor["num_cpus"] = min(1.0, 2 / replicas)
        options: dict[str, Any] = {"ray_actor_options": actor} if actor else {}
        deployment = serve.deployment(num_replicas=replicas, **options)(Matmul)
    serve.run(deployment.bind(), name="overload", route_prefix="/work")
    print(f"READY http://127.0.0.1:{port}/work", flush=True)

    serve_until_sigterm(serve.shutdown if system == "ray" else None)


if __name__ == "__main__":
    main()
