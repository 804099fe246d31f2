"""Which backend an instance runs on, and how the controller builds it.

The process that starts an instance (serve.start, `surge run`) makes a
`BackendChoice`; it travels to the controller process in its spec (surge.launch), so a
controller restarted by the supervisor comes back on the same backend, and
`build_backend` makes it there. The local backend is the default and never imports Ray;
`ray` needs `pip install 'surge[ray]'`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from surge.errors import ConfigError

if TYPE_CHECKING:
    from surge.backends.base import Backend
    from surge.config.weights import WeightStoreOptions
    from surge.launch import Membership

__all__ = ["BACKENDS", "BackendChoice", "build_backend", "caller_ray_address"]

BACKENDS = ("local", "ray")
DEFAULT_BACKEND = "local"  # one machine, nothing to install


@dataclass(frozen=True)
class BackendChoice:
    name: str = DEFAULT_BACKEND
    # The Ray cluster (ray.init's address): None means "auto" (RAY_ADDRESS, else the
    # cluster started on this machine with `ray start`).
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ConfigError(f"backend {self.name!r} is not available; use one of "
                              f"{', '.join(BACKENDS)}")
        if self.ray_address is not None and self.name != "ray":
            raise ConfigError("ray_address is only used with backend='ray'")


def caller_ray_address() -> str | None:
    """The cluster this process is connected to, if it called ray.init (without importing
    Ray when it did not)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    address = ray.get_runtime_context().gcs_address
    return str(address) if address else None


def build_backend(choice: BackendChoice, membership: Membership,
                  state_dir: str | None = None,
                  weights: WeightStoreOptions | None = None) -> Backend:
    """The backend, for a controller whose members are told `membership`."""
    if choice.name == "ray":
        try:
            from surge.backends.ray import RayBackend
        except ImportError as exc:
            raise ConfigError(f"backend 'ray' needs Ray ({exc}); install it with "
                              "pip install 'surge[ray]'") from None
        return RayBackend(membership, choice.ray_address, state_dir, weights)
    from surge.backends.local import LocalBackend

    return LocalBackend(membership, state_dir, weights=weights)
