"""A slow reader of a big stream, and pings beside it: serving memory and ping latency.

    python bench/slow_reader.py [--systems surge,ray] [--total-mib 1024] [--rate-mib 1]
                                [--read-s 10] [--baseline-s 3] [--ping-ms 10]
                                [--ping own,same]

The issue's memory hole (#15): a client asks for a 1 GiB `StreamingResponse` (GET
/stream?bytes=...&chunk=65536 of bench/apps/*_stream.py: the replica yields 64 KiB
chunks as fast as they are taken) and reads it at ~1 MiB/s for ~10 s, then closes,
while other clients ping small endpoints through the same proxy: `own`, GET /ping, a
deployment (and replica) of its own, so only the proxy is shared; `same`, GET
/stream?ping=1, answered by the streaming replica itself. A serving path with
backpressure holds a few socket buffers of the stream; one without keeps reading from the
replica and holds what the client has not taken yet.

The slow reader is a blocking socket with a 64 KiB receive buffer (the kernel doubles
it), reading its budget every 50 ms; each pinger is a keep-alive connection sending one
GET at a time, one every `--ping-ms` (or as soon as the previous answer came, if that
took longer), timed from send to the end of the answer. All run in this process, each in
a thread of its own. Before the reader starts, `--baseline-s` of pings alone give the
baseline latency. A pinger waits for each answer, so a ping that takes seconds hides the
pings it did not send meanwhile: the "open loop" p99 adds them back (what one ping every
`--ping-ms` regardless would have seen: HdrHistogram's correction). RSS
(/proc/PID/statm) of the serving processes (proxy and replicas, by title) is sampled
every 100 ms; reported: before, peak, at the end of reading and 2 s after the reader
closed, for each serving process and in sum (the peak of the sum is the highest sum of
one sample, not the sum of each process's peak), and the RSS of every process of the
system (its driver's tree) before and at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httptools

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import cmdline, free_port, start_system
from bench.streaming import app_argv, percentile, reap, remember

SYSTEMS = {"surge": "surge (1 proxy process)", "ray": "Ray Serve 2.60 (its HTTP proxy)"}
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def rss_kib(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KIB
    except (OSError, IndexError, ValueError):
        return 0


def role(pid: int) -> str:
    cmd = cmdline(pid)
    for key, name in (("surge:proxy", "proxy"), ("ProxyActor", "proxy"),
                      ("Stream", "stream replica"), ("Ping", "ping replica")):
        if key in cmd:
            return name
    return cmd[:40]


# -- the two clients ----------------------------------------------------------------------


class Pinger:
    """GET `path` on one keep-alive connection, one at a time; latencies in seconds."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self.host, self.port, self.path = host, port, path
        self.sock: socket.socket | None = None
        self.failures = 0
        self.request = f"GET {path} HTTP/1.1\r\nhost: {host}:{port}\r\n\r\n".encode()
        self.complete = False

    def on_message_complete(self) -> None:
        self.complete = True

    def once(self) -> float | None:
        started = time.perf_counter()
        try:
            if self.sock is None:
                self.sock = socket.create_connection((self.host, self.port), timeout=30)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            parser = httptools.HttpResponseParser(self)
            self.complete = False
            self.sock.sendall(self.request)
            while not self.complete:
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("closed")
                parser.feed_data(data)
            if parser.get_status_code() != 200:
                raise ConnectionError(f"status {parser.get_status_code()}")
            return time.perf_counter() - started
        except (OSError, httptools.HttpParserError, ConnectionError):
            self.failures += 1
            if self.sock is not None:
                self.sock.close()
            self.sock = None
            return None

    def ping_for(self, seconds: float, interval: float,
                 until: threading.Event | None = None) -> list[float]:
        """Ping every `interval` (or back to back if slower) for `seconds` or until `until`."""
        latencies: list[float] = []
        started = time.perf_counter()
        while time.perf_counter() - started < seconds and not (until and until.is_set()):
            sent = time.perf_counter()
            latency = self.once()
            if latency is not None:
                latencies.append(latency)
            time.sleep(max(0.0, sent + interval - time.perf_counter()))
        return latencies

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def ping_all(pingers: dict[str, Pinger], seconds: float, interval: float,
             until: threading.Event | None = None) -> tuple[dict[str, list[float]],
                                                            list[threading.Thread]]:
    """Each pinger in its own thread; the latencies fill in as they come (join the threads)."""
    results: dict[str, list[float]] = {}
    threads = []
    for target, pinger in pingers.items():
        def run(t: str = target, p: Pinger = pinger) -> None:
            results[t] = p.ping_for(seconds, interval, until)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
    return results, threads


