"""Shared pieces of the benchmarks: systems under test as subprocesses, wrk, /proc CPU.

Every system runs as its own process tree started here and stopped here (by process
group), and only ever listens on 127.0.0.1. Ray Serve runs from its own virtualenv,
created on first use (`ray[serve]==2.60.0`, a few minutes, cached in ~/.cache).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "apps"
RAY_VERSION = "2.60.0"
RAY_VENV = Path(os.environ.get("SURGE_BENCH_RAY_VENV",
                               Path.home() / ".cache" / "surge-bench" / f"ray-{RAY_VERSION}"))
RAY_PYTHON = RAY_VENV / "bin" / "python"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ray_python() -> str:
    """The Python of a virtualenv with Ray Serve 2.60, created if missing."""
    python = RAY_PYTHON
    check = f"import ray, sys; sys.exit(ray.__version__ != '{RAY_VERSION}')"
    probe = [str(python), "-c", check]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return str(python)
    print(f"creating {RAY_VENV} with ray[serve]=={RAY_VERSION} (once; a few minutes) ...",
          flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(RAY_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"ray[serve]=={RAY_VERSION}"],
                   check=True)
    return str(python)


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    print("installing wrk with apt-get ...", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    found = shutil.which("wrk")
    if not found:
        raise SystemExit("wrk is required (apt-get install wrk)")
    return found


# -- processes -----------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def process_tree(root: int) -> list[int]:
    tree = _children()
    found, frontier = [root], [root]
    while frontier:
        for child in tree.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


def cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def pss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    match = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) if match else 0


@dataclass
class System:
    """A system under test: a driver process (and its tree) serving HTTP on `url`."""

    name: str
    process: subprocess.Popen[str]
    url: str
    info: dict[str, str] = field(default_factory=dict)

    def pids(self) -> list[int]:
        return process_tree(self.process.pid)

    def serving_pids(self) -> list[int]:
        """Processes that handle requests (proxy and replicas), by their titles."""
        keys = ("surge:proxy", "surge:replica", "ProxyActor", "ServeReplica", "raw_server")
        return [p for p in self.pids() if any(k in cmdline(p) for k in keys)]


@contextmanager
def start_system(name: str, argv: list[str], env: dict[str, str] | None = None,
                 timeout_s: float = 180.0, stderr: IO[str] | None = None,
                 ) -> Iterator[System]:
    """Run `argv` (prints `READY url [k=v ...]` when serving); stop its process group after.

    A process of Ray's virtualenv starts a Ray instance of its own (RAY_ADDRESS=local):
    without it `ray.init()` joins the cluster named in /tmp/ray/ray_current_cluster,
    which a cluster killed earlier leaves behind, and waits for its dead GCS for ever.
    One that does not say READY within `timeout_s` is stopped (its readline ends).
    Its stderr is discarded unless `stderr` (an open file) keeps it."""
    extra = dict(env or {})
    if argv[0] == str(RAY_PYTHON):
        extra.setdefault("RAY_ADDRESS", "local")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL if stderr is None else stderr,
                               text=True, env={**os.environ, **extra},
                               start_new_session=True, cwd=ROOT)
    assert process.stdout is not None
    watchdog = threading.Timer(timeout_s, _kill_group, (process.pid,))
    watchdog.start()
    line = ""
    try:
        while True:
            line = process.stdout.readline()
            if not line or line.startswith("READY"):
                break
    finally:
        watchdog.cancel()
    if not line.startswith("READY"):
        _stop(process)
        raise RuntimeError(f"{name} did not start within {timeout_s:.0f} s: {line!r}")
    parts = line.split()
    info = dict(p.split("=", 1) for p in parts[2:])
    try:
        yield System(name, process, parts[1], info)
    finally:
        _stop(process)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


# -- wrk -----------------------------------------------------------------------------------


@dataclass
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    non_2xx: int
    errors: int
    cpu_us_per_request: float


def _ms(text: str) -> float:
    match = re.match(r"([\d.]+)(us|ms|s)", text)
    if not match:
        return float("nan")
    value, unit = float(match.group(1)), match.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def run_wrk(url: str, connections: int, duration_s: float, cpu_pids: list[int],
            threads: int = 2, script: str | None = None) -> WrkResult:
    """wrk against `url` (with a Lua `script`, e.g. a POST body); CPU of `cpu_pids`."""
    wrk = ensure_wrk()
    before = cpu_seconds(cpu_pids)
    seconds = max(1, round(duration_s))
    lua = ["-s", script] if script else []
    out = subprocess.run([wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s",
                          "--latency", "--timeout", "5s", *lua, url],
                         capture_output=True, text=True, timeout=duration_s + 60).stdout
    cpu = cpu_seconds(cpu_pids) - before
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if rate is None or count is None:
        raise RuntimeError(f"wrk failed against {url}:\n{out}")
    rps, requests = float(rate.group(1)), int(count.group(1))
    p50 = re.search(r"^\s*50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s*99%\s+(\S+)", out, re.M)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                       out)
    return WrkResult(
        rps=rps, requests=requests,
        p50_ms=_ms(p50.group(1)) if p50 else float("nan"),
        p99_ms=_ms(p99.group(1)) if p99 else float("nan"),
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        errors=sum(int(g) for g in errors.groups()) if errors else 0,
        cpu_us_per_request=cpu / requests * 1e6 if requests else float("nan"))


def median_result(results: list[WrkResult]) -> WrkResult:
    ordered = sorted(results, key=lambda r: r.rps)
    middle = ordered[len(ordered) // 2]
    return WrkResult(
        rps=statistics.median(r.rps for r in results),
        p50_ms=statistics.median(r.p50_ms for r in results),
        p99_ms=statistics.median(r.p99_ms for r in results),
        requests=middle.requests, non_2xx=sum(r.non_2xx for r in results),
        errors=sum(r.errors for r in results),
        cpu_us_per_request=statistics.median(r.cpu_us_per_request for r in results))


# -- driver subprocesses (added for handles/startup/memory) ---------------------------------


def rss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    match = re.search(r"^Rss:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) if match else 0


def start_ticks(pid: int) -> int:
    """The process's start time (clock ticks since boot): with the pid, its identity."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def _signal_known(known: dict[int, int], sig: int) -> None:
    for pid, ticks in known.items():
        if ticks >= 0 and start_ticks(pid) == ticks:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


