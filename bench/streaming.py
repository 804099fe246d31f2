"""Token streams through one proxy: N concurrent SSE streams x K chunks, surge vs Ray Serve.

    python bench/streaming.py [--streams 1000] [--chunks 50] [--gap-ms 20] [--ramp-s 0.5]
                              [--systems surge,ray] [--rounds 1] [--profile]

Each system serves the same app (bench/apps/surge_stream.py, bench/apps/ray_stream.py):
GET /stream?n=K&gap_ms=G answers a starlette `StreamingResponse` (text/event-stream) of K
events `data: <i>\\n\\n` with `await asyncio.sleep(G / 1000)` between them, from one
replica with `max_ongoing_requests = N + 100`, behind one proxy (surge: `proxy_workers=1`;
Ray: its one HTTP proxy on the node), only on 127.0.0.1.

The client opens N HTTP/1.1 connections, one stream each, spread evenly over `--ramp-s`
(so connection set-up is not what is measured) and reads them all at once. It is one
uvloop loop of raw `asyncio.Protocol`s with httptools parsing (the shape of
src/surge/loadtest/generator.py), running in this process. For each stream it records
the arrival time of every event (`time.perf_counter()` when the bytes that complete it
are read): time to first chunk counts from the moment the stream's TCP connection was
established (the request is written then), and every later event gives an inter-chunk
gap (two events read together give a gap of 0 for the second: what a reader would see).
Errors, each stream counted once: `connect` (refused, failed), `connection` (closed or
unparseable before the response head), `status` (not 200), `short` (fewer than K
events when the response ended or the connection closed), `bad` (an event other than
`data: <next i>`), `timeout` (not finished `--timeout-s` after the ramp plus the ideal
stream length).

Delivered chunks/s = events received / (last event - first connect). CPU is read from
/proc around the measured window (just before the first connect, just after the last
stream ended): the serving processes (proxy + replica, by process title) and every
process of the system (its driver's whole tree: for Ray, the GCS, raylet, dashboard and
agents, controller, proxy, replica), each per delivered chunk; the client's own CPU
(`getrusage` of this process: nothing else runs here during the window) is reported
too, as cores (CPU seconds / wall seconds) and per chunk, and so is the whole machine's
busy CPU (/proc/stat) and what is left of it after the system and the client ("other
work": whatever else runs on the machine). Serving CPU counts each thread's time on a
CPU in nanoseconds (/proc/PID/task/TID/schedstat), since the window is ~1.5 s and /proc's
10 ms ticks would be coarse.

What the client costs (2-core machine, defaults): 0.2-0.4 of a core against surge,
13-18 us per delivered chunk, about half of it in the kernel (py-spy: the client's busy
samples are mostly uvloop's read() per chunk and epoll; the Python per chunk, httptools
included, is ~20% of them), and ~0.05 of a core against Ray, which delivers fewer chunks
per second. At the ideal 50,000 chunks/s of the defaults' middle second it would need
~0.7-0.9 of a core; every run prints its share so a run where it crowds the server shows.
(Over 500 lines: the three systems' servers, the client and the per-thread CPU
accounting live together so that one command gives every row of the same run.)
"""

from __future__ import annotations

import argparse
import array
import asyncio
import gc
import os
import resource
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    APPS,
    System,
    cmdline,
    cpu_seconds,
    free_port,
    ray_python,
    start_system,
    start_ticks,
)

SYSTEMS = {
    "surge": "surge (1 proxy process, 1 replica)",
    "ray": "Ray Serve 2.60 (its HTTP proxy, 1 replica)",
}
ERROR_KINDS = ("connect", "connection", "status", "short", "bad", "timeout")


# -- the systems ------------------------------------------------------------------------------


