"""What a surge process is told when it starts: one typed spec on its standard input.

Whoever starts a surge process writes it one JSON line and closes the pipe: the
supervisor starts the controller with a `ControllerProcessSpec`; a backend starts
proxies and replicas with a `ProxyProcessSpec` or `ReplicaProcessSpec` (directly, through
the fork server, or through the Ray actor that hosts it, which fills in its node), and
a node's weight store with a `WeightStoreProcessSpec` (a replica's spec names the
store's socket, `weight_store`). The
spec says everything the environment used to carry: the control address and token
(stdin is private to the two processes, unlike argv or /proc/PID/environ), where to
listen (`Unix(directory)` or `Tcp(host)`), which node it is on, what its lifetime is
tied to (`Lifetime`), its logging config and whether it records metrics.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, TypeVar

import msgspec

from surge.clock import SYSTEM
from surge.config import HTTPOptions, gRPCOptions
from surge.config.defaults import REPLICA_NICE
from surge.config.weights import WeightStoreOptions
from surge.control_auth import user_dir
from surge.errors import ConfigError, RayServeException
from surge.model import LOCAL_NODE
from surge.observability.config import DashboardOptions, LoggingConfig

__all__ = [
    "CONTROLLER_ERROR",
    "CONTROLLER_READY",
    "LOCAL_NODE",
    "ORPHAN_TIMEOUT_S",
    "ApplySpec",
    "ControllerProcessSpec",
    "DaemonSpec",
    "Lifetime",
    "MemberSpec",
    "Membership",
    "NodeWeightStore",
    "ProxyProcessSpec",
    "ReplicaProcessSpec",
    "Tcp",
    "Unix",
    "WeightStoreProcessSpec",
    "await_ready",
    "encode",
    "read_spec",
    "start_process",
]

# A process placed on a cluster with no controller for this long leaves: its driver is
# gone for good (a restart takes ~1 s; the supervisor gives up after 5 in a minute).
ORPHAN_TIMEOUT_S = 120.0
MAX_SPEC_BYTES = 1 << 20  # a spec is a few hundred bytes; a megabyte means a wrong pipe
# The controller's (and a detached instance's daemon's) one line on stdout for the
# process that started it.
CONTROLLER_READY = "surge-controller ready"
CONTROLLER_ERROR = "surge-controller error"


class Unix(msgspec.Struct, frozen=True, tag="unix"):
    """Listen on a Unix socket in `directory` (one host: cheaper than loopback TCP)."""

    directory: str


class Tcp(msgspec.Struct, frozen=True, tag="tcp"):
    """Listen on TCP at `host` (None: the node's IP) for routers on other nodes;
    with `also_unix`, also on a Unix socket for the routers on this node."""

    host: str | None = None
    also_unix: bool = False


class Lifetime(msgspec.Struct, frozen=True):
    """What the process's life is tied to.

    Supervised (local backend): it outlives a controller that crashes and leaves when
    the supervisor does. Unsupervised: it dies with `parent_pid`. Placed on a cluster
    (`orphan_timeout_s` set): it dies with its host actor, and leaves after that long
    without a controller.
    """

    supervisor_pid: int = 0
    parent_pid: int = 0
    orphan_timeout_s: float | None = None
    detached: bool = False  # the supervisor is a detached instance's daemon (api/daemon.py)

    @property
    def reconnects(self) -> bool:
        """Whether a lost controller is waited for (it will be restarted) or left."""
        return bool(self.supervisor_pid) or self.orphan_timeout_s is not None


class MemberSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What proxies and replicas share: where the controller is, and how to live."""

    controller: str
    process_id: str
    token: str | None = None  # the instance's control token
    node_id: str = LOCAL_NODE
    node_ip: str | None = None  # set on multi-node backends
    lifetime: Lifetime = Lifetime()
    logging: LoggingConfig = LoggingConfig()
    metrics: bool = True  # False: nobody reads metrics, record none


class NodeWeightStore(msgspec.Struct, frozen=True, tag="node_weight_store"):
    """The weight store of whichever node a process lands on (a cluster backend places
    it): a socket in the user's private directory there, per instance and node; the host
    that starts the first replica on a node starts the store with these options."""

    instance: str
    options: WeightStoreOptions = WeightStoreOptions()

    def socket_path(self, node_id: str) -> str:
        tag = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.instance)[-40:]
        return os.path.join(user_dir(), f"weights-{tag}-{node_id[:16]}.sock")


