"""How many threads each of a replica's thread pools gets: its `num_cpus`, as Ray does;
and whether it runs nicer than the proxy.

A numeric library sizes its pool to the machine's cores unless told otherwise, so N
replicas on a node each start a pool as wide as the node and their threads spin against
one another (issue 30 measured 8 MLP replicas on 2 cores under wrk: 1,209 µs of CPU
per request, 247 µs with one BLAS thread each). Ray sets `OMP_NUM_THREADS` to an
actor's `num_cpus` (at least 1) unless it is set already; surge does the same for every
pool a replica may load (OpenMP, OpenBLAS, MKL, BLIS, Accelerate, numexpr, torch's
intra-op pool).

Each pool is sized by the first of its variables that is set, in the order its library
reads them (OpenBLAS: `OPENBLAS_NUM_THREADS`, then `GOTO_NUM_THREADS`, then
`OMP_NUM_THREADS`); a variable already in the replica's environment (the user's
`runtime_env.env_vars`, or the environment surge was started in) is the user's and
wins; a pool none of them sizes gets `pool_size(num_cpus)`. Pure: the replica's shell
(replica/threads.py) puts `env` in its environment and resizes the pools it already
loaded (a forked replica inherits its template's) to `pools`.

A replica runs `REPLICA_NICE` nicer than the proxy where the node's replicas can keep
all its cores busy, so that the proxy still gets the CPU to refuse the excess; below
that the nice buys nothing and costs latency: a nicer process that wakes on a core
where a nice-0 one runs waits for it (its share, and so its turn, is 110/1024 of the
other's at nice 10). `replica_nice` decides it from the cores the node's replicas can
use, this one counted: each one's `num_cpus`, at least one (its own Python thread).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from surge.config.defaults import REPLICA_NICE

__all__ = ["POOLS", "ThreadLimits", "cores_used", "pool_size", "replica_nice", "thread_limits",
           "user_threads"]

# pool -> the variables that size it, in the order its library reads them (the first one
# set wins). A pool's own variable (the first) is the one surge sets when it is unset;
# torch has none of its own: it reads MKL's, then OpenMP's.
POOLS: Mapping[str, tuple[str, ...]] = {
    "openmp": ("OMP_NUM_THREADS",),
    "openblas": ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"),
    "mkl": ("MKL_NUM_THREADS", "OMP_NUM_THREADS"),
    "blis": ("BLIS_NUM_THREADS", "OMP_NUM_THREADS"),
    "accelerate": ("VECLIB_MAXIMUM_THREADS",),
    "numexpr": ("NUMEXPR_NUM_THREADS", "OMP_NUM_THREADS"),
    "torch": ("MKL_NUM_THREADS", "OMP_NUM_THREADS"),
}
OWN_VARIABLE_FREE = frozenset({"torch"})  # pools sized only through others' variables


@dataclass(frozen=True)
class ThreadLimits:
    """`env`: the variables to add to the replica's environment (never one already
    there); `pools`: each pool's size, for the pools already loaded."""

    env: Mapping[str, str]
    pools: Mapping[str, int]


def pool_size(num_cpus: float) -> int:
    """Threads per pool for a replica of `num_cpus`: its whole CPUs, at least 1 (Ray's
    rule: 0.5 CPU gets 1 thread, 2 get 2); a non-finite amount gets 1."""
    if not math.isfinite(num_cpus):
        return 1
    return max(1, math.floor(num_cpus))


def user_threads(value: str | None) -> int | None:
    """A thread count the user set, or None when unset or not a positive integer (the
    libraries ignore such a value too, so it sizes nothing)."""
    if value is None or not value.strip().isdigit():
        return None
    count = int(value)
    return count if count > 0 else None


def thread_limits(num_cpus: float, environ: Mapping[str, str]) -> ThreadLimits:
    """Each pool's size and the variables to set, for a replica of `num_cpus` whose
    environment (the user's variables included) is `environ`."""
    default = pool_size(num_cpus)
    pools: dict[str, int] = {}
    env: dict[str, str] = {}
    for pool, variables in POOLS.items():
        given = [n for n in (user_threads(environ.get(v)) for v in variables) if n]
        pools[pool] = given[0] if given else default
        own = variables[0]
        if pool not in OWN_VARIABLE_FREE and own not in environ:
            env[own] = str(pools[pool])
    return ThreadLimits(env, pools)


def cores_used(num_cpus: float) -> float:
    """The cores a replica of `num_cpus` can keep busy: its `num_cpus`, at least one (its
    own thread runs Python whatever its pools); a non-finite amount counts one."""
    if not math.isfinite(num_cpus):
        return 1.0
    return max(1.0, num_cpus)


def replica_nice(cores_wanted: float, node_cores: int, nicer: int = REPLICA_NICE) -> int:
    """How much nicer than the proxy a replica starts: `nicer` when the node's replicas,
    this one included, can keep its `node_cores` busy (`cores_wanted`: the sum of their
    `cores_used`), else 0. One that started below that stays at 0 as more come: the
    proxy then shares one core's worth with it, and the rest by weight with the others."""
    return nicer if cores_wanted >= node_cores else 0
