"""What a gRPC servicer function declares: its methods, their kinds and (de)serializers.

Ray Serve names a service by the import path of its generated
`add_XServicer_to_server(servicer, server)` function (`gRPCOptions.grpc_servicer_functions`).
Calling it with a recording server (`_Recording`) and a stand-in servicer captures the
method handlers it would add, without a real server and without the user's servicer
class: each handler says whether the method streams requests and responses, and holds the
request's deserializer and the response's serializer. The proxy keeps only the paths and
kinds (it never parses a message); the replica uses the (de)serializers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from surge.errors import ConfigError

__all__ = ["GrpcMethod", "check_servicer_functions", "import_servicer_function", "methods_of",
           "pack_metadata", "unpack_metadata"]

Metadata = tuple[tuple[str, str | bytes], ...]


def pack_metadata(metadata: Any) -> list[tuple[str, str]]:
    """Metadata for a frame: a binary value as latin-1 text (a text value given for a
    -bin key is its UTF-8), so that unpack_metadata gives the same bytes back."""
    return [(key, value.decode("latin-1") if isinstance(value, bytes) else
             value.encode().decode("latin-1") if key.endswith("-bin") else value)
            for key, value in metadata or ()]


def unpack_metadata(metadata: Any) -> Metadata:
    return tuple((key, value.encode("latin-1") if key.endswith("-bin") else value)
                 for key, value in metadata)


@dataclass(frozen=True)
class GrpcMethod:
    path: str  # "/package.Service/Method", as the client calls it
    servicer: str  # the import path of the servicer function that declared it
    request_streaming: bool
    response_streaming: bool
    request_deserializer: Callable[[bytes], Any] | None = None
    response_serializer: Callable[[Any], bytes] | None = None

    @property
    def name(self) -> str:
        """The RPC's name: the deployment's method that serves it (case-sensitive)."""
        return self.path.rpartition("/")[2]

    @property
    def service(self) -> str:
        return self.path.split("/")[1]


class _StandIn:
    """The servicer handed to the function: every method is None (never called)."""

    def __getattr__(self, name: str) -> None:
        return None


class _Recording:
    """A server that only records the method handlers it is given."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        for name, handler in handlers.items():
            self.handlers[f"/{service}/{name}"] = handler

    def add_generic_rpc_handlers(self, generic_handlers: Any) -> None:
        # Older generated code adds only this: grpc's generic handler keeps its table.
        for generic in generic_handlers:
            table = getattr(generic, "_method_handlers", None)
            if isinstance(table, Mapping):
                self.handlers.update(table)


def import_servicer_function(path: str) -> Callable[..., Any]:
    """`module:attr` or `module.attr`, with Ray Serve's messages when it cannot be used."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    try:
        if not module_name or not attr:
            raise ModuleNotFoundError(path)
        function = getattr(importlib.import_module(module_name), attr)
    except (ModuleNotFoundError, AttributeError) as exc:
        raise ConfigError(
            f"{path} can't be imported! Please make sure there are no typo in those "
            f"functions. Or you might want to rebuild service definitions if .proto file "
            f"is changed. ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # the module itself raised while importing
        raise ConfigError(f"{path} can't be imported: importing {module_name} raised "
                          f"{type(exc).__name__}: {exc}") from None
    if not callable(function):
        raise ConfigError(f"{path} is not a callable function! Please make sure the function "
                          "is imported correctly.")
    return function  # type: ignore[no-any-return]


def check_servicer_functions(functions: Sequence[str]) -> None:
    """Each imports and declares methods; ConfigError (Ray's message) for the first that
    does not."""
    for path in functions:
        methods_of(path)


def methods_of(path: str) -> dict[str, GrpcMethod]:
    """Every method the servicer function at `path` declares, by its path."""
    function = import_servicer_function(path)
    recording = _Recording()
    try:
        function(_StandIn(), recording)
    except Exception as exc:
        raise ConfigError(f"{path} is not a gRPC add_*Servicer_to_server function: calling it "
                          f"raised {type(exc).__name__}: {exc}") from None
    if not recording.handlers:
        raise ConfigError(f"{path} added no gRPC methods: is it an add_*Servicer_to_server "
                          "function?")
    return {method_path: GrpcMethod(
        method_path, path, bool(handler.request_streaming), bool(handler.response_streaming),
        handler.request_deserializer, handler.response_serializer)
        for method_path, handler in recording.handlers.items()}
