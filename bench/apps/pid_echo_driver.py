"""An echo app that answers with its replica's PID, driven over stdin (startup, memory).

    python pid_echo_driver.py --system surge|ray --port PORT

Run surge with .venv's Python (SURGE_ADDRESS set to a free port) and Ray with the Ray
virtualenv's. Prints wall-clock timestamps (time.time()) as it goes:

    T_START t          first line of this script (after the interpreter started)
    T_SERVE_START t    just before serve.start(http_options=...)
    T_RUN t            just before serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    T_RUN_DONE t       serve.run returned
    READY url

then reads commands on stdin: `SCALE n` (prints `T_SCALE t`, redeploys with
`Echo.options(num_replicas=n)`, prints `SCALED t`) and `STOP` (shuts down, exits).
GET url answers `{"pid": <replica PID>}`.
"""

from __future__ import annotations

import time

print(f"T_START {time.time():.6f}", flush=True)

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402


class Echo:
    async def __call__(self, request: Any) -> dict[str, int]:
        return {"pid": os.getpid()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", choices=("surge", "ray"), required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    http = {"host": "127.0.0.1", "port": args.port}
    if args.system == "surge":
        from surge import serve
    else:
        from ray import serve
    print(f"T_SERVE_START {time.time():.6f}", flush=True)
    if args.system == "ray":
        import ray

        try:
            ray.init(address="local", _node_ip_address="127.0.0.1",
                     dashboard_host="127.0.0.1", log_to_driver=False)
        except Exception as exc:
            print(f"FATAL Ray did not start: {exc!r}", flush=True)
            raise
    serve.start(http_options=http)
    deployment = serve.deployment(name="Echo")(Echo)
    print(f"T_RUN {time.time():.6f}", flush=True)
    serve.run(deployment.bind(), name="echo", route_prefix="/echo")
    print(f"T_RUN_DONE {time.time():.6f}", flush=True)
    print(f"READY http://127.0.0.1:{args.port}/echo", flush=True)
    for line in sys.stdin:
        command = line.split()
        if not command:
            continue
        if command[0] == "SCALE":
            replicas = int(command[1])
            print(f"T_SCALE {time.time():.6f}", flush=True)
            serve.run(deployment.options(num_replicas=replicas).bind(), name="echo",
                      route_prefix="/echo")
            print(f"SCALED {time.time():.6f}", flush=True)
        elif command[0] == "STOP":
            break
    if args.system == "surge":
        serve.shutdown()
    else:
        import ray

        ray.shutdown()  # serve.shutdown() takes ~40 s on Ray; the local cluster goes anyway


if __name__ == "__main__":
    main()
