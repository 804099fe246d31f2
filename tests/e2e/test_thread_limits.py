"""A replica's thread pools follow its num_cpus, checked with threadpoolctl from inside
a real forked replica whose numpy (and OpenBLAS pool, one thread per core) it inherited
from the fork server's template: 1 thread by default, 2 for num_cpus=2, 1 for 0.5, and
the user's value when runtime_env.env_vars sets one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from surge import serve
from surge.backends.node_cores import node_cores
from surge.config.defaults import REPLICA_NICE
from surge.policy.threads import replica_cores, replica_nice
from tests.e2e.conftest import Running, running_instance
from tests.e2e.procs import surge_processes
from tests.e2e.thread_app import BlasThreads, OwnsItsPools
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                    "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                    "NUMEXPR_NUM_THREADS")


def _template_has_blas() -> bool:
    """The fork server has imported numpy (its OpenBLAS is mapped)."""
    templates = [pid for pid, title in surge_processes(os.getpid()).items()
                 if title.startswith("surge:forkserver")]
    return any("openblas" in Path(f"/proc/{pid}/maps").read_text() for pid in templates)


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    """An instance started without any thread variable in its environment, whose fork
    server has numpy loaded before the first replica is forked."""
    saved = {name: os.environ.pop(name) for name in THREAD_VARIABLES if name in os.environ}
    try:
        with running_instance() as running:
            eventually(_template_has_blas, 30, what="numpy loaded in the fork server")
            yield running
    finally:
        os.environ.update(saved)


def _ask(app: Any, name: str) -> dict[str, Any]:
    handle = serve.run(app, name=name, route_prefix=f"/{name}")
    try:
        answer: dict[str, Any] = handle.remote().result(timeout_s=30)
    finally:
        serve.delete(name)
    assert answer["numpy_inherited"], "the replica did not inherit an initialised pool"
    return answer


@pytest.mark.parametrize(("options", "threads", "omp"), [
    ({}, 1, "1"),  # Ray's default num_cpus=1; the template's pool had one per core
    ({"num_cpus": 2}, 2, "2"),
    ({"num_cpus": 0.5}, 1, "1"),  # fractions: floor, at least 1
    ({"num_cpus": 0}, 1, "1"),
    ({"runtime_env": {"env_vars": {"OPENBLAS_NUM_THREADS": "3"}}}, 3, "1"),  # theirs wins
    ({"num_cpus": 2, "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "3"}}}, 3, "3"),
], ids=["default", "num_cpus=2", "num_cpus=0.5", "num_cpus=0", "user OPENBLAS",
        "user OMP"])
def test_a_forked_replicas_blas_pool_follows_num_cpus(instance: Running,
                                                      options: dict[str, Any], threads: int,
                                                      omp: str) -> None:
    answer = _ask(BlasThreads.options(ray_actor_options=options).bind(), "blas")
    assert answer["blas"] == [threads]
    assert answer["env"]["OMP_NUM_THREADS"] == omp
    # ... and the replica yields the CPU to the proxy (this process started the instance)
    # where the node's replicas (it alone: the test's earlier ones were deleted) can keep
    # all its cores busy: on 2 cores, the num_cpus=2 one and the ones whose user's
    # variable asks for 3 threads
    env_vars = options.get("runtime_env", {}).get("env_vars", {})
    nicer = replica_nice(replica_cores(options.get("num_cpus", 1.0), env_vars), node_cores())
    assert answer["nice"] == min(19, os.nice(0) + nicer)


def test_the_first_replica_is_reniced_once_the_replicas_can_take_every_core(
        instance: Running) -> None:
    # Two replicas of half the node's cores each: the first starts at the proxy's
    # priority, the second reaches the node's cores, and the first is made as nice.
    half = max(node_cores(), 2) / 2
    handle = serve.run(BlasThreads.options(num_replicas=2, ray_actor_options={
        "num_cpus": half}).bind(), name="pair", route_prefix="/pair")
    try:
        pids: set[int] = set()

        def both_answered() -> bool:
            pids.add(handle.remote().result(timeout_s=30)["pid"])
            return len(pids) == 2

        eventually(both_answered, 60, what="both replicas answered")
        nicer = min(19, os.nice(0) + REPLICA_NICE)
        for pid in pids:  # every thread of each
            tasks = os.listdir(f"/proc/{pid}/task")
            assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in tasks} == {nicer}
    finally:
        serve.delete("pair")


def _unsized_pool() -> int:
    """The BLAS pool numpy starts with when nothing sizes it."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    code = ("import numpy, threadpoolctl; print([p['num_threads'] for p in "
            "threadpoolctl.threadpool_info() if p['user_api'] == 'blas'][0])")
    return int(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                              capture_output=True, text=True, timeout=60).stdout)


def test_a_class_that_owns_its_pools_gets_them_back(instance: Running) -> None:
    answer = _ask(OwnsItsPools.bind(), "owns")
    assert answer["blas"] == [_unsized_pool()]
    assert answer["env"] == {"OMP_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": None,
                             "MKL_NUM_THREADS": None}
    # ... and still the user's, if they set one
    user = {"runtime_env": {"env_vars": {"OPENBLAS_NUM_THREADS": "3"}}}
    answer = _ask(OwnsItsPools.options(ray_actor_options=user).bind(), "owns")
    assert answer["env"]["OPENBLAS_NUM_THREADS"] == "3"
    assert answer["env"]["OMP_NUM_THREADS"] is None
