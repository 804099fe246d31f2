"""gRPC ingress: Ray Serve's gRPC proxy on surge's data path, bytes through.

The proxy process runs a grpc.aio server beside its HTTP server, on the same event loop,
on `gRPCOptions.port` (every worker of a node binds it with SO_REUSEPORT). It has one
handler of the right kind for every method of the servicers named in
`grpc_servicer_functions` (learned by calling each with a recording server,
transport/grpc_methods.py), with no deserializer and no serializer: a request's bytes go
to the replica in a `GrpcRequest` frame and the response's bytes come back, so a message
is parsed once, in the replica, the only process that needs the user's `_pb2`.

A call names its application in the `application` metadata (any name, or none, picks the
only one) and reaches the deployment's method named like the RPC, through the app's
ingress Router: the admission path, queue limits and backpressure of HTTP. Its deadline
(the client's, capped by `request_timeout_s`) becomes the request's timeout, and a client
that goes away cancels it at the replica. Client streams flow only as the replica pulls
them (`Pull`); response streams are flow-controlled like HTTP's (transport/flow.py).
Statuses are decided in proxy/grpc_status.py; `request_id` always comes back in the
trailing metadata.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio

from surge.errors import BackPressureError, ConfigError, DeploymentUnavailableError
from surge.model import DeploymentId, ProxySpec, RouteTable, RouteTarget
from surge.policy.auth import check_bearer
from surge.proxy.grpc_status import (
    CODE_NAMES,
    HEALTHZ,
    LIST_APPLICATIONS,
    Code,
    Timeout,
    choose_app,
    metadata_value,
    status_of,
    truncate,
)
from surge.router.replica_link import Pending
from surge.transport.grpc_methods import GrpcMethod, methods_of, pack_metadata, unpack_metadata
from surge.transport.messages import (
    Failure,
    GrpcEnd,
    GrpcMessage,
    GrpcRequest,
    Item,
    Message,
    Pull,
)

if TYPE_CHECKING:
    from surge.proxy.server import Proxy

__all__ = ["GRPC_SERVER_OPTIONS", "GrpcIngress", "start_grpc"]

log = logging.getLogger("surge.proxy")

# Ray Serve's message size limit, both ways: 2 GiB - 1 (grpc's own default is 4 MiB in).
MAX_MESSAGE_BYTES = 2**31 - 1
GRPC_SERVER_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                       ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                       ("grpc.so_reuseport", 1)]
_STATUS = {code.value[0]: code for code in grpc.StatusCode}
DRAINING = "This node is being drained."
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3  # HealthCheckResponse.ServingStatus


class _Call:
    """One RPC in flight: the router's sink for it, and what its handler waits on."""

    __slots__ = ("end", "items", "loop", "pending", "pull_waiter", "pulls", "router", "timer",
                 "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: deque[bytes] = deque()  # response stream messages not yet yielded
        self.end: GrpcEnd | BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.pulls = 0  # client stream messages the replica asked for, not yet sent
        self.pull_waiter: asyncio.Future[None] | None = None
        self.pending: Pending | None = None
        self.router: Any = None  # the Router it was submitted to
        self.timer: asyncio.TimerHandle | None = None

    def deliver(self, message: Message) -> None:
        if isinstance(message, Item):
            self.items.append(message.payload)
        elif isinstance(message, Pull):
            self.pulls += message.count
            _wake(self.pull_waiter)
            return
        elif isinstance(message, GrpcEnd):
            self.end = message
        elif isinstance(message, Failure):
            self.end = _failure(message)
        else:
            self.end = RuntimeError(f"a gRPC call cannot take {type(message).__name__}")
        _wake(self.waiter)

    def fail(self, exc: BaseException) -> None:
        if self.end is None:
            self.end = exc
        _wake(self.waiter)
        _wake(self.pull_waiter)

    async def next(self) -> bytes | None:
        """The next response message, or None once the call ended."""
        while not self.items:
            if self.end is not None:
                return None
            self.waiter = self.loop.create_future()
            await self.waiter
        return self.items.popleft()


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def _failure(message: Failure) -> BaseException:
    from surge.errors import RequestCancelledError

    if message.kind == "cancelled":
        return RequestCancelledError(message.message)
    return RuntimeError(message.message)


class GrpcIngress(grpc.GenericRpcHandler):  # type: ignore[misc]
    """The handlers of every method served, and the routing of each call."""

    def __init__(self, proxy: Proxy, methods: Mapping[str, GrpcMethod],
                 request_timeout_s: float | None, health: bool = False) -> None:
        self.proxy = proxy
        self.loop = proxy.loop
        self.request_timeout_s = request_timeout_s
        self.methods = dict(methods)
        self.ongoing = 0  # calls submitted and not yet ended
        self.drained = asyncio.Event()  # set when the proxy starts draining (Health/Watch)
        self._apps: dict[str, RouteTarget] = {}
        self._table: RouteTable | None = None
        self._handlers: dict[str, grpc.RpcMethodHandler] = {
            path: self._handler(method) for path, method in self.methods.items()}
        self._handlers[LIST_APPLICATIONS] = grpc.unary_unary_rpc_method_handler(
            self._list_applications)
        self._handlers[HEALTHZ] = grpc.unary_unary_rpc_method_handler(self._healthz)
        if health:
            self._handlers[HEALTH_CHECK] = grpc.unary_unary_rpc_method_handler(self._check)
            self._handlers[HEALTH_WATCH] = grpc.unary_stream_rpc_method_handler(self._watch)

    def __repr__(self) -> str:
        return f"<GrpcIngress methods={len(self.methods)} apps={len(self._apps)}>"

    def service(self, handler_call_details: Any) -> Any:
        return self._handlers.get(handler_call_details.method)

    def _handler(self, method: GrpcMethod) -> grpc.RpcMethodHandler:
        if method.request_streaming and method.response_streaming:
            async def stream_stream(requests: Any, context: Any) -> AsyncIterator[bytes]:
                async for item in self._stream(method, b"", requests, context):
                    yield item
            return grpc.stream_stream_rpc_method_handler(stream_stream)
        if method.request_streaming:
            async def stream_unary(requests: Any, context: Any) -> bytes:
                return await self._unary(method, b"", requests, context)
            return grpc.stream_unary_rpc_method_handler(stream_unary)
        if method.response_streaming:
            async def unary_stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
                async for item in self._stream(method, request, None, context):
                    yield item
            return grpc.unary_stream_rpc_method_handler(unary_stream)

        async def unary_unary(request: bytes, context: Any) -> bytes:
            return await self._unary(method, request, None, context)
        return grpc.unary_unary_rpc_method_handler(unary_unary)

    # -- RayServeAPIService ----------------------------------------------------------------

    def apps(self) -> dict[str, RouteTarget]:
        table = self.proxy.runtime.routes
        if table is not self._table:
            self._table = table
            self._apps = {target.app: target for target in table.targets}
        return self._apps

    async def _list_applications(self, request: bytes, context: Any) -> bytes:
        # ListApplicationsResponse: field 1, repeated string application_names.
        return b"".join(_field(1, name.encode()) for name in self.apps())

    async def _healthz(self, request: bytes, context: Any) -> bytes:
        if self.proxy.site.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING)
        return _field(1, b"success")  # HealthzResponse: field 1, string message

    # -- grpc.health.v1.Health (opt-in) -----------------------------------------------------

    def _serving(self, request: bytes) -> int | None:
        """HealthCheckResponse's status for the service asked about (None: unknown)."""
        service = _string_field(request)
        if service and service not in self._services():
            return None
        return NOT_SERVING if self.proxy.site.draining else SERVING

    def _services(self) -> set[str]:
        return {method.service for method in self.methods.values()}

    async def _check(self, request: bytes, context: Any) -> bytes:
        status = self._serving(request)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return bytes((0x08, status or 0))  # HealthCheckResponse: field 1, enum status

    async def _watch(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        """The status now, and NOT_SERVING when the proxy starts draining; the stream
        stays open until the client leaves."""
        status = self._serving(request)
        yield bytes((0x08, SERVICE_UNKNOWN if status is None else status))
        if status == SERVING:
            await self.drained.wait()
            yield bytes((0x08, NOT_SERVING))
        await self.loop.create_future()  # only the client's cancel ends it

    # -- calls -----------------------------------------------------------------------------

    async def _unary(self, method: GrpcMethod, body: bytes, requests: Any,
                     context: Any) -> bytes:
        call, request_id, labels = await self._begin(method, body, requests, context)
        started = self.proxy.now()
        code = Code.UNKNOWN
        try:
            pump = self._pump(call, requests) if requests is not None else None
            try:
                while call.end is None:
                    call.waiter = self.loop.create_future()
                    await call.waiter
            finally:
                if pump is not None:
                    pump.cancel()
            end = call.end
            if isinstance(end, GrpcEnd) and end.code == Code.OK:
                code = Code.OK
                context.set_trailing_metadata(_trailers(request_id, end.trailers))
                return end.body
            code, details, trailers = self._status(end, request_id)
        except asyncio.CancelledError:
            code = Code.CANCELLED
            raise
        finally:
            self._close(call, code, labels, started, request_id)
        await context.abort(_STATUS[code], details, trailers)
        raise AssertionError("unreachable")  # abort raises

    async def _stream(self, method: GrpcMethod, body: bytes, requests: Any,
                      context: Any) -> AsyncIterator[bytes]:
        call, request_id, labels = await self._begin(method, body, requests, context)
        started = self.proxy.now()
        code = Code.UNKNOWN
        try:
            pump = self._pump(call, requests) if requests is not None else None
            try:
                while True:
                    item = await call.next()
                    if item is None:
                        break
                    yield item
                    pending = call.pending
                    if pending is not None:
                        pending.consumed(len(item))  # grpc took it: the replica may send on
            finally:
                if pump is not None:
                    pump.cancel()
            end = call.end
            if isinstance(end, GrpcEnd) and end.code == Code.OK:
                code = Code.OK
                context.set_trailing_metadata(_trailers(request_id, end.trailers))
                return
            code, details, trailers = self._status(end, request_id)
        except (asyncio.CancelledError, GeneratorExit):
            code = Code.CANCELLED
            raise
        finally:
            self._close(call, code, labels, started, request_id)
        await context.abort(_STATUS[code], details, trailers)

    async def _begin(self, method: GrpcMethod, body: bytes, requests: Any,
                     context: Any) -> tuple[_Call, str, tuple[str, str, str]]:
        """Route and submit the call, or end it at once (NOT_FOUND, UNAVAILABLE, ...)."""
        metadata = tuple(context.invocation_metadata() or ())
        request_id = metadata_value(metadata, "request_id") or str(uuid.uuid4())
        target, not_found = choose_app(metadata_value(metadata, "application"), self.apps())
        if target is None:
            self._count(("", "", method.path), Code.NOT_FOUND, 0.0, request_id)
            await context.abort(grpc.StatusCode.NOT_FOUND, not_found,
                                (("request_id", request_id),))
        assert target is not None
        labels = (target.app, target.deployment, method.path)
        if target.auth is not None:  # the application's bearer tokens, as over HTTP
            refusal = check_bearer([value.encode() for key, value in metadata
                                    if key == "authorization" and isinstance(value, str)],
                                   target.auth.digests)
            if refusal is not None:
                self._count(labels, Code.UNAUTHENTICATED, 0.0, request_id)
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal.message.decode(),
                                    (("request_id", request_id),))
        if self.proxy.site.draining:
            self._count(labels, Code.UNAVAILABLE, 0.0, request_id)
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING,
                                (("request_id", request_id),))
        call = _Call(self.loop)
        request = GrpcRequest(0, method.path, method.servicer, pack_metadata(metadata), body,
                              request_id,
                              target.app, metadata_value(metadata, "multiplexed_model_id"),
                              context.peer() or "", requests is not None)
        pending = call.pending = Pending(request, call)
        router = call.router = self.proxy.runtime.router(
            DeploymentId(target.app, target.deployment))
        try:
            router.submit(pending)
        except (BackPressureError, DeploymentUnavailableError) as exc:
            code, details = status_of(exc, request_id)
            reason = "backpressure" if isinstance(exc, BackPressureError) else "unavailable"
            self.proxy.recorder.rejected(target.app, target.deployment, reason)
            self._count(labels, code, 0.0, request_id)
            await context.abort(_STATUS[code], details, (("request_id", request_id),))
        self.ongoing += 1
        timeout = self._timeout(context)
        if timeout is not None:
            call.timer = self.loop.call_later(timeout, self._timed_out, call, timeout)
        return call, request_id, labels

    def _timeout(self, context: Any) -> float | None:
        remaining: float | None = context.time_remaining()
        limit = self.request_timeout_s
        if remaining is None:
            return limit
        return remaining if limit is None else min(remaining, limit)

    def _timed_out(self, call: _Call, timeout_s: float) -> None:
        call.timer = None
        if call.end is None:
            self._cancel(call)
            call.fail(Timeout(round(timeout_s, 3)))

    def _cancel(self, call: _Call) -> None:
        pending = call.pending
        if pending is not None and call.router is not None:
            call.router.cancel(pending)

    def _pump(self, call: _Call, requests: Any) -> asyncio.Task[None]:
        """Send the client's stream as the replica pulls it."""
        async def pump() -> None:
            pending = call.pending
            assert pending is not None
            iterator = requests.__aiter__()
            while True:
                while call.pulls <= 0:
                    if call.end is not None:
                        return
                    call.pull_waiter = self.loop.create_future()
                    await call.pull_waiter
                try:
                    body = await iterator.__anext__()
                except StopAsyncIteration:
                    body = None
                except Exception:  # the client's stream broke: its call ends with it
                    return
                link = pending.link
                if link is None or pending.cancelled or call.end is not None:
                    return
                call.pulls -= 1
                link.send(GrpcMessage(pending.message.id, body or b"", body is not None))
                if body is None:
                    return

        return self.loop.create_task(pump())

    def _status(self, end: GrpcEnd | BaseException | None,
                request_id: str) -> tuple[int, str, tuple[tuple[str, str | bytes], ...]]:
        if isinstance(end, GrpcEnd):  # the user's method failed, or set its own code
            return end.code, truncate(end.details), _trailers(request_id, end.trailers)
        code, details = status_of(end or RuntimeError("the call ended without an answer"),
                                  request_id)
        return code, details, (("request_id", request_id),)

    def _close(self, call: _Call, code: int, labels: tuple[str, str, str], started: float,
               request_id: str) -> None:
        self.ongoing -= 1
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if call.end is None:  # the client went away (or the handler failed): stop it
            self._cancel(call)
            call.end = RuntimeError("call closed")
        self._count(labels, code, (self.proxy.now() - started) * 1000.0, request_id)

    def _count(self, labels: tuple[str, str, str], code: int, latency_ms: float,
               request_id: str) -> None:
        name = CODE_NAMES[code] if 0 <= code < len(CODE_NAMES) else str(code)
        self.proxy.record_grpc(labels, code, name, latency_ms, request_id)


