"""The messages that cross process boundaries, as typed msgspec structs.

Data path: HttpRequest/Call/Cancel/Credit go to a replica; HttpStart/HttpBody/Result/Item/
End/Failure/Rejected come back, and Models (a multiplexed replica's models, whenever they
change) without being asked. Control path: Rpc/Reply/Push carry cloudpickled
payloads between the controller and the other processes (never request bodies).
"""

from __future__ import annotations

import msgspec

__all__ = [
    "Call",
    "Cancel",
    "Credit",
    "End",
    "Failure",
    "HttpBody",
    "HttpRequest",
    "HttpStart",
    "Item",
    "Message",
    "Models",
    "Push",
    "Rejected",
    "Reply",
    "Result",
    "Rpc",
]


class HttpRequest(msgspec.Struct, tag=1, array_like=True):
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


class Call(msgspec.Struct, tag=2, array_like=True):
    id: int
    method: str
    payload: bytes  # pickled (args, kwargs): handle calls are Python-to-Python
    stream: bool = False
    model_id: str = ""
    request_id: str = ""


class Cancel(msgspec.Struct, tag=3, array_like=True):
    id: int


class Credit(msgspec.Struct, tag=4, array_like=True):
    """The consumer passed on this much of the request's stream (transport/flow.py)."""

    id: int
    amount: int


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


Message = (HttpRequest | Call | Cancel | Credit | HttpStart | HttpBody | Result | Item | End
           | Failure | Rejected | Models | Rpc | Reply | Push)
