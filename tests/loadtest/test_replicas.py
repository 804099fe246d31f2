"""Which replicas a pulse reports: the application behind the target path."""

from __future__ import annotations

import asyncio

import pytest

from surge.loadtest.replicas import (
    ReplicaSampler,
    count_replicas,
    default_address,
    node_cpu,
    same_endpoint,
)
from surge.model import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentStatus,
    DeploymentStatusOverview,
    ServeStatus,
)
from tests.ports import free_port


def app(prefix: str | None, **deployments: tuple[int, int]) -> ApplicationStatusOverview:
    return ApplicationStatusOverview(
        ApplicationStatus.RUNNING, "", prefix,
        {name: DeploymentStatusOverview(DeploymentStatus.HEALTHY,
                                        {"RUNNING": running, "STARTING": 1}, "", target)
         for name, (running, target) in deployments.items()})


STATUS = ServeStatus(applications={
    "mlp": app("/mlp", Ingress=(2, 3), Model=(4, 8)),
    "echo": app("/", Echo=(1, 1)),
    "internal": app(None, Worker=(5, 5)),
}, http_address="127.0.0.1:8000")


@pytest.mark.parametrize("path, counts", [
    ("/mlp", (6, 11)), ("/mlp/predict?x=1", (6, 11)), ("/other", (1, 1)), ("/", (1, 1)),
    ("/mlpx", (1, 1))])
def test_count_replicas_of_the_matching_application(path: str,
                                                    counts: tuple[int, int]) -> None:
    assert count_replicas(STATUS, path) == counts


def test_count_replicas_of_everything_without_a_route() -> None:
    status = ServeStatus(applications={"a": app(None, A=(1, 2)), "b": app(None, B=(3, 3))})
    assert count_replicas(status, "/x") == (4, 5)
    assert count_replicas(ServeStatus(), "/") == (0, 0)


def test_node_cpu_is_the_busiest_node_behind_the_path_if_the_controller_read_one() -> None:
    def cpu(share: float | None) -> ApplicationStatusOverview:
        overview = app("/a", A=(1, 1), B=(1, 1))
        if share is not None:
            overview.deployments["A"].rates["node_cpu"] = share
            overview.deployments["B"].rates["node_cpu"] = share / 2
        return overview

    status = ServeStatus(applications={"a": cpu(0.9), "b": app("/", C=(1, 1))})
    assert node_cpu(status, "/a/x") == 0.9
    assert node_cpu(status, "/b") is None  # app b's deployments: no reading
    assert node_cpu(ServeStatus(applications={"a": cpu(None)}), "/a") is None


@pytest.mark.parametrize("http, host, port, same", [
    ("127.0.0.1:8000", "127.0.0.1", 8000, True),
    ("0.0.0.0:8000", "localhost", 8000, True),
    ("127.0.0.1:8000", "127.0.0.1", 8001, False),
    ("10.1.2.3:8000", "127.0.0.1", 8000, False),
    ("", "127.0.0.1", 8000, False)])
def test_same_endpoint(http: str, host: str, port: int, same: bool) -> None:
    assert same_endpoint(http, host, port) is same


def test_default_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SURGE_ADDRESS", raising=False)
    assert default_address("10.0.0.1:1") == ("10.0.0.1:1", "flag")
    assert default_address(None) == ("127.0.0.1:52800", "default")
    monkeypatch.setenv("SURGE_ADDRESS", "127.0.0.1:7")
    assert default_address(None) == ("127.0.0.1:7", "env")


def test_no_instance_means_no_sampler_and_a_notice_only_when_asked() -> None:
    notices: list[str] = []
    address = f"127.0.0.1:{free_port()}"

    async def connect(source: str) -> ReplicaSampler | None:
        return await ReplicaSampler.connect(address, source, "127.0.0.1", 1, "/",
                                            notices.append)

    assert asyncio.run(connect("default")) is None and notices == []
    assert asyncio.run(connect("flag")) is None
    assert len(notices) == 1 and "replica counts will be null" in notices[0]