class ReplicaProcessSpec(MemberSpec, frozen=True, kw_only=True, tag="replica"):
    app: str
    deployment: str
    listen: Unix | Tcp
    # this node's weight store (surge.weights): its Unix socket, or (placed on a cluster)
    # the store of whichever node the replica lands on
    weight_store: str | NodeWeightStore | None = None
    # ray_actor_options num_cpus: its thread pools' size (replica/threads.py)
    num_cpus: float = 1.0
    # how much nicer than its starter it runs (policy/threads.replica_nice: the local
    # backend counts its node's replicas; a backend that cannot count leaves the default)
    nice: int = REPLICA_NICE


class WeightStoreProcessSpec(msgspec.Struct, frozen=True, kw_only=True, tag="weights"):
    """A node's weight store (surge.weights): where its entries live, its budget, and
    where it listens: on `listen_fd`, a socket its starter bound at `socket_path` and
    handed down (connections wait in its backlog until the store accepts), or, without
    one, on a socket it binds there itself."""

    options: WeightStoreOptions = WeightStoreOptions()
    socket_path: str
    listen_fd: int | None = None
    node_id: str = LOCAL_NODE
    lifetime: Lifetime = Lifetime()
    logging: LoggingConfig = LoggingConfig()


class ProxyProcessSpec(MemberSpec, frozen=True, kw_only=True, tag="proxy"):
    port: int | None = None  # its own port (nodes sharing an IP); None: http_options.port


class Membership(msgspec.Struct, frozen=True, kw_only=True):
    """What the controller tells every member of its instance alike; backends add the
    rest (who it is, where it listens, what its life is tied to)."""

    controller: str
    token: str | None = None
    supervisor_pid: int = 0
    logging: LoggingConfig = LoggingConfig()
    metrics: bool = True

    def replica(self, replica_id: str, app: str, deployment: str, listen: Unix | Tcp,
                lifetime: Lifetime, weight_store: str | NodeWeightStore | None = None,
                num_cpus: float = 1.0, nice: int = REPLICA_NICE) -> ReplicaProcessSpec:
        return ReplicaProcessSpec(controller=self.controller, process_id=replica_id,
                                  token=self.token, lifetime=lifetime, logging=self.logging,
                                  metrics=self.metrics, app=app, deployment=deployment,
                                  listen=listen, weight_store=weight_store,
                                  # JSON has no inf; both size the pools at 1 thread
                                  num_cpus=num_cpus if math.isfinite(num_cpus) else 0.0,
                                  nice=nice)

    def proxy(self, proxy_id: str, port: int | None, lifetime: Lifetime) -> ProxyProcessSpec:
        return ProxyProcessSpec(controller=self.controller, process_id=proxy_id,
                                token=self.token, lifetime=lifetime, logging=self.logging,
                                metrics=self.metrics, port=port)


class ControllerProcessSpec(msgspec.Struct, frozen=True, kw_only=True, tag="controller"):
    address: str  # the control address to bind
    http: HTTPOptions = HTTPOptions()
    grpc: gRPCOptions = gRPCOptions()
    backend: str = "local"
    ray_address: str | None = None
    token: str | None = None
    state_dir: str | None = None  # private to the instance: checkpoint, sockets
    recover: bool = False  # a restart: reload the checkpoint, re-attach to the members
    lifetime: Lifetime = Lifetime()
    logging: LoggingConfig = LoggingConfig()
    dashboard: DashboardOptions = DashboardOptions()
    weights: WeightStoreOptions = WeightStoreOptions()

    def membership(self, bound: str) -> Membership:
        """What this controller, listening at `bound`, tells its members."""
        return Membership(controller=bound, token=self.token,
                          supervisor_pid=self.lifetime.supervisor_pid, logging=self.logging,
                          metrics=self.dashboard.enabled)


