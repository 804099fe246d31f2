"""Ray Serve's `HTTPOptions` (plus surge's limits and TLS) and where proxies run."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from surge.config.defaults import (
    CERT_REQS,
    DEFAULT_HTTP_HOST,
    DEFAULT_HTTP_PORT,
    DEFAULT_KEEP_ALIVE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_REQUEST_BODY_TIMEOUT_S,
    DEFAULT_REQUEST_HEADER_TIMEOUT_S,
    DEFAULT_WEBSOCKET_IDLE_TIMEOUT_S,
    DEFAULT_WEBSOCKET_MAX_MESSAGE_BYTES,
)
from surge.config.schema import number, require


class ProxyLocation(enum.StrEnum):
    """Ray Serve's `ProxyLocation`: where proxies run (a string enum: either spelling)."""

    Disabled = "Disabled"
    HeadOnly = "HeadOnly"
    EveryNode = "EveryNode"


PROXY_LOCATIONS = ("EveryNode", "HeadOnly", "Disabled", "NoServer")  # NoServer: Ray's old name
# Ray Serve's gRPC port.
DEFAULT_GRPC_PORT = 9000


def default_proxy_workers() -> int:
    """One proxy process per two cores (the rest serve replicas), between 1 and 8."""
    import os

    return max(1, min(8, (os.cpu_count() or 1) // 2))


@dataclass(frozen=True, kw_only=True)
class HTTPOptions:
    """Ray Serve's `HTTPOptions`, plus surge's body-size limit."""

    host: str = DEFAULT_HTTP_HOST
    port: int = DEFAULT_HTTP_PORT
    root_path: str = ""
    request_timeout_s: float | None = None
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    request_header_timeout_s: float = DEFAULT_REQUEST_HEADER_TIMEOUT_S
    request_body_timeout_s: float = DEFAULT_REQUEST_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    websocket_max_message_bytes: int = DEFAULT_WEBSOCKET_MAX_MESSAGE_BYTES
    websocket_idle_timeout_s: float = DEFAULT_WEBSOCKET_IDLE_TIMEOUT_S
    location: str = "EveryNode"
    proxy_workers: int | None = None  # None: default_proxy_workers()
    # TLS (Ray Serve's and uvicorn's names). A certificate turns the port into HTTPS only;
    # the files are checked when the options are given (proxy/tls.py) and read by each
    # proxy worker. ssl_ca_certs verifies client certificates (mutual TLS): then
    # ssl_cert_reqs defaults to "required".
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: str | int | None = None  # "none" | "optional" | "required" (or 0/1/2)

    def __post_init__(self) -> None:
        number("port", self.port, ge=0, le=65535, integer=True)
        number("request_timeout_s", self.request_timeout_s, ge=0, allow_none=True)
        number("keep_alive_timeout_s", self.keep_alive_timeout_s, ge=0)
        number("max_body_bytes", self.max_body_bytes, ge=0)
        require(float(self.max_body_bytes).is_integer(),
                f"max_body_bytes must be a whole number of bytes, got {self.max_body_bytes!r}.")
        object.__setattr__(self, "max_body_bytes", int(self.max_body_bytes))  # 1e6 is fine
        number("max_header_bytes", self.max_header_bytes, ge=1024, integer=True)
        number("request_header_timeout_s", self.request_header_timeout_s, ge=0.1)
        number("request_body_timeout_s", self.request_body_timeout_s, ge=0.1)
        number("max_connections", self.max_connections, ge=1, integer=True)
        number("websocket_max_message_bytes", self.websocket_max_message_bytes, ge=1,
               integer=True)
        number("websocket_idle_timeout_s", self.websocket_idle_timeout_s, ge=0.1)
        if self.proxy_workers is not None:
            number("proxy_workers", self.proxy_workers, ge=1, integer=True)
        require(self.location in PROXY_LOCATIONS,
                f"proxy location must be one of {PROXY_LOCATIONS}, got {self.location!r}.")
        object.__setattr__(self, "location", str(self.location))  # a ProxyLocation too
        self._check_tls_shape()

    def _check_tls_shape(self) -> None:
        """The TLS keys fit together; proxy/tls.py checks the files themselves."""
        for name in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, str) and bool(value)),
                    f"{name} must be the path of a PEM file, got {value!r}.")
        require(self.ssl_certfile is not None or (self.ssl_keyfile is None
                                                  and self.ssl_ca_certs is None),
                "ssl_keyfile and ssl_ca_certs need ssl_certfile (the server's certificate).")
        reqs = self.ssl_cert_reqs
        if isinstance(reqs, int) and not isinstance(reqs, bool) and reqs in (0, 1, 2):
            reqs = CERT_REQS[reqs]  # uvicorn's spelling: ssl.CERT_NONE/OPTIONAL/REQUIRED
        require(reqs is None or reqs in CERT_REQS,
                f"ssl_cert_reqs must be one of {', '.join(CERT_REQS)}, got "
                f"{self.ssl_cert_reqs!r}.")
        require(reqs in (None, "none") or self.ssl_ca_certs is not None,
                f"ssl_cert_reqs {reqs!r} needs ssl_ca_certs: the CA bundle that client "
                "certificates are verified against.")
        if reqs is None:
            reqs = "required" if self.ssl_ca_certs is not None else "none"
        object.__setattr__(self, "ssl_cert_reqs", reqs)

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None


@dataclass(frozen=True, kw_only=True)
class gRPCOptions:
    """Ray Serve's `gRPCOptions`: the gRPC port and the servicers it serves (by import
    path of their `add_*Servicer_to_server` functions; an empty list starts none)."""

    port: int = DEFAULT_GRPC_PORT
    grpc_servicer_functions: Sequence[str] = ()
    request_timeout_s: float | None = None
    enable_reflection: bool = True
    # surge's: the standard grpc.health.v1.Health service (Check, Watch) at each proxy.
    enable_health_service: bool = False

    def __post_init__(self) -> None:
        number("grpc port", self.port, ge=0, le=65535, integer=True, path=("port",))
        functions = self.grpc_servicer_functions
        require(not isinstance(functions, str) and all(isinstance(f, str) for f in functions),
                "grpc_servicer_functions must be a list of import paths like "
                "'my_pb2_grpc:add_MyServiceServicer_to_server'.")
        object.__setattr__(self, "grpc_servicer_functions", tuple(functions))
        number("request_timeout_s", self.request_timeout_s, ge=0, allow_none=True)
