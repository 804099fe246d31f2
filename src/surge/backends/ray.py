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

Proxies: the controller decides where they go (controller/plan.py, policy.placement)
and asks for each with the node it must run on (a hard node-affinity strategy) and,
for nodes sharing an IP, its own port. `placements` tells the controller which node
each process landed on, once its actor has started it.

Actors are detached, so processes outlive a crashed controller; a restarted one
`adopt`s them by name (namespace "surge", name "<instance>/<process id>").

Weight store: one per node (surge.weights). A replica's spec asks for "its node's
store" (`NodeWeightStore`); the host actor that starts the first replica on a node
starts the store there in an actor of its own (`<instance>/weights/<node id>`,
ray_host.py). `close` kills those actors; their stores' guardians unlink the entries.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from surge.backends.base import Exit, Placement, PlacementError, ProxyLaunch, ReplicaLaunch
from surge.backends.ray_host import ProcessHost
from surge.clock import SYSTEM
from surge.config import ReplicaResources
from surge.config.weights import WeightStoreOptions
from surge.errors import ConfigError
from surge.launch import ORPHAN_TIMEOUT_S, Lifetime, Membership, NodeWeightStore, Tcp, encode

__all__ = ["RayBackend"]

log = logging.getLogger("surge.backend")

_ray: Any = ray  # for Ray's untyped functions (nodes, util.get_node_ip_address)

NAMESPACE = "surge"
HEAD_RESOURCE = "node:__internal_head__"
# How stale the cached view of the cluster's nodes may be (placement checks only).
NODES_REFRESH_S = 1.0
# kill(): SIGKILL through the actor first; a second kill this much later kills the actor.
KILL_ESCALATION_S = 2.0
# A placed process dies with its host actor, and leaves after this without a controller.
PLACED = Lifetime(orphan_timeout_s=ORPHAN_TIMEOUT_S)


@dataclass
class _Hosted:
    process_id: str
    actor: Any
    started: Any  # ObjectRef of ProcessHost.start: pid, node
    exited: Any  # ObjectRef of ProcessHost.wait: the exit code
    pid: int = 0
    node_id: str = ""
    node_ip: str = ""
    killed_at: float | None = None
    demand: dict[str, float] = field(default_factory=dict)


