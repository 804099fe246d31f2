"""Replica counts of the surge instance behind the target, sampled every 100 ms.

The sampler speaks surge's control protocol (`hello`, then `status` calls) to the
instance at `--surge-address` (else SURGE_ADDRESS, else the default control port). An
address not given with the flag is used only if that instance's HTTP address is the
target's, so pulsing nginx next to an unrelated surge never reports its replicas (the
flag forces it, e.g. behind a load balancer). No instance reachable means no replica
counts (null in the report), never an error.

`count_replicas` is the pure part: RUNNING and target replicas of the application whose
route prefix matches the target path (longest prefix), else of every application;
`node_cpu` the busiest node CPU of those deployments' (the controller reads its node's
/proc/stat and tells it for the deployments whose replicas all run there).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from surge.clock import Clock, SystemClock
from surge.config import DEFAULT_CONTROL_PORT
from surge.loadtest.stats import ReplicaSample
from surge.model import ApplicationStatusOverview, RouteTable, RouteTarget, ServeStatus
from surge.transport.rpc import RpcPeer, connect_rpc, split_address

__all__ = ["ReplicaSampler", "count_replicas", "default_address", "node_cpu", "same_endpoint"]

SAMPLE_INTERVAL_S = 0.1
# A status call slower than this is skipped (the sampler never holds up the run).
STATUS_TIMEOUT_S = 1.0
CONNECT_TIMEOUT_S = 1.0


def default_address(flag: str | None) -> tuple[str, str]:
    """(address, where it came from): "flag", "env" (SURGE_ADDRESS) or "default"."""
    if flag:
        return flag, "flag"
    env = os.environ.get("SURGE_ADDRESS")
    if env:
        return env, "env"
    return f"127.0.0.1:{DEFAULT_CONTROL_PORT}", "default"


def same_endpoint(http_address: str, host: str, port: int) -> bool:
    """Whether surge's HTTP address (host:port) is the target host:port."""
    if not http_address:
        return False
    their_host, their_port = split_address(http_address)
    if their_port != port:
        return False
    loopback = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"}
    return their_host == host or (their_host in loopback and host in loopback)


def _apps(status: ServeStatus, path: str) -> list[ApplicationStatusOverview]:
    """The application serving `path`, else all of them."""
    targets = tuple(RouteTarget(name, "", app.route_prefix)
                    for name, app in status.applications.items() if app.route_prefix)
    match = RouteTable(targets).match(path.split("?", 1)[0])
    return [status.applications[match.app]] if match is not None \
        else list(status.applications.values())


def node_cpu(status: ServeStatus, path: str) -> float | None:
    """The busy share of the busiest node CPU behind `path` (None: not known)."""
    shares = [d.rates["node_cpu"] for a in _apps(status, path) for d in a.deployments.values()
              if "node_cpu" in d.rates]
    return max(shares, default=None)


def count_replicas(status: ServeStatus, path: str) -> tuple[int, int]:
    """(RUNNING, target) replicas of the application serving `path`, else of all."""
    apps = _apps(status, path)
    running = sum(d.replica_states.get("RUNNING", 0) for a in apps for d in a.deployments.values())
    target = sum(d.target_replicas for a in apps for d in a.deployments.values())
    return running, target


class ReplicaSampler:
    """Collects `ReplicaSample`s (time from t0, running, target) until stopped."""

    def __init__(self, peer: RpcPeer, address: str, path: str,
                 clock: Clock | None = None) -> None:
        self.peer = peer
        self.address = address
        self.path = path
        self.samples: list[ReplicaSample] = []
        self._now = (clock or SystemClock()).monotonic

    def __repr__(self) -> str:
        return f"<ReplicaSampler {self.address} samples={len(self.samples)}>"

    @classmethod
    async def connect(cls, address: str, source: str, host: str, port: int, path: str,
                      notice: Callable[[str], None]) -> ReplicaSampler | None:
        """A sampler for the instance at `address` if it is the target's, else None."""
        try:
            peer = await connect_rpc(address, None, timeout=CONNECT_TIMEOUT_S)
            await peer.call("hello", timeout=STATUS_TIMEOUT_S, role="pulse", pid=os.getpid())
            status = await peer.call("status", timeout=STATUS_TIMEOUT_S)
        except Exception as exc:  # any failure means: no replica counts
            if source != "default":
                notice(f"no surge instance answers at {address} ({type(exc).__name__}); "
                       "replica counts will be null")
            return None
        if not isinstance(status, ServeStatus):
            peer.close()
            return None
        if source != "flag" and not same_endpoint(status.http_address, host, port):
            if source == "env":
                notice(f"the surge instance at SURGE_ADDRESS={address} serves "
                       f"{status.http_address or 'no HTTP'}, not {host}:{port}: replica "
                       "counts will be null (--surge-address forces it)")
            peer.close()
            return None
        return cls(peer, address, path)

    async def run(self, t0: float, stop: asyncio.Event) -> list[ReplicaSample]:
        """Sample every 100 ms (on a fixed grid from t0) until `stop` is set."""
        tick = 0
        while not stop.is_set():
            at = self._now() - t0
            try:
                status = await self.peer.call("status", timeout=STATUS_TIMEOUT_S)
            except Exception:
                if self.peer.is_closed:
                    return self.samples
                status = None
            if isinstance(status, ServeStatus):
                running, target = count_replicas(status, self.path)
                self.samples.append(ReplicaSample(round(at, 4), running, target,
                                                  node_cpu(status, self.path)))
            tick = max(tick + 1, int((self._now() - t0) / SAMPLE_INTERVAL_S) + 1)
            delay = t0 + tick * SAMPLE_INTERVAL_S - self._now()
            try:
                await asyncio.wait_for(stop.wait(), max(delay, 0.0))
            except TimeoutError:
                pass
        return self.samples

    def close(self) -> None:
        self.peer.close()
