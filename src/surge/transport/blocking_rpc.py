"""One control RPC over a blocking socket, for code that must not await.

`serve.status()` or `serve.get_app_handle()` called from async code running on the
process's own event loop (a replica's request handler) cannot wait for that loop to
answer. This client does the same exchange as transport/rpc.py's `RpcPeer` on a
blocking socket of its own: connect, the token handshake (transport/handshake.py),
one `Rpc`, its `Reply`. It blocks its caller for one round trip to the controller, as
Ray's own blocking calls do from async code.
"""

from __future__ import annotations

import pickle
import secrets
import socket
from typing import Any

import cloudpickle

from surge.errors import ControlAuthError, ControllerUnavailableError
from surge.transport.framing import FrameDecoder, FrameEncoder
from surge.transport.handshake import NONCE_BYTES, ClientHandshake, HandshakeFailed
from surge.transport.messages import Message, Reply, Rpc

__all__ = ["blocking_call"]

CALL_ID = 1


def blocking_call(address: str, method: str, token: str | None, timeout_s: float = 30.0,
                  **kwargs: Any) -> Any:
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s)
    except OSError as exc:
        raise ControllerUnavailableError(f"no surge instance answers at {address} "
                                         f"({exc})") from None
    with sock:
        link = _Link(sock)
        if token:
            _handshake(link, token)
        link.send(Rpc(id=CALL_ID, method=method, payload=cloudpickle.dumps(kwargs)))
        while True:
            message = link.receive()
            if isinstance(message, Reply) and message.id == CALL_ID:
                value = pickle.loads(message.payload)
                if message.ok:
                    return value
                raise value


def _handshake(link: _Link, token: str) -> None:
    client = ClientHandshake(token, secrets.token_bytes(NONCE_BYTES))
    link.send(client.start())
    try:
        while not client.done:
            for frame in client.receive(link.receive()):
                link.send(frame)
    except HandshakeFailed as exc:
        raise ControlAuthError(f"the surge instance refused this process's token: "
                               f"{exc}") from None


class _Link:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.encoder, self.decoder = FrameEncoder(), FrameDecoder()
        self.ready: list[Message] = []

    def send(self, message: Message) -> None:
        self.sock.sendall(self.encoder.encode(message))

    def receive(self) -> Message:
        while not self.ready:
            data = self.sock.recv(65536)
            if not data:
                raise ControllerUnavailableError("the surge instance closed the connection")
            self.ready += self.decoder.feed(data)
        return self.ready.pop(0)
