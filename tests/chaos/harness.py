"""The chaos harness: a real surge instance, open-loop load from `surge pulse`, faults on a
timeline, every process's memory, and the table of what happened.

One run of a scenario:

    instance up -> deploy -> load starts (PulseGenerator, t0 known here)
      t = warm-up end: RSS of every surge process (the baseline), then the fault
      t = end - 0.5 s: RSS again, still under load
    load ends (every request answered, timed out, or unanswered at max_time)
    -> the scenario checks the aftermath -> an Outcome (counts by class, problems)

Processes are told apart by (pid, start time), so a replaced process is never compared
with its predecessor: memory is compared for the survivors only. Every process seen is
remembered, and whatever is left of them after `serve.shutdown()` is killed, so a
scenario that breaks the instance for good cannot leave orphans behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from surge import serve
from surge.loadtest.generator import PulseGenerator
from surge.loadtest.options import PulseOptions
from surge.loadtest.runner import raise_fd_limit
from surge.loadtest.schedule import Schedule
from surge.loadtest.stats import POINTS_PER_S, Record
from tests.e2e.procs import descendants, title
from tests.ports import free_port

# A process whose RSS moved more than this between warm-up and the end is reported.
RSS_TOLERANCE = 0.20
# Requests in flight before t=0 need their connections: the generator opens a few then.
START_MARGIN_S = 0.5


# -- processes ----------------------------------------------------------------------------


def start_ticks(pid: int) -> int:
    """When the process started (clock ticks since boot): with the pid, its identity."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def rss_kib(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, order=True)
class Proc:
    pid: int
    ticks: int
    title: str

    def alive(self) -> bool:
        return start_ticks(self.pid) == self.ticks

    @property
    def kind(self) -> str:
        """controller, proxy, forkserver or replica:app:deployment."""
        return self.title.removeprefix("surge:")


class Processes:
    """Every surge process this driver started, as far as it has seen them."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[tuple[int, int], Proc] = {}

    def scan(self) -> list[Proc]:
        """The live surge processes: descendants of the driver, and any seen before (a
        process whose parent died is no longer a descendant, but it is still ours)."""
        live: dict[tuple[int, int], Proc] = {}
        for pid in descendants(self.root):
            name = title(pid)
            ticks = start_ticks(pid)
            if name.startswith("surge:") and ticks >= 0:
                live[(pid, ticks)] = self.seen.setdefault((pid, ticks), Proc(pid, ticks, name))
        for key, proc in self.seen.items():
            if key not in live and proc.alive():
                live[key] = proc
        return sorted(live.values())

    def of_kind(self, prefix: str) -> list[Proc]:
        return [p for p in self.scan() if p.kind.startswith(prefix)]

    def memory(self) -> dict[Proc, int]:
        found = {}
        for proc in self.scan():
            rss = rss_kib(proc.pid)
            if rss is not None and proc.alive():
                found[proc] = rss
        return found

    def kill_leftovers(self) -> list[Proc]:
        left = [p for p in self.seen.values() if p.alive()]
        for proc in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
        return left


@dataclass(frozen=True)
class RssChange:
    proc: Proc
    before_kib: int
    after_kib: int

    @property
    def change(self) -> float:
        return (self.after_kib - self.before_kib) / self.before_kib

    def __str__(self) -> str:
        return (f"{self.proc.kind} (pid {self.proc.pid}): {self.before_kib / 1024:.1f} -> "
                f"{self.after_kib / 1024:.1f} MiB ({self.change:+.1%})")


def compare_memory(before: dict[Proc, int], after: dict[Proc, int]) -> list[RssChange]:
    """The survivors' RSS, warm-up vs end; processes that came or went are not compared."""
    return [RssChange(proc, before[proc], after[proc]) for proc in sorted(before)
            if proc in after and before[proc] > 0]


# -- the instance -------------------------------------------------------------------------


@dataclass
class Instance:
    url: str
    control_address: str
    processes: Processes

    def call(self, method: str, timeout: float = 10.0, **kwargs: Any) -> Any:
        from surge.api.instance import current

        instance = current()
        if instance is None:
            raise RuntimeError("not connected to a surge instance")
        return instance.call(method, timeout=timeout, **kwargs)


@contextlib.contextmanager
def surge_instance(**http_options: Any) -> Iterator[Instance]:
    """Start surge on free loopback ports; shut it down after and kill what is left."""
    control = f"127.0.0.1:{free_port()}"
    port = free_port()
    previous = os.environ.get("SURGE_ADDRESS")
    os.environ["SURGE_ADDRESS"] = control
    processes = Processes(os.getpid())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port, "proxy_workers": 1,
                                  **http_options})
        processes.scan()
        yield Instance(f"http://127.0.0.1:{port}", control, processes)
    finally:
        processes.scan()
        with contextlib.suppress(Exception):
            serve.shutdown()
        processes.kill_leftovers()
        if previous is None:
            os.environ.pop("SURGE_ADDRESS", None)
        else:
            os.environ["SURGE_ADDRESS"] = previous


# -- load and the timeline ----------------------------------------------------------------