def _trailers(request_id: str,
              packed: list[tuple[str, str]]) -> tuple[tuple[str, str | bytes], ...]:
    """`request_id` first, then the user's trailers (a user's own request_id wins)."""
    user = unpack_metadata(packed)
    if any(key == "request_id" for key, _ in user):
        return user
    return (("request_id", request_id), *user)


def _field(number: int, value: bytes) -> bytes:
    """One length-delimited protobuf field (the two API responses need no _pb2)."""
    size, length = bytearray(), len(value)
    while True:
        byte = length & 0x7F
        length >>= 7
        if length:
            size.append(byte | 0x80)
        else:
            size.append(byte)
            break
    return bytes((number << 3 | 2,)) + bytes(size) + value


def _string_field(message: bytes) -> str:
    """Field 1 of a message whose only field is a string (HealthCheckRequest.service)."""
    if len(message) < 2 or message[0] != 0x0A:
        return ""
    length, shift, index = 0, 0, 1
    while index < len(message):
        byte = message[index]
        length |= (byte & 0x7F) << shift
        index += 1
        if not byte & 0x80:
            break
        shift += 7
    return message[index:index + length].decode(errors="replace")


def load_methods(functions: tuple[str, ...]) -> dict[str, GrpcMethod]:
    methods: dict[str, GrpcMethod] = {}
    for path in functions:
        methods.update(methods_of(path))
    return methods


