"""A test's own TCP connection to a server on this machine, for the clients that write
exact bytes: tests/e2e/test_http.py's HTTP/1 `RawConnection` and tests/proxy/h2_client.py's
HTTP/2 `Client`."""

from __future__ import annotations

import socket
from typing import Self


class RawSocket:
    """A connected socket (`sock`), closed when the `with` block ends."""

    def __init__(self, port: int, timeout_s: float, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()
