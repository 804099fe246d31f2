"""policy.threads: each pool's size and the variables set, as tables."""

from __future__ import annotations

import math

import pytest

from surge.config.defaults import REPLICA_NICE
from surge.policy.threads import (
    POOLS,
    ThreadLimits,
    cfs_quota_cores,
    cores_used,
    cpu_max_cores,
    pool_size,
    replica_cores,
    replica_nice,
    thread_limits,
    to_renice,
    usable_cores,
    user_threads,
)

OWN = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
       "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


@pytest.mark.parametrize(("num_cpus", "threads"), [
    (1.0, 1), (2.0, 2), (8, 8),  # whole CPUs: that many
    (0.0, 1), (0.25, 1), (0.5, 1), (1.5, 1), (2.99, 2),  # fractions: floor, at least 1
    (math.inf, 1), (math.nan, 1),  # the config accepts inf; it sizes nothing
])
def test_pool_size_is_the_whole_cpus_at_least_one(num_cpus: float, threads: int) -> None:
    assert pool_size(num_cpus) == threads


@pytest.mark.parametrize(("value", "threads"), [
    (None, None), ("", None), ("abc", None), ("0", None), ("-2", None), ("2,1", None),
    ("1", 1), ("3", 3), (" 4 ", 4),
])
def test_user_threads_reads_only_positive_integers(value: str | None,
                                                   threads: int | None) -> None:
    assert user_threads(value) == threads


def test_unset_everything_gets_num_cpus() -> None:
    limits = thread_limits(2.0, {"PATH": "/bin"})
    assert limits == ThreadLimits({name: "2" for name in OWN},
                                  {pool: 2 for pool in POOLS})


def test_the_default_replica_gets_one_thread_per_pool() -> None:
    limits = thread_limits(1.0, {})
    assert set(limits.pools.values()) == {1}
    assert limits.env["OMP_NUM_THREADS"] == limits.env["OPENBLAS_NUM_THREADS"] == "1"


