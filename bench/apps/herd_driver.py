"""Start N echo replicas at once and delete them (bench/herd.py runs it).

    python herd_driver.py --replicas N --port PORT [--proxy-workers 8] [--idle-s 10]

Prints monotonic timestamps (CLOCK_MONOTONIC is the machine's, so the parent can compare):

    T_START t         before serve.start
    T_STARTED t       serve.start returned (controller and proxy workers up)
    T_RUN t           before serve.run (N replicas)
    T_RUN_DONE t      serve.run returned: every replica RUNNING
    IDLE_FROM t       the idle window starts (the parent reads the controller's CPU)
    IDLE_TO t         it ends
    T_DELETE t        before serve.delete
    T_DELETE_DONE t   serve.delete returned: every replica gone
    DONE

then shuts the instance down.
"""

from __future__ import annotations

import argparse
import time
import urllib.request
from typing import Any

from surge import serve


class Echo:
    async def __call__(self, request: Any) -> dict[str, str]:
        return {"echo": request.query_params.get("value", "")}


def say(key: str) -> None:
    print(f"{key} {time.monotonic():.6f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--proxy-workers", type=int, default=8)
    parser.add_argument("--idle-s", type=float, default=10.0)
    args = parser.parse_args()
    say("T_START")
    serve.start(http_options={"host": "127.0.0.1", "port": args.port,
                              "proxy_workers": args.proxy_workers})
    say("T_STARTED")
    deployment = serve.deployment(name="Echo", num_replicas=args.replicas)(Echo)
    say("T_RUN")
    serve.run(deployment.bind(), name="herd", route_prefix="/herd")
    say("T_RUN_DONE")
    status = serve.status().applications["herd"].deployments["Echo"]
    print(f"STATES {status.replica_states}", flush=True)
    with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/herd?value=x", timeout=10) as r:
        print(f"GET {r.status}", flush=True)
    say("IDLE_FROM")
    time.sleep(args.idle_s)
    say("IDLE_TO")
    say("T_DELETE")
    serve.delete("herd")
    say("T_DELETE_DONE")
    serve.shutdown()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
