"""Open a router's link to a replica: a Unix socket on this node, else TCP with the
instance's handshake (replica_link.py) and keepalive.

Links to other hosts use TCP keepalive (an idle link) and TCP_USER_TIMEOUT (a link with
requests sent and not yet acknowledged: keepalive never probes those), so a replica
whose host vanished without closing the connection fails its in-flight requests within
seconds instead of hanging them until the kernel gives up (~15 minutes of
retransmissions).
"""

from __future__ import annotations

import asyncio
import socket

from surge.model import ReplicaInfo
from surge.router.replica_link import ReplicaLink
from surge.transport.rpc import split_address

__all__ = ["HANDSHAKE_TIMEOUT_S", "KEEPALIVE", "UNACKED_TIMEOUT_S", "dial"]

# A replica on another node must complete the token handshake within this.
HANDSHAKE_TIMEOUT_S = 10.0
# TCP keepalive on links to replicas (idle s, interval s, probes): a dead host is noticed
# in about 5 + 3 * 1 = 8 s, without a heartbeat of our own on the data path.
KEEPALIVE = (5, 1, 3)
# Data unacknowledged this long closes a link to a replica on another host: as long as the
# keepalive verdict, and far above a lossy link's retransmission backoff.
UNACKED_TIMEOUT_S = 8.0


async def dial(loop: asyncio.AbstractEventLoop, info: ReplicaInfo, link: ReplicaLink,
               node_id: str, token: str | None) -> None:
    """Connect `link` to the replica; it is trusted when this returns."""
    if info.address.startswith("unix:"):
        await loop.create_unix_connection(lambda: link, info.address[5:])
    elif info.local_address and info.node_id == node_id:  # same node: no TCP
        await loop.create_unix_connection(lambda: link, info.local_address[5:])
    else:
        if token:  # TCP replicas take requests only after the handshake
            link.require_handshake(token)
        host, port = split_address(info.address)
        transport, _ = await loop.create_connection(lambda: link, host, port)
        _keepalive(transport.get_extra_info("socket"))
    await asyncio.wait_for(link.trusted, HANDSHAKE_TIMEOUT_S)


def _keepalive(sock: socket.socket | None) -> None:
    if sock is None:
        return
    idle, interval, probes = KEEPALIVE
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                        int(UNACKED_TIMEOUT_S * 1000))
    except (OSError, AttributeError):  # not every platform has the TCP_KEEP* options
        pass