class Timeline(threading.Thread):
    """Calls each action at its time (seconds from the load's t0) on a thread of its own,
    so the generator's loop is never blocked; an action that raises is recorded."""

    def __init__(self, t0: float, actions: list[tuple[float, str, Callable[[], None]]]) -> None:
        super().__init__(name="chaos-timeline", daemon=True)
        self.t0 = t0
        self.actions = sorted(actions, key=lambda a: a[0])
        self.errors: list[str] = []
        self.started_at: dict[str, float] = {}  # seconds from t0, when each action began

    def run(self) -> None:
        for at, name, action in self.actions:
            delay = self.t0 + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the timeline's pacing: each action runs at its time
            self.started_at[name] = time.monotonic() - self.t0
            try:
                action()
            except Exception as exc:
                self.errors.append(f"{name} failed: {exc!r}")


def run_load(options: PulseOptions,
             actions: list[tuple[float, str, Callable[[], None]]]) -> tuple[Record, Timeline]:
    """Send the schedule (surge pulse's generator) while the timeline runs its actions."""
    raise_fd_limit(options.connections, lambda message: None)
    t0 = time.monotonic() + START_MARGIN_S
    timeline = Timeline(t0, actions)
    timeline.start()

    async def send() -> Record:
        return await PulseGenerator(options.plan()).run(t0)

    record: Record = uvloop.run(send())
    timeline.join(timeout=30)
    record.check()
    return record, timeline


def steady(rps: float, seconds: float) -> Schedule:
    return Schedule.from_spec([{"rps": rps, "for_s": seconds}])


# -- what happened ------------------------------------------------------------------------


@dataclass
class Counts:
    """Every request sent, by how it ended."""

    sent: int = 0
    ok: int = 0
    s503: int = 0
    s5xx: int = 0  # other 5xx
    s4xx: int = 0
    connection: int = 0  # refused, reset or closed mid-request
    timeout: int = 0  # no answer within the generator's timeout: a hang
    other: int = 0  # anything else (1xx/3xx, the generator's own overflow)
    unanswered: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, record: Record) -> Counts:
        counts = cls(sent=record.sent, ok=record.total_ok, unanswered=record.unanswered)
        for kind, n in record.error_totals().items():
            if not n:
                continue
            counts.by_kind[kind] = n
            if kind == "503":
                counts.s503 += n
            elif kind == "connection":
                counts.connection += n
            elif kind == "timeout":
                counts.timeout += n
            elif kind.isdigit() and 500 <= int(kind) < 600:
                counts.s5xx += n
            elif kind.isdigit() and 400 <= int(kind) < 500:
                counts.s4xx += n
            else:
                counts.other += n
        return counts

    @property
    def failed(self) -> int:
        return self.sent - self.ok


def error_points(record: Record, by: str = "send") -> list[int]:
    """The 100 ms points in which some request that did not get a 2xx was sent (or, `by`
    "completion", ended)."""
    points: set[int] = set()
    for counts in (record.errors_sent if by == "send" else record.errors).values():
        points.update(point for point, n in enumerate(counts) if n)
    return sorted(points)


def seconds(point: int) -> float:
    return point / POINTS_PER_S


@dataclass
class Outcome:
    """One scenario's row: counts, latency, memory, and every check that failed."""

    scenario: str
    counts: Counts
    p99_ms: float | None
    served_rps: float
    errors_until_s: float | None  # when the last failed request ended, from the fault
    memory: list[RssChange]
    replaced: list[str]
    notes: list[str]
    problems: list[str]
    report: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def worst_rss(self) -> RssChange | None:
        return max(self.memory, key=lambda c: abs(c.change), default=None)


COLUMNS = ("scenario", "sent", "2xx", "503", "other 5xx", "4xx", "conn. errors", "timeouts",
           "unanswered", "2xx p99 ms", "errors until", "RSS change (worst survivor)", "result")


def _n(value: int) -> str:
    return f"{value:,}"


def row(outcome: Outcome) -> list[str]:
    c = outcome.counts
    worst = outcome.worst_rss
    rss = "-" if worst is None else f"{worst.change:+.1%} ({worst.proc.kind.split(':')[0]})"
    until = "-" if outcome.errors_until_s is None else f"+{outcome.errors_until_s:.1f} s"
    p99 = "-" if outcome.p99_ms is None else f"{outcome.p99_ms:,.1f}"
    result = "ok" if not outcome.problems else f"FAILED ({len(outcome.problems)})"
    return [outcome.scenario, _n(c.sent), _n(c.ok), _n(c.s503), _n(c.s5xx), _n(c.s4xx),
            _n(c.connection), _n(c.timeout + c.other), _n(c.unanswered), p99, until, rss,
            result]


def table(outcomes: list[Outcome]) -> str:
    """A Markdown table (it reads as plain text too), then each failed check."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(o)) + " |" for o in outcomes]
    for outcome in outcomes:
        lines += [f"{outcome.scenario}: {problem}" for problem in outcome.problems]
    return "\n".join(lines)


def details(outcome: Outcome) -> str:
    """Everything about one run: notes, memory per process, problems."""
    lines = [f"== {outcome.scenario}"]
    lines += [f"   {note}" for note in outcome.notes]
    lines += [f"   rss {change}" for change in outcome.memory]
    if outcome.replaced:
        lines.append(f"   new processes: {', '.join(outcome.replaced)}")
    lines += [f"   PROBLEM: {problem}" for problem in outcome.problems]
    return "\n".join(lines)
