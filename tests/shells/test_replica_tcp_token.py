"""A replica reached over TCP (multi-node backends) serves only connections that complete
the instance's token handshake first: handle calls carry pickled arguments. The router's
side of the same handshake refuses a replica that cannot prove it knows the token."""

from __future__ import annotations

import asyncio
import pickle

from surge.replica.server import ReplicaServer
from surge.replica.user_code import UserCode
from surge.router.replica_link import ReplicaLink
from surge.transport.framing import FrameDecoder, FrameEncoder
from surge.transport.handshake import (
    AUTHENTICATE,
    NONCE_BYTES,
    ClientHandshake,
    HandshakeFailed,
    ServerUnproven,
)
from surge.transport.messages import Call, Message, Result, Rpc

TOKEN = "the-control-token"
QUIET_S = 15.0


class Doubler:
    def double(self, value: int) -> int:
        return value * 2


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = FrameEncoder(), FrameDecoder()

    def send(self, *messages: Message) -> None:
        self.writer.write(b"".join(self.encoder.encode(m) for m in messages))

    async def receive(self) -> list[Message]:
        """What came back before the replica closed the connection or went quiet. Every
        refusal closes the connection, so the wait bounds only a stalled test machine (a
        2 s wait once ran out on CI's loaded fast tier)."""
        received: list[Message] = []
        try:
            while not received:
                data = await asyncio.wait_for(self.reader.read(65536), QUIET_S)
                if not data:
                    break  # closed by the replica
                received += self.decoder.feed(data)
        except TimeoutError:
            pass
        return received


async def connect(port: int) -> Connection:
    return Connection(*await asyncio.open_connection("127.0.0.1", port))


async def handshake_then_call(port: int, token: str, call: Call) -> list[Message]:
    """Do the client's side of the handshake knowing `token`; then send `call`."""
    conn = await connect(port)
    client = ClientHandshake(token, b"n" * NONCE_BYTES)
    conn.send(client.start())
    try:
        while not client.done:
            answers = await conn.receive()
            if not answers:
                conn.writer.close()
                await conn.writer.wait_closed()
                return []
            for message in answers:
                conn.send(*client.receive(message))
    except HandshakeFailed:
        conn.writer.close()
        await conn.writer.wait_closed()
        return []
    conn.send(call)
    received = await conn.receive()
    conn.writer.close()
    await conn.writer.wait_closed()
    return received


async def serve_and_probe() -> dict[str, list[Message]]:
    user = UserCode(Doubler, (), {}, 4)
    await user.construct()
    server = ReplicaServer(user, 4, "test:Doubler")
    listener = await asyncio.get_running_loop().create_server(
        server.protocol_requiring(TOKEN), "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    call = Call(id=1, method="double", payload=pickle.dumps(((21,), {})))
    results = {}
    try:
        for name, frames in (("no handshake", [call]),  # a raw token is no handshake:
                             ("raw token", [Rpc(id=0, method=AUTHENTICATE,
                                                payload=TOKEN.encode()), call])):
            conn = await connect(port)
            conn.send(*frames)
            results[name] = await conn.receive()
            conn.writer.close()
            await conn.writer.wait_closed()
        results["wrong token"] = await handshake_then_call(port, "a-guess", call)
        results["right token"] = await handshake_then_call(port, TOKEN, call)
    finally:
        listener.close()
        user.close()
    return results


def test_tcp_replica_requires_the_handshake_before_any_call() -> None:
    results = asyncio.run(serve_and_probe())
    assert results["no handshake"] == []  # closed without running anything
    assert results["raw token"] == []
    assert results["wrong token"] == []  # the client saw the replica's proof fail
    right = results["right token"]
    assert len(right) == 1 and isinstance(right[0], Result)
    assert pickle.loads(right[0].payload) == 42


async def link_to_impostor() -> BaseException | None:
    """A router's link to a TCP 'replica' that knows another token."""
    impostor = ReplicaServer(UserCode(Doubler, (), {}, 4), 4, "impostor")
    listener = await asyncio.get_running_loop().create_server(
        impostor.protocol_requiring("another-token"), "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    link = ReplicaLink("r1", lambda link, pending, message: None, lambda link: None)
    link.require_handshake(TOKEN)
    try:
        await asyncio.get_running_loop().create_connection(lambda: link, "127.0.0.1", port)
        try:
            await asyncio.wait_for(link.trusted, 5.0)
        except HandshakeFailed as exc:
            return exc
        return None
    finally:
        listener.close()


def test_a_router_never_trusts_a_replica_that_cannot_prove_the_token() -> None:
    failure = asyncio.run(link_to_impostor())
    assert isinstance(failure, ServerUnproven)