class DaemonSpec(msgspec.Struct, frozen=True, kw_only=True, tag="daemon"):
    """A detached instance: what its supervising daemon starts (surge.api.daemon)."""

    address: str
    http: HTTPOptions = HTTPOptions()
    grpc: gRPCOptions = gRPCOptions()
    backend: str = "local"
    ray_address: str | None = None
    logging: LoggingConfig = LoggingConfig()
    dashboard: DashboardOptions = DashboardOptions()
    weights: WeightStoreOptions = WeightStoreOptions()
    sys_path: tuple[str, ...] = ()  # where the user's modules are


class ApplySpec(msgspec.Struct, frozen=True, kw_only=True, tag="apply"):
    """A config to build and deploy (Ray's REST API, PUT /api/serve/applications/)."""

    controller: str
    token: str | None = None
    config: str  # the ServeDeploySchema, as JSON


Spec = TypeVar("Spec", ControllerProcessSpec, ProxyProcessSpec, ReplicaProcessSpec, ApplySpec,
               DaemonSpec, WeightStoreProcessSpec)
AnySpec = (ControllerProcessSpec | ProxyProcessSpec | ReplicaProcessSpec | ApplySpec | DaemonSpec
           | WeightStoreProcessSpec)


def encode(spec: AnySpec) -> bytes:
    """The spec as the one line its process reads."""
    return msgspec.json.encode(spec) + b"\n"


def decode(kind: type[Spec], data: bytes) -> Spec:
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"this surge process was started with an unreadable "
                          f"{kind.__name__}: {exc}") from None


def read_spec(kind: type[Spec], stream: BinaryIO | None = None) -> Spec:
    """Read this process's spec from its standard input (one line)."""
    source = stream if stream is not None else sys.stdin.buffer
    line = source.readline(MAX_SPEC_BYTES)
    if not line.strip():
        raise ConfigError(f"this surge process reads its {kind.__name__} on standard input "
                          "and got none; it is started by surge, not by hand")
    return decode(kind, line)


def start_process(argv: Sequence[str], spec: bytes, env: Mapping[str, str],
                  **options: Any) -> subprocess.Popen[bytes]:
    """Start a surge process and hand it its spec: one line on its stdin, then EOF.

    A process that dies before reading it is not an error here: its exit is seen like
    any other (the pipe is unbuffered, so a closed one fails the write, not the close).
    """
    process = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.PIPE, bufsize=0,
                               close_fds=True, **options)
    hand_spec(process, spec)
    return process


def hand_spec(process: subprocess.Popen[bytes], spec: bytes) -> None:
    """Write a started process's spec on its (unbuffered) stdin and close it."""
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError), process.stdin:
        process.stdin.write(spec)  # a few hundred bytes, below any pipe's buffer


def await_ready(process: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The ready line's details from a just-started controller (or daemon) on its stdout
    pipe, which is closed after; a process that says it failed, says nothing in time or
    exits is killed and raises `RayServeException` with its reason."""
    assert process.stdout is not None
    line = _read_line(process, timeout)
    process.stdout.close()
    if line.startswith(f"{CONTROLLER_READY} "):
        ready: dict[str, Any] = json.loads(line[len(CONTROLLER_READY) + 1:])
        return ready
    process.kill()
    process.wait()
    reason = line[len(CONTROLLER_ERROR) + 1:] if line.startswith(f"{CONTROLLER_ERROR} ") else (
        line or "the controller exited without saying why (see its log)")
    raise RayServeException(f"could not start surge: {reason}")


def _read_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = SYSTEM.monotonic() + timeout
    data = b""
    while b"\n" not in data and SYSTEM.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
        elif process.poll() is not None:
            break
    return data.decode(errors="replace").split("\n", 1)[0].strip()
