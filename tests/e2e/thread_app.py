"""Deployments that report, from inside their replica, how many threads their BLAS
pool has (tests/e2e/test_thread_limits.py)."""

from __future__ import annotations

import os
import sys

# The fork server's template imports numpy before it forks (its PRELOAD_LATER), so a
# replica inherits an OpenBLAS pool already started with one thread per core.
NUMPY_INHERITED = "numpy" in sys.modules

import numpy  # noqa: E402, F401 - the BLAS library whose pool is checked
import threadpoolctl  # noqa: E402

from surge import serve  # noqa: E402

VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def report() -> dict[str, object]:
    pools = threadpoolctl.threadpool_info()
    return {"blas": [p["num_threads"] for p in pools if p["user_api"] == "blas"],
            "numpy_inherited": NUMPY_INHERITED,
            "env": {name: os.environ.get(name) for name in VARIABLES},
            "nice": os.nice(0), "pid": os.getpid()}


@serve.deployment
class BlasThreads:
    def __call__(self) -> dict[str, object]:
        return report()


@serve.deployment
class OwnsItsPools:
    """As LLMServer: its engine sizes its own pools."""

    __surge_own_thread_pools__ = True

    def __call__(self) -> dict[str, object]:
        return report()
