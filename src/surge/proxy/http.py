"""The asyncio shell of an HTTP/1.1 connection: a thin Protocol around `h1.H1Connection`.

Bytes, timer ticks, writing pauses and the router's frames go into the sans-IO core;
`_act` then carries out what it decided (see `proxy/h1.py` for the order): requests go
to their route's router as `Pending`s with their deadline armed (an OpenAI app's chat,
completions and embeddings to their model's deployment's router when the body names
the model: `_by_model`), cancels to the router, bytes to the transport,
acknowledgements of streamed bytes to `Pending.consumed`, answered requests to
`Proxy.record`. A client that goes away cancels its requests
through the router, unless it sent `x-request-disconnect-disabled: ?1`. A connection
the core closes with `reset` (a stream cut by its deadline) is aborted with SO_LINGER 0,
so the client gets a TCP reset, as from Ray Serve's proxy, rather than a FIN.

Flow control, both ways: the core asks to pause reading while MAX_PIPELINED responses
are owed or while a replica's window for a streamed upload or WebSocket is shut
(`upload_paused`; their frames go out as `sends`), and while the transport has paused
writing (its buffer is full) it holds the acknowledgements of streamed bytes, so
replicas stop sending until the client reads.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

from surge.errors import BackPressureError, DeploymentUnavailableError
from surge.policy.llm_models import decode_model, lora_model_id, path_model
from surge.proxy.exchange import Exchange
from surge.proxy.h1 import H1Connection
from surge.proxy.h1_state import Conn, Phase
from surge.proxy.host import Host
from surge.proxy.routes import Route
from surge.proxy.ws_exchange import WsExchange
from surge.router.replica_link import Pending
from surge.transport.messages import HttpRequest, Message

__all__ = ["HttpConnection"]

CLOSED, WAITING, DONE, DETACHED = Conn.CLOSED, Phase.WAITING, Phase.DONE, Phase.DETACHED
TOO_MANY = b"Too many connections; retry later."
_LINGER_0 = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST and drops the rest


def _reset(transport: asyncio.Transport) -> None:
    """Close with a TCP reset: what is still unsent is dropped (the client's read of it
    fails as a broken connection, which is the point)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
        except OSError:  # already gone: the abort below is all there is to do
            pass
    transport.abort()