def app_argv(system: str, port: int, max_ongoing: int,
             ping: bool = False) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the streaming app on `system` (bench/apps/*_stream.py)."""
    extra = ["ping"] if ping else []
    if system == "surge":
        env = {"SURGE_ADDRESS": f"127.0.0.1:{free_port()}", "SURGE_LOG_LEVEL": "WARNING"}
        return [sys.executable, str(APPS / "surge_stream.py"), str(port), str(max_ongoing),
                *extra], env
    return [ray_python(), str(APPS / "ray_stream.py"), str(port), str(max_ongoing), *extra], {}


def remember(system: System) -> dict[int, int]:
    """The system's processes now, with their start times (to tell them from reused pids)."""
    return {pid: start_ticks(pid) for pid in system.pids()}


def reap(known: dict[int, int]) -> None:
    """SIGKILL what is left of a stopped system (Ray's actors run in their own groups)."""
    for pid, ticks in known.items():
        if ticks >= 0 and start_ticks(pid) == ticks:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def cpu_snapshot(pids: list[int]) -> dict[int, tuple[float, float]]:
    """Per process: CPU seconds summed over its threads' /proc/PID/task/TID/schedstat
    (nanoseconds), and /proc/PID/stat's utime + stime (10 ms ticks, threads that ended
    included)."""
    snapshot = {}
    for pid in pids:
        try:
            fine = sum(int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
                       for tid in os.listdir(f"/proc/{pid}/task")) / 1e9
        except (OSError, ValueError, IndexError):
            fine = -1.0
        snapshot[pid] = (fine, cpu_seconds([pid]))
    return snapshot


def cpu_between(before: dict[int, tuple[float, float]],
                after: dict[int, tuple[float, float]],
                split: dict[int, float] | None = None) -> float:
    """CPU seconds from one snapshot to the next: each process's threads' nanoseconds, unless
    they disagree with its ticks by more than 3 ticks (a thread ended in the window and took
    its time with it), then its ticks. A process that is in only one snapshot counts 0."""
    total = 0.0
    tick = 1 / os.sysconf("SC_CLK_TCK")
    for pid, (fine1, coarse1) in after.items():
        if pid not in before:
            continue
        fine0, coarse0 = before[pid]
        fine, coarse = fine1 - fine0, coarse1 - coarse0
        used = fine if fine0 >= 0 and fine1 >= 0 and abs(fine - coarse) <= 3 * tick else coarse
        total += used
        if split is not None:
            split[pid] = used
    return total


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / ticks


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def own_sys_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def role(pid: int) -> str:
    """proxy, replica, or the process's command line (shortened)."""
    cmd = cmdline(pid)
    if "surge:proxy" in cmd or "ProxyActor" in cmd:
        return "proxy"
    if "surge:replica" in cmd or "ServeReplica" in cmd:
        return "replica"
    return cmd[:60]


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (nan if empty)."""
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), int(q / 100 * len(ordered) + 0.999999)))
    return ordered[rank - 1]


# -- the client -------------------------------------------------------------------------------


class Streams:
    """What all the streams of one run share: their results, and when the last one ended."""

    def __init__(self, streams: int, chunks: int) -> None:
        self.streams, self.chunks = streams, chunks
        self.gaps = array.array("d")
        self.firsts = array.array("d")
        self.connects = array.array("d")
        self.delivered = 0
        self.errors: Counter[str] = Counter()
        self.ended = 0
        self.first_connect = 0.0
        self.last_chunk = 0.0
        self.all_ended = asyncio.Event()
        self.open: set[StreamClient] = set()

    def end(self, conn: StreamClient, kind: str) -> None:
        self.open.discard(conn)
        if kind != "ok":
            self.errors[kind] += 1
        self.ended += 1
        if self.ended == self.streams:
            self.all_ended.set()


class StreamClient(asyncio.Protocol):
    """One connection, one GET, one SSE stream read to its end."""

    __slots__ = ("ended", "last", "parser", "partial", "request", "run", "seen", "started",
                 "status", "transport", "wrong")

    def __init__(self, run: Streams, request: bytes) -> None:
        self.run = run
        self.request = request
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.started = time.perf_counter()
        self.last = 0.0
        self.seen = 0
        self.partial = b""
        self.status = 0
        self.wrong = False
        self.ended = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        now = time.perf_counter()
        self.transport = transport  # type: ignore[assignment]
        self.run.connects.append(now - self.started)
        self.last = now  # time to first chunk counts from here
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._end("connection")
        except httptools.HttpParserError:
            self._end("short" if self.status == 200 else "connection")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended:
            self._end("short" if self.status == 200 else "connection")

    # httptools callbacks

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status != 200:
            self._end("status")

    def on_body(self, body: bytes) -> None:
        if self.ended:
            return
        now = time.perf_counter()
        if self.partial:
            body = self.partial + body
        parts = body.split(b"\n\n")
        self.partial = parts.pop()
        if not parts:
            return
        run, seen = self.run, self.seen
        for part in parts:
            if part != b"data: %d" % seen:
                self.wrong = True
            if seen:
                run.gaps.append(now - self.last)
            else:
                run.firsts.append(now - self.last)
            self.last = now
            seen += 1
        self.seen = seen
        run.delivered += len(parts)
        run.last_chunk = now

    def on_message_complete(self) -> None:
        if not self.ended:
            self._end("bad" if self.wrong else "ok" if self.seen == self.run.chunks
                      else "short")

    def _end(self, kind: str) -> None:
        if self.ended:
            return
        if kind == "ok" and self.wrong:
            kind = "bad"
        self.ended = True
        self.run.end(self, kind)
        if self.transport is not None:
            self.transport.close()


@dataclass
class Result:
    streams: int
    chunks: int
    gap_ms: float
    delivered: int
    window_s: float
    errors: Counter[str]
    gap_p50_ms: float
    gap_p99_ms: float
    gap_max_ms: float
    first_p50_ms: float
    first_p99_ms: float
    first_max_ms: float
    connect_p99_ms: float
    serving_cpu_s: float
    all_cpu_s: float
    client_cpu_s: float
    machine_cpu_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def chunks_per_s(self) -> float:
        return self.delivered / self.window_s if self.window_s > 0 else float("nan")

    def per_chunk_us(self, seconds: float) -> float:
        return seconds / self.delivered * 1e6 if self.delivered else float("nan")

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


async def run_streams(host: str, port: int, streams: int, chunks: int, gap_ms: float,
                      ramp_s: float, timeout_s: float, serving: list[int] | None = None,
                      everything: list[int] | None = None) -> Result:
    """Open `streams` SSE streams over `ramp_s`, read them all; CPU of the given pids."""
    loop = asyncio.get_running_loop()
    run = Streams(streams, chunks)
    request = (f"GET /stream?n={chunks}&gap_ms={gap_ms:g} HTTP/1.1\r\n"
               f"host: {host}:{port}\r\naccept: text/event-stream\r\n\r\n").encode()
    connecting: set[asyncio.Task[Any]] = set()

    def connected(conn: StreamClient, task: asyncio.Task[Any]) -> None:
        connecting.discard(task)
        if task.cancelled() or task.exception() is not None:
            conn._end("connect")

    serving, everything = serving or [], everything or []
    cpu0, all0 = cpu_snapshot(serving), cpu_snapshot(everything)
    own0, sys0, machine0 = own_cpu_s(), own_sys_s(), machine_busy_s()
    start = time.perf_counter()
    run.first_connect = start
    for i in range(streams):
        delay = start + i * ramp_s / streams - time.perf_counter()
        if delay > 0.0005:
            await asyncio.sleep(delay)
        conn = StreamClient(run, request)
        run.open.add(conn)
        task = loop.create_task(loop.create_connection(lambda c=conn: c, host, port))  # type: ignore[misc]
        connecting.add(task)
        task.add_done_callback(lambda t, c=conn: connected(c, t))  # type: ignore[misc]
    ideal_s = (chunks - 1) * gap_ms / 1000
    try:
        await asyncio.wait_for(run.all_ended.wait(), timeout=ideal_s + timeout_s)
    except TimeoutError:
        for conn in list(run.open):
            conn._end("timeout")
        for task in list(connecting):
            task.cancel()
    end = time.perf_counter()
    split: dict[int, float] = {}
    cpu = cpu_between(cpu0, cpu_snapshot(serving), split)
    everything_cpu = cpu_between(all0, cpu_snapshot(everything))
    own, own_sys = own_cpu_s() - own0, own_sys_s() - sys0
    machine = machine_busy_s() - machine0
    roles: dict[str, float] = {}
    for pid, used in split.items():
        roles[role(pid)] = roles.get(role(pid), 0.0) + used
    gaps, firsts = sorted(run.gaps), sorted(run.firsts)
    window = (run.last_chunk or end) - run.first_connect
    return Result(
        streams=streams, chunks=chunks, gap_ms=gap_ms, delivered=run.delivered,
        window_s=window, errors=run.errors,
        gap_p50_ms=percentile(gaps, 50) * 1e3, gap_p99_ms=percentile(gaps, 99) * 1e3,
        gap_max_ms=(gaps[-1] * 1e3 if gaps else float("nan")),
        first_p50_ms=percentile(firsts, 50) * 1e3, first_p99_ms=percentile(firsts, 99) * 1e3,
        first_max_ms=(firsts[-1] * 1e3 if firsts else float("nan")),
        connect_p99_ms=percentile(sorted(run.connects), 99) * 1e3,
        serving_cpu_s=cpu, all_cpu_s=everything_cpu, client_cpu_s=own,
        machine_cpu_s=machine,
        extra={"wall_s": end - start, "roles": roles, "client_sys_s": own_sys})


def measure(host: str, port: int, args: argparse.Namespace, serving: list[int],
            everything: list[int]) -> Result:
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        return uvloop.run(run_streams(host, port, args.streams, args.chunks, args.gap_ms,
                                      args.ramp_s, args.timeout_s, serving, everything))
    finally:
        gc.enable()
        gc.unfreeze()


def warm_up(host: str, port: int) -> None:
    """A few short streams first (imports, route tables, the first connections)."""
    for _ in range(3):
        result = uvloop.run(run_streams(host, port, 20, 5, 5, 0.05, 30))
        if not result.error_count:
            return
    raise RuntimeError(f"warm-up streams failed: {dict(result.errors)}")


# -- report -----------------------------------------------------------------------------------


def figures(r: Result) -> dict[str, float]:
    """The reported figures of one run (CPU per delivered chunk, cores = CPU s / wall s)."""
    wall = r.extra.get("wall_s", r.window_s)
    return {
        "delivered": r.delivered, "chunks_per_s": r.chunks_per_s,
        "gap_p50_ms": r.gap_p50_ms, "gap_p99_ms": r.gap_p99_ms, "gap_max_ms": r.gap_max_ms,
        "first_p50_ms": r.first_p50_ms, "first_p99_ms": r.first_p99_ms,
        "first_max_ms": r.first_max_ms, "connect_p99_ms": r.connect_p99_ms,
        "errors": r.error_count,
        "serving_us": r.per_chunk_us(r.serving_cpu_s), "all_us": r.per_chunk_us(r.all_cpu_s),
        "serving_cores": r.serving_cpu_s / wall, "all_cores": r.all_cpu_s / wall,
        "client_us": r.per_chunk_us(r.client_cpu_s), "client_cores": r.client_cpu_s / wall,
        "machine_cores": r.machine_cpu_s / wall, "wall_s": wall,
        "other_cores": max(0.0, r.machine_cpu_s - r.all_cpu_s - r.client_cpu_s) / wall,
        "proxy_us": r.per_chunk_us(r.extra.get("roles", {}).get("proxy", float("nan"))),
        "replica_us": r.per_chunk_us(r.extra.get("roles", {}).get("replica", float("nan"))),
        "client_sys_share": r.extra.get("client_sys_s", float("nan")) / r.client_cpu_s
        if r.client_cpu_s else float("nan"),
    }


def median_figures(runs: list[Result]) -> dict[str, float]:
    """The median of each figure over the rounds; errors summed."""
    each = [figures(r) for r in runs]
    merged = {key: float(statistics.median(f[key] for f in each)) for key in each[0]}
    merged["errors"] = sum(f["errors"] for f in each)
    return merged


HEADER = ("| system | chunks delivered | chunks/s | gap p50 ms | gap p99 ms | gap max ms "
          "| first p50 ms | first p99 ms | connect p99 ms | errors "
          "| serving CPU µs/chunk (proxy+replica) | proxy / replica µs/chunk "
          "| CPU µs/chunk (all processes) "
          "| client: cores (µs/chunk) | machine busy cores (other work) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def row(label: str, f: dict[str, float], expected: int, errors: str) -> str:
    return (f"| {label} | {f['delivered']:,.0f} / {expected:,} | {f['chunks_per_s']:,.0f} | "
            f"{f['gap_p50_ms']:.1f} | {f['gap_p99_ms']:.1f} | {f['gap_max_ms']:.1f} | "
            f"{f['first_p50_ms']:.1f} | {f['first_p99_ms']:.1f} | {f['connect_p99_ms']:.1f} | "
            f"{errors} | {f['serving_us']:.1f} | {f['proxy_us']:.1f} / {f['replica_us']:.1f} | "
            f"{f['all_us']:.1f} | "
            f"{f['client_cores']:.2f} ({f['client_us']:.1f}) | {f['machine_cores']:.2f} "
            f"({f['other_cores']:.2f}) |")


def error_text(errors: Counter[str]) -> str:
    return ", ".join(f"{kind} {errors[kind]}" for kind in ERROR_KINDS if errors[kind]) or "0"


def raise_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--chunks", type=int, default=50)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--ramp-s", type=float, default=0.5,
                        help="open the connections evenly over this long")
    parser.add_argument("--timeout-s", type=float, default=120.0,
                        help="a stream not done this long after the ramp plus its ideal "
                             "length counts as a timeout")
    parser.add_argument("--systems", default="surge,ray")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the systems in turn this many times (fresh each time); "
                             "medians are reported")
    parser.add_argument("--profile", action="store_true",
                        help="sample surge's proxy and replica with py-spy while the last "
                             "round's streams run and print their top functions "
                             "(bench/profile.py; with --chunks 250 they run ~5 s)")
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    for name in systems:
        if name not in SYSTEMS:
            raise SystemExit(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
    raise_nofile(args.streams + 1024)
    ideal = args.streams * args.chunks / (args.ramp_s + (args.chunks - 1) * args.gap_ms / 1000)
    print(f"{args.streams} streams x {args.chunks} chunks, {args.gap_ms:g} ms apart, opened "
          f"over {args.ramp_s:g} s; ideal gap {args.gap_ms:g} ms, ideal rate "
          f"{ideal:,.0f} chunks/s; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, list[Result]] = {name: [] for name in systems}
    for round_no in range(1, args.rounds + 1):
        for name in systems:
            port = free_port()
            argv, env = app_argv(name, port, args.streams + 100)
            print(f"== round {round_no}: {SYSTEMS[name]}", flush=True)
            known: dict[int, int] = {}
            try:
                with start_system(name, argv, env) as system:
                    warm_up("127.0.0.1", port)
                    known = remember(system)
                    serving, everything = system.serving_pids(), system.pids()
                    profiler = None
                    if args.profile and name == "surge" and round_no == args.rounds:
                        from bench.profile import Profiler

                        profiler = Profiler({f"{cmdline(pid).split()[0]} #{pid}": pid
                                             for pid in serving},
                                            args.ramp_s + args.chunks * args.gap_ms / 1000)
                    r = measure("127.0.0.1", port, args, serving, everything)
                    if profiler is not None:
                        print(profiler.report(15), flush=True)
                    known.update(remember(system))
            except RuntimeError as exc:
                print(f"   {name} FAILED: {exc}", flush=True)
                continue
            finally:
                reap(known)
            results[name].append(r)
            f = figures(r)
            print(f"   {f['chunks_per_s']:,.0f} chunks/s ({r.delivered:,} in {r.window_s:.2f} s), "
                  f"gap p50 {f['gap_p50_ms']:.1f} p99 {f['gap_p99_ms']:.1f} "
                  f"max {f['gap_max_ms']:.1f} ms, first p50 {f['first_p50_ms']:.1f} "
                  f"p99 {f['first_p99_ms']:.1f} ms, errors {error_text(r.errors)}, "
                  f"serving CPU {f['serving_us']:.1f} µs/chunk (proxy {f['proxy_us']:.1f}, "
                  f"replica {f['replica_us']:.1f}; {f['serving_cores']:.2f} cores; all "
                  f"processes {f['all_us']:.1f} µs/chunk), client {f['client_cores']:.2f} "
                  f"cores ({f['client_us']:.1f} µs/chunk, {f['client_sys_share']:.0%} "
                  "in the kernel), "
                  f"machine busy {f['machine_cores']:.2f} cores (other work "
                  f"{f['other_cores']:.2f})", flush=True)
    expected = args.streams * args.chunks
    print()
    print(HEADER)
    medians: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        for i, r in enumerate(runs, 1):
            print(row(f"{SYSTEMS[name]}, round {i}", figures(r), expected, error_text(r.errors)))
        if runs:
            medians[name] = median_figures(runs)
    if args.rounds > 1:
        for name, f in medians.items():
            errors: Counter[str] = Counter()
            for r in results[name]:
                errors.update(r.errors)
            print(row(f"**{SYSTEMS[name]}, median of {len(results[name])}**", f, expected,
                      error_text(errors)))
    print()
    nan = float("nan")

    def fig(system: str, key: str) -> float:
        return medians[system][key] if system in medians else nan

    ratio = fig("surge", "chunks_per_s") / fig("ray", "chunks_per_s")
    print(f"surge / Ray chunks/s: {ratio:.2f}x; the client took "
          f"{fig('surge', 'client_cores'):.2f} cores against surge, "
          f"{fig('ray', 'client_cores'):.2f} against Ray")
    print("summary: " + " ".join([
        f"chunks_per_s={fig('surge', 'chunks_per_s'):.0f}",
        f"ray_chunks_per_s={fig('ray', 'chunks_per_s'):.0f}",
        f"ratio_vs_ray={ratio:.2f}",
        f"server_cpu_us_per_chunk={fig('surge', 'serving_us'):.1f}",
        f"ray_server_cpu_us_per_chunk={fig('ray', 'serving_us'):.1f}",
        f"ray_all_cpu_us_per_chunk={fig('ray', 'all_us'):.1f}",
        f"gap_p99_ms={fig('surge', 'gap_p99_ms'):.1f}",
        f"ray_gap_p99_ms={fig('ray', 'gap_p99_ms'):.1f}",
        f"first_p99_ms={fig('surge', 'first_p99_ms'):.1f}",
        f"ray_first_p99_ms={fig('ray', 'first_p99_ms'):.1f}",
        f"errors={fig('surge', 'errors'):.0f}",
        f"ray_errors={fig('ray', 'errors'):.0f}",
        f"client_cores={fig('surge', 'client_cores'):.2f}",
    ]))


if __name__ == "__main__":
    main()
