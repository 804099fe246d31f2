"""policy.threads: each pool's size and the variables set, as tables."""

from __future__ import annotations

import math

import pytest

from surge.config.defaults import REPLICA_NICE
from surge.policy.threads import (
    POOLS,
    ThreadLimits,
    cores_used,
    pool_size,
    replica_nice,
    thread_limits,
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
