"""Shared pieces of the benchmarks: systems under test as subprocesses, wrk, /proc CPU.

Every system runs as its own process tree started here and stopped here (by process
group), and only ever listens on 127.0.0.1. Ray Serve runs from its own virtualenv,
created on first use (`ray[serve]==2.60.0`, a few minutes, cached in ~/.cache).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "apps"
RAY_VERSION = "2.60.0"
RAY_VENV = Path(os.environ.get("SURGE_BENCH_RAY_VENV",
                               Path.home() / ".cache" / "surge-bench" / f"ray-{RAY_VERSION}"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ray_python() -> str:
    """The Python of a virtualenv with Ray Serve 2.60, created if missing."""
    python = RAY_VENV / "bin" / "python"
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
                 timeout_s: float = 180.0) -> Iterator[System]:
    """Run `argv` (prints `READY url [k=v ...]` when serving); stop its process group after."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, env={**os.environ, **(env or {})},
                               start_new_session=True, cwd=ROOT)
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = ""
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line or line.startswith("READY"):
            break
    if not line.startswith("READY"):
        _stop(process)
        raise RuntimeError(f"{name} did not start: {line!r}")
    parts = line.split()
    info = dict(p.split("=", 1) for p in parts[2:])
    try:
        yield System(name, process, parts[1], info)
    finally:
        _stop(process)


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
            threads: int = 2) -> WrkResult:
    wrk = ensure_wrk()
    before = cpu_seconds(cpu_pids)
    seconds = max(1, round(duration_s))
    out = subprocess.run([wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s",
                          "--latency", "--timeout", "5s", url],
                         capture_output=True, text=True, timeout=duration_s + 60).stdout
    cpu = cpu_seconds(cpu_pids) - before
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if rate is None or count is None:
        raise RuntimeError(f"wrk failed against {url}:\n{out}")
    rps, requests = float(rate.group(1)), int(count.group(1))
    p50 = re.search(r"50%\s+(\S+)", out)
    p99 = re.search(r"99%\s+(\S+)", out)
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