@dataclass
class Reader:
    """Reads the big stream at `rate` bytes/s for `seconds`, then closes."""

    host: str
    port: int
    total: int
    rate: float
    seconds: float
    read: int = 0
    status: str = ""
    error: str = ""
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        sock = socket.socket()
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            sock.settimeout(30)
            sock.connect((self.host, self.port))
            sock.sendall(f"GET /stream?bytes={self.total}&chunk=65536 HTTP/1.1\r\n"
                         f"host: {self.host}:{self.port}\r\n\r\n".encode())
            started = time.perf_counter()
            tick = 0.05
            while True:
                elapsed = time.perf_counter() - started
                if elapsed >= self.seconds:
                    break
                budget = int(self.rate * min(elapsed + tick, self.seconds)) - self.read
                while budget > 0:
                    data = sock.recv(min(budget, 65536))
                    if not data:
                        self.error = "closed by the server"
                        return
                    if not self.status:
                        self.status = data.split(b"\r\n", 1)[0].decode(errors="replace")
                    self.read += len(data)
                    budget -= len(data)
                time.sleep(max(0.0, started + elapsed + tick - time.perf_counter()))
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            sock.close()
            self.done.set()


# -- one system ---------------------------------------------------------------------------


@dataclass
class Outcome:
    system: str
    read_mib: float
    reader_status: str
    reader_error: str
    rss_before: dict[int, int]
    rss_peak: dict[int, int]  # pid 0: the highest sum over the serving processes of a sample
    rss_end: dict[int, int]
    rss_after: dict[int, int]
    all_before_kib: int
    all_end_kib: int
    ping_before: dict[str, list[float]]
    ping_during: dict[str, list[float]]
    ping_failures: dict[str, int]
    roles: dict[int, str]


PING_PATHS = {"own": "/ping", "same": "/stream?ping=1"}


def sample_rss(pids: list[int], peak: dict[int, int]) -> None:
    now_kib = {pid: rss_kib(pid) for pid in pids}
    for pid, kib in now_kib.items():
        peak[pid] = max(peak.get(pid, 0), kib)
    peak[0] = max(peak.get(0, 0), sum(now_kib.values()))


def measure(name: str, args: argparse.Namespace) -> Outcome:
    port = free_port()
    argv, env = app_argv(name, port, 100, ping=True)
    known: dict[int, int] = {}
    interval = args.ping_ms / 1000
    try:
        with start_system(name, argv, env) as system:
            known = remember(system)
            pingers = {t: Pinger("127.0.0.1", port, PING_PATHS[t]) for t in args.ping}
            for pinger in pingers.values():
                pinger.ping_for(1.0, interval)  # warm-up
            serving = system.serving_pids()
            roles = {pid: role(pid) for pid in serving}
            before = {pid: rss_kib(pid) for pid in serving}
            all_before = sum(rss_kib(pid) for pid in system.pids())
            failures = {t: p.failures for t, p in pingers.items()}
            baseline, threads = ping_all(pingers, args.baseline_s, interval)
            for thread in threads:
                thread.join()
            reader = Reader("127.0.0.1", port, args.total_mib << 20, args.rate_mib * (1 << 20),
                            args.read_s)
            reading = threading.Thread(target=reader.run, daemon=True)
            peak = {**before, 0: sum(before.values())}
            reading.start()
            during, threads = ping_all(pingers, args.read_s + 30, interval, reader.done)
            while not reader.done.wait(0.1):
                sample_rss(serving, peak)
            reading.join(timeout=60)
            for thread in threads:
                thread.join(timeout=60)
            end = {pid: rss_kib(pid) for pid in serving}
            all_end = sum(rss_kib(pid) for pid in system.pids())
            for _ in range(20):
                sample_rss(serving, peak)
                time.sleep(0.1)
            after = {pid: rss_kib(pid) for pid in serving}
            known.update(remember(system))
            for pinger in pingers.values():
                pinger.close()
            return Outcome(name, reader.read / (1 << 20), reader.status, reader.error,
                           before, peak, end, after, all_before, all_end, baseline, during,
                           {t: p.failures - failures[t] for t, p in pingers.items()}, roles)
    finally:
        reap(known)


def open_loop(latencies: list[float], interval: float) -> list[float]:
    """The latencies an open loop of one ping every `interval` would have seen: a ping that
    took L > interval stands for the ones that were not sent meanwhile, which would have
    waited L - interval, L - 2 interval, ... (HdrHistogram's coordinated-omission
    correction)."""
    filled = list(latencies)
    for latency in latencies:
        missed = latency - interval
        while missed > interval:
            filled.append(missed)
            missed -= interval
    return filled


def ms(values: list[float], q: float) -> str:
    return f"{percentile(sorted(values), q) * 1e3:.1f}" if values else "-"


