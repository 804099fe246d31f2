"""transport.gate: handshakes a bounded few at a time, first come first served."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop

from surge.testing import FakeClock
from surge.transport.gate import HandshakeGate
from surge.transport.rpc import RpcPeer, connect_rpc

TOKEN = "the-token"


class Waiting:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log, self.is_closed = name, log, False

        self.hung_up = False

    def admitted(self) -> None:
        self.log.append(self.name)

    def close(self) -> None:
        self.hung_up = True


def test_beyond_the_limit_connections_wait_in_order_and_closed_ones_are_skipped() -> None:
    gate, log = HandshakeGate(limit=2), []
    a, b, c, d, e = (Waiting(n, log) for n in "abcde")
    assert [gate.enter(x) for x in (a, b, c, d, e)] == [True, True, False, False, False]
    d.is_closed = e.is_closed = True
    gate.forget(e)  # closed while waiting
    gate.leave(a)
    assert log == ["c"]
    gate.leave(b)  # d and e closed meanwhile: nobody else waits
    assert log == ["c"] and (gate.running, len(gate.waiting)) == (1, 0)
    assert (gate.admitted_total, gate.queued_total) == (3, 3)
    with pytest.raises(ValueError):
        HandshakeGate(limit=0)


def test_a_connection_that_waited_past_its_clients_patience_is_closed_unread() -> None:
    clock, log = FakeClock(), []
    gate = HandshakeGate(limit=1, patience_s=25.0, clock=clock)
    first, stale, fresh = (Waiting(n, log) for n in ("first", "stale", "fresh"))
    assert gate.enter(first)
    assert not gate.enter(stale)
    clock.advance(20.0)
    assert not gate.enter(fresh)
    clock.advance(6.0)  # stale has waited 26 s, fresh 6 s
    gate.leave(first)
    assert log == ["fresh"] and stale.hung_up and not fresh.hung_up
    assert (gate.expired_total, gate.admitted_total, gate.running) == (1, 2, 1)


class Handler:
    async def handle_rpc(self, peer: RpcPeer, method: str, kwargs: dict[str, Any]) -> Any:
        return method

    def on_push(self, peer: RpcPeer, topic: str, value: Any) -> None:
        pass

    def on_disconnect(self, peer: RpcPeer) -> None:
        pass


class Noting(RpcPeer):
    """The accepting end, noting when it was let in and when its handshake ended."""

    def __init__(self, gate: HandshakeGate, seen: list[Noting]) -> None:
        super().__init__(Handler(), TOKEN, gate)
        self.events: list[str] = []
        seen.append(self)

    def admitted(self) -> None:
        self.events.append("admitted")
        super().admitted()

    def token_accepted(self) -> None:
        self.events.append("accepted")
        super().token_accepted()


def test_a_herd_of_clients_all_get_in_through_a_gate_of_one() -> None:
    async def main() -> HandshakeGate:
        gate = HandshakeGate(limit=1)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: RpcPeer(Handler(), TOKEN, gate),
                                          "127.0.0.1", 0, backlog=256)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        peers = await asyncio.gather(*(connect_rpc(address, None, token=TOKEN)
                                       for _ in range(40)))
        answers = await asyncio.gather(*(peer.call("hello") for peer in peers))
        for peer in peers:
            peer.close()
        server.close()
        assert answers == ["hello"] * 40
        return gate

    gate = asyncio.run(main())
    assert gate.admitted_total == 40 and gate.queued_total > 0
    assert (gate.running, len(gate.waiting)) == (0, 0)


# uvloop reads a connection paused in connection_made all the same: there a queued
# connection's handshake once ran past the gate, and its turn, when it came, put the
# authenticated connection on the pre-auth deadline (closed 10 s later).
@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_queued_clients_wait_for_their_turn_on_either_event_loop(run: Any) -> None:
    seen: list[Noting] = []

    async def main() -> HandshakeGate:
        gate = HandshakeGate(limit=1)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Noting(gate, seen), "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()[:2]
        _, silent = await asyncio.open_connection(host, port)  # holds the one turn
        clients: list[asyncio.Task[RpcPeer]] = []
        try:
            while not seen:
                await asyncio.sleep(0.01)
            clients += [loop.create_task(connect_rpc(f"{host}:{port}", None, token=TOKEN))
                        for _ in range(5)]
            await asyncio.sleep(0.3)  # time for five handshakes, had they run
            assert not any(client.done() for client in clients)
            assert gate.running == 1 and len(gate.waiting) == 5
            silent.close()  # its turn ends: the others', one at a time
            for peer in await asyncio.gather(*clients):
                peer.close()
        finally:  # a failure above ends the loop cleanly (uvloop waits on what is open)
            silent.close()
            for client in clients:
                if client.done() and not client.cancelled() and client.exception() is None:
                    client.result().close()
                client.cancel()
            for peer in seen:
                peer.close()
            server.close()
        return gate

    gate = run(main())
    assert (gate.admitted_total, gate.running, len(gate.waiting)) == (6, 0, 0)
    # Each queued connection's handshake ran once it was let in, so each was
    # authenticated after the deadline it was given, which that cancelled.
    assert [p.events for p in seen] == [[]] + [["admitted", "accepted"]] * 5
