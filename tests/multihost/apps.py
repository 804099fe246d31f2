"""The deployment the multi-host tests serve: it answers with the host it runs on."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from surge import serve

SUBNET_PROBE = ("10.203.0.254", 9)  # never sent to: connect() on UDP only picks a route


def host_ip() -> str:
    """This host's address: the source address of a route into the test subnet."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(SUBNET_PROBE)
        return str(sock.getsockname()[0])


@serve.deployment(num_replicas=2, max_ongoing_requests=8,
                  ray_actor_options={"num_cpus": 1})
class Where:
    """One replica per worker host (each has one CPU); 20 ms per request."""

    def __init__(self) -> None:
        self.ip = host_ip()

    async def __call__(self, request: Any) -> dict[str, Any]:
        await asyncio.sleep(0.02)
        return {"ip": self.ip, "pid": os.getpid()}


app = Where.bind()