def mib(kib: float) -> str:
    return f"{kib / 1024:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="surge,ray")
    parser.add_argument("--total-mib", type=int, default=1024, help="size of the stream")
    parser.add_argument("--rate-mib", type=float, default=1.0, help="reading rate, MiB/s")
    parser.add_argument("--read-s", type=float, default=10.0, help="read this long, then close")
    parser.add_argument("--baseline-s", type=float, default=3.0)
    parser.add_argument("--ping-ms", type=float, default=10.0)
    parser.add_argument("--ping", default="own,same",
                        help="what to ping: own (GET /ping, its own deployment: only the proxy "
                             "is shared) and/or same (GET /stream?ping=1, the streaming "
                             "replica itself)")
    args = parser.parse_args()
    args.ping = [t for t in args.ping.split(",") if t]
    for target in args.ping:
        if target not in PING_PATHS:
            raise SystemExit(f"--ping: unknown target {target!r}")
    print(f"one reader of a {args.total_mib} MiB stream at {args.rate_mib:g} MiB/s for "
          f"{args.read_s:g} s, a ping every {args.ping_ms:g} ms to each of "
          f"{', '.join(PING_PATHS[t] for t in args.ping)}; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    outcomes: dict[str, Outcome] = {}
    for name in [s for s in args.systems.split(",") if s]:
        print(f"== {SYSTEMS[name]}", flush=True)
        try:
            o = outcomes[name] = measure(name, args)
        except RuntimeError as exc:
            print(f"   {name} FAILED: {exc}", flush=True)
            continue
        pings = "; ".join(f"ping {PING_PATHS[t]} p99 {ms(o.ping_before.get(t, []), 99)} -> "
                          f"{ms(o.ping_during.get(t, []), 99)} ms" for t in args.ping)
        print(f"   read {o.read_mib:.1f} MiB ({o.reader_status or '-'}"
              f"{'; ' + o.reader_error if o.reader_error else ''}); serving RSS "
              f"{mib(sum(o.rss_before.values()))} -> peak {mib(o.rss_peak[0])} MiB; {pings}",
              flush=True)
    print()
    print("| system | process | RSS before MiB | peak MiB | end of reading MiB "
          "| 2 s after close MiB | growth (peak - before) MiB |")
    print("|---|---|---|---|---|---|---|")
    for name, o in outcomes.items():
        for pid in sorted(o.rss_before, key=lambda p: o.roles[p]):
            print(f"| {SYSTEMS[name]} | {o.roles[pid]} | {mib(o.rss_before[pid])} | "
                  f"{mib(o.rss_peak.get(pid, 0))} | {mib(o.rss_end.get(pid, 0))} | "
                  f"{mib(o.rss_after.get(pid, 0))} | "
                  f"{mib(o.rss_peak.get(pid, 0) - o.rss_before[pid])} |")
        before, peak = sum(o.rss_before.values()), o.rss_peak[0]
        print(f"| {SYSTEMS[name]} | **serving, sum** (peak: of one sample) | {mib(before)} | "
              f"{mib(peak)} | {mib(sum(o.rss_end.values()))} | "
              f"{mib(sum(o.rss_after.values()))} | **{mib(peak - before)}** |")
    print()
    print("| system | read MiB | every process RSS before / end MiB | ping | p50 / p99 / max ms "
          "before | p50 / p99 / max ms while reading | p99 ms while reading, open loop "
          "| pings while reading (failed) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, o in outcomes.items():
        for target in args.ping:
            before_l, during_l = o.ping_before.get(target, []), o.ping_during.get(target, [])
            print(f"| {SYSTEMS[name]} | {o.read_mib:.1f} | {mib(o.all_before_kib)} / "
                  f"{mib(o.all_end_kib)} | {PING_PATHS[target]} | {ms(before_l, 50)} / "
                  f"{ms(before_l, 99)} / {ms(before_l, 100)} | {ms(during_l, 50)} / "
                  f"{ms(during_l, 99)} / {ms(during_l, 100)} | "
                  f"{ms(open_loop(during_l, args.ping_ms / 1000), 99)} | {len(during_l)} "
                  f"({o.ping_failures.get(target, 0)}) |")
    print()

    def growth(name: str) -> str:
        o = outcomes.get(name)
        if o is None:
            return "nan"
        return f"{(o.rss_peak[0] - sum(o.rss_before.values())) / 1024:.1f}"

    def p99(name: str, target: str, during: bool, filled: bool = False) -> str:
        o = outcomes.get(name)
        if o is None or target not in args.ping:
            return "nan"
        values = (o.ping_during if during else o.ping_before).get(target, [])
        return ms(open_loop(values, args.ping_ms / 1000) if filled else values, 99)

    figures = [f"rss_growth_mib={growth('surge')}", f"ray_rss_growth_mib={growth('ray')}"]
    for target in args.ping:
        figures += [f"ping_{target}_p99_before_ms={p99('surge', target, False)}",
                    f"ping_{target}_p99_ms={p99('surge', target, True)}",
                    f"ping_{target}_p99_open_ms={p99('surge', target, True, True)}",
                    f"ray_ping_{target}_p99_before_ms={p99('ray', target, False)}",
                    f"ray_ping_{target}_p99_ms={p99('ray', target, True)}",
                    f"ray_ping_{target}_p99_open_ms={p99('ray', target, True, True)}"]
    print("summary: " + " ".join(figures))


if __name__ == "__main__":
    main()
