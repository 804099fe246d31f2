"""The asyncio shell of one gRPC connection: bytes from the socket into its sans-IO
core (proxy/grpc_core.py), the core's decisions carried out.

After every read, router frame or deadline the shell applies what the core decided, in
its order (`GrpcCore`'s docstring): submits to the target's router (a refusal goes back
to the core, which ends the call), deadlines armed, frames for the replica sent on the
call's link, acknowledgements, cancels, ended calls counted and recorded, reflection
streams started and woken for their questions (grpcio-reflection's servicer is async).
Then the bytes are written: after a read or a deadline at once, after a router frame at
the loop's next turn (a burst of frames is one write). While the socket is full the
connection reads nothing more and the core holds acknowledgements.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from surge.codecs.h2 import H2Error
from surge.codecs.h2_send import HeldLimitError
from surge.errors import BackPressureError, DeploymentUnavailableError
from surge.proxy.grpc_call import GrpcCall
from surge.proxy.grpc_core import GrpcCore
from surge.proxy.grpc_ingress import GrpcIngress
from surge.proxy.grpc_status import Code, truncate
from surge.router.replica_link import is_final
from surge.transport.messages import Message

__all__ = ["GrpcConnection"]

log = logging.getLogger("surge.proxy")


class GrpcConnection(asyncio.Protocol):
    __slots__ = ("_asked", "_flush_scheduled", "_preface_timer", "core", "ingress",
                 "transport")

    def __init__(self, ingress: GrpcIngress) -> None:
        self.ingress = ingress
        self.core = GrpcCore(ingress, ingress.proxy.now, self)
        self.transport: asyncio.Transport | None = None
        self._flush_scheduled = False
        self._preface_timer: asyncio.TimerHandle | None = None
        self._asked: dict[GrpcCall, asyncio.Event] = {}  # a reflection task's wake-up

    def __repr__(self) -> str:
        return f"<GrpcConnection {self.core!r}>"

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.core.peer = f"ipv6:[{peer[0]}]:{peer[1]}" if ":" in peer[0] else \
                f"ipv4:{peer[0]}:{peer[1]}"
        ingress = self.ingress
        if len(ingress.connections) >= ingress.proxy.spec.max_connections:
            self.core.h2.goaway()  # too many connections: this one serves nothing
            self._flush()
            transport.close()
            return
        ingress.connections.add(self)
        if ingress.draining:
            self.core.h2.goaway()
        # A client that never starts HTTP/2 is closed as slow headers are over HTTP/1.1.
        self._preface_timer = ingress.loop.call_later(
            ingress.proxy.spec.request_header_timeout_s, self._no_preface)
        self._flush()

    def _no_preface(self) -> None:
        self._preface_timer = None
        log.debug("gRPC connection %s closed: no HTTP/2 preface in time", self.core.peer)
        self.close()

    def data_received(self, data: bytes) -> None:
        core = self.core
        try:
            core.receive(data)
            if self._preface_timer is not None and core.h2.started:
                self._preface_timer.cancel()
                self._preface_timer = None
        except H2Error as exc:
            log.debug("gRPC connection %s closed: %s", core.peer, exc)
            self._apply()
            self._flush()
            self.close()
            return
        self._apply()
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ingress.connections.discard(self)
        self.transport = None
        if self._preface_timer is not None:
            self._preface_timer.cancel()
            self._preface_timer = None
        self.core.lost()
        self._apply()

    def pause_writing(self) -> None:
        self.core.pause_writing()
        if self.transport is not None:
            self.transport.pause_reading()  # nothing more in while nothing goes out

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()
        self.core.resume_writing()
        self._apply()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def going_away(self) -> None:
        self.core.going_away()
        self._flush()

    def busy(self) -> bool:
        return self.core.busy()

    # -- the router's side (GrpcCall.sink) -------------------------------------------------

    def delivered(self, call: GrpcCall, message: Message) -> None:
        """A frame of the call's answer, from its replica."""
        try:
            self.core.delivered(call, message)
        except Exception as exc:  # one call's bad answer must not close the replica's link
            log.exception("gRPC call %s: its answer could not be sent", call.request_id)
            self.core.unsendable(call, exc, settled=is_final(message))
        self._apply()
        self._flush_soon()

    def failed(self, call: GrpcCall, exc: BaseException) -> None:
        """The router gave up on the call (its replica died, no replica will come)."""
        self.core.failed(call, exc)
        self._apply()
        self._flush_soon()

    # -- carrying out the core's decisions -------------------------------------------------

    def _apply(self) -> None:
        core, ingress = self.core, self.ingress
        if core.submits:
            submits, core.submits = core.submits, []
            for call in submits:
                self._submit(call)
        if core.timers:
            timers, core.timers = core.timers, []
            for call, timeout in timers:
                if not call.ended:
                    call.timer = ingress.loop.call_later(timeout, self._timed_out, call,
                                                         timeout)
        if core.sends:
            sends, core.sends = core.sends, []
            for call, message in sends:
                pending = call.pending
                if pending is not None and pending.link is not None:
                    pending.link.send(message)
        if core.acks:
            acks, core.acks = core.acks, []
            for pending, nbytes in acks:
                pending.consumed(nbytes)
        if core.cancels:
            cancels, core.cancels = core.cancels, []
            for call in cancels:
                if call.submitted and call.pending is not None and call.router is not None:
                    call.router.cancel(call.pending)
        if core.ended:
            ended, core.ended = core.ended, []
            for call, code in ended:
                self._ended(call, code)
        if core.reflecting:
            reflecting, core.reflecting = core.reflecting, []
            for call in reflecting:
                if not call.ended:
                    asked = self._asked[call] = asyncio.Event()
                    call.task = ingress.loop.create_task(self._reflect(call, asked))
        if core.asked:
            calls, core.asked = core.asked, []
            for call in calls:
                if (event := self._asked.get(call)) is not None:
                    event.set()

    def _submit(self, call: GrpcCall) -> None:
        if call.ended:  # ended in the same read (reset, deadline): never sent
            call.submitted = False
            return
        ingress, target, pending = self.ingress, call.target, call.pending
        assert target is not None and pending is not None
        router = call.router = ingress.router(target)
        try:
            router.submit(pending)
        except (BackPressureError, DeploymentUnavailableError) as exc:
            reason = self.core.refused(call, exc)
            ingress.proxy.recorder.rejected(target.app, target.deployment, reason)
            return
        ingress.ongoing += 1

    def _ended(self, call: GrpcCall, code: int) -> None:
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if call.task is not None:
            call.task.cancel()
            self._asked.pop(call, None)
        if call.submitted:
            self.ingress.ongoing -= 1
        self.ingress.record(call, code)
        call.release()

    def _timed_out(self, call: GrpcCall, timeout_s: float) -> None:
        call.timer = None
        self.core.timed_out(call, timeout_s)
        self._apply()
        self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self.core.h2.out
        if out:
            transport = self.transport
            if transport is not None and not transport.is_closing():
                transport.writelines(out)
            out.clear()

    def _flush_soon(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.ingress.loop.call_soon(self._flush)

    # -- reflection: a stream both ways, answered by grpcio-reflection's servicer ----------

    async def _reflect(self, call: GrpcCall, asked: asyncio.Event) -> None:
        questions, core = call.questions, self.core
        assert questions is not None

        async def requests() -> AsyncIterator[bytes]:
            while True:
                while not questions:
                    asked.clear()
                    await asked.wait()
                body = questions.popleft()
                if body is None:
                    return
                yield body

        try:
            async for response in self.ingress.local.reflect(requests()):
                core.send_message(call, response, ack=False)
                self._flush_soon()
            core.end(call, Code.OK, "")
        except HeldLimitError as exc:  # a client that asks and never reads
            core.end(call, Code.RESOURCE_EXHAUSTED, str(exc))
        except Exception as exc:
            core.end(call, Code.INTERNAL, truncate(str(exc)))
        self._apply()
        self._flush()
