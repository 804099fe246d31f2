"""A replica's share of the node's CPU: its thread pools sized to its `num_cpus`
(policy/threads.py), and its priority below the proxy's, from inside it.

At start, before the user's code is imported, `size_pools` puts the policy's variables
in the replica's environment (libraries loaded later read them, and so do the processes
the replica starts) and resizes, with threadpoolctl, the pools already loaded: a forked
replica inherits its template's (numpy's OpenBLAS, one thread per core, started before
anyone knew the replica's num_cpus), and a variable set after a pool started does not
resize it. torch's intra-op pool too when torch is already imported (never imported
here: it costs seconds).

A class that sizes its own pools says so with `OWN_POOLS_ATTRIBUTE` (LLMServer: vLLM
binds its OpenMP threads to the cores it is given); `release` gives such a replica the
environment and the pools it started with, before its constructor runs.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

from threadpoolctl import ThreadpoolController

from surge.config.defaults import REPLICA_NICE
from surge.policy.threads import ThreadLimits, thread_limits

__all__ = ["OWN_POOLS_ATTRIBUTE", "SizedPools", "owns_thread_pools", "size_pools",
           "yield_cpu_to_the_front"]

log = logging.getLogger("surge.replica")

OWN_POOLS_ATTRIBUTE = "__surge_own_thread_pools__"
# The pools threadpoolctl resizes (its libraries' internal_api); the others are sized by
# their variable alone, read when their library loads.
THREADPOOLCTL_POOLS = frozenset({"openmp", "openblas", "mkl", "blis"})


class SizedPools:
    """What `size_pools` did, so that `release` can undo it."""

    def __init__(self, limits: ThreadLimits, environ: MutableMapping[str, str],
                 limiter: Any, torch_before: int | None) -> None:
        self.limits = limits
        self._environ = environ
        self._limiter = limiter
        self._torch_before = torch_before
        self.released = False

    def __repr__(self) -> str:
        state = "released" if self.released else f"pools={dict(self.limits.pools)}"
        return f"<SizedPools {state} set={sorted(self.limits.env)}>"

    def release(self) -> None:
        """Remove the variables surge set and give the pools their sizes back."""
        if self.released:
            return
        self.released = True
        for name, value in self.limits.env.items():
            if self._environ.get(name) == value:
                del self._environ[name]
        self._limiter.restore_original_limits()
        torch = sys.modules.get("torch")
        if torch is not None and self._torch_before is not None:
            torch.set_num_threads(self._torch_before)


def size_pools(num_cpus: float,
               environ: MutableMapping[str, str] | None = None) -> SizedPools:
    """Size this process's thread pools for a replica of `num_cpus` (the user's
    variables in `environ`, the process's environment by default, win)."""
    env = os.environ if environ is None else environ
    limits = thread_limits(num_cpus, env)
    env.update(limits.env)
    controller = ThreadpoolController()  # the libraries loaded now, each by its path
    # keyed by prefix (every threadpoolctl 3.x matches it; only 3.8 matches a path)
    limiter = controller.limit(limits={
        lib.prefix: limits.pools[lib.internal_api] for lib in controller.lib_controllers
        if lib.internal_api in THREADPOOLCTL_POOLS})
    torch_before = None
    torch = sys.modules.get("torch")
    if torch is not None:
        torch_before = int(torch.get_num_threads())
        torch.set_num_threads(limits.pools["torch"])
    log.debug("thread pools for num_cpus=%g: %s", num_cpus, dict(limits.pools))
    return SizedPools(limits, env, limiter, torch_before)


def yield_cpu_to_the_front(increment: int = REPLICA_NICE) -> None:
    """Run this replica (every thread and process it starts) `increment` nicer than the
    proxy and controller that started it (config.defaults.REPLICA_NICE where the node's
    replicas can keep all its cores busy, else 0 until the backend renices it:
    policy/threads.replica_nice and to_renice). Called
    first thing, before its start-up: a starting replica must not outrank the serving ones
    (reniced only once built, the demo's first replica lost the CPU to the seven forking
    beside it and refused 0.3% of the pulse's onset, where from the start it refuses none)."""
    if not increment:
        return
    try:
        os.nice(increment)
    except OSError as exc:  # not permitted here: serve at the same priority
        log.debug("replica priority unchanged: %r", exc)


def owns_thread_pools(target: Any) -> bool:
    """The user's class sizes its own thread pools (it sets OWN_POOLS_ATTRIBUTE)."""
    return bool(getattr(target, OWN_POOLS_ATTRIBUTE, False))
