"""Where proxies run on a multi-node backend, and which port a node's proxy binds.

`proxy_nodes` is Ray Serve's `proxy_location`: EveryNode puts a proxy on the head node
(where the controller runs) and on every node that hosts at least one replica, so
proxies come and go with replicas; HeadOnly only on the head; Disabled (or its old
name NoServer) nowhere, handles only.

`proxy_port`: a node's proxy binds the configured HTTP port when no other surge proxy
holds it on that node's IP (a real cluster: one IP per node, every proxy on the same
port), else the next port up that none holds. Nodes sharing an IP (Ray's
`cluster_utils.Cluster`, or several raylets per host) so get port, port+1, port+2, ...
in the order their proxies start. Port 0 stays 0: each proxy binds a free port.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

__all__ = ["proxy_nodes", "proxy_port"]


def proxy_nodes(location: str, head: str, replica_nodes: Iterable[str]) -> frozenset[str]:
    """The nodes that should run a proxy."""
    if location in ("Disabled", "NoServer"):
        return frozenset()
    if location == "HeadOnly":
        return frozenset({head})
    return frozenset({head, *replica_nodes})


def proxy_port(configured: int, taken: Collection[int]) -> int:
    """The port for a new proxy on an IP where surge's proxies already hold `taken`."""
    if configured == 0:
        return 0
    port = configured
    while port in taken:
        port += 1
    return port
