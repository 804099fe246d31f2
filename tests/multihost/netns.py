"""Hosts as Linux network namespaces on one bridge: a small test network on this machine.

    with Network(hosts=4) as net:          # namespaces mh<run>-h0 .. h3, 10.203.0.1 .. .4
        proc = net.popen(net.hosts[0], ["python", "-m", "http.server"])
        net.link_down(net.hosts[1])        # its switch port down: silence, no FIN, no RST
        with net.impaired(net.hosts[2], loss=0.2, delay_s=0.1): ...

Each host is a namespace with loopback up and one veth pair: `eth0` inside, with the
host's own address, and its peer enslaved to a bridge in the root namespace (the
"switch"). The bridge has no address, so nothing in the root namespace can reach the
hosts or be reached from them, and the hosts' addresses exist only inside their own
namespaces: two runs at once (each with its own names) never see each other's traffic.

Faults: `link_down` sets the host's port on the bridge down (the other hosts see pure
silence, as when a cable or a switch port dies); `impaired` adds loss and delay on one
direction of every connection of the host: what it sends, with `tc netem` where the
kernel has sch_netem, else what it receives, with an NFQUEUE rule and
`tests.multihost.nfq` (userspace verdicts after the delay). Receiving is the direction
the fallback takes because a packet dropped on its way out is reported to the sender's
own TCP stack, which resends it at once: that would not be loss on a wire.

Processes run with `ip netns exec` in a session of their own; `close` kills every
process still in the namespaces (`ip netns pids`: only processes this run started can
be in them), then removes the links and the namespaces, whatever state they are in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Host", "Network", "NetworkUnavailable", "unavailable_reason"]

SUBNET = "10.203.0"  # host i has SUBNET.(i+1)/24; private to this run's namespaces
DEV = "eth0"  # the host's interface, inside its namespace
NFQUEUE_NUM = 0  # the queue `impaired` uses (queues are per namespace)
COMMAND_TIMEOUT_S = 20.0  # one `ip`/`tc`/`iptables` call
STOP_GRACE_S = 5.0  # SIGTERM, then this long, then SIGKILL


class NetworkUnavailable(RuntimeError):
    """Namespaces cannot be made here (no `ip`, no CAP_NET_ADMIN): the tests skip."""


@dataclass(frozen=True)
class Host:
    index: int
    name: str  # "h0", "h1", ...
    netns: str  # the namespace, unique to the run
    ip: str
    port: str  # the veth end on the bridge (root namespace): the host's switch port

    def __str__(self) -> str:
        return f"{self.name} ({self.ip})"


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True,
                            timeout=COMMAND_TIMEOUT_S, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): "
                           f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None: try one and remove it."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed: apt-get install iproute2"
    probe = f"mhprobe{os.getpid()}"
    try:
        made = _run(["ip", "netns", "add", probe], check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns add` could not run: {exc}"
    if made.returncode != 0:
        return f"cannot create a network namespace (needs CAP_NET_ADMIN and CAP_SYS_ADMIN): " \
               f"{made.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return True  # gone already


def _iptables() -> str | None:
    for name in ("iptables-legacy", "iptables"):
        if shutil.which(name):
            return name
    return None


class Network:
    """N hosts on one bridge; a context manager that removes everything it made."""

    def __init__(self, hosts: int, run_id: str | None = None) -> None:
        if not 1 <= hosts <= 200:
            raise ValueError("1 to 200 hosts")
        self.hosts_count = hosts
        self.run_id = run_id or uuid.uuid4().hex[:6]
        self.bridge = f"mh{self.run_id}br"  # at most 15 characters, as every link name
        self.hosts: list[Host] = []
        self.procs: list[subprocess.Popen[Any]] = []
        self.started_on: dict[int, str] = {}  # pid of each of procs -> its host's netns
        # netns -> how it is impaired ("netem", or the NFQUEUE daemon's process)
        self.impairments: dict[str, str | subprocess.Popen[Any]] = {}

    def __repr__(self) -> str:
        return (f"<Network {self.run_id} hosts={[str(h) for h in self.hosts]} "
                f"processes={sum(1 for p in self.procs if p.poll() is None)}>")

    # -- building and tearing down ---------------------------------------------------------

    def __enter__(self) -> Network:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        reason = unavailable_reason()
        if reason:
            raise NetworkUnavailable(reason)
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "link", "set", self.bridge, "up"])
        for index in range(self.hosts_count):
            host = Host(index, f"h{index}", f"mh{self.run_id}-h{index}",
                        f"{SUBNET}.{index + 1}", f"mh{self.run_id}p{index}")
            self.hosts.append(host)
            self._add_host(host)

    def _add_host(self, host: Host) -> None:
        ns = host.netns
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", host.port, "type", "veth", "peer", "name", DEV,
              "netns", ns])
        _run(["ip", "link", "set", host.port, "master", self.bridge, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{host.ip}/24", "dev", DEV])
        _run(["ip", "-n", ns, "link", "set", DEV, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def close(self) -> None:
        """Stop every process, then remove the namespaces, the veths and the bridge."""
        with contextlib.suppress(Exception):
            self.kill_all(*self.hosts)
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.wait(timeout=STOP_GRACE_S)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        for host in self.hosts:
            _run(["ip", "netns", "del", host.netns], check=False)  # takes eth0 and its peer
            _run(["ip", "link", "del", host.port], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)

    # -- processes -------------------------------------------------------------------------

    def command(self, host: Host, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", host.netns, *argv]

    def popen(self, host: Host, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start argv inside the host, in a session of its own (so its group can be
        signalled without touching anything else)."""
        proc = subprocess.Popen(self.command(host, argv), start_new_session=True, **kwargs)
        self.procs.append(proc)
        self.started_on[proc.pid] = host.netns
        return proc

    def run(self, host: Host, argv: Sequence[str], timeout: float = 60.0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(host, argv), capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)

    def pids(self, host: Host) -> list[int]:
        """Every live process in the host's namespace (ours: nothing else can enter it);
        zombies are left out (they are gone, only not yet reaped by their parent)."""
        result = _run(["ip", "netns", "pids", host.netns], check=False)
        return [int(p) for p in result.stdout.split() if p.strip().isdigit()
                and not _zombie(int(p))]

    def kill_all(self, *hosts: Host, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM every process in the hosts' namespaces, SIGKILL what is left after
        grace_s. The process groups this network started there are signalled too: one
        just started may not have entered its namespace yet."""
        names = {host.netns for host in hosts}

        def left() -> list[int]:
            for proc in self.procs:
                proc.poll()  # reap the ones we started
            ours = [p.pid for p in self.procs
                    if p.returncode is None and self.started_on.get(p.pid) in names]
            return [pid for host in hosts for pid in self.pids(host)] + ours

        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = left()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            for proc in self.procs:
                if proc.returncode is None and self.started_on.get(proc.pid) in names:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, sig)  # its own session: start_new_session
            deadline = time.monotonic() + grace_s
            while left() and time.monotonic() < deadline:
                time.sleep(0.1)  # teardown: poll the namespaces until they are empty

    # -- faults ----------------------------------------------------------------------------

    def link_down(self, host: Host) -> None:
        """The host's switch port down: its packets go nowhere and none reach it."""
        _run(["ip", "link", "set", host.port, "down"])

    def link_up(self, host: Host) -> None:
        _run(["ip", "link", "set", host.port, "up"])

    def impairment_unavailable(self, host: Host) -> str | None:
        """Why `impaired` cannot work here (no sch_netem and no iptables), or None."""
        probe = ["tc", "qdisc", "add", "dev", DEV, "root", "netem", "delay", "1ms"]
        if self.run(host, probe, timeout=COMMAND_TIMEOUT_S).returncode == 0:
            self.run(host, ["tc", "qdisc", "del", "dev", DEV, "root"],
                     timeout=COMMAND_TIMEOUT_S)
            return None
        if _iptables() is None:
            return ("loss and delay need sch_netem in the kernel or iptables for the "
                    "NFQUEUE fallback: apt-get install iptables")
        return None

    @contextlib.contextmanager
    def impaired(self, host: Host, loss: float, delay_s: float,
                 seed: int = 0) -> Iterator[str]:
        """Loss and delay on everything the host sends; yields how ("netem" or
        "nfqueue")."""
        how = self._impair(host, loss, delay_s, seed)
        try:
            yield how
        finally:
            self._unimpair(host)

    def _impair(self, host: Host, loss: float, delay_s: float, seed: int) -> str:
        netem = ["tc", "qdisc", "add", "dev", DEV, "root", "netem", "loss",
                 f"{loss * 100:g}%", "delay", f"{delay_s * 1000:g}ms", "limit", "10000"]
        if self.run(host, netem, timeout=COMMAND_TIMEOUT_S).returncode == 0:
            self.impairments[host.netns] = "netem"
            return "netem"
        iptables = _iptables()
        if iptables is None:
            raise RuntimeError("no sch_netem in this kernel and no iptables for the NFQUEUE "
                               "fallback: apt-get install iptables")
        root = str(Path(__file__).resolve().parents[2])
        daemon = self.popen(host, [sys.executable, "-m", "tests.multihost.nfq",
                                   "--queue", str(NFQUEUE_NUM), "--loss", str(loss),
                                   "--delay", str(delay_s), "--seed", str(seed)],
                            cwd=root, stdout=subprocess.PIPE, text=True)
        assert daemon.stdout is not None
        line = daemon.stdout.readline()  # "ready" once bound to the queue
        if line.strip() != "ready":
            daemon.kill()
            raise RuntimeError(f"the NFQUEUE daemon did not start: {line!r}")
        rule = ["-t", "mangle", "-A", "PREROUTING", "-i", DEV, "-j", "NFQUEUE",
                "--queue-num", str(NFQUEUE_NUM), "--queue-bypass"]
        result = self.run(host, [iptables, *rule], timeout=COMMAND_TIMEOUT_S)
        if result.returncode != 0:
            daemon.kill()
            raise RuntimeError(f"iptables NFQUEUE rule: {result.stderr.strip()}")
        self.impairments[host.netns] = daemon
        return "nfqueue"

    def _unimpair(self, host: Host) -> None:
        how = self.impairments.pop(host.netns, None)
        if how == "netem":
            self.run(host, ["tc", "qdisc", "del", "dev", DEV, "root"],
                     timeout=COMMAND_TIMEOUT_S)
        elif isinstance(how, subprocess.Popen):
            iptables = _iptables()
            assert iptables is not None
            self.run(host, [iptables, "-t", "mangle", "-F", "PREROUTING"],
                     timeout=COMMAND_TIMEOUT_S)
            daemon = how
            daemon.send_signal(signal.SIGTERM)  # it lets every held packet go, then exits
            try:
                daemon.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=STOP_GRACE_S)
            if daemon.stdout is not None:
                daemon.stdout.close()
