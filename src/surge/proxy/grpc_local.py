"""The services the gRPC ingress answers itself, with no replica: Ray Serve's
`RayServeAPIService` (ListApplications, Healthz), the standard `grpc.health.v1.Health`
(opt-in: `enable_health_service`) and server reflection (opt-in, grpcio-reflection).

The API and health messages are a field or two, written and read here without a _pb2.
Reflection runs grpcio-reflection's own servicer over the descriptors the servicer
functions' modules registered when the proxy imported them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from surge.proxy.grpc_status import HEALTHZ, LIST_APPLICATIONS, Code

__all__ = ["HEALTH_CHECK", "HEALTH_WATCH", "REFLECTION", "LocalServices", "field",
           "string_field"]

log = logging.getLogger("surge.proxy")

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3  # HealthCheckResponse.ServingStatus
DRAINING = "This node is being drained."
Answer = tuple[int, str, bytes]  # code, details, the response message (when OK)


class LocalServices:
    """What each local method answers. `unary` methods answer at once; Watch streams the
    status and its change when the proxy drains; reflection is a stream both ways."""

    def __init__(self, apps: Callable[[], Iterable[str]], services: Iterable[str],
                 draining: Callable[[], bool], unready: Callable[[], str],
                 health: bool, reflection: bool) -> None:
        self._apps = apps
        self._services = set(services)
        self._draining = draining
        self._unready = unready  # why the API service answers UNAVAILABLE ("": it does not)
        self.unary: dict[str, Callable[[bytes], Answer]] = {
            LIST_APPLICATIONS: self._list_applications, HEALTHZ: self._healthz}
        self.watch = health  # HEALTH_WATCH is served
        if health:
            self.unary[HEALTH_CHECK] = self._check
        self._reflection: Any = _reflection_servicer(sorted(self._services)) \
            if reflection else None

    def __repr__(self) -> str:
        return f"<LocalServices {sorted(self.unary)} reflection={self._reflection is not None}>"

    def serves(self, path: str) -> bool:
        return (path in self.unary or (self.watch and path == HEALTH_WATCH)
                or (self._reflection is not None and path == REFLECTION))

    def _list_applications(self, request: bytes) -> Answer:
        if unready := self._unready():  # as Ray's: while draining or no route yet
            return Code.UNAVAILABLE, unready, b""
        # ListApplicationsResponse: field 1, repeated string application_names.
        return Code.OK, "", b"".join(field(1, name.encode()) for name in self._apps())

    def _healthz(self, request: bytes) -> Answer:
        if unready := self._unready():  # HTTP /-/healthz's check and message
            return Code.UNAVAILABLE, unready, b""
        return Code.OK, "", field(1, b"success")  # HealthzResponse: field 1, string message

    def serving(self, request: bytes) -> int:
        """HealthCheckResponse's status for the service a request asks about."""
        service = string_field(request)
        if service and service not in self._services:
            return SERVICE_UNKNOWN
        return NOT_SERVING if self._draining() else SERVING

    def _check(self, request: bytes) -> Answer:
        status = self.serving(request)
        if status == SERVICE_UNKNOWN:
            return Code.NOT_FOUND, "unknown service", b""
        return Code.OK, "", status_message(status)

    async def reflect(self, requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """ServerReflectionInfo: each request parsed, answered by grpcio-reflection."""
        from grpc_reflection.v1alpha import reflection_pb2

        async def parsed() -> AsyncIterator[Any]:
            async for body in requests:
                yield reflection_pb2.ServerReflectionRequest.FromString(body)

        async for response in self._reflection.ServerReflectionInfo(parsed(), None):
            yield response.SerializeToString()


def status_message(status: int) -> bytes:
    return bytes((0x08, status))  # HealthCheckResponse: field 1, enum status


def _reflection_servicer(services: list[str]) -> Any:
    try:
        from grpc_reflection.v1alpha import reflection
        from grpc_reflection.v1alpha._async import ReflectionServicer
    except ImportError:
        log.warning("gRPC reflection is on but grpcio-reflection is not installed; serving "
                    "without it (pip install grpcio-reflection, or enable_reflection: false)")
        return None
    return ReflectionServicer([*services, reflection.SERVICE_NAME])


def field(number: int, value: bytes) -> bytes:
    """One length-delimited protobuf field (the API responses need no _pb2)."""
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


def string_field(message: bytes) -> str:
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
