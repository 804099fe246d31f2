"""The local backend: every replica and proxy is a process on this machine.

Replicas are forked from a pre-imported template process (the fork server) when it
is available, else started as fresh interpreters; the proxy is a child of the
controller. A start through the fork server does not wait for it (backends/forking.py):
the replica's pid is known from a later `poll_exits`, and a signal asked for before
then is sent once it is. Each gets its spec (surge.launch) on stdin. With a supervisor (the process
that started the instance) they outlive the controller and leave with the supervisor;
a restarted controller `adopt`s them by pid. Replicas listen on Unix sockets in the
instance's state directory, where the node's weight store (surge.weights, one process
beside the fork server) listens too; each replica's spec names that socket. GPUs are
found from CUDA_VISIBLE_DEVICES or `nvidia-smi -L` and handed out as
CUDA_VISIBLE_DEVICES (fractions share a GPU); CPUs are not reserved but counted
(backends/node_cores.py): a replica starts nicer than the proxy only once the node's
replicas can keep all its cores busy, and those that started below that are reniced
then, here, when their pids are known.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping

from surge.backends.base import (
    LOCAL_PLACEMENT,
    Exit,
    Placement,
    PlacementError,
    ProxyLaunch,
    ReplicaLaunch,
)
from surge.backends.early import PROXY, forkserver_env, take_early
from surge.backends.forking import ForkServer
from surge.backends.node_cores import NodeCores, nicer_than_this, node_cores, raise_nice
from surge.config import ReplicaResources
from surge.config.weights import WeightStoreOptions
from surge.launch import Lifetime, Membership, Unix, encode, hand_spec, start_process
from surge.policy.threads import replica_cores
from surge.process import open_pidfd, pid_gone
from surge.weights.node import NodeStore

__all__ = ["LocalBackend", "detect_gpus"]

log = logging.getLogger("surge.backend")


def detect_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU")]


class GpuPool:
    """Whole and fractional GPU shares, first fit."""

    def __init__(self, gpus: list[str]) -> None:
        self.free = {gpu: 1.0 for gpu in gpus}
        self.held: dict[str, list[tuple[str, float]]] = {}

    def take(self, owner: str, amount: float) -> list[str]:
        if amount <= 0:
            return []
        if amount >= 1:
            whole = [g for g, free in self.free.items() if free >= 1.0][: int(amount)]
            if len(whole) < int(amount):
                raise PlacementError(self._shortage(amount))
            picks = [(g, 1.0) for g in whole]
        else:
            fits = [g for g, free in self.free.items() if free + 1e-9 >= amount]
            if not fits:
                raise PlacementError(self._shortage(amount))
            picks = [(fits[0], amount)]
        for gpu, share in picks:
            self.free[gpu] -= share
        self.held[owner] = picks
        return [gpu for gpu, _ in picks]

    def claim(self, owner: str, gpus: list[str], amount: float) -> None:
        """Account for GPUs an adopted replica already holds."""
        known = [gpu for gpu in gpus if gpu in self.free]
        if amount <= 0 or not known:
            return
        picks = [(known[0], amount)] if amount < 1 else [(gpu, 1.0) for gpu in known]
        for gpu, share in picks:
            self.free[gpu] -= share
        self.held[owner] = picks

    def give_back(self, owner: str) -> None:
        for gpu, share in self.held.pop(owner, []):
            self.free[gpu] += share

    def _shortage(self, amount: float) -> str:
        return (f"needs num_gpus={amount:g} but this machine has {len(self.free)} GPU(s) with "
                f"{sum(self.free.values()):g} free; lower num_gpus or add GPUs")


class LocalBackend:
    name = "local"
    head = LOCAL_PLACEMENT
    deaths_visible_at_once = True  # a member's pid is gone the moment it dies

    def __init__(self, membership: Membership, state_dir: str | None = None,
                 gpus: list[str] | None = None, use_forkserver: bool = True,
                 weights: WeightStoreOptions | None = None) -> None:
        self.membership = membership
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.gpus = GpuPool(detect_gpus() if gpus is None else gpus)
        self.cores = NodeCores(node_cores())
        self.renice_when_forked: set[str] = set()  # reniced while the fork server had it
        # Replicas on this host listen on Unix sockets here: cheaper than loopback TCP.
        if state_dir:
            self.socket_dir = os.path.join(state_dir, "sockets")
            os.makedirs(self.socket_dir, mode=0o700, exist_ok=True)
        else:
            self.socket_dir = tempfile.mkdtemp(prefix="surge-")
        self.forked: dict[str, int] = {}  # replica id -> pid, for fork-server children
        # Asked of the fork server, pid not known yet: id -> (spec, env, signal to send).
        self.pending: dict[str, tuple[bytes, dict[str, str], int | None]] = {}
        self._exits: list[Exit] = []  # seen before poll_exits asked
        # Processes a previous controller started: id -> (pid, pidfd or None).
        self.adopted: dict[str, tuple[int, int | None]] = {}
        # Unsupervised, members die with this process (their parent).
        self.lifetime = Lifetime(supervisor_pid=membership.supervisor_pid,
                                 parent_pid=os.getpid())
        self.forkserver: ForkServer | None = None
        if use_forkserver:
            self.forkserver = ForkServer(self._env({}, ()))
        self.weights: NodeStore | None = None
        options = weights if weights is not None else WeightStoreOptions()
        if options.enabled:
            self.weights = NodeStore(options, os.path.join(self.socket_dir, "weights.sock"),
                                     self.lifetime, membership.logging, self._env({}, ()))
            # Its process starts once the fork server is ready (poll_exits): the two
            # would otherwise share the CPU the first proxy and replica are waiting for.
            self.weights.start_or_adopt(defer=self.forkserver is not None)

    def __repr__(self) -> str:
        return f"<LocalBackend processes={len(self.processes)} gpus_free={self.gpus.free}>"

    def _env(self, extra: dict[str, str], sys_path: tuple[str, ...]) -> dict[str, str]:
        env = forkserver_env()  # without the control token: the spec carries it
        paths = [p for p in (*sys_path, env.get("PYTHONPATH", "")) if p]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env.update(extra)
        return env

    def start_replica(self, launch: ReplicaLaunch) -> int:
        extra = dict(launch.resources.env_vars)
        gpus = self.gpus.take(launch.replica_id, launch.resources.num_gpus)
        if launch.resources.num_gpus > 0:
            extra["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        store = self.weights.address if self.weights is not None else None
        env = self._env(extra, launch.sys_path)
        num_cpus = launch.resources.num_cpus
        nice = self.cores.take(launch.replica_id, replica_cores(num_cpus, env))
        self._renice_others()
        spec = encode(self.membership.replica(launch.replica_id, launch.deployment.app,
                                              launch.deployment.name, Unix(self.socket_dir),
                                              self.lifetime, store, num_cpus, nice))
        if self.forkserver is not None and not self.forkserver.broken:
            self.forkserver.submit(launch.replica_id, spec, env)
            self.pending[launch.replica_id] = (spec, env, None)
            return 0  # known at a later poll_exits (and from the replica itself)
        return self._spawn(launch.replica_id, "surge.replica", spec, env)

    def start_proxy(self, launch: ProxyLaunch) -> int:
        spec = encode(self.membership.proxy(launch.proxy_id, launch.port, self.lifetime))
        env = self._env({}, ())
        early = take_early(PROXY, env)  # imported already, beside the controller
        if early is None:
            return self._spawn(launch.proxy_id, "surge.proxy", spec, env)
        hand_spec(early, spec)
        return self._track(launch.proxy_id, early)

    def _spawn(self, process_id: str, module: str, spec: bytes, env: dict[str, str]) -> int:
        return self._track(process_id, start_process([sys.executable, "-m", module], spec, env))

    def _track(self, process_id: str, process: subprocess.Popen[bytes]) -> int:
        previous = self.processes.get(process_id)
        if previous is not None and previous.poll() is not None:  # its exit, still unseen
            self._exits.append(Exit(process_id, previous.returncode))
        self.processes[process_id] = process
        self._forked_now(process_id, process.pid)  # a pending one started anew
        return process.pid

    def _renice_others(self) -> None:
        """Renice the replicas that started below the nice the node's replicas now want."""
        for owner in self.cores.renice():
            pid = self._pid(owner)
            if pid is None:  # not forked yet: its spec says it starts at 0
                self.renice_when_forked.add(owner)
            else:
                raise_nice(pid, self.cores.nices[owner])

    def _pid(self, process_id: str) -> int | None:
        process = self.processes.get(process_id)
        adopted = self.adopted.get(process_id)
        if process is not None:
            return process.pid
        return self.forked.get(process_id) or (adopted[0] if adopted else None)

    def _forked_now(self, process_id: str, pid: int) -> None:
        if process_id in self.renice_when_forked:
            self.renice_when_forked.discard(process_id)
            raise_nice(pid, self.cores.nices.get(process_id, 0))

    def adopt(self, process_id: str, pid: int, gpus: list[str] | None = None,
              num_gpus: float = 0.0, resources: ReplicaResources | None = None) -> None:
        """Take over a live process that a previous controller started (`resources`: a
        replica's, whose cores are counted; its nice is raised, never lowered, as needed)."""
        if process_id in self.adopted or process_id in self.processes:
            return
        self.adopted[process_id] = (pid, open_pidfd(pid))
        if resources is not None:
            env = dict(self._env(dict(resources.env_vars), ()))
            self.cores.take(process_id, replica_cores(resources.num_cpus, env),
                            nice=nicer_than_this(pid))
            self._renice_others()
        if gpus:
            self.gpus.claim(process_id, gpus, num_gpus)

    def terminate(self, process_id: str) -> None:
        self._signal(process_id, signal.SIGTERM)

    def kill(self, process_id: str) -> None:
        self._signal(process_id, signal.SIGKILL)

    def _signal(self, process_id: str, signum: int) -> None:
        pending = self.pending.get(process_id)
        if pending is not None:  # not forked yet: signalled once it is (KILL wins)
            spec, env, asked = pending
            self.pending[process_id] = (spec, env, signal.SIGKILL if signal.SIGKILL in (
                asked, signum) else signum)
            return
        adopted = self.adopted.get(process_id)
        forked = self.forked.get(process_id) or (adopted[0] if adopted else None)
        if forked is not None:
            try:
                os.kill(forked, signum)
            except (ProcessLookupError, PermissionError):
                pass
            return
        process = self.processes.get(process_id)
        if process is not None and process.poll() is None:
            try:
                process.send_signal(signum)
            except ProcessLookupError:
                pass

    def poll_exits(self) -> list[Exit]:
        if self.weights is not None:
            forkserver = self.forkserver
            if self.weights.pending and (forkserver is None or forkserver.ready
                                         or not forkserver.alive or forkserver.broken):
                self.weights.spawn_pending()
            self.weights.poll()
        exits, self._exits = self._exits, []
        for process_id, process in list(self.processes.items()):
            code = process.poll()
            if code is not None:
                del self.processes[process_id]
                self.gpus.give_back(process_id)
                exits.append(Exit(process_id, code))
        for process_id, (pid, pidfd) in list(self.adopted.items()):
            if pid_gone(pid, pidfd):
                del self.adopted[process_id]
                if pidfd is not None:
                    os.close(pidfd)
                self.gpus.give_back(process_id)
                exits.append(Exit(process_id, None))
        forkserver = self.forkserver
        if forkserver is not None:
            exits += self._forkserver_events(forkserver)
            if not forkserver.alive:  # its children outlive it: watch them by pid
                forkserver.close()
                exits += self._forkserver_events(forkserver)  # what its thread saw last
                for process_id, pid in self.forked.items():
                    self.adopted[process_id] = (pid, open_pidfd(pid))
                self.forked.clear()
                self.forkserver = None
                for process_id, (spec, env, asked) in list(self.pending.items()):
                    del self.pending[process_id]  # never answered: a new interpreter
                    self._spawn(process_id, "surge.replica", spec, env)
                    if asked is not None:
                        self._signal(process_id, asked)
        for exit_ in exits:
            self.cores.give_back(exit_.process_id)
            self.renice_when_forked.discard(exit_.process_id)
        return exits

    def _forkserver_events(self, forkserver: ForkServer) -> list[Exit]:
        events = forkserver.poll()
        for process_id, pid in events.spawned:
            pending = self.pending.pop(process_id, None)
            self.forked[process_id] = pid
            self._forked_now(process_id, pid)
            if pending is not None and pending[2] is not None:
                self._signal(process_id, pending[2])
        for process_id, why in events.failed:
            pending = self.pending.pop(process_id, None)
            if pending is None:
                continue
            log.warning("the fork server could not start %s (%s); starting it as a new "
                        "interpreter", process_id, why)
            spec, env, asked = pending
            self._spawn(process_id, "surge.replica", spec, env)
            if asked is not None:
                self._signal(process_id, asked)
        exits = []
        for process_id, code in events.exited:
            self.forked.pop(process_id, None)
            self.gpus.give_back(process_id)
            exits.append(Exit(process_id, code))
        return exits

    def placements(self) -> Mapping[str, Placement]:
        return {}  # one node: nothing to tell apart

    def alive(self) -> list[str]:
        running = [pid for pid, p in self.processes.items() if p.poll() is None]
        adopted = [p for p, (pid, fd) in self.adopted.items() if not pid_gone(pid, fd)]
        return running + list(self.forked) + list(self.pending) + adopted

    def close(self) -> None:
        if self.forkserver is not None:
            self.forkserver.close()
        if self.weights is not None:
            self.weights.close()
        for _, pidfd in self.adopted.values():
            if pidfd is not None:
                os.close(pidfd)
        shutil.rmtree(self.socket_dir, ignore_errors=True)
