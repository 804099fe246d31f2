"""The echo app on surge: `python surge_echo.py PORT [MAX_ONGOING] [MAX_QUEUED]`.

SURGE_BENCH_TLS=CERT:KEY serves HTTPS with those files (bench/http_echo.py surge_tls).
SURGE_BENCH_RAY=1 runs it on the ray backend: a one-node Ray cluster on 127.0.0.1 started
here, the proxy and the replica each in a Ray actor (bench/http_echo.py surge_ray).
SURGE_BENCH_LOGGING=JSON is the logging_config it passes to serve.start.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from until_sigterm import serve_until_sigterm

from surge import serve


@serve.deployment
class Echo:
    async def __call__(self, request: Any) -> dict[str, str]:
        return {"echo": request.query_params.get("value", "")}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    port = int(sys.argv[1])
    options: dict[str, Any] = {}
    if len(sys.argv) > 2 and sys.argv[2] != "-":
        options["max_ongoing_requests"] = int(sys.argv[2])
    if len(sys.argv) > 3 and sys.argv[3] != "-":
        options["max_queued_requests"] = int(sys.argv[3])
    os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")
    http: dict[str, Any] = {"port": port}
    tls = os.environ.get("SURGE_BENCH_TLS")
    if tls:
        http["ssl_certfile"], http["ssl_keyfile"] = tls.split(":", 1)
    backend: dict[str, Any] = {}
    cluster = None
    if os.environ.get("SURGE_BENCH_RAY") == "1":
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # 127.0.0.1, before Ray loads
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "include_dashboard": False, "dashboard_port": _free_port()})
        backend = {"backend": "ray", "ray_address": cluster.address}
    logging_config = json.loads(os.environ.get("SURGE_BENCH_LOGGING", "null"))
    serve.start(http_options=http, logging_config=logging_config, **backend)
    serve.run(Echo.options(**options).bind(), name="echo", route_prefix="/echo")
    scheme = "https" if tls else "http"
    print(f"READY {scheme}://127.0.0.1:{port}/echo?value=x", flush=True)

    # a Ray cluster's nodes, not only their processes' group
    serve_until_sigterm(cluster.shutdown if cluster is not None else None)


if __name__ == "__main__":
    main()
