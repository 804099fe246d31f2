"""Handle-call figures for one system, as one JSON line on stdout.

    python handles_driver.py --system surge|ray [--duration 3] [--bursts 5] [--burst-size 1000]

Run surge with .venv's Python (SURGE_ADDRESS set to a free port) and Ray with the Ray
virtualenv's. For a deployment `Echo` (`__call__(self, x)` returns x, as a plain method
and as `async def`, max_ongoing_requests=100) it measures sequential
`handle.remote(i).result()` calls/s from the driver, sequential `await handle.remote(i)`
inside `asyncio.run`, and bursts of concurrent awaited calls
(`await asyncio.gather(*[handle.remote(i) for i in range(n)])`), each burst timed alone.
Progress goes to stderr; the last stdout line is `JSON {...}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from typing import Any

WARMUP_CALLS = 300
BURST_TIMEOUT_S = 60.0


class EchoSync:
    def __call__(self, x: Any) -> Any:
        return x


class EchoAsync:
    async def __call__(self, x: Any) -> Any:
        return x


def log(message: str) -> None:
    print(f"[handles_driver {os.getpid()}] {message}", file=sys.stderr, flush=True)


def seq_result(handle: Any, duration: float) -> dict[str, Any]:
    calls, worst = 0, 0.0
    started = time.perf_counter()
    end = started + duration
    now = started
    while now < end:
        value = handle.remote(calls).result()
        if value != calls:
            raise AssertionError(f"echo returned {value!r} for {calls!r}")
        before, now = now, time.perf_counter()
        worst = max(worst, now - before)
        calls += 1
    elapsed = now - started
    return {"calls": calls, "per_s": calls / elapsed, "max_call_ms": worst * 1000}


async def seq_await(handle: Any, duration: float) -> dict[str, Any]:
    calls, worst = 0, 0.0
    started = time.perf_counter()
    end = started + duration
    now = started
    while now < end:
        value = await handle.remote(calls)
        if value != calls:
            raise AssertionError(f"echo returned {value!r} for {calls!r}")
        before, now = now, time.perf_counter()
        worst = max(worst, now - before)
        calls += 1
    elapsed = now - started
    return {"calls": calls, "per_s": calls / elapsed, "max_call_ms": worst * 1000}


async def bursts(handle: Any, count: int, size: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        results = await asyncio.wait_for(
            asyncio.gather(*[handle.remote(i) for i in range(size)]), BURST_TIMEOUT_S)
        times.append(time.perf_counter() - started)
        if list(results) != list(range(size)):
            raise AssertionError("a burst returned wrong or reordered results")
        await asyncio.sleep(0.05)
    return times


def measure(serve: Any, system: str, variant: str, cls: type, args: argparse.Namespace,
            errors: list[str]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    app = f"echo_{variant}"
    deployment = serve.deployment(name="Echo", max_ongoing_requests=100)(cls)
    if system == "surge":
        # Ray queues a burst without bound and the bench times how it drains; surge's
        # default wait bound (max_queue_wait_s, 0.1 s) would refuse most of a 1,000-call
        # burst to one replica instead. Revisions of surge before the bound have no such
        # option (ValueError) and queue as Ray does already.
        try:
            deployment = deployment.options(max_queue_wait_s=None)
        except ValueError:
            pass
    started = time.perf_counter()
    handle = serve.run(deployment.bind(), name=app, route_prefix=f"/{app}")
    figures["deploy_s"] = time.perf_counter() - started
    try:
        started = time.perf_counter()
        first = handle.remote(-1).result()
        figures["first_call_s"] = time.perf_counter() - started
        assert first == -1, first
        for i in range(WARMUP_CALLS):
            handle.remote(i).result()
        steps = [
            ("seq_result", lambda: seq_result(handle, args.duration)),
            ("seq_await", lambda: asyncio.run(seq_await(handle, args.duration))),
            ("burst_s", lambda: asyncio.run(bursts(handle, args.bursts, args.burst_size))),
        ]
        for key, step in steps:
            log(f"{system} {variant}: {key}")
            try:
                figures[key] = step()
            except Exception as exc:  # reported in the JSON, not raised
                errors.append(f"{variant}/{key}: {type(exc).__name__}: {exc}")
                log(traceback.format_exc())
    finally:
        try:
            serve.delete(app)
        except Exception as exc:
            errors.append(f"{variant}/delete: {type(exc).__name__}: {exc}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", choices=("surge", "ray"), required=True)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--bursts", type=int, default=5)
    parser.add_argument("--burst-size", type=int, default=1000)
    parser.add_argument("--port", type=int, required=True, help="HTTP port (127.0.0.1)")
    parser.add_argument("--variants", default="sync,async")
    args = parser.parse_args()
    result: dict[str, Any] = {"system": args.system, "variants": {}, "errors": []}
    started = time.perf_counter()
    if args.system == "surge":
        import surge
        from surge import serve
        result["version"] = getattr(surge, "__version__", "?")
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    else:
        import ray
        from ray import serve

        result["version"] = ray.__version__
        try:
            ray.init(address="local", _node_ip_address="127.0.0.1",
                     dashboard_host="127.0.0.1", log_to_driver=False)
            serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        except Exception as exc:
            print("JSON " + json.dumps({**result, "fatal": f"Ray did not start: {exc!r}"}),
                  flush=True)
            raise
    result["start_s"] = time.perf_counter() - started
    classes = {"sync": EchoSync, "async": EchoAsync}
    try:
        for variant in args.variants.split(","):
            log(f"{args.system}: deploying {variant}")
            try:
                result["variants"][variant] = measure(serve, args.system, variant,
                                                      classes[variant], args, result["errors"])
            except Exception as exc:
                result["errors"].append(f"{variant}: {type(exc).__name__}: {exc}")
                log(traceback.format_exc())
        print("JSON " + json.dumps(result), flush=True)
    finally:
        stopped = time.perf_counter()
        if args.system == "surge":
            serve.shutdown()
        else:
            import ray

            ray.shutdown()  # serve.shutdown() takes ~40 s on Ray; the cluster goes anyway
        log(f"stopped in {time.perf_counter() - stopped:.1f} s")


if __name__ == "__main__":
    main()