class Driver:
    """A measurement script run in its own session, talked to line by line.

    `stop()` ends it and everything it started: it snapshots the process tree (processes
    that moved to their own process group, e.g. Ray's actors and surge's controller,
    included), asks nicely (`STOP` on stdin), then SIGTERM and SIGKILL to the group and to
    each remembered process that is still the same process (pid and start time).
    """

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        import tempfile
        import threading

        self.name = name
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr, text=True,
                                        env={**os.environ, **(env or {})},
                                        start_new_session=True, cwd=ROOT)
        self.spawned_at = time.time()
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._known: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._cond:
                self.lines.append((time.time(), line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def remember_tree(self) -> list[int]:
        pids = process_tree(self.process.pid)
        for pid in pids:
            self._known.setdefault(pid, start_ticks(pid))
        return pids

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.remember_tree()
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def wait_line(self, prefix: str, timeout_s: float) -> tuple[float, str]:
        """The first line starting with `prefix` (and when it arrived); RuntimeError if none."""
        deadline = time.monotonic() + timeout_s
        index = 0
        with self._cond:
            while True:
                for at, line in self.lines[index:]:
                    if line.startswith(prefix):
                        return at, line
                index = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None
                                 and not self._reader.is_alive()):
                    break
                self._cond.wait(min(left, 0.5))
        self.remember_tree()
        raise RuntimeError(f"{self.name}: no {prefix!r} line within {timeout_s:.0f} s "
                           f"(exit code {self.process.poll()}); stderr tail:\n"
                           f"{self.stderr_tail()}")

    def stderr_tail(self, lines: int = 25) -> str:
        try:
            self.stderr.flush()
            self.stderr.seek(0)
            return "\n".join(self.stderr.read().splitlines()[-lines:])
        except (OSError, ValueError):
            return ""

    def stop(self, grace_s: float = 30.0) -> None:
        if self.process.poll() is None:
            self.remember_tree()
            self.send("STOP")
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.remember_tree()
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        _signal_known(self._known, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
                start_ticks(p) == t for p, t in self._known.items() if t >= 0):
            time.sleep(0.1)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _signal_known(self._known, signal.SIGKILL)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self.stderr.close()


@contextmanager
def driver(name: str, argv: list[str], env: dict[str, str] | None = None,
           grace_s: float = 30.0) -> Iterator[Driver]:
    """Run a `Driver`; always stop it (and its whole tree) on the way out."""
    running = Driver(name, argv, env)
    try:
        yield running
    finally:
        running.stop(grace_s)


def surge_env() -> dict[str, str]:
    """Environment for a surge driver: its own control port, quiet logs."""
    return {"SURGE_ADDRESS": f"127.0.0.1:{free_port()}", "SURGE_LOG_LEVEL": "WARNING"}


def system_python(system: str) -> str:
    return sys.executable if system == "surge" else ray_python()


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so `with driver(...)` blocks stop what they started."""
    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def options(doc: str, helps: Mapping[str, str] | None = None,
            **defaults: Any) -> argparse.Namespace:
    """A benchmark's command line, parsed: an option `--a-name` per keyword `a_name`, of
    its default's type (False: a flag; a Path: a path; write a float's default as 2.0,
    not 2), with the text in `helps` under its keyword; the description is the first
    paragraph of `doc`, the script's docstring."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    helps = dict(helps or {})
    for name, default in defaults.items():
        flag, text = "--" + name.replace("_", "-"), helps.pop(name, None)
        if default is False:
            parser.add_argument(flag, action="store_true", help=text)
        elif isinstance(default, (bool, type(None))):
            raise TypeError(f"{flag}: a default of {default!r} gives no type; a flag's is False")
        else:
            kind = Path if isinstance(default, Path) else type(default)
            parser.add_argument(flag, type=kind, default=default, help=text)
    if helps:
        raise TypeError(f"help for options that do not exist: {sorted(helps)}")
    return parser.parse_args()
