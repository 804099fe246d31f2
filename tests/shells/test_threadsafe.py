"""ThreadSafeProtocol on real sockets, on asyncio's loop and on uvloop: frames sent from
other threads keep their order; what the kernel cannot take waits without being
overtaken; reading lent to a thread is handed back on `reclaim`, at the end of the
stream and at close. Waits are on state (`eventually_async`, thread joins), never sleeps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from surge.transport.connection import FramedProtocol
from surge.transport.messages import End, Item, Message
from surge.transport.threadsafe import READ_BYTES, ThreadSafeProtocol
from tests.eventually import eventually_async

WAIT_S = 5.0

Runner = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    def runner(coro: Coroutine[Any, Any, None]) -> None:
        wrapped = asyncio.wait_for(coro, 20)
        if request.param == "uvloop":
            uvloop.run(wrapped)
        else:
            asyncio.run(wrapped)

    return runner


class Peer(FramedProtocol):
    """The far end: records what it receives; sends on request."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[Message] = []

    def message_received(self, message: Message) -> None:
        self.received.append(message)


class Client(ThreadSafeProtocol):
    def __init__(self) -> None:
        super().__init__()
        self.received: list[tuple[int, Message]] = []  # (thread that handled it, frame)
        self.lost = False

    def message_received(self, message: Message) -> None:
        self.received.append((threading.get_ident(), message))

    def closed(self, exc: Exception | None) -> None:
        self.lost = True


