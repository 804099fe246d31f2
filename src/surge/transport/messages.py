"""The messages that cross process boundaries, as typed msgspec structs.

Data path: HttpRequest/Call/GrpcRequest/GrpcMessage/Cancel/Credit go to a replica;
HttpStart/HttpBody/Result/Item/End/GrpcEnd/Pull/Failure/Rejected come back, and Models (a
multiplexed replica's models, whenever they change), RoutingStats (its engine's queue,
every routing-stats period) and PrefixHeld (what its engine cached and evicted, with
them) without being asked. A request's own
stream follows it both ways under the same id: the rest of a streamed upload (HttpBody,
`HttpRequest.more_body`), or a WebSocket's messages (WsData, then WsClose; WsAccept
answers `HttpRequest.upgrade`), the sender of each spending credit the receiver grants
(Credit, transport/flow.py). A gRPC call's request and response messages travel
serialized, as the client sent them (a client stream as GrpcMessage frames the replica
asks for with Pull): only the replica parses them. Control path: Rpc/Reply/Push carry
cloudpickled payloads between the controller and the other processes (never request
bodies).
"""

from __future__ import annotations

import msgspec

__all__ = [
    "Call",
    "Cancel",
    "Credit",
    "End",
    "Failure",
    "GrpcEnd",
    "GrpcMessage",
    "GrpcRequest",
    "HttpBody",
    "HttpRequest",
    "HttpStart",
    "Item",
    "Message",
    "Models",
    "PrefixHeld",
    "Pull",
    "Push",
    "Rejected",
    "Reply",
    "Result",
    "RoutingStats",
    "Rpc",
    "WsAccept",
    "WsClose",
    "WsData",
]


class HttpRequest(msgspec.Struct, tag=1, array_like=True, omit_defaults=True):
    # omit_defaults: trailing fields at their defaults (the usual) are not encoded.
    id: int
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    client: str
    route_prefix: str
    request_id: str
    http_version: str = "1.1"
    root_path: str = ""
    raw_path: bytes = b""
    scheme: str = "http"  # "https" when the proxy serves TLS
    model_id: str = ""  # the serve_multiplexed_model_id header, read once by the proxy
    more_body: bool = False  # the body goes on in HttpBody frames, sent against Credit
    upgrade: str = ""  # "websocket": an upgrade the app may accept (WsAccept)


class Call(msgspec.Struct, tag=2, array_like=True):
    id: int
    method: str
    payload: bytes  # pickled (args, kwargs): handle calls are Python-to-Python
    stream: bool = False
    model_id: str = ""
    request_id: str = ""
    session_id: str = ""  # handle.options(session_id=...): the callee's request context


class Cancel(msgspec.Struct, tag=3, array_like=True):
    id: int


class Credit(msgspec.Struct, tag=4, array_like=True):
    """The consumer passed on this much of the request's stream (transport/flow.py)."""

    id: int
    amount: int


class GrpcRequest(msgspec.Struct, tag=5, array_like=True):
    """A gRPC call: its first (or only) request message as the client serialized it."""

    id: int
    method: str  # "/package.Service/Method"
    servicer: str  # the import path of the add_*Servicer_to_server that declared it
    metadata: list[tuple[str, str]]  # the client's (grpc_methods.pack_metadata)
    body: bytes  # the request message (empty for a client stream: GrpcMessage frames)
    request_id: str
    app: str
    model_id: str = ""
    client: str = ""  # the peer, as grpc names it ("ipv4:127.0.0.1:5555")
    streamed: bool = False  # client streaming: the messages follow as GrpcMessage frames


class GrpcMessage(msgspec.Struct, tag=6, array_like=True):
    """One message of a client stream, sent only as the replica asked (`Pull`)."""

    id: int
    body: bytes
    more: bool  # False: the client's stream ended (`body` is then empty)


class HttpStart(msgspec.Struct, tag=10, array_like=True):
    id: int
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    more: bool


class HttpBody(msgspec.Struct, tag=11, array_like=True):
    id: int
    body: bytes
    more: bool


class Result(msgspec.Struct, tag=12, array_like=True):
    id: int
    payload: bytes


