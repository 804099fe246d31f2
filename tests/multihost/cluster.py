"""A Ray cluster across network namespaces, and surge on it, started as an operator would.

    with hosts_cluster() as cluster:      # h0: Ray head + surge; h1, h2: Ray workers; h3: client
        cluster.deploy()                  # tests.multihost.apps:app, one replica per worker
        cluster.get(cluster.head, "/")    # from the client host, over the bridge

Each host of a `netns.Network` runs what a machine of a real cluster runs: `ray start
--head` on h0 (no CPUs: replicas go to the workers), `ray start --address` on h1 and
h2 (one CPU each, so one replica each), then `surge start --backend ray` on h0 with the
control address, the proxies and the dashboard on 0.0.0.0, and `surge deploy`. h3 runs
nothing of the cluster: the tests' clients live there, in threads of the test process
that entered its namespace (`in_host`), so requests cross the bridge as they would
cross a network, and reach only the namespaces' own addresses.

Every process runs in a host's namespace with the run's own TMPDIR (surge's control
token, Ray's session directories), so nothing is shared with other runs or with the
machine's own Ray or surge; `close` stops all of them through `Network.close`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.eventually import eventually
from tests.multihost.netns import Host, Network

ROOT = Path(__file__).resolve().parents[2]
RAY_PORT = 6379
CONTROL_PORT = 52800
HTTP_PORT = 8000
DASHBOARD_PORT = 52801
AGENT_PORT = 52370  # Ray's dashboard agent; +1 its metrics, +2 the runtime env agent
START_TIMEOUT_S = 120.0  # a busy 2-core machine starts Ray slowly; that is not a failure
# Ray's GCS declares a silent node dead after 3 missed checks, 0.5 s apart, each given 2 s
# (Ray's defaults take 30 s: the tests would spend it waiting). A 1 s timeout, or checks
# from the first second, had starting raylets declared dead on a machine with a load of 40.
RAY_SYSTEM_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                     "health_check_timeout_ms": 2000,
                     "health_check_initial_delay_ms": 10_000}
CLONE_NEWNET = 0x40000000

T = TypeVar("T")


def _setns(netns: str) -> None:
    """Move the calling thread (only it) into the namespace."""
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        setns = getattr(os, "setns", None)  # Python 3.12+
        if setns is not None:
            setns(fd, CLONE_NEWNET)
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({netns}): {os.strerror(errno)}")
    finally:
        os.close(fd)


def in_host(host: Host, target: Callable[[], T], timeout: float = 60.0) -> T:
    """Run `target` in a new thread inside the host's namespace; its result or its error."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            _setns(host.netns)
            box["value"] = target()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"in-{host.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{target!r} in {host} took over {timeout:g} s")
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def host_thread(host: Host, target: Callable[[], None], name: str) -> threading.Thread:
    """A thread (not started) that runs `target` inside the host's namespace."""
    def run() -> None:
        _setns(host.netns)
        target()

    return threading.Thread(target=run, name=name, daemon=True)


def titles(pids: list[int]) -> dict[int, str]:
    """pid -> command line (a surge process's is its title, e.g. "surge:controller")."""
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                found[pid] = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
    return found


