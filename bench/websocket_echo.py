"""WebSocket echo: surge vs Ray Serve 2.60, messages per second and CPU per message.

    python bench/websocket_echo.py [--systems surge,ray] [--sockets 1,32] [--duration 5]
        [--size 64] [--kill-replica]

Each system serves the same FastAPI WebSocket echo (bench/apps/ws_echo.py). `--sockets`
clients each send a message and wait for its echo, over and over, for `--duration`
seconds (closed loop); reported: messages/s, p50/p99 round trip, CPU microseconds per
message of the serving processes (proxy + replica). `--kill-replica` then opens a
socket, kills the replica with SIGKILL and prints the close code the client got.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import APPS, System, cmdline, cpu_seconds, free_port, ray_python, start_system


async def _client(url: str, until: float, payload: str, rtts: list[float]) -> int:
    from websockets.asyncio.client import connect

    count = 0
    async with connect(url, max_size=None) as ws:
        while time.monotonic() < until:
            started = time.perf_counter()
            await ws.send(payload)
            await ws.recv()
            rtts.append(time.perf_counter() - started)
            count += 1
    return count


async def _load(url: str, sockets: int, duration: float, size: int) -> tuple[int, list[float]]:
    until = time.monotonic() + duration
    rtts: list[float] = []
    counts = await asyncio.gather(*(_client(url, until, "m" * size, rtts)
                                    for _ in range(sockets)))
    return sum(counts), rtts


def measure(system: System, sockets: int, duration: float, size: int) -> str:
    serving = system.serving_pids()
    asyncio.run(_load(system.url, sockets, 1.0, size))  # warm up
    before = cpu_seconds(serving)
    started = time.monotonic()
    messages, rtts = asyncio.run(_load(system.url, sockets, duration, size))
    elapsed = time.monotonic() - started
    cpu = (cpu_seconds(serving) - before) / max(messages, 1) * 1e6
    rtts.sort()
    p50 = statistics.median(rtts) * 1e3
    p99 = rtts[int(len(rtts) * 0.99)] * 1e3
    return (f"sockets={sockets:<4} {messages / elapsed:>9,.0f} msg/s  p50 {p50:7.2f} ms  "
            f"p99 {p99:7.2f} ms  cpu/msg {cpu:6.0f} us")


async def _close_code_after_kill(url: str, replica: int) -> str:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async with connect(url) as ws:
        await ws.send("x")
        await ws.recv()
        os.kill(replica, signal.SIGKILL)
        try:
            await asyncio.wait_for(ws.recv(), 30)
        except ConnectionClosed as closed:
            rcvd = closed.rcvd
            return f"close {rcvd.code} {rcvd.reason!r}" if rcvd else "no close frame (1006)"
        except TimeoutError:
            return "nothing within 30 s"
    return "an answer?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--systems", default="surge,ray")
    parser.add_argument("--sockets", default="1,32")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--kill-replica", action="store_true")
    args = parser.parse_args()
    for name in args.systems.split(","):
        port = free_port()
        python = ray_python() if name == "ray" else sys.executable
        env = {"SURGE_ADDRESS": f"127.0.0.1:{free_port()}", "SURGE_LOG_LEVEL": "WARNING"}
        with start_system(name, [python, str(APPS / "ws_echo.py"), name, str(port)],
                          env) as system:
            print(f"== {name}", flush=True)
            for sockets in (int(s) for s in args.sockets.split(",")):
                print("  " + measure(system, sockets, args.duration, args.size), flush=True)
            if args.kill_replica:
                replica = next(p for p in system.pids()
                               if "surge:replica" in cmdline(p) or "ServeReplica" in cmdline(p))
                code = asyncio.run(_close_code_after_kill(system.url, replica))
                print(f"  replica killed mid-connection: the client got {code}", flush=True)


if __name__ == "__main__":
    main()
