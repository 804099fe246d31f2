"""The ray backend on a 3-node Ray cluster: placement, a proxy per node, HTTP, titles."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from surge import serve
from surge.api.instance import current
from surge.config.defaults import REPLICA_NICE
from tests.eventually import eventually
from tests.ray.apps import OnGpu, Where
from tests.ray.cluster import RayCluster, Running, surge_on

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def surge(cluster: RayCluster) -> Iterator[Running]:
    with surge_on(cluster) as running:
        serve.run(Where.bind(), name="where", route_prefix="/where")
        serve.run(OnGpu.bind(), name="gpu", route_prefix="/gpu")
        yield running


def replicas() -> list[dict[str, object]]:
    instance = current()
    assert instance is not None
    result: list[dict[str, object]] = instance.call("replicas", timeout=10)
    return result


def answers(url: str, count: int = 20) -> list[dict[str, object]]:
    with httpx.Client(timeout=30) as client:
        out = []
        for _ in range(count):
            response = client.get(url)
            assert response.status_code == 200, response.text
            out.append(response.json())
        return out


def test_gpu_deployment_lands_on_the_gpu_node_with_its_own_gpu(cluster: RayCluster,
                                                               surge: Running) -> None:
    seen = {}
    for _ in range(10):  # every proxy, so both replicas answer
        for address in serve.status().proxy_addresses.values():
            for answer in answers(f"http://{address}/gpu", 5):
                seen[answer["pid"]] = answer
    assert len(seen) == 2
    assert {a["node"] for a in seen.values()} == {cluster.gpu_node.node_id}
    assert sorted(str(a["cuda"]) for a in seen.values()) == ["0", "1"]  # one GPU each


def test_cpu_replicas_see_no_gpu(surge: Running) -> None:
    assert all(a["cuda"] in (None, "") for a in answers(f"{surge.url}/where", 10))


def test_replicas_on_ray_size_their_pools_to_num_cpus_and_yield_the_cpu(surge: Running) -> None:
    answer = serve.get_app_handle("where").pools.remote().result(timeout_s=60)
    # num_cpus 0.25: one thread, whatever the node's cores (Ray's OMP_NUM_THREADS agrees)
    assert (answer["blas"], answer["omp"]) == ([1], "1"), answer
    assert answer["nice"] >= REPLICA_NICE


def test_every_node_with_replicas_has_a_proxy_and_each_serves(cluster: RayCluster,
                                                              surge: Running) -> None:
    status = serve.status()
    head = cluster.head.node_id
    nodes = {str(a["node"]) for a in answers(f"{surge.url}/where", 30)} | {
        cluster.gpu_node.node_id}

    def proxies() -> dict[str, str]:
        return dict(serve.status().proxy_addresses)

    wanted = {n for n in nodes if n != head}
    eventually(lambda: {p.removeprefix("proxy-node-") for p in proxies()} >= wanted, 30,
               interval_s=0.1, what=f"a proxy on each of {wanted}")
    addresses = proxies()
    assert status.http_address == addresses["proxy-0"]  # the head's
    assert len(set(addresses.values())) == len(addresses)  # one IP: distinct ports
    ports = sorted(int(a.rpartition(":")[2]) for a in addresses.values())
    assert ports[0] == surge.http_port
    assert ports == list(range(surge.http_port, surge.http_port + len(ports)))
    for address in addresses.values():
        assert answers(f"http://{address}/where", 3)
        assert answers(f"http://{address}/gpu", 3)


def test_a_node_proxy_prefers_replicas_on_its_own_node(cluster: RayCluster,
                                                       surge: Running) -> None:
    gpu_proxy = f"proxy-node-{cluster.gpu_node.node_id}"
    address = eventually(lambda: serve.status().proxy_addresses.get(gpu_proxy), 30,
                         interval_s=0.1, what="the gpu node's proxy")
    # Both OnGpu replicas are on the gpu node, so any answer is local there; Where has
    # replicas elsewhere too, yet the gpu node's proxy is answered by its own only if
    # one is there, else by any: check the rule on the node that has a Where replica.
    where_nodes = {str(a["node"]) for a in answers(f"{surge.url}/where", 30)}
    for node in where_nodes - {cluster.head.node_id}:
        proxy = serve.status().proxy_addresses[f"proxy-node-{node}"]
        assert {a["node"] for a in answers(f"http://{proxy}/where", 20)} == {node}
    assert {a["node"] for a in answers(f"http://{address}/gpu", 10)} == {
        cluster.gpu_node.node_id}


def title(pid: int | str) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        return file.read().split(b"\0")[0].decode(errors="replace").strip()


def parent(pid: int | str) -> int:
    with open(f"/proc/{pid}/stat") as file:
        return int(file.read().rpartition(")")[2].split()[1])


def test_process_titles_match_the_local_backend(surge: Running) -> None:
    titles = {title(r["pid"]) for r in replicas()}  # type: ignore[arg-type]
    assert titles == {"surge:replica:gpu:OnGpu", "surge:replica:where:Where"}
    for replica in replicas():  # each is the child of its Ray actor
        assert title(parent(replica["pid"])).startswith("ray::ProcessHost")  # type: ignore[arg-type]
    hosted_proxies = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if title(entry) == "surge:proxy" and \
                        title(parent(entry)).startswith("ray::ProcessHost"):
                    hosted_proxies.append(entry)
            except OSError:
                continue
    assert len(hosted_proxies) >= len(serve.status().proxy_addresses)


def unix_connections(path: str) -> int:
    """Accepted connections on the Unix socket at `path` (server-side entries carry it)."""
    with open("/proc/net/unix") as table:
        rows = [line.split() for line in table.read().splitlines()[1:]]
    return sum(1 for row in rows if len(row) >= 8 and row[7] == path and row[5] == "03")


def test_a_proxy_reaches_replicas_on_its_node_by_unix_socket(cluster: RayCluster,
                                                             surge: Running) -> None:
    from surge.control_auth import user_dir

    gpu_proxy = f"proxy-node-{cluster.gpu_node.node_id}"
    address = eventually(lambda: serve.status().proxy_addresses.get(gpu_proxy), 30,
                         interval_s=0.1, what="the gpu node's proxy")
    answers(f"http://{address}/gpu", 10)
    sockets = os.path.join(user_dir(), "sockets")
    gpu_replicas = [r for r in replicas() if r["app"] == "gpu"]
    assert gpu_replicas
    connected = [r for r in gpu_replicas
                 if unix_connections(os.path.join(sockets, f"{r['replica_id']}.sock"))]
    assert connected, "the node's proxy should use the replicas' Unix sockets"
