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
use, this one counted (`replica_cores`: each one's `num_cpus`, at least one, its own
Python thread, or its widest thread pool where the user's variables size one wider),
against the node's cores (`usable_cores`: its affinity, less a cgroup CPU quota, which
`cpu_max_cores` and `cfs_quota_cores` read). Once they reach it, the replicas that
started below it are made as nice (`to_renice`): the first two replicas of a deployment
on 2 cores would otherwise run at 0 and 10.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from surge.config.defaults import REPLICA_NICE

__all__ = ["POOLS", "ThreadLimits", "cfs_quota_cores", "cores_used", "cpu_max_cores",
           "pool_size", "replica_cores", "replica_nice", "thread_limits", "to_renice",
           "usable_cores", "user_threads"]

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
    `replica_cores`), else 0. The ones that started below it are reniced once the count
    reaches it (`to_renice`)."""
    return nicer if cores_wanted >= node_cores else 0


def replica_cores(num_cpus: float, environ: Mapping[str, str]) -> float:
    """The cores a replica of `num_cpus` whose environment is `environ` can keep busy:
    `cores_used`, or its widest thread pool where the user's variables (an
    `OMP_NUM_THREADS` in its `runtime_env`) size one wider than `num_cpus`."""
    return max(cores_used(num_cpus), *thread_limits(num_cpus, environ).pools.values())


def to_renice(nices: Mapping[str, int], cores_wanted: float, node_cores: int,
              nicer: int = REPLICA_NICE) -> list[str]:
    """The replicas (`nices`: each one's nice, by id) to make nicer now that the node's
    replicas want `cores_wanted`: those below `replica_nice`'s answer, once it is not 0."""
    nice = replica_nice(cores_wanted, node_cores, nicer)
    return [owner for owner, now in nices.items() if now < nice] if nice else []


def cpu_max_cores(text: str) -> float | None:
    """The cores a cgroup v2 `cpu.max` ("QUOTA PERIOD", in µs) allows; None: no quota
    ("max ...") or a text that is not one."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _ratio(parts[0], parts[1])


def cfs_quota_cores(quota_us: str, period_us: str) -> float | None:
    """The cores a cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` allow; None: no
    quota (-1) or a text that is not one."""
    return _ratio(quota_us.strip(), period_us.strip())


def _ratio(quota: str, period: str) -> float | None:
    if not (quota.isdigit() and period.isdigit()) or not int(quota) or not int(period):
        return None  # ("-1" is not digits: no quota)
    return int(quota) / int(period)


def usable_cores(affinity: int, quotas: Iterable[float | None]) -> int:
    """The cores a node's processes can keep busy: the `affinity` count (a cpuset), less
    the tightest CPU quota (`docker --cpus=2`, a Kubernetes CPU limit) rounded up, at
    least one."""
    limits = [math.ceil(q) for q in quotas if q is not None]
    return max(1, min([affinity, *limits]))