async def start_grpc(proxy: Proxy, host: str, port: int, functions: tuple[str, ...],
                     request_timeout_s: float | None,
                     reflection: bool = False,
                     health: bool = False) -> tuple[aio.Server, int] | None:
    """Serve gRPC for `proxy` (None: no servicer functions, so no server, as Ray). With
    the HTTP port's certificate (http_options.ssl_*), the gRPC port serves TLS only, with
    the same client-certificate mode.

    Raises ConfigError when a servicer function cannot be used or the port is taken."""
    if not functions:
        return None
    methods = load_methods(functions)
    ingress = GrpcIngress(proxy, methods, request_timeout_s, health)
    server = aio.server(options=GRPC_SERVER_OPTIONS)
    server.add_generic_rpc_handlers((ingress,))
    if reflection:
        _enable_reflection(server, methods)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        spec = proxy.spec
        if spec.ssl_certfile is not None:
            bound = server.add_secure_port(address, _credentials(spec))
        else:
            bound = server.add_insecure_port(address)
    except (RuntimeError, OSError) as exc:
        raise ConfigError(f"cannot listen for gRPC on {address}: {exc}") from None
    await server.start()
    proxy.grpc = ingress
    return server, bound


def _credentials(spec: ProxySpec) -> Any:
    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        with open(path, "rb") as file:
            return file.read()

    key, chain = read(spec.ssl_keyfile or spec.ssl_certfile), read(spec.ssl_certfile)
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=read(spec.ssl_ca_certs),
        require_client_auth=spec.ssl_cert_reqs == "required")


def _enable_reflection(server: aio.Server, methods: Mapping[str, GrpcMethod]) -> None:
    """grpc's server reflection for the user's services (needs grpcio-reflection)."""
    try:
        from grpc_reflection.v1alpha import reflection
    except ImportError:
        log.warning("gRPC reflection is on but grpcio-reflection is not installed; serving "
                    "without it (pip install grpcio-reflection, or enable_reflection: false)")
        return
    names = sorted({method.service for method in methods.values()})
    reflection.enable_server_reflection([*names, reflection.SERVICE_NAME], server)

