"""Which node this process runs on, as told by the backend that placed it.

The local backend says nothing: one machine, node "local", replicas on Unix sockets.
The ray backend starts every replica and proxy with SURGE_NODE_ID (its Ray node id)
and SURGE_NODE_IP (the node's address: replicas listen there on TCP, since routers on
other nodes must reach them), and a proxy with SURGE_PROXY_PORT when its port differs
from http_options.port (several nodes on one IP). Routers prefer replicas whose node id
is their own. A placed process's lifetime is tied to the Ray actor hosting it, not to
the controller: it keeps serving and reconnects when the controller is away.
"""

from __future__ import annotations

import os

__all__ = [
    "LOCAL_NODE",
    "NODE_ID_ENV",
    "NODE_IP_ENV",
    "ORPHAN_TIMEOUT_S",
    "PROXY_PORT_ENV",
    "node_id",
    "node_ip",
    "placed",
    "proxy_port",
]

NODE_ID_ENV = "SURGE_NODE_ID"
NODE_IP_ENV = "SURGE_NODE_IP"
PROXY_PORT_ENV = "SURGE_PROXY_PORT"
LOCAL_NODE = "local"  # ReplicaInfo.node_id on the local backend
# A placed process with no controller for this long leaves: its driver is gone for good
# (a restart takes ~1 s; the supervisor gives up after 5 in a minute).
ORPHAN_TIMEOUT_S = 120.0


def node_id() -> str:
    return os.environ.get(NODE_ID_ENV) or LOCAL_NODE


def node_ip() -> str | None:
    return os.environ.get(NODE_IP_ENV) or None


def placed() -> bool:
    """Whether a multi-node backend placed this process (its host actor owns its life)."""
    return bool(os.environ.get(NODE_ID_ENV))


def proxy_port(configured: int) -> int:
    value = os.environ.get(PROXY_PORT_ENV)
    return int(value) if value else configured
