"""A replica reached over TCP (multi-node backends) serves only connections that
present the control token first: handle calls carry pickled arguments."""

from __future__ import annotations

import asyncio
import pickle

from surge.replica.server import ReplicaServer
from surge.replica.user_code import UserCode
from surge.transport.framing import FrameDecoder, FrameEncoder
from surge.transport.messages import Call, Message, Result, Rpc
from surge.transport.rpc import AUTHENTICATE

TOKEN = "the-control-token"


class Doubler:
    def double(self, value: int) -> int:
        return value * 2


async def exchange(port: int, *messages: Message) -> list[Message]:
    """Send the frames; return what came back before the replica closed or went quiet."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    encoder, decoder = FrameEncoder(), FrameDecoder()
    writer.write(b"".join(encoder.encode(m) for m in messages))
    await writer.drain()
    received: list[Message] = []
    try:
        while not received:
            data = await asyncio.wait_for(reader.read(65536), 2.0)
            if not data:
                break  # closed by the replica
            received += decoder.feed(data)
    except TimeoutError:
        pass
    writer.close()
    return received


async def serve_and_probe() -> tuple[list[Message], list[Message], list[Message]]:
    user = UserCode(Doubler, (), {}, 4)
    await user.construct()
    server = ReplicaServer(user, 4, "test:Doubler")
    listener = await asyncio.get_running_loop().create_server(
        server.protocol_requiring(TOKEN), "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    call = Call(id=1, method="double", payload=pickle.dumps(((21,), {})))
    try:
        without = await exchange(port, call)
        wrong = await exchange(port, Rpc(id=0, method=AUTHENTICATE, payload=b"guess"), call)
        right = await exchange(port, Rpc(id=0, method=AUTHENTICATE, payload=TOKEN.encode()),
                               call)
    finally:
        listener.close()
        user.close()
    return without, wrong, right


def test_tcp_replica_requires_the_token_before_any_call() -> None:
    without, wrong, right = asyncio.run(serve_and_probe())
    assert without == [] and wrong == []  # closed without running anything
    assert len(right) == 1 and isinstance(right[0], Result)
    assert pickle.loads(right[0].payload) == 42