@dataclass
class HostsCluster:
    net: Network
    run_dir: Path
    env: dict[str, str]
    token: str = ""  # the instance's control token (the REST API wants it off loopback)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def head(self) -> Host:
        return self.net.hosts[0]

    @property
    def workers(self) -> list[Host]:
        return self.net.hosts[1:3]

    @property
    def client(self) -> Host:
        return self.net.hosts[3]

    def __repr__(self) -> str:
        return f"<HostsCluster {self.net!r} run_dir={self.run_dir}>"

    # -- commands on the hosts -----------------------------------------------------------

    def sh(self, host: Host, argv: list[str], timeout: float = START_TIMEOUT_S) -> str:
        """Run a command on the host (the run's environment); its output, or an error
        with the end of the host's Ray logs."""
        try:
            result = self.net.run(host, argv, timeout=timeout, env=self.env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{host}: {' '.join(argv)} did not end in {timeout:g} s"
                               f"{self.ray_logs(host)}") from None
        if result.returncode != 0:
            raise RuntimeError(f"{host}: {' '.join(argv)} exited {result.returncode}:\n"
                               f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
                               f"{self.ray_logs(host)}")
        return result.stdout

    def ray_logs(self, host: Host, lines: int = 12) -> str:
        """What the host's Ray daemons logged as errors, or their last lines (for a
        failure's message); stack frames left out."""
        found = []
        for path in sorted((self.run_dir / host.name).glob("session_2*/logs/*")):
            if path.name not in ("raylet.out", "raylet.err", "gcs_server.out",
                                 "gcs_server.err") or not path.stat().st_size:
                continue
            text = [line for line in path.read_text(errors="replace").splitlines()
                    if line.strip() and not line.startswith((" ", "/", "\t"))]
            errors = [line for line in text if " E " in line or " C " in line
                      or " F " in line or "Check failed" in line]
            tail = (errors or text)[-lines:]
            found.append(f"\n--- {path.relative_to(self.run_dir)}\n" + "\n".join(tail))
        return "".join(found)

    def surge(self, *args: str, timeout: float = START_TIMEOUT_S) -> str:
        return self.sh(self.head, [sys.executable, "-m", "surge.cli.main", *args],
                       timeout=timeout)

    def ray_head(self) -> None:
        self.sh(self.head, [
            *self._ray_start(self.head), "--head", f"--port={RAY_PORT}", "--num-cpus=0",
            "--include-dashboard=false", f"--system-config={json.dumps(RAY_SYSTEM_CONFIG)}"])

    def ray_worker(self, host: Host) -> None:
        self.sh(host, [*self._ray_start(host), f"--address={self.head.ip}:{RAY_PORT}",
                       "--num-cpus=1"])

    def _ray_start(self, host: Host) -> list[str]:
        ray = str(Path(sys.executable).with_name("ray"))
        temp = self.run_dir / host.name  # Ray's sockets and logs: one directory per host
        temp.mkdir(exist_ok=True)
        # No log monitor (nobody reads the logs from a driver): one process less per host.
        # The agents' ports are fixed (each host has its own ports), so the raylet need not
        # wait for their port files: a starved raylet gave up on that wait and crashed.
        return [ray, "start", f"--node-ip-address={host.ip}", f"--temp-dir={temp}",
                "--disable-usage-stats", "--num-gpus=0", "--include-log-monitor=false",
                f"--dashboard-agent-grpc-port={AGENT_PORT}",
                f"--metrics-export-port={AGENT_PORT + 1}",
                f"--runtime-env-agent-port={AGENT_PORT + 2}"]

    def start(self) -> None:
        """Ray on the head, then on both workers at once (a worker needs the head's node
        registered), then surge on the head."""
        began = time.monotonic()
        self.ray_head()
        self.timings["ray head"] = time.monotonic() - began
        errors: list[BaseException] = []

        def worker(host: Host) -> None:
            try:
                self.ray_worker(host)
            except BaseException as exc:  # re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(h,)) for h in self.workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        self.timings["ray workers"] = time.monotonic() - began - self.timings["ray head"]
        began = time.monotonic()
        self.surge("start", "--backend", "ray", "-a", f"{self.head.ip}:{RAY_PORT}",
                   "--http-host", "0.0.0.0", "--http-port", str(HTTP_PORT),
                   "--dashboard-host", "0.0.0.0", "--dashboard-port", str(DASHBOARD_PORT))
        self.timings["surge start"] = time.monotonic() - began
        self.token = next((self.run_dir / "tmp").glob("surge-*/control-*.token")).read_text()

    def deploy(self, target: str = "tests.multihost.apps:app", name: str = "where") -> None:
        self.surge("deploy", target, "--name", name)

    # -- looking at it from the client host ----------------------------------------------

    def url(self, host: Host, path: str = "/") -> str:
        return f"http://{host.ip}:{HTTP_PORT}{path}"

    def get(self, host: Host, path: str = "/", timeout: float = 10.0) -> tuple[int, str]:
        """One GET from the client host to the host's proxy: (status, body)."""
        def fetch() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(self.url(host, path), timeout=timeout) as resp:
                    return int(resp.status), resp.read().decode()
            except urllib.error.HTTPError as exc:
                return int(exc.code), exc.read().decode()

        return in_host(self.client, fetch, timeout=timeout + 5)

    def details(self) -> dict[str, Any]:
        """Ray's REST view of the instance (GET /api/serve/applications/ on the head)."""
        url = f"http://{self.head.ip}:{DASHBOARD_PORT}/api/serve/applications/"

        def fetch() -> dict[str, Any]:
            request = urllib.request.Request(
                url, headers={"Authorization": f"Bearer {self.token.strip()}"})
            with urllib.request.urlopen(request, timeout=10) as resp:
                data: dict[str, Any] = json.loads(resp.read())
                return data

        return in_host(self.client, fetch, timeout=15)

    def replicas(self, app: str = "where") -> list[dict[str, Any]]:
        deployments = self.details()["applications"][app]["deployments"]
        return [r for d in deployments.values() for r in d["replicas"]]

    def node_ips(self) -> dict[str, str]:
        """Ray node id -> host IP, from the proxies (one per node that hosts a replica)."""
        return {p["node_id"]: p["node_ip"] for p in self.details()["proxies"].values()}

    def running_on(self, app: str = "where") -> list[str]:
        """The host IPs of the RUNNING replicas, sorted."""
        ips = self.node_ips()
        return sorted(ips.get(r["node_id"] or "", "?") for r in self.replicas(app)
                      if r["state"] == "RUNNING")

    def processes(self, host: Host, prefix: str = "surge:") -> dict[int, str]:
        """The host's processes whose command line starts with `prefix`."""
        return {pid: title for pid, title in titles(self.net.pids(host)).items()
                if title.startswith(prefix)}

    def wait_serving(self, timeout: float = START_TIMEOUT_S) -> None:
        """The whole service: a replica RUNNING on each worker, every proxy answering 200."""
        want = sorted(h.ip for h in self.workers)
        eventually(lambda: self.running_on() == want, timeout, interval_s=0.2,
                   what=f"replicas RUNNING on {want}")
        for host in [self.head, *self.workers]:
            eventually(functools.partial(self.answers, host), timeout, interval_s=0.2,
                       what=f"{host}'s proxy serving")

    def answers(self, host: Host) -> bool:
        return self.get(host)[0] == 200

    def close(self) -> None:
        try:
            self.net.close()
        finally:
            shutil.rmtree(self.run_dir, ignore_errors=True)


@contextlib.contextmanager
def hosts_cluster() -> Iterator[HostsCluster]:
    """Four hosts, Ray on three, surge started on the head; everything removed after."""
    run_dir = Path(tempfile.mkdtemp(prefix="mh-"))
    (run_dir / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(run_dir / "tmp"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
           "SURGE_ADDRESS": f"0.0.0.0:{CONTROL_PORT}", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_raylet_start_wait_time_s": "120",
           "RAY_AUTH_MODE": "disabled"}  # not ~/.ray's token: the run is private
    for key in ("SURGE_DASHBOARD", "SURGE_CONTROL_TOKEN", "RAY_ADDRESS"):
        env.pop(key, None)
    cluster = HostsCluster(Network(hosts=4), run_dir, env)
    try:
        cluster.net.__enter__()
        started = time.monotonic()
        cluster.start()
        print(f"multihost: Ray on 3 hosts and surge started in "
              f"{time.monotonic() - started:.1f} s {cluster.timings}", flush=True)
        yield cluster
    finally:
        cluster.close()
