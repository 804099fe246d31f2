"""A small multi-node Ray cluster on this machine, and a surge instance on it.

Three Ray nodes (ray.cluster_utils.Cluster: separate raylets, one machine): the head
with 1 CPU and no GPU, a "gpu" node with 2 CPUs and 2 logical GPUs, a "cpu" node with
2 CPUs. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray use 127.0.0.1 for every node, so
all traffic stays on loopback; nodes sharing that IP get distinct proxy ports
(policy.placement.proxy_port). Fast GCS health checks make a removed node count as
dead within ~2 s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from surge import serve
from tests.e2e.conftest import Running
from tests.ports import free_port, free_port_run

# Loopback for every node; a slow start (a busy 2-core machine) is not a failure.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_raylet_start_wait_time_s": "120"}
SYSTEM_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                 "health_check_initial_delay_ms": 0}


@dataclass
class RayCluster:
    cluster: Any
    head: Any
    gpu_node: Any
    cpu_node: Any

    @property
    def address(self) -> str:
        return str(self.cluster.address)


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """`values` in the environment while the block runs, the previous ones after."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in values.items():
            patch.setenv(key, value)
        yield


@contextlib.contextmanager
def ray_cluster() -> Iterator[RayCluster]:
    with environ(LOOPBACK_ENV):  # read when Ray is imported
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "num_gpus": 0, "include_dashboard": False,
            # A free port: other Ray clusters on this machine may hold 8265.
            "dashboard_port": free_port(), "_system_config": SYSTEM_CONFIG})
        try:
            gpu = cluster.add_node(num_cpus=2, num_gpus=2, resources={"gpu_node": 1})
            cpu = cluster.add_node(num_cpus=2, resources={"cpu_node": 1})
            cluster.wait_for_nodes()
            yield RayCluster(cluster, cluster.head_node, gpu, cpu)
        finally:
            cluster.shutdown()


@contextlib.contextmanager
def surge_on(cluster: RayCluster, **options: Any) -> Iterator[Running]:
    control = f"127.0.0.1:{free_port()}"
    http_port = free_port_run(4)
    with environ({**LOOPBACK_ENV, "SURGE_ADDRESS": control,
                  "SURGE_DASHBOARD": f"127.0.0.1:{free_port()}"}):
        serve.start(http_options={"host": "127.0.0.1", "port": http_port}, backend="ray",
                    ray_address=cluster.address, **options)
        try:
            yield Running(http_port, control)
        finally:
            serve.shutdown()