async def connected() -> tuple[Client, Peer, asyncio.Server]:
    loop = asyncio.get_running_loop()
    peers: list[Peer] = []

    def make_peer() -> Peer:
        peers.append(Peer())
        return peers[-1]

    server = await loop.create_server(make_peer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, client = await loop.create_connection(Client, "127.0.0.1", port)
    await eventually_async(lambda: peers and peers[0].transport is not None, WAIT_S,
                           what="the peer accepted")
    return client, peers[0], server


def item(n: int, size: int = 1) -> Item:
    return Item(id=n, payload=bytes([n % 256]) * size)


async def in_thread(function: Callable[[], Any]) -> Any:
    """Run `function` on a thread of its own (not the loop's) and wait for it."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(function()))
    thread.start()
    await asyncio.get_running_loop().run_in_executor(None, thread.join)
    return result[0] if result else None


def test_frames_from_the_loop_and_other_threads_arrive_in_send_order(run: Runner) -> None:
    async def main() -> None:
        client, peer, server = await connected()
        client.send(item(1))  # on the loop: coalesced, still in the buffer

        def from_thread() -> int:
            client.send(item(2))  # written at once, after what the loop buffered
            client.send(item(3))
            return len(client._out)

        assert await in_thread(from_thread) == 0
        client.send(item(4))
        await eventually_async(lambda: len(peer.received) == 4, WAIT_S)
        assert [m.id for m in peer.received] == [1, 2, 3, 4]  # type: ignore[union-attr]
        client.close()
        server.close()

    run(main())


def test_what_the_kernel_cannot_take_waits_and_nothing_overtakes_it(run: Runner) -> None:
    async def main() -> None:
        client, peer, server = await connected()
        assert peer.transport is not None
        peer.transport.pause_reading()  # the socket buffers fill up
        big = item(7, size=32 * 1024 * 1024)

        def from_thread() -> bool:
            client.send(big)
            blocked = client._blocked  # the rest waits for the loop to write it
            client.send(item(8))  # ...and this waits behind it
            return blocked

        assert await in_thread(from_thread)
        client.send(item(9))
        peer.transport.resume_reading()
        await eventually_async(lambda: len(peer.received) == 3, WAIT_S)
        assert [m.id for m in peer.received] == [7, 8, 9]  # type: ignore[union-attr]
        assert peer.received[0] == big
        assert not client._blocked and not client._out
        client.close()
        server.close()

    run(main())


def test_a_close_while_the_kernel_is_full_still_sends_everything(run: Runner) -> None:
    async def main() -> None:
        client, peer, server = await connected()
        assert peer.transport is not None
        peer.transport.pause_reading()
        big = item(7, size=32 * 1024 * 1024)
        assert await in_thread(lambda: (client.send(big), client._blocked)[1])
        client.send(item(8))
        client.close()  # graceful: what waits in `_out` goes before the FIN
        await in_thread(lambda: client.send(item(9)))  # too late: dropped, not interleaved
        peer.transport.resume_reading()
        await eventually_async(lambda: client.lost and peer.is_closed, WAIT_S)
        assert [m.id for m in peer.received] == [7, 8]  # type: ignore[union-attr]
        assert peer.received[0] == big
        server.close()

    run(main())


class SocketlessTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[tuple[int, bytes]] = []  # (writing thread, bytes)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append((threading.get_ident(), bytes(data)))

    def is_closing(self) -> bool:
        return False


def test_without_a_socket_other_threads_frames_go_through_the_loop(run: Runner) -> None:
    async def main() -> None:
        client = Client()
        transport = SocketlessTransport()
        client.connection_made(transport)
        await in_thread(lambda: client.send(End(id=1)))
        await eventually_async(lambda: transport.written, WAIT_S)
        # written by the loop's thread: the transport is the loop's
        assert transport.written == [(threading.get_ident(), client._encoder.encode(End(id=1)))]

    run(main())


def test_a_lent_link_is_read_by_the_waiting_thread_until_reclaimed(run: Runner) -> None:
    async def main() -> None:
        client, peer, server = await connected()
        client.lend()
        assert client.lent
        peer.send(item(1))
        thread = await in_thread(lambda: (
            client.read_until(lambda: len(client.received) == 1, lambda: None),
            threading.get_ident())[1])
        assert client.received == [(thread, item(1))]  # handled on the reading thread
        client.reclaim()
        assert not client.lent
        peer.send(item(2))
        await eventually_async(lambda: len(client.received) == 2, WAIT_S)
        assert client.received[1] == (threading.get_ident(), item(2))  # on the loop again
        client.close()
        server.close()

    run(main())


def test_a_thread_reads_into_one_buffer_and_every_frame_keeps_its_bytes(run: Runner) -> None:
    """The reading thread reuses its buffer: a frame longer than one read (READ_BYTES),
    then others, each read into the same bytes, all arrive whole."""
    async def main() -> None:
        client, peer, server = await connected()
        client.lend()
        frames = [item(1, READ_BYTES + 1000), item(2, 10), item(3, 70_000)]

        def read_each() -> None:
            for count, frame in enumerate(frames, 1):
                asyncio.run_coroutine_threadsafe(_send(peer, frame), loop).result(WAIT_S)
                deadline = time.monotonic() + WAIT_S
                client.read_until(lambda c=count: len(client.received) == c,
                                  lambda d=deadline: d - time.monotonic())

        loop = asyncio.get_running_loop()
        await in_thread(read_each)
        assert [message for _, message in client.received] == frames
        client.close()
        server.close()

    run(main())


async def _send(peer: Peer, frame: Message) -> None:
    peer.send(frame)


def test_reclaim_wakes_a_reading_thread_which_hands_the_reading_back(run: Runner) -> None:
    async def main() -> None:
        client, peer, server = await connected()
        client.lend()
        reader = threading.Thread(target=client.read_until,
                                  args=(lambda: False, lambda: None))  # waits for nothing
        reader.start()
        await eventually_async(lambda: client.reading, WAIT_S, what="the thread polling")
        client.reclaim()  # it is reading: asked to stop, it hands the reading back
        await asyncio.get_running_loop().run_in_executor(None, reader.join)
        await eventually_async(lambda: not client.lent, WAIT_S, what="reading handed back")
        peer.send(item(3))
        await eventually_async(lambda: client.received, WAIT_S)
        assert client.received == [(threading.get_ident(), item(3))]
        client.close()
        server.close()

    run(main())


def test_read_until_gives_up_at_the_deadline(run: Runner) -> None:
    async def main() -> None:
        client, _, server = await connected()
        client.lend()
        await in_thread(lambda: client.read_until(lambda: False, lambda: 0.0))
        assert client.lent and not client.reading  # still lent: the thread may come back
        client.close()
        server.close()

    run(main())


def test_the_end_of_the_stream_seen_by_a_thread_reaches_the_transport(run: Runner) -> None:
    async def main() -> None:
        client, peer, server = await connected()
        client.lend()
        reader = threading.Thread(target=client.read_until,
                                  args=(lambda: False, lambda: None))
        reader.start()
        await eventually_async(lambda: client.reading, WAIT_S, what="the thread polling")
        peer.close()
        await asyncio.get_running_loop().run_in_executor(None, reader.join)
        await eventually_async(lambda: client.lost, WAIT_S, what="connection_lost")
        assert client._sock is None
        server.close()

    run(main())


def test_closing_wakes_a_reading_thread_which_closes_what_it_polled(run: Runner) -> None:
    async def main() -> None:
        client, _, server = await connected()
        client.lend()
        reader = threading.Thread(target=client.read_until,
                                  args=(lambda: False, lambda: None))
        reader.start()
        await eventually_async(lambda: client.reading, WAIT_S, what="the thread polling")
        client.close()
        await eventually_async(lambda: client.lost, WAIT_S, what="connection_lost")
        await asyncio.get_running_loop().run_in_executor(None, reader.join)
        assert client._left_to_reader == []  # its fds were closed once it stopped polling
        server.close()

    run(main())