@pytest.mark.parametrize(("environ", "num_cpus", "pools", "not_set"), [
    # the user's own variable wins for its pool, and only its pool
    ({"OPENBLAS_NUM_THREADS": "3"}, 1.0,
     {"openblas": 3, "openmp": 1, "mkl": 1, "torch": 1}, {"OPENBLAS_NUM_THREADS"}),
    # OMP_NUM_THREADS sizes every pool that reads it after its own variable
    ({"OMP_NUM_THREADS": "3"}, 1.0,
     {"openmp": 3, "openblas": 3, "mkl": 3, "blis": 3, "numexpr": 3, "torch": 3,
      "accelerate": 1}, {"OMP_NUM_THREADS"}),
    # ... but a pool's own variable comes first
    ({"OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "2"}, 1.0,
     {"openmp": 3, "openblas": 2}, {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}),
    # OpenBLAS reads GOTO_NUM_THREADS before OMP_NUM_THREADS
    ({"GOTO_NUM_THREADS": "4", "OMP_NUM_THREADS": "3"}, 1.0,
     {"openblas": 4, "openmp": 3}, {"OMP_NUM_THREADS"}),
    # torch reads MKL_NUM_THREADS before OMP_NUM_THREADS
    ({"MKL_NUM_THREADS": "5", "OMP_NUM_THREADS": "3"}, 1.0,
     {"torch": 5, "mkl": 5, "openmp": 3}, {"MKL_NUM_THREADS", "OMP_NUM_THREADS"}),
    # a value that is no count is still the user's (never overwritten) but sizes nothing
    ({"OMP_NUM_THREADS": "lots"}, 2.0, {"openmp": 2, "openblas": 2}, {"OMP_NUM_THREADS"}),
    # more threads than CPUs, if the user says so
    ({"OPENBLAS_NUM_THREADS": "16"}, 0.5, {"openblas": 16, "openmp": 1},
     {"OPENBLAS_NUM_THREADS"}),
])
def test_the_users_variables_win(environ: dict[str, str], num_cpus: float,
                                 pools: dict[str, int], not_set: set[str]) -> None:
    limits = thread_limits(num_cpus, environ)
    assert {pool: limits.pools[pool] for pool in pools} == pools
    assert not_set.isdisjoint(limits.env)
    assert set(limits.env) == set(OWN) - not_set
    for name, value in limits.env.items():  # what surge sets says the pool's size
        pool = next(p for p, variables in POOLS.items() if variables[0] == name)
        assert value == str(limits.pools[pool])


def test_torch_has_no_variable_of_its_own() -> None:
    limits = thread_limits(4.0, {})
    assert limits.pools["torch"] == 4
    assert all(not name.startswith("TORCH") for name in limits.env)


@pytest.mark.parametrize(("num_cpus", "cores"), [
    (1.0, 1.0), (2.0, 2.0), (2.5, 2.5),  # its num_cpus ...
    (0.0, 1.0), (0.5, 1.0),  # ... at least one: its own thread runs Python
    (math.inf, 1.0), (math.nan, 1.0),
])
def test_a_replica_uses_its_num_cpus_at_least_one_core(num_cpus: float, cores: float) -> None:
    assert cores_used(num_cpus) == cores


@pytest.mark.parametrize(("wanted", "node_cores", "nice"), [
    (1.0, 2, 0),  # one replica on two cores: the proxy keeps a core, nothing to yield
    (1.0, 16, 0), (15.0, 16, 0), (15.99, 16, 0),
    (2.0, 2, REPLICA_NICE),  # the replicas can take every core: the proxy must outrank them
    (3.0, 2, REPLICA_NICE), (32.0, 2, REPLICA_NICE), (16.0, 16, REPLICA_NICE),
    (1.0, 1, REPLICA_NICE),  # one core: any replica can take it
])
def test_a_replica_is_nicer_only_where_the_replicas_can_take_every_core(
        wanted: float, node_cores: int, nice: int) -> None:
    assert replica_nice(wanted, node_cores) == nice
    assert replica_nice(wanted, node_cores, nicer=5) == (5 if nice else 0)


@pytest.mark.parametrize(("num_cpus", "environ", "cores"), [
    (1.0, {}, 1.0), (2.5, {}, 2.5), (0.5, {}, 1.0),  # cores_used: surge sizes the pools
    (1.0, {"OMP_NUM_THREADS": "4"}, 4.0),  # the user's variable wins over num_cpus ...
    (1.0, {"OPENBLAS_NUM_THREADS": "3", "OMP_NUM_THREADS": "1"}, 3.0),  # ... any pool's
    (6.0, {"OMP_NUM_THREADS": "2"}, 6.0),  # narrower pools: num_cpus still counts
    (1.0, {"OMP_NUM_THREADS": "zero"}, 1.0),  # a value no library reads
    (math.inf, {"MKL_NUM_THREADS": "2"}, 2.0),
])
def test_a_replica_counts_its_widest_thread_pool(num_cpus: float, environ: dict[str, str],
                                                 cores: float) -> None:
    assert replica_cores(num_cpus, environ) == cores


def test_the_replicas_below_the_nice_are_reniced_once_they_can_take_every_core() -> None:
    nices = {"a": 0, "b": REPLICA_NICE, "c": 3}
    assert to_renice(nices, 1.5, 2) == []  # below the cores: nobody
    assert to_renice(nices, 2.0, 2) == ["a", "c"]  # raised to the nice, never lowered
    assert to_renice(nices, 4.0, 2, nicer=3) == ["a"]
    assert to_renice({}, 8.0, 2) == []


@pytest.mark.parametrize(("text", "cores"), [
    ("max 100000\n", None),  # no quota
    ("200000 100000\n", 2.0),  # docker --cpus=2
    ("150000 100000", 1.5), ("50000 100000", 0.5),
    ("", None), ("max", None), ("abc 100000", None), ("100000 0", None), ("0 100000", None),
])
def test_a_cgroup_v2_cpu_max_gives_the_cores_its_quota_allows(text: str,
                                                              cores: float | None) -> None:
    assert cpu_max_cores(text) == cores


@pytest.mark.parametrize(("quota", "period", "cores"), [
    ("-1\n", "100000\n", None),  # no quota
    ("200000\n", "100000\n", 2.0), ("25000", "50000", 0.5),
    ("", "100000", None), ("100000", "", None),
])
def test_a_cgroup_v1_cfs_quota_gives_the_cores_it_allows(quota: str, period: str,
                                                         cores: float | None) -> None:
    assert cfs_quota_cores(quota, period) == cores


@pytest.mark.parametrize(("affinity", "quotas", "cores"), [
    (64, [], 64), (64, [None, None], 64),  # no quota: the affinity (a cpuset)
    (64, [2.0], 2), (64, [1.5], 2), (64, [0.5], 1),  # a quota, rounded up
    (64, [None, 8.0, 4.0], 4),  # the tightest of a group's and those above it
    (2, [8.0], 2),  # a quota wider than the cpuset
    (0, [], 1),
])
def test_the_node_has_the_cores_of_its_affinity_less_its_cpu_quota(
        affinity: int, quotas: list[float | None], cores: int) -> None:
    assert usable_cores(affinity, quotas) == cores
