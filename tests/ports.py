"""Loopback ports for the processes a test starts to listen on.

`bind(("127.0.0.1", 0))` hands out a port from the kernel's ephemeral range, the range it also
gives outgoing connections. Between that pick and the listener's own bind, a connection opened
while the instance starts (a replica's link, the proxy's to the controller) can take the port:
CI saw "cannot listen on 127.0.0.1:48975: Address already in use". A port below the ephemeral
range is never given to an outgoing connection, so the pick only has to be free now.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

LOWEST = 20_000  # below: Ray's worker ports (10002-19999 by default)
_picker = random.Random(os.urandom(16))  # unaffected by a test's random.seed


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_run(count: int = 1) -> int:
    """A port p with p .. p+count-1 free now and outside the ephemeral range."""
    highest = _ephemeral_low() - count
    for _ in range(200):
        base = _picker.randint(LOWEST, highest)
        if all(is_free(port) for port in range(base, base + count)):
            return base
    raise RuntimeError(f"no run of {count} free ports between {LOWEST} and {highest + count}")


def free_port() -> int:
    return free_port_run(1)