class HttpConnection(asyncio.Protocol):
    __slots__ = ("_acting", "_again", "_reading_paused", "client", "core", "proxy",
                 "transport")

    def __init__(self, proxy: Host) -> None:
        self.proxy = proxy
        self.core = H1Connection(proxy.site, self._act)
        self.transport: asyncio.Transport | None = None
        self.client = ""  # "ip:port" of the peer, as the replica's request.client
        self._acting = False
        self._again = False
        self._reading_paused = False  # what the transport was last told

    def __repr__(self) -> str:
        return f"<HttpConnection {self.client} {self.core!r}>"

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        proxy = self.proxy
        if len(proxy.connections) >= proxy.spec.max_connections:
            self.core.decline(503, TOO_MANY, ((b"retry-after", b"1"),), "connection_limit")
        else:
            proxy.connections.add(self)
        self._act()

    def data_received(self, data: bytes) -> None:
        self.core.receive_data(data)
        self._act()

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.connections.discard(self)
        self.transport = None
        self.core.connection_lost()
        self._act()

    def pause_writing(self) -> None:
        self.core.pause_writing()

    def resume_writing(self) -> None:
        self.core.resume_writing()
        self._act()

    # -- timers ----------------------------------------------------------------------------

    def timed_out(self, exchange: Exchange, timeout_s: float) -> None:
        exchange.timer = None
        exchange.timed_out(timeout_s)
        self._act()

    def sweep(self, now: float) -> None:
        self.core.check_time(now)
        self._act()

    def going_away(self) -> None:
        """The proxy stops: an open WebSocket is closed with 1001 rather than cut."""
        websocket = self.core.uploading
        if isinstance(websocket, WsExchange):
            websocket.going_away("proxy shutting down")
            self._act()

    # -- carrying out the core's decisions -------------------------------------------------

    def _act(self) -> None:
        """Carry out what the core decided, in the order proxy/h1.py gives."""
        if self._acting:  # a frame delivered while we act: the loop below picks it up
            self._again = True
            return
        self._acting = True
        core = self.core
        try:
            while True:
                if core.dispatch:
                    self._dispatch_all(core.dispatch)
                if core.sends:  # before records: a closed WebSocket's last word
                    self._send_upstream(core.sends)
                out = core.out
                if out:
                    if self.transport is not None:
                        self.transport.write(out[0] if len(out) == 1 else b"".join(out))
                    out.clear()
                if core.cancels or core.acks:
                    self._stop_and_grant(core)
                records = core.records
                if records:
                    record = self.proxy.record
                    for exchange in records:
                        if exchange.timer is not None:
                            self._disarm(exchange)
                        record(exchange)
                        if exchange.phase is DONE and not (exchange.buffered or exchange.held):
                            # Nothing more to tell its Pending (it points back at the
                            # exchange): no cycle is left for the garbage collector.
                            exchange.pending = None
                    records.clear()
                if core.settled or core.rejections:
                    self._settle_and_count(core)
                if (core.state is CLOSED or core.upload_paused
                        or core.reading_paused is not self._reading_paused):
                    self._flow(core)
                if not self._again:
                    return
                self._again = False
        finally:
            self._acting = False

    def _dispatch_all(self, dispatch: list[Exchange]) -> None:
        index = 0
        while index < len(dispatch):  # an answer at once may let a queued one in
            self._dispatch(dispatch[index])
            index += 1
        dispatch.clear()

    def _stop_and_grant(self, core: H1Connection) -> None:
        for exchange in core.cancels:
            if exchange.pending is not None:
                exchange.head.route.router.cancel(exchange.pending)  # type: ignore[union-attr]
        core.cancels.clear()
        # After the write above: the bytes a grant stands for are with the transport.
        for exchange, nbytes in core.acks:
            if exchange.pending is not None:
                exchange.pending.consumed(nbytes)
        core.acks.clear()

    def _send_upstream(self, sends: list[tuple[Exchange, Message]]) -> None:
        """A request's own stream, to the replica that has it (it granted the room)."""
        for exchange, frame in sends:
            pending = exchange.pending
            if pending is not None and pending.link is not None and not pending.cancelled:
                frame.id = pending.message.id  # type: ignore[union-attr]
                pending.link.send(frame)
        sends.clear()

    def _disarm(self, exchange: Exchange) -> None:
        if exchange.phase is not DETACHED:  # a detached request's deadline still holds
            exchange.timer.cancel()
            exchange.timer = None

    def _settle_and_count(self, core: H1Connection) -> None:
        for exchange in core.settled:
            if exchange.timer is not None:
                exchange.timer.cancel()
                exchange.timer = None
        core.settled.clear()
        rejected = self.proxy.recorder.rejected
        for app, deployment, reason in core.rejections:
            rejected(app, deployment, reason)
        core.rejections.clear()

    def _flow(self, core: H1Connection) -> None:
        transport = self.transport
        if transport is None:
            return
        if core.state is CLOSED:
            if not transport.is_closing():
                if core.reset:
                    _reset(transport)
                else:
                    transport.close()
        else:
            paused = core.reading_paused or core.upload_paused
            if paused is not self._reading_paused:
                self._reading_paused = paused
                if paused:
                    transport.pause_reading()
                else:
                    transport.resume_reading()

    def _dispatch(self, exchange: Exchange) -> None:
        head = exchange.head
        route = head.route
        assert route is not None  # only routed requests are dispatched
        if route.models is not None:
            route = self._by_model(exchange, route)
        proxy = self.proxy
        router = route.router
        model_id = head.model_id
        lora_base = getattr(router, "lora_base", "")  # an LLM server with LoRA adapters
        if lora_base and not model_id:
            if exchange.body and exchange.upstream is None:
                model_id = lora_model_id(decode_model(exchange.body), lora_base)
            elif head.method == "GET":  # a model card: where the adapter is
                model_id = lora_model_id(path_model(head.path), lora_base)
        request = HttpRequest(0, head.method, head.path, head.query, head.headers, exchange.body,
                              self.client, route.prefix, head.request_id.decode(),
                              head.http_version, proxy.spec.root_path, head.raw_path,
                              proxy.site.scheme, model_id)
        if exchange.upstream is not None:  # the rest of its body, or a WebSocket, follows
            if isinstance(exchange, WsExchange):
                request.upgrade = "websocket"
            else:
                request.more_body = True
        pending = exchange.pending = Pending(request, exchange)
        try:
            router.submit(pending)
        except (BackPressureError, DeploymentUnavailableError) as exc:
            exchange.on_failure(exc)
            return
        except Exception as exc:
            # Never leave the exchange unanswered: every later response waits behind it.
            router.cancel(pending)
            exchange.on_failure(exc)
            return
        timeout = head.timeout
        if timeout is not None and exchange.phase is WAITING:
            exchange.timer = proxy.loop.call_later(timeout, self.timed_out, exchange, timeout)

    def _by_model(self, exchange: Exchange, route: Route[Any]) -> Route[Any]:
        """An OpenAI app's request goes straight to its model's deployment when the body
        says which (policy/openai_route.py); its cancels and metrics follow it there."""
        head = exchange.head
        models = route.models
        assert models is not None
        chosen = models.route_for(head.method, head.path, exchange.body,
                                  exchange.upstream is not None)
        if chosen is None:
            return route
        head.route = chosen
        head.labels = chosen.labels
        return chosen
