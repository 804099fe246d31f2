"""Run a pulse: generator(s), replica sampler and the live progress line, then the report.

With `workers=1` the generator runs on this process's loop. With N workers, N spawned
processes each send 1/N of the schedule (see `schedule.arrival_times`) over 1/N of the
connections; they all start at the same monotonic instant (CLOCK_MONOTONIC is shared
by the processes of a machine), stream progress snapshots every 0.5 s over a pipe and
hand back their `Record`, which merges by adding counts. Replica sampling and the
progress line always run here.

The progress line is printed every second; falling behind the schedule (send lag over
`stats.BEHIND_S`) or running out of connections is announced on its own line, loudly,
and repeated in the summary: the offered load is never lowered to hide it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any, TextIO

import uvloop

from surge.clock import Clock, SystemClock
from surge.loadtest.generator import Plan, PulseGenerator
from surge.loadtest.options import PulseOptions
from surge.loadtest.replicas import ReplicaSampler, default_address
from surge.loadtest.stats import (
    BEHIND_S,
    POINTS_PER_S,
    Record,
    ReplicaSample,
    Window,
    merge_histograms,
    point_of,
    replica_points,
)
from surge.loadtest.summary import series, summarize

__all__ = ["Progress", "PulseResult", "build_report", "raise_fd_limit", "run_pulse"]

PROGRESS_EVERY_S = 1.0
SNAPSHOT_EVERY_S = 0.5
# Workers need this long to start (spawned interpreters importing numpy): t0 waits.
START_MARGIN_S = 0.3
# File descriptors beyond the connections: stdio, pipes, the control connection, imports.
FD_SPARE = 64


@dataclass(frozen=True)
class Progress:
    """The last second, as one generator (or the sum of all workers) saw it."""

    elapsed: float
    window: Window
    lag_max_s: float
    waited: int
    open_connections: int
    outstanding: int

    @classmethod
    def of(cls, generator: PulseGenerator) -> Progress:
        record, elapsed = generator.record, generator.elapsed
        last = point_of(max(elapsed, 0.0))
        first = last - POINTS_PER_S
        lags = record.lag_max[max(first, 0):last + 1]
        return cls(elapsed, record.window(first, last), max(lags, default=0.0),
                   record.waited, generator.open_connections, generator.outstanding)

    @classmethod
    def merge(cls, parts: list[Progress]) -> Progress:
        windows = [p.window for p in parts]
        return cls(
            elapsed=max(p.elapsed for p in parts),
            window=Window(max(w.seconds for w in windows), sum(w.offered for w in windows),
                          sum(w.ok for w in windows), sum(w.errors for w in windows),
                          merge_histograms(w.latency for w in windows)),
            lag_max_s=max(p.lag_max_s for p in parts), waited=sum(p.waited for p in parts),
            open_connections=sum(p.open_connections for p in parts),
            outstanding=sum(p.outstanding for p in parts))


@dataclass(frozen=True)
class PulseResult:
    report: dict[str, Any]
    record: Record
    samples: tuple[ReplicaSample, ...]


class _Console:
    """The live line and the loud notices, on one stream."""

    def __init__(self, stream: TextIO, quiet: bool, connections: int) -> None:
        self.stream = stream
        self.quiet = quiet
        self.connections = connections
        self.tty = stream.isatty()
        self._waited = 0
        self._behind = False

    def notice(self, message: str) -> None:
        self._end_line()
        print(f"surge pulse: {message}", file=self.stream, flush=True)

    def _end_line(self) -> None:
        if self.tty and not self.quiet:
            print("\r\033[K", end="", file=self.stream)

    def progress(self, p: Progress, replicas: int | None,
                 node_cpu: float | None = None) -> None:
        if p.lag_max_s > BEHIND_S and not self._behind:
            self.notice(f"WARNING: the generator is {p.lag_max_s * 1000:.0f} ms behind its "
                        f"schedule at t={p.elapsed:.1f}s (CPU-bound). The offered load is "
                        "unchanged; the delay counts in the latencies. Try --workers.")
        self._behind = p.lag_max_s > BEHIND_S
        if p.waited > self._waited:
            self.notice(f"WARNING: all {self.connections} connections busy: "
                        f"{p.waited - self._waited} requests waited for one in the last "
                        "second (latency counts the wait; raise --connections to measure "
                        "the server alone)")
            self._waited = p.waited
        if self.quiet:
            return
        w = p.window
        seconds = w.seconds or 1.0
        p99 = w.p99_ms
        line = (f"pulse {p.elapsed:6.1f}s  offered {w.offered / seconds:8,.0f}/s  "
                f"ok {w.ok / seconds:8,.0f}/s  errors {w.errors / seconds:7,.0f}/s  "
                f"p99 {'-' if p99 is None else f'{p99:.1f} ms':>9}  "
                f"replicas {'-' if replicas is None else replicas:>3}  "
                f"cpu {'-' if node_cpu is None else f'{100 * node_cpu:.0f}%':>4}  "
                f"conns {p.open_connections}")
        if p.lag_max_s > BEHIND_S:
            line += f"  BEHIND {p.lag_max_s * 1000:.0f} ms"
        if self.tty:
            print(f"\r\033[K{line}", end="", file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)

    def done(self) -> None:
        if self.tty and not self.quiet:
            print(file=self.stream, flush=True)


def raise_fd_limit(connections: int, notice: Callable[[str], None]) -> None:
    """Let this process hold `connections` sockets (raise the soft RLIMIT_NOFILE)."""
    wanted = connections + FD_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    if new < wanted:
        notice(f"WARNING: only {new} file descriptors are allowed (ulimit -n), fewer than "
               f"{connections} connections need; connecting past that fails as connection "
               "errors")


# -- workers ------------------------------------------------------------------------------


def _worker_main(plan: Plan, pipe: Connection) -> None:
    uvloop.run(_worker(plan, pipe))


async def _worker(plan: Plan, pipe: Connection) -> None:
    def notice(message: str) -> None:
        pipe.send(("notice", message))

    raise_fd_limit(plan.connections, notice)
    generator = PulseGenerator(plan, notice=notice)
    pipe.send(("ready", None))
    t0 = pipe.recv()
    task = asyncio.ensure_future(generator.run(t0))
    while not task.done():
        await asyncio.wait({task}, timeout=SNAPSHOT_EVERY_S)
        pipe.send(("progress", Progress.of(generator)))
    pipe.send(("done", (task.result(), generator.stopped_early)))


class _Workers:
    """N spawned generator processes and their messages, read on this loop."""

    def __init__(self, options: PulseOptions, console: _Console, clock: Clock) -> None:
        context = multiprocessing.get_context("spawn")
        self.console = console
        self.clock = clock  # must be the system's: the workers read CLOCK_MONOTONIC too
        self.pipes: list[Connection] = []
        self.processes: list[multiprocessing.process.BaseProcess] = []
        for worker in range(options.workers):
            here, there = context.Pipe()
            process = context.Process(target=_worker_main, args=(options.plan(worker), there),
                                      name=f"surge-pulse-{worker}", daemon=True)
            process.start()
            there.close()
            self.pipes.append(here)
            self.processes.append(process)
        self.latest: dict[int, Progress] = {}
        self.records: dict[int, Record] = {}
        self.stopped_early = False
        self.messages: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()
        # One reading thread per pipe: recv() blocks until a whole message is in, which
        # the loop must not do (and the pipe must stay blocking for it).
        self.threads = concurrent.futures.ThreadPoolExecutor(len(self.pipes),
                                                             "surge-pulse-reader")
        self.readers = [asyncio.ensure_future(self._read(index)) for index in
                        range(len(self.pipes))]

    async def _read(self, index: int) -> None:
        pipe = self.pipes[index]
        while True:
            try:
                kind, value = await asyncio.get_running_loop().run_in_executor(
                    self.threads, pipe.recv)
            except (EOFError, OSError):
                self.messages.put_nowait((index, "died", None))
                return
            self.messages.put_nowait((index, kind, value))
            if kind == "done":
                return

    async def start(self) -> float:
        ready: set[int] = set()
        while len(ready) < len(self.pipes):
            index, kind, value = await self.messages.get()
            self._handle(index, kind, value)
            if kind == "ready":
                ready.add(index)
        t0 = self.clock.monotonic() + START_MARGIN_S
        for pipe in self.pipes:
            pipe.send(t0)
        return t0

    def _handle(self, index: int, kind: str, value: Any) -> None:
        if kind == "notice":
            self.console.notice(f"worker {index}: {value}")
        elif kind == "progress":
            self.latest[index] = value
        elif kind == "done":
            self.records[index], stopped = value
            self.stopped_early |= stopped
        elif kind == "died" and index not in self.records:
            raise RuntimeError(f"pulse worker {index} died (exit code "
                               f"{self.processes[index].exitcode})")

    async def finish(self) -> Record:
        while len(self.records) < len(self.pipes):
            index, kind, value = await self.messages.get()
            self._handle(index, kind, value)
        self.close()
        merged = Record()  # takes the workers' goodput objectives with their counts
        for index in sorted(self.records):
            merged.merge(self.records[index])
        return merged

    def progress(self) -> Progress | None:
        return Progress.merge(list(self.latest.values())) if self.latest else None

    def close(self) -> None:
        for reader in self.readers:
            reader.cancel()
        for pipe in self.pipes:
            pipe.close()
        self.threads.shutdown(wait=False, cancel_futures=True)
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()


# -- the run ------------------------------------------------------------------------------


async def _sampler(options: PulseOptions, console: _Console) -> ReplicaSampler | None:
    address, source = default_address(options.surge_address)
    target = options.plan().target
    return await ReplicaSampler.connect(address, source, target.host, target.port,
                                        target.path, console.notice)


async def _show_progress(source: Callable[[], Progress | None], console: _Console,
                         sampler: ReplicaSampler | None, t0: float, clock: Clock) -> None:
    tick = 1
    while True:
        await asyncio.sleep(max(t0 + tick * PROGRESS_EVERY_S - clock.monotonic(), 0.0))
        tick += 1
        progress = source()
        if progress is not None:
            latest = sampler.samples[-1] if sampler and sampler.samples else None
            console.progress(progress, latest.running if latest else None,
                             latest.node_cpu if latest else None)


async def _run(options: PulseOptions, console: _Console, clock: Clock) -> PulseResult:
    started_at = clock.wall()
    sampler = await _sampler(options, console)
    stop = asyncio.Event()
    workers: _Workers | None = None
    if options.workers == 1:
        raise_fd_limit(options.connections, console.notice)
        generator = PulseGenerator(options.plan(), clock, notice=console.notice)
        t0 = clock.monotonic() + START_MARGIN_S
        job: asyncio.Future[Record] = asyncio.ensure_future(generator.run(t0))

        def source() -> Progress | None:
            return Progress.of(generator)
    else:
        workers = _Workers(options, console, clock)
        t0 = await workers.start()
        job = asyncio.ensure_future(workers.finish())

        def source() -> Progress | None:
            assert workers is not None
            return workers.progress()
    sampling = asyncio.ensure_future(sampler.run(t0, stop)) if sampler else None
    showing = asyncio.ensure_future(_show_progress(source, console, sampler, t0, clock))
    try:
        record = await job
    finally:
        showing.cancel()
        stop.set()
        if sampling is not None:
            await sampling
        if sampler is not None:
            sampler.close()
        console.done()
    stopped = workers.stopped_early if workers else generator.stopped_early
    samples = tuple(sampler.samples) if sampler else ()
    report = build_report(options, record, samples if sampler else None, stopped,
                          started_at=started_at)
    return PulseResult(report, record, samples)


def build_report(options: PulseOptions, record: Record,
                 samples: tuple[ReplicaSample, ...] | None, stopped_early: bool = False,
                 started_at: float | None = None) -> dict[str, Any]:
    """report.json's content: the run's parameters, the summary and the series."""
    points = replica_points(samples, record.points) if samples is not None else None
    run = options.describe()
    when = None if started_at is None else \
        datetime.fromtimestamp(started_at).astimezone().strftime("%Y-%m-%dT%H:%M:%S%z")
    run.update(stopped_early=stopped_early, replicas_sampled=samples is not None,
               started_at=when)
    return {"version": 1, "run": run,
            "summary": summarize(record, options.schedule, options.slo_ms, samples or ()),
            "series": series(record, points)}


def run_pulse(options: PulseOptions, stream: TextIO | None = None, quiet: bool = False,
              clock: Clock | None = None) -> PulseResult:
    """Run the pulse to the end (whatever the server does) and build the report."""
    console = _Console(stream or sys.stderr, quiet, options.connections)
    result = uvloop.run(_run(options, console, clock or SystemClock()))
    _announce(result.report, console)
    return result


def _announce(report: dict[str, Any], console: _Console) -> None:
    generator = report["summary"]["generator"]
    if generator["behind"]:
        console.notice(f"WARNING: the generator fell behind its schedule for "
                       f"{generator['behind_s']:.1f} s (worst {generator['lag_max_ms']:.0f} "
                       "ms): latencies include that delay; the offered load was not lowered")
    if generator["waited_for_connection"]:
        console.notice(f"WARNING: {generator['waited_for_connection']:,} requests waited "
                       f"for one of the {report['run']['connections']} connections")
    summary = report["summary"]
    if summary.get("machine_limited"):
        console.notice(f"the node's CPU was saturated (peak {summary['node_cpu_peak_pct']:.0f}%) "
                       f"for {summary['node_saturated_s']:.1f} s while requests were refused "
                       "or slow: the machine was the limit, not the replica count")
    if report["run"]["stopped_early"]:
        console.notice(f"WARNING: stopped at --max-time {report['run']['max_time_s']:g}s; "
                       f"{report['summary']['unanswered']:,} requests unanswered")
