"""The ray backend: replicas and proxies placed on a Ray cluster, one Ray actor each.

The controller stays a local process (on the head, next to the driver) and connects
to the cluster with `ray.init`. Each replica is a detached, named Ray actor
(`ray_host.ProcessHost`) created with the deployment's num_cpus / num_gpus / custom
resources, so Ray picks the node; the actor starts surge's replica process there,
which listens on TCP on its node's IP and registers with the controller as on the
local backend. Ray is used for placement and liveness only, never per request.

Liveness: per process, one `wait()` call on its actor resolves when the child exits
(its code) or fails when the actor dies (killed, node lost); `poll_exits` gathers
them with a non-blocking `ray.wait`. Ray's `gcs` notices a lost node within its health
check period, then the controller replaces the replicas elsewhere.

Proxies (HTTPOptions.location, policy.placement): the controller's `proxy-N` workers
run on the head node; with EveryNode each other node hosting a replica gets a proxy
`proxy-node-<node id>` that this backend starts and stops as replicas come and go
(the controller sees it register, serve and exit like any proxy). Its port follows
policy.placement.proxy_port (distinct ports for nodes sharing an IP).

Actors are detached, so processes outlive a crashed controller; a restarted one
`adopt`s them by name (namespace "surge", name "<instance>/<process id>").
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from surge.backends.base import Exit, PlacementError, ReplicaLaunch
from surge.backends.ray_host import ProcessHost
from surge.config import HTTPOptions
from surge.control_auth import TOKEN_ENV
from surge.errors import ConfigError
from surge.node import PROXY_PORT_ENV
from surge.policy.placement import proxy_nodes, proxy_port

__all__ = ["RayBackend"]

log = logging.getLogger("surge.backend")

_ray: Any = ray  # for Ray's untyped functions (nodes, util.get_node_ip_address)

NAMESPACE = "surge"
NODE_PROXY_PREFIX = "proxy-node-"
HEAD_RESOURCE = "node:__internal_head__"
# How stale the cached view of the cluster's nodes may be (placement checks only).
NODES_REFRESH_S = 1.0
# kill(): SIGKILL through the actor first; a second kill this much later kills the actor.
KILL_ESCALATION_S = 2.0
PASSED_ENV = ("SURGE_LOG_LEVEL", TOKEN_ENV)


@dataclass
class _Hosted:
    process_id: str
    actor: Any
    started: Any  # ObjectRef of ProcessHost.start: pid, node
    exited: Any  # ObjectRef of ProcessHost.wait: the exit code
    is_proxy: bool
    pid: int = 0
    node_id: str = ""
    node_ip: str = ""
    port: int | None = None  # node proxies: the port they were given
    killed_at: float | None = None
    demand: dict[str, float] = field(default_factory=dict)


class RayBackend:
    name = "ray"

    def __init__(self, controller_address: str, http: HTTPOptions,
                 ray_address: str | None = None) -> None:
        if not ray.is_initialized():
            try:
                ray.init(address=ray_address or "auto", namespace=NAMESPACE,
                         logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"cannot connect to the Ray cluster at "
                                  f"{ray_address or 'auto'}: {exc}; start one with `ray start "
                                  "--head` or pass ray_address") from None
        self.http = http
        self.host_class = ray.remote(ProcessHost)
        self.hosts: dict[str, _Hosted] = {}
        self._exits: list[Exit] = []
        self._nodes: list[dict[str, Any]] = []
        self._nodes_at = -NODES_REFRESH_S
        self.head = self._head_node()
        self.head_ip = self._node_ip(self.head)
        self.controller_address = self._reachable(controller_address)
        # Actor names are scoped to the instance (its state directory survives restarts).
        state = os.environ.get("SURGE_STATE_DIR")
        self.instance = os.path.basename(state) if state else self.controller_address
        log.info("ray backend: head node %s (%s), controller at %s", self.head[:12],
                 self.head_ip, self.controller_address)

    def __repr__(self) -> str:
        return (f"<RayBackend head={self.head[:12]} processes={len(self.hosts)} "
                f"proxy_nodes={len(self._node_proxies())}>")

    # -- the cluster -------------------------------------------------------------------

    def nodes(self, fresh: bool = False) -> list[dict[str, Any]]:
        now = time.monotonic()
        if fresh or now - self._nodes_at > NODES_REFRESH_S:
            self._nodes = [n for n in _ray.nodes() if n.get("Alive")]
            self._nodes_at = now
        return self._nodes

    def _head_node(self) -> str:
        for node in self.nodes(fresh=True):
            if HEAD_RESOURCE in node.get("Resources", {}):
                return str(node["NodeID"])
        return str(ray.get_runtime_context().get_node_id())

    def _node_ip(self, node_id: str) -> str:
        for node in self.nodes():
            if node["NodeID"] == node_id:
                return str(node["NodeManagerAddress"])
        return str(_ray.util.get_node_ip_address())

    def _reachable(self, address: str) -> str:
        """The control address as other nodes must dial it."""
        host, _, port = address.rpartition(":")
        if host in ("0.0.0.0", "::", ""):
            return f"{self.head_ip}:{port}"
        if ipaddress.ip_address(host).is_loopback and any(
                not ipaddress.ip_address(n["NodeManagerAddress"]).is_loopback
                and n["NodeManagerAddress"] != self.head_ip for n in self.nodes()):
            log.warning("the control address %s is loopback but the Ray cluster has other "
                        "hosts: their replicas cannot reach it; set SURGE_ADDRESS=0.0.0.0:%s",
                        address, port)
        return address

    def _check_fits(self, launch: ReplicaLaunch, demand: dict[str, float]) -> None:
        """PlacementError when no alive node could ever hold the replica (Ray would queue
        the actor forever); a node that is only busy now is Ray's to wait for."""
        for node in self.nodes():
            total = node.get("Resources", {})
            if all(total.get(name, 0.0) + 1e-9 >= amount for name, amount in demand.items()):
                return
        wants = ", ".join(f"{k}={v:g}" for k, v in sorted(demand.items()) if v)
        raise PlacementError(f"no node of the Ray cluster has {wants or 'room'} for a replica "
                             f"of {launch.deployment}; add such a node or lower "
                             "ray_actor_options")

    # -- starting ----------------------------------------------------------------------

    def _actor_name(self, process_id: str) -> str:
        return f"{self.instance}/{process_id}"

    def _env(self, extra: dict[str, str], sys_path: tuple[str, ...] = ()) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)}
        paths = [p for p in (*sys_path, os.environ.get("PYTHONPATH", "")) if p]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env.update(extra)
        return env

    def _host(self, process_id: str, module: str, args: list[str], env: dict[str, str],
              options: dict[str, Any], is_proxy: bool) -> _Hosted:
        actor: Any = self.host_class.options(
            name=self._actor_name(process_id), namespace=NAMESPACE, lifetime="detached",
            max_restarts=0, get_if_exists=False, **options).remote()
        hosted = _Hosted(process_id, actor, actor.start.remote(module, args, env),
                         actor.wait.remote(), is_proxy)
        self.hosts[process_id] = hosted
        return hosted

    def start_replica(self, launch: ReplicaLaunch) -> int:
        resources = launch.resources
        demand = {"CPU": resources.num_cpus, "GPU": resources.num_gpus,
                  **dict(resources.resources)}
        self._check_fits(launch, {k: v for k, v in demand.items() if v > 0})
        args = [self.controller_address, launch.replica_id, launch.deployment.app,
                launch.deployment.name]
        options: dict[str, Any] = {"num_cpus": resources.num_cpus,
                                   "num_gpus": resources.num_gpus}
        if resources.resources:
            options["resources"] = dict(resources.resources)
        hosted = self._host(launch.replica_id, "surge.replica", args,
                            self._env(dict(resources.env_vars), launch.sys_path), options,
                            is_proxy=False)
        hosted.demand = demand
        return 0  # the pid is known once the actor has started it (replica_ready has it)

    def start_proxy(self, proxy_id: str) -> int:
        """The controller's proxy workers, on the head node. Node proxies follow replicas
        (`_place_proxies`); when one exits the controller asks again, and that is a no-op."""
        if proxy_id.startswith(NODE_PROXY_PREFIX) or proxy_id in self.hosts:
            return 0
        self._start_proxy(proxy_id, self.head, {})
        return 0

    def _start_proxy(self, proxy_id: str, node_id: str, env: dict[str, str]) -> _Hosted:
        strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        return self._host(proxy_id, "surge.proxy", [self.controller_address, proxy_id],
                          self._env(env), {"num_cpus": 0, "scheduling_strategy": strategy},
                          is_proxy=True)

    def adopt(self, process_id: str, pid: int, gpus: list[str] | None = None,
              num_gpus: float = 0.0) -> None:
        """Watch a process a previous controller started: find its actor by name."""
        if process_id in self.hosts:
            return
        try:
            actor = ray.get_actor(self._actor_name(process_id), namespace=NAMESPACE)
        except ValueError:
            log.warning("%s (pid %d) has no Ray actor %r; treating it as gone", process_id,
                        pid, self._actor_name(process_id))
            self._exits.append(Exit(process_id, None))
            return
        self.hosts[process_id] = _Hosted(process_id, actor, actor.describe.remote(),
                                         actor.wait.remote(), process_id.startswith("proxy-"),
                                         pid=pid)

    # -- stopping ----------------------------------------------------------------------

    def terminate(self, process_id: str) -> None:
        hosted = self.hosts.get(process_id)
        if hosted is None:
            return
        if not hosted.node_id:  # not started yet (maybe waiting for resources): no drain
            ray.kill(hosted.actor, no_restart=True)
            return
        hosted.actor.signal.remote(int(signal.SIGTERM))

    def kill(self, process_id: str) -> None:
        hosted = self.hosts.get(process_id)
        if hosted is None:
            return
        now = time.monotonic()
        if hosted.killed_at is None and hosted.node_id:
            hosted.killed_at = now
            hosted.actor.signal.remote(int(signal.SIGKILL))
        elif hosted.killed_at is None or now - hosted.killed_at > KILL_ESCALATION_S:
            ray.kill(hosted.actor, no_restart=True)  # the child gets its parent-death signal

    # -- watching ----------------------------------------------------------------------

    def poll_exits(self) -> list[Exit]:
        self._reap()
        exits, self._exits = self._exits, []
        self._place_proxies()
        return exits

    def _reap(self) -> None:
        """Note started and exited processes (a non-blocking ray.wait on their refs)."""
        watched: dict[Any, tuple[_Hosted, bool]] = {}
        for hosted in self.hosts.values():
            if not hosted.node_id:
                watched[hosted.started] = (hosted, False)
            watched[hosted.exited] = (hosted, True)
        if watched:
            ready, _ = ray.wait(list(watched), num_returns=len(watched), timeout=0)
            for ref in ready:
                hosted, is_exit = watched[ref]
                if is_exit:
                    self._exits.append(self._collect(hosted, ref))
                elif hosted.process_id in self.hosts:
                    self._started(hosted, ref)

    def _started(self, hosted: _Hosted, ref: Any) -> None:
        try:
            info = ray.get(ref)
        except ray.exceptions.RayError:
            return  # its wait() fails too: reported as an exit
        hosted.pid = hosted.pid or int(info.get("pid", 0))
        hosted.node_id, hosted.node_ip = str(info["node_id"]), str(info["node_ip"])
        log.info("%s runs on node %s (%s) as pid %d%s", hosted.process_id,
                 hosted.node_id[:12], hosted.node_ip, hosted.pid,
                 f", GPUs {','.join(info['gpus'])}" if info.get("gpus") else "")

    def _collect(self, hosted: _Hosted, ref: Any) -> Exit:
        code: int | None
        try:
            code = int(ray.get(ref))
        except ray.exceptions.RayError as exc:  # the actor died: killed, or its node is gone
            code = None
            log.warning("%s: its Ray actor died (%s)", hosted.process_id,
                        type(exc).__name__)
        self.hosts.pop(hosted.process_id, None)
        try:
            ray.kill(hosted.actor, no_restart=True)
        except ray.exceptions.RayError:
            pass
        return Exit(hosted.process_id, code)

    # -- proxies per node ----------------------------------------------------------------

    def _node_proxies(self) -> dict[str, _Hosted]:
        return {h.process_id[len(NODE_PROXY_PREFIX):]: h for h in self.hosts.values()
                if h.process_id.startswith(NODE_PROXY_PREFIX)}

    def _place_proxies(self) -> None:
        """Start and stop node proxies (EveryNode), while the head's proxies are up: they
        go first at shutdown, and no node proxy may start after them."""
        if not any(h.is_proxy and not h.process_id.startswith(NODE_PROXY_PREFIX)
                   for h in self.hosts.values()):
            return
        replica_nodes = {h.node_id for h in self.hosts.values() if not h.is_proxy and h.node_id}
        wanted = proxy_nodes(self.http.location, self.head, replica_nodes) - {self.head}
        running = self._node_proxies()
        for node_id, hosted in running.items():
            if node_id not in wanted and hosted.killed_at is None:
                log.info("node %s hosts no replica now: stopping its proxy", node_id[:12])
                hosted.killed_at = time.monotonic()  # asked once; it drains, then exits
                self.terminate(hosted.process_id)
        for node_id in sorted(wanted - set(running)):
            ip = self._node_ip(node_id)
            taken = [h.port if h.port is not None else self.http.port
                     for h in self.hosts.values()
                     if h.is_proxy and (h.node_ip or self.head_ip) == ip]
            port = proxy_port(self.http.port, taken)
            hosted = self._start_proxy(f"{NODE_PROXY_PREFIX}{node_id}", node_id,
                                       {PROXY_PORT_ENV: str(port)})
            hosted.port, hosted.node_ip = port, ip
            log.info("node %s hosts replicas: starting its proxy on %s:%d", node_id[:12], ip,
                     port)

    def alive(self) -> list[str]:
        self._reap()  # exits found here are still reported by the next poll_exits
        return list(self.hosts)

    def close(self) -> None:
        for hosted in self.hosts.values():
            try:
                ray.kill(hosted.actor, no_restart=True)
            except ray.exceptions.RayError:
                pass
        self.hosts.clear()
        ray.shutdown()
