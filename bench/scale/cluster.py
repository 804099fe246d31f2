"""One configuration's processes for bench/control_scale.py: replica hosts, the controller
(as surge starts it: its spec on stdin, its ready line on stdout), router hosts, and the
driver's own control connection to it."""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import cloudpickle

from bench.common import free_port
from bench.scale.procs import BenchProcess
from surge.config import (
    AppSpec,
    AutoscalingConfig,
    DeploymentConfig,
    DeploymentSpec,
    HTTPOptions,
)
from surge.launch import (
    ControllerProcessSpec,
    Lifetime,
    await_ready,
    encode,
    start_process,
)
from surge.model import DeploymentId
from surge.observability.config import DashboardOptions, LoggingConfig
from surge.transport.rpc import RpcPeer, connect_rpc

__all__ = ["DID", "STEADY_LOAD", "STEP_LOAD", "TARGET_ONGOING", "Cluster", "app_spec"]

HERE = Path(__file__).resolve().parent
REPLICAS_PER_HOST = 2500
ROUTERS_PER_HOST = 250
TARGET_ONGOING = 2.0
SERVICE_S = 0.01  # what the reported rates imply: in flight / rate
STEADY_LOAD = 0.6  # of the replicas' target load, reached in a slow ramp: no scaling
STEP_LOAD = 1.75  # a surge: proactive scales up at once (to max_replicas)
DID = DeploymentId("scale", "Model")


class Fake:
    """Any class: the controller never unpickles a replica's code; fake replicas
    never build it."""


def app_spec(replicas: int) -> AppSpec:
    scaling = AutoscalingConfig(min_replicas=replicas, max_replicas=replicas + replicas // 8,
                                target_ongoing_requests=TARGET_ONGOING, upscale_delay_s=0.0)
    config = DeploymentConfig(name=DID.name, max_ongoing_requests=8,
                              autoscaling_config=scaling)
    spec = DeploymentSpec(config=config, target_blob=cloudpickle.dumps(Fake),
                          init_blob=cloudpickle.dumps(((), {})))
    return AppSpec(name=DID.app, route_prefix="/", ingress=DID.name, deployments=(spec,))


class Cluster:
    """One configuration's processes, and the driver's control connection."""

    def __init__(self, replicas: int, routers: int, startup_s: float, deltas: bool) -> None:
        self.replicas, self.routers, self.startup_s = replicas, routers, startup_s
        self.deltas = deltas
        self.directory = tempfile.mkdtemp(prefix="surge-scale-")
        self.token = secrets.token_hex(16)
        self.address = f"127.0.0.1:{free_port()}"
        self.hosts: list[BenchProcess] = []
        self.router_hosts: list[BenchProcess] = []
        self.controller: subprocess.Popen[bytes] | None = None
        self.driver: RpcPeer | None = None

    async def start(self) -> None:
        python = sys.executable
        for i in range(max(2, math.ceil(self.replicas / REPLICAS_PER_HOST))):
            host = await BenchProcess.start([python, str(HERE / "replica_host.py")], {
                "controller": self.address, "token": self.token, "startup_s": self.startup_s,
                "socket": os.path.join(self.directory, f"host-{i}.sock")})
            await host.expect("listening", 60)
            self.hosts.append(host)
        state = os.path.join(self.directory, "state")
        os.makedirs(state, mode=0o700)
        spec = ControllerProcessSpec(
            address=self.address, http=HTTPOptions(location="NoServer"), token=self.token,
            state_dir=state, lifetime=Lifetime(parent_pid=os.getpid()),
            logging=LoggingConfig(log_level="WARNING"),
            dashboard=DashboardOptions(host="127.0.0.1", port=0))
        argv = [python, str(HERE / "controller_main.py"),
                *[os.path.join(self.directory, f"host-{i}.sock") for i in range(len(self.hosts))]]
        with open(os.path.join(self.directory, "controller.log"), "wb") as log:
            self.controller = start_process(argv, encode(spec), dict(os.environ),
                                            stdout=subprocess.PIPE, stderr=log,
                                            start_new_session=True)
        await asyncio.to_thread(await_ready, self.controller, 60.0)
        self.driver = await connect_rpc(self.address, None, token=self.token)
        for _ in range(max(1, math.ceil(self.routers / ROUTERS_PER_HOST))):
            share = math.ceil(self.routers / max(1, math.ceil(self.routers / ROUTERS_PER_HOST)))
            count = min(share, self.routers - ROUTERS_PER_HOST * len(self.router_hosts))
            host = await BenchProcess.start([python, str(HERE / "router_host.py")], {
                "controller": self.address, "token": self.token, "routers": count,
                "deltas": self.deltas})
            await host.expect("started", 60)
            self.router_hosts.append(host)

    @property
    def pid(self) -> int:
        assert self.controller is not None
        return self.controller.pid

    async def call(self, method: str, **kwargs: Any) -> Any:
        assert self.driver is not None
        return await self.driver.call(method, timeout=120.0, **kwargs)

    async def routers_ask(self, command: dict[str, Any], event: str) -> list[dict[str, Any]]:
        for host in self.router_hosts:
            host.send(command)
        return [await host.expect(event, 120) for host in self.router_hosts]

    async def router_status(self) -> tuple[int, int, int]:
        """(routers connected, the smallest set a router holds, routers holding one)."""
        answers = await self.routers_ask({"cmd": "status"}, "status")
        return (sum(a["connected"] for a in answers),
                min((a["smallest"] for a in answers if a["with_set"]), default=0),
                sum(a["with_set"] for a in answers))

    async def seen(self, ids: list[str], kind: str = "seen") -> dict[str, tuple[int, float]]:
        """Per id: how many routers saw it (or saw it leave), and the latest time."""
        total: dict[str, list[float]] = {i: [0, 0.0] for i in ids}
        for answer in await self.routers_ask({"cmd": kind, "ids": ids}, kind):
            for replica_id, (count, latest) in answer["result"].items():
                total[replica_id][0] += count
                total[replica_id][1] = max(total[replica_id][1], latest)
        return {i: (int(c), t) for i, (c, t) in total.items()}

    async def dropped(self, replica_id: str) -> bool:
        count, _ = (await self.seen([replica_id], "gone"))[replica_id]
        return count >= self.routers

    async def set_load(self, fraction: float, queued: int) -> float:
        """The routers report this fraction of the replicas' target load in all (each
        host spreads it over its routers in whole requests); when the first router host
        applied it."""
        in_flight = fraction * self.replicas * TARGET_ONGOING / self.routers  # a mean
        answers = await self.routers_ask({"cmd": "load", "in_flight": in_flight,
                                          "service_s": SERVICE_S, "queued": queued},
                                         "applied")
        return min(a["t"] for a in answers)

    async def stop(self) -> None:
        if self.driver is not None:
            self.driver.close()
        if self.controller is not None and self.controller.poll() is None:
            os.killpg(self.controller.pid, signal.SIGKILL)
            self.controller.wait()
        for host in self.router_hosts + self.hosts:
            await host.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
