"""transport.rpc pushes: one pickle for many peers (broadcast), repeats not unpickled."""

from __future__ import annotations

import asyncio
from typing import Any

from surge.model import DeploymentId, LoadReport
from surge.testing import FakePeer
from surge.transport.rpc import RpcPeer, broadcast, connect_rpc

TOKEN = "the-token"
REPORT = [LoadReport(DeploymentId("app", "M"), 3, 3, 0, 0, 1)]


class Collector:
    memo_topics = frozenset({"load"})

    def __init__(self) -> None:
        self.pushes: list[tuple[str, Any]] = []
        self.arrived = asyncio.Event()

    async def handle_rpc(self, peer: RpcPeer, method: str, kwargs: dict[str, Any]) -> Any:
        return None

    def on_push(self, peer: RpcPeer, topic: str, value: Any) -> None:
        self.pushes.append((topic, value))
        if len(self.pushes) == 4:
            self.arrived.set()

    def on_disconnect(self, peer: RpcPeer) -> None:
        pass


def test_broadcast_pickles_once_and_repeated_payloads_are_the_same_value() -> None:
    async def main() -> Collector:
        collector = Collector()
        server = await asyncio.get_running_loop().create_server(
            lambda: RpcPeer(collector, TOKEN), "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        client = await connect_rpc(address, None, token=TOKEN)
        fake = FakePeer("router")
        size = broadcast([client, fake], "load", REPORT)  # a fake gets the value itself
        assert size > 0 and fake.pushed("load") == [REPORT]
        client.push("load", REPORT)  # the same bytes again
        client.push("other", REPORT)
        client.push("other", REPORT)
        await asyncio.wait_for(collector.arrived.wait(), 10)
        client.close()
        server.close()
        return collector

    collector = asyncio.run(main())
    (_, a), (_, b), (_, c), (_, d) = collector.pushes
    assert a == b == c == d == REPORT
    assert a is b  # memo topic: the repeat was not unpickled
    assert c is not d  # not a memo topic