class RayBackend:
    name = "ray"
    deaths_visible_at_once = False  # a lost node is noticed after Ray's health checks

    def __init__(self, membership: Membership, ray_address: str | None = None,
                 state_dir: str | None = None,
                 weights: WeightStoreOptions | None = None) -> None:
        if not ray.is_initialized():
            try:
                ray.init(address=ray_address or "auto", namespace=NAMESPACE,
                         logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"cannot connect to the Ray cluster at "
                                  f"{ray_address or 'auto'}: {exc}; start one with `ray start "
                                  "--head` or pass ray_address") from None
        self.host_class = ray.remote(ProcessHost)
        self.hosts: dict[str, _Hosted] = {}
        self._exits: list[Exit] = []
        self._nodes: list[dict[str, Any]] = []
        self._nodes_at = -NODES_REFRESH_S
        head = self._head_node()
        self.head = Placement(head, self._node_ip(head))
        # Members on other nodes must dial the control address from there.
        self.membership = msgspec.structs.replace(
            membership, controller=self._reachable(membership.controller))
        # Actor names are scoped to the instance (its state directory survives restarts).
        self.instance = (os.path.basename(state_dir) if state_dir
                         else self.membership.controller)
        options = weights if weights is not None else WeightStoreOptions()
        self.weights = NodeWeightStore(self.instance, options) if options.enabled else None
        log.info("ray backend: head node %s (%s), controller at %s", head[:12],
                 self.head.node_ip, self.membership.controller)

    def __repr__(self) -> str:
        return f"<RayBackend head={self.head.node_id[:12]} processes={len(self.hosts)}>"

    # -- the cluster -------------------------------------------------------------------

    def nodes(self, fresh: bool = False) -> list[dict[str, Any]]:
        now = SYSTEM.monotonic()
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
        head_ip = self.head.node_ip
        if host in ("0.0.0.0", "::", ""):
            return f"{head_ip}:{port}"
        if ipaddress.ip_address(host).is_loopback and any(
                not ipaddress.ip_address(n["NodeManagerAddress"]).is_loopback
                and n["NodeManagerAddress"] != head_ip for n in self.nodes()):
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
        env: dict[str, str] = {}
        paths = [p for p in (*sys_path, os.environ.get("PYTHONPATH", "")) if p]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env.update(extra)
        return env

    def _host(self, process_id: str, module: str, spec: bytes, env: dict[str, str],
              options: dict[str, Any]) -> _Hosted:
        actor: Any = self.host_class.options(
            name=self._actor_name(process_id), namespace=NAMESPACE, lifetime="detached",
            max_restarts=0, get_if_exists=False, **options).remote()
        hosted = _Hosted(process_id, actor, actor.start.remote(module, spec, env),
                         actor.wait.remote())
        self.hosts[process_id] = hosted
        return hosted

    def start_replica(self, launch: ReplicaLaunch) -> int:
        resources = launch.resources
        demand = {"CPU": resources.num_cpus, "GPU": resources.num_gpus,
                  **dict(resources.resources)}
        self._check_fits(launch, {k: v for k, v in demand.items() if v > 0})
        spec = self.membership.replica(launch.replica_id, launch.deployment.app,
                                       launch.deployment.name, Tcp(also_unix=True), PLACED,
                                       self.weights, resources.num_cpus)
        options: dict[str, Any] = {"num_cpus": resources.num_cpus,
                                   "num_gpus": resources.num_gpus}
        if resources.resources:
            options["resources"] = dict(resources.resources)
        hosted = self._host(launch.replica_id, "surge.replica", encode(spec),
                            self._env(dict(resources.env_vars), launch.sys_path), options)
        hosted.demand = demand
        return 0  # the pid is known once the actor has started it (replica_started has it)

    def start_proxy(self, launch: ProxyLaunch) -> int:
        if launch.proxy_id in self.hosts:  # asked again before its exit was seen
            return 0
        spec = self.membership.proxy(launch.proxy_id, launch.port, PLACED)
        strategy = NodeAffinitySchedulingStrategy(node_id=launch.node_id, soft=False)
        self._host(launch.proxy_id, "surge.proxy", encode(spec), self._env({}),
                   {"num_cpus": 0, "scheduling_strategy": strategy})
        return 0

    def adopt(self, process_id: str, pid: int, gpus: list[str] | None = None,
              num_gpus: float = 0.0, resources: ReplicaResources | None = None) -> None:
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
                                         actor.wait.remote(), pid=pid)

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
        now = SYSTEM.monotonic()
        if hosted.killed_at is None and hosted.node_id:
            hosted.killed_at = now
            hosted.actor.signal.remote(int(signal.SIGKILL))
        elif hosted.killed_at is None or now - hosted.killed_at > KILL_ESCALATION_S:
            ray.kill(hosted.actor, no_restart=True)  # the child gets its parent-death signal

    # -- watching ----------------------------------------------------------------------

    def poll_exits(self) -> list[Exit]:
        self._reap()
        exits, self._exits = self._exits, []
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

    def placements(self) -> Mapping[str, Placement]:
        return {h.process_id: Placement(h.node_id, h.node_ip) for h in self.hosts.values()
                if h.node_id}

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
        if self.weights is not None:  # the nodes' stores, started by replicas' hosts
            for node in self.nodes(fresh=True):
                try:
                    store = ray.get_actor(f"{self.instance}/weights/{node['NodeID']}",
                                          namespace=NAMESPACE)
                    ray.kill(store, no_restart=True)
                except (ValueError, ray.exceptions.RayError):
                    pass
        ray.shutdown()