class Item(msgspec.Struct, tag=13, array_like=True):
    id: int
    payload: bytes


class End(msgspec.Struct, tag=14, array_like=True):
    id: int


class Failure(msgspec.Struct, tag=15, array_like=True):
    id: int
    kind: str  # "user" | "cancelled" | "unavailable" | "internal"
    message: str
    payload: bytes = b""  # pickled exception when it pickles


class Rejected(msgspec.Struct, tag=16, array_like=True):
    id: int
    ongoing: int


class Models(msgspec.Struct, tag=17, array_like=True):
    """The models a multiplexed replica holds or is loading, sent to every router on a
    change (and on connect): routing affinity without a controller round trip. `id` is
    always 0, no request's id, so a link that does not route by model ignores it."""

    id: int
    ids: list[str]
    max_copies: int = 0  # replicas one model may occupy (0: the router's default)
    matching_timeout_s: float = 1.0  # then a waiting request may go to any replica
    capacity: int = -1  # models it holds at most (max_num_models_per_replica; -1: no limit)
    # An LLM server's model id: a request whose JSON body's `model` is
    # `<lora_base>:<adapter>` carries that as its model id (the proxy reads the field).
    lora_base: str = ""


class GrpcEnd(msgspec.Struct, tag=18, array_like=True):
    """A gRPC call's end: its status, trailing metadata, and a unary response's message."""

    id: int
    code: int  # grpc.StatusCode's number (0: OK)
    details: str
    trailers: list[tuple[str, str]]  # grpc_methods.pack_metadata
    body: bytes = b""
    has_body: bool = False  # a unary response (an empty message is a message too)


class Pull(msgspec.Struct, tag=19, array_like=True):
    """The replica may take `count` more messages of the call's client stream."""

    id: int
    count: int


class WsAccept(msgspec.Struct, tag=23, array_like=True):
    """The app accepted a WebSocket (`websocket.accept`): the proxy answers 101."""

    id: int
    subprotocol: str | None
    headers: list[tuple[bytes, bytes]]


class WsData(msgspec.Struct, tag=24, array_like=True):
    """One whole WebSocket message, either way: text (UTF-8 in `data`) or binary."""

    id: int
    data: bytes
    text: bool = False


class WsClose(msgspec.Struct, tag=25, array_like=True):
    """A WebSocket's end. From the replica (final): the app closed with `code`; from the
    proxy: the client closed (or went away, 1006; or broke a limit, 1009 / 1001)."""

    id: int
    code: int
    reason: str = ""


class RoutingStats(msgspec.Struct, tag=26, array_like=True):
    """A replica's `record_routing_stats` as routing reads it, sent to every router each
    period (and on connect): its engine's queue (waiting + running sequences; -1: the
    stats do not say) and KV-cache use. `id` is always 0, as Models'."""

    id: int
    queue: int
    kv_cache_usage: float = -1.0
    period_s: float = 10.0  # how often it comes: older than two periods, it is ignored


class PrefixHeld(msgspec.Struct, tag=27, array_like=True):
    """What a replica's engine now holds and no longer holds of the prompts it served, in
    the routers' chunk names (policy/kv_chunks.py, from its KV events), sent with its
    RoutingStats: chains held (head first), names evicted, and whether its whole cache
    was cleared before these. `id` is always 0, as Models'."""

    id: int
    stored: list[list[int]] = msgspec.field(default_factory=list)
    removed: list[int] = msgspec.field(default_factory=list)
    cleared: bool = False


class Rpc(msgspec.Struct, tag=20, array_like=True):
    id: int
    method: str
    payload: bytes


class Reply(msgspec.Struct, tag=21, array_like=True):
    id: int
    ok: bool
    payload: bytes


class Push(msgspec.Struct, tag=22, array_like=True):
    topic: str
    payload: bytes


Message = (HttpRequest | Call | GrpcRequest | GrpcMessage | Cancel | Credit | HttpStart
           | HttpBody | Result | Item | End | Failure | Rejected | GrpcEnd | Pull | Models
           | RoutingStats | PrefixHeld | WsAccept | WsData | WsClose | Rpc | Reply | Push)
