"""The local backend's count of its node's cores: read from the affinity and a cgroup CPU
quota, taken by each replica it starts or adopts, given back at each exit, and the
replicas that started below the nice reniced once the count reaches the cores."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from surge.backends.base import ReplicaLaunch
from surge.backends.local import LocalBackend
from surge.backends.node_cores import NodeCores, node_cores, raise_nice
from surge.config import ReplicaResources
from surge.config.defaults import REPLICA_NICE
from surge.config.weights import WeightStoreOptions
from surge.launch import Membership
from surge.model import DeploymentId
from surge.policy.threads import POOLS
from tests.eventually import eventually

AFFINITY = len(os.sched_getaffinity(0))
DEPLOYMENT = DeploymentId("app", "d")


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(("own", "files", "cores"), [
    ("0::/\n", {}, AFFINITY),  # no cgroup files: the affinity
    ("0::/\n", {"cpu.max": "max 100000\n"}, AFFINITY),
    ("0::/\n", {"cpu.max": "100000 100000\n"}, 1),  # docker --cpus=1 (a namespace's root)
    # a group's limit, or one above it (a systemd slice's CPUQuota), the tightest
    ("0::/a/b\n", {"a/b/cpu.max": "max 100000\n", "a/cpu.max": "50000 100000\n"}, 1),
    ("0::/docker/x\n", {"cpu.max": "100000 100000\n"}, 1),  # its path not under the mount
    # cgroup v1: the cpu controller's group
    ("3:cpu,cpuacct:/k\n0::/\n", {"cpu/k/cpu.cfs_quota_us": "100000\n",
                                  "cpu/k/cpu.cfs_period_us": "100000\n"}, 1),
    ("3:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
     AFFINITY),
])
def test_the_node_has_its_affinitys_cores_less_a_cgroup_quota(
        tmp_path: Path, own: str, files: dict[str, str], cores: int) -> None:
    root = _cgroup(tmp_path / "cgroup", files)
    (tmp_path / "own").write_text(own)
    assert node_cores(str(root), str(tmp_path / "own")) == min(cores, AFFINITY)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalBackend]:
    for variables in POOLS.values():  # the pools' widths are the test's, not the runner's
        for variable in variables:
            monkeypatch.delenv(variable, raising=False)
    local = LocalBackend(Membership(controller="127.0.0.1:1"), gpus=[], use_forkserver=False,
                         weights=WeightStoreOptions(enabled=False))
    local.cores = NodeCores(4)
    yield local
    local.close()


def _launch(replica_id: str, num_cpus: float = 1.0, **env: str) -> ReplicaLaunch:
    return ReplicaLaunch(replica_id, DEPLOYMENT, ReplicaResources(num_cpus=num_cpus,
                                                                  env_vars=env))


def _exits(backend: LocalBackend, count: int) -> list[str]:
    seen: list[str] = []

    def exited() -> bool:
        seen.extend(e.process_id for e in backend.poll_exits())
        return len(seen) >= count

    eventually(exited, 60, what=f"{count} exits")
    return seen


@pytest.mark.e2e
def test_a_replica_counts_the_threads_its_env_vars_ask_and_gives_them_back(
        backend: LocalBackend) -> None:
    # (no controller answers: each replica exits at once, a normal exit)
    backend.start_replica(_launch("r1", 1.0, OMP_NUM_THREADS="3"))  # 3 of 4
    assert repr(backend.cores) == "<NodeCores 3 of 4 held by 1, 0 nicer>"
    backend.start_replica(_launch("r2", 1.0))  # 4 of 4: nicer, and r1 with it
    assert backend.cores.nices == {"r1": REPLICA_NICE, "r2": REPLICA_NICE}
    assert sorted(_exits(backend, 2)) == ["r1", "r2"]
    assert repr(backend.cores) == "<NodeCores 0 of 4 held by 0, 0 nicer>"


@pytest.mark.e2e
def test_a_fork_servers_replica_is_reniced_once_forked_and_gives_its_cores_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    local = LocalBackend(Membership(controller="127.0.0.1:1"), gpus=[],
                         weights=WeightStoreOptions(enabled=False))
    try:
        local.cores = NodeCores(2)
        local.start_replica(_launch("r1"))
        local.start_replica(_launch("r2"))  # 2 of 2: r1, not forked yet, reniced once it is
        assert "r1" in local.pending and local.renice_when_forked == {"r1"}
        assert sorted(_exits(local, 2)) == ["r1", "r2"]
        assert local.renice_when_forked == set()
        assert repr(local.cores) == "<NodeCores 0 of 2 held by 0, 0 nicer>"
    finally:
        local.close()


THREADS = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); " \
          "print('up', flush=True); time.sleep(60)"


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[str]]]:
    started = [subprocess.Popen([sys.executable, "-c", THREADS], stdout=subprocess.PIPE,
                                text=True) for _ in range(2)]
    for process in started:
        assert process.stdout is not None and process.stdout.readline() == "up\n"
    yield started
    for process in started:
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


def _nices(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.e2e
def test_adopted_replicas_are_reniced_every_thread_and_give_their_cores_back(
        backend: LocalBackend, sleepers: list[subprocess.Popen[str]]) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    nicer = min(19, own + REPLICA_NICE)
    first, second = sleepers
    backend.adopt("r1", first.pid, resources=ReplicaResources(num_cpus=2.0))
    backend.adopt("proxy", os.getpid())  # not a replica (no resources): not counted
    assert repr(backend.cores) == "<NodeCores 2 of 4 held by 1, 0 nicer>"
    assert _nices(first.pid) == {own}
    backend.adopt("r2", second.pid, resources=ReplicaResources(
        num_cpus=1.0, env_vars={"OPENBLAS_NUM_THREADS": "2"}))  # 4 of 4
    assert _nices(first.pid) == {nicer} and _nices(second.pid) == {nicer}
    assert len(os.listdir(f"/proc/{first.pid}/task")) >= 2  # each of its threads
    raise_nice(first.pid, 1)  # never lowered
    assert _nices(first.pid) == {nicer}
    first.kill()
    first.wait()
    assert _exits(backend, 1) == ["r1"]
    assert repr(backend.cores) == "<NodeCores 2 of 4 held by 1, 1 nicer>"
