"""How a new instance is started (`StartOptions`), and where the user's modules are.

Its own module so that a driver that only connects to a running instance (or has not
started one yet) does not import the supervisor, the launcher and the backends.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from surge.backends.choice import BackendChoice
from surge.config import HTTPOptions, gRPCOptions
from surge.config.weights import WeightStoreOptions
from surge.observability.config import DashboardOptions, LoggingConfig

__all__ = ["StartOptions", "user_sys_path"]


@dataclass(frozen=True)
class StartOptions:
    """How a new instance is started (serve.start's arguments, the YAML config's)."""

    http: HTTPOptions = field(default_factory=HTTPOptions)
    grpc: gRPCOptions = field(default_factory=gRPCOptions)
    backend: BackendChoice = field(default_factory=BackendChoice)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    dashboard: DashboardOptions = field(default_factory=DashboardOptions.from_env)
    weights: WeightStoreOptions = field(default_factory=WeightStoreOptions)


def user_sys_path() -> tuple[str, ...]:
    """Where the user's modules live, so replicas can import them by reference."""
    main = sys.modules.get("__main__")
    entries = [os.getcwd()]
    main_file = getattr(main, "__file__", None)
    if main_file:
        entries.insert(0, os.path.dirname(os.path.abspath(main_file)))
    entries += [p for p in sys.path if p and os.path.isdir(p) and "site-packages" not in p
                and not p.startswith(sys.base_prefix)]
    return tuple(dict.fromkeys(entries))
