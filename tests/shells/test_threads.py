"""replica.threads: the pools this process loaded are resized, and given back; the local
backend's count of the cores its replicas can use sets each one's priority."""

from __future__ import annotations

import numpy  # noqa: F401 - loads the BLAS library whose pool is resized
import threadpoolctl

from surge.backends.node_cores import NodeCores
from surge.config.defaults import REPLICA_NICE
from surge.replica.threads import SizedPools, owns_thread_pools, size_pools


def blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]


def test_pools_are_sized_and_released() -> None:
    before = blas_threads()
    environ = {"OPENBLAS_NUM_THREADS": "3", "PATH": "/bin"}
    pools = size_pools(1.0, environ)
    try:
        assert blas_threads() == [3]  # the user's variable sizes its pool
        assert environ["OMP_NUM_THREADS"] == "1" and environ["OPENBLAS_NUM_THREADS"] == "3"
        assert repr(pools).startswith("<SizedPools pools={'openmp': 1, 'openblas': 3,")
    finally:
        pools.release()
    assert blas_threads() == before
    assert environ == {"OPENBLAS_NUM_THREADS": "3", "PATH": "/bin"}  # theirs stays
    assert repr(pools).startswith("<SizedPools released")
    pools.release()  # twice is once
    assert blas_threads() == before


def test_a_variable_changed_since_is_not_removed() -> None:
    environ: dict[str, str] = {}
    pools = size_pools(2.0, environ)
    environ["OMP_NUM_THREADS"] = "7"  # the user's code set it meanwhile
    pools.release()
    assert environ == {"OMP_NUM_THREADS": "7"}
    assert isinstance(pools, SizedPools)


def test_a_class_says_it_owns_its_pools() -> None:
    class Engine:
        __surge_own_thread_pools__ = True

    assert owns_thread_pools(Engine) and not owns_thread_pools(object)
    assert not owns_thread_pools(lambda: None)


def test_a_replica_starts_nicer_once_the_nodes_replicas_can_take_every_core() -> None:
    cores = NodeCores(4)
    assert cores.take("a", 1.0) == 0  # alone on 4 cores
    assert cores.take("b", 1.0) == 0  # 2 of 4
    assert cores.take("c", 2.0) == REPLICA_NICE  # 4 of 4
    assert repr(cores) == "<NodeCores 4 of 4 held by 3, 1 nicer>"
    assert cores.renice() == ["a", "b"]  # the ones that started below it
    assert cores.renice() == []  # once
    cores.give_back("c")
    cores.give_back("c")  # twice is once
    assert cores.take("d", 1.0) == 0  # 3 of 4: the one that left is not counted
    cores.take("d", 1.0)  # the same replica again (a restart) is counted once
    assert repr(cores) == "<NodeCores 3 of 4 held by 3, 2 nicer>"
    assert cores.take("e", 1.0, nice=0) == 0  # adopted: the nice it runs at
    assert cores.renice() == ["d", "e"]


def test_the_cores_held_are_a_running_total_that_leaves_no_rounding_behind() -> None:
    cores = NodeCores(3)
    cores.take("a", 2.3)
    cores.take("b", 1.9)
    cores.give_back("a")
    # 1.9 + 1.1 is 3.0 as floats; a float total kept by += and -= reads 2.9999999999999996
    # here (2.3 + 1.9 - 2.3 + 1.1) and would start c at 0 on a node its replicas fill.
    assert cores.take("c", 1.1) == REPLICA_NICE
    assert cores.wanted == 3.0
    cores.take("c", 1.0)  # taken again (a restart): its new count replaces the old
    assert cores.wanted == 2.9
    for owner in ("b", "c", "c"):
        cores.give_back(owner)
    assert cores.wanted == 0.0 and cores.held == {} and cores.nices == {}
    assert repr(cores) == "<NodeCores 0 of 3 held by 0, 0 nicer>"
