"""The router's LLM-aware choice: the engine's queue, and session / prompt-prefix affinity.

Used for a deployment once one of its replicas sent a `RoutingStats` frame (its class
defines `record_routing_stats`; surge's LLMServer does). Each replica's score is its
engine's last reported queue plus the change in this router's in flight there since
(sent minus answered), never less than the router's own in flight there, and its
in-flight count alone once the report is stale (policy/engine_routing.py). A request
with an affinity key (its session id: the `x-session-id` header or a handle's
`options(session_id=...)`; else, on an OpenAI prompt route, the body's first
AFFINITY_PREFIX_BYTES) prefers its rendezvous replica within the policy's slack.
"""

from __future__ import annotations

import random

from surge.policy.engine_routing import (
    affinity_key,
    choose_by_score,
    choose_with_affinity,
    engine_score,
    rendezvous,
)
from surge.router.slots import Loads
from surge.transport.messages import Call, GrpcRequest, HttpRequest

__all__ = ["SESSION_HEADER", "Scores", "choose_by_engine", "request_key"]

# Ray's RAY_SERVE_SESSION_ID_HEADER_KEY default (the replica reads the same header).
SESSION_HEADER = b"x-session-id"


class Scores:
    """Each routable replica's score, computed when the policy samples it (O(1) each)."""

    __slots__ = ("loads", "now")

    def __init__(self, loads: Loads, now: float) -> None:
        self.loads = loads
        self.now = now

    def __len__(self) -> int:
        return len(self.loads)

    def __getitem__(self, index: int) -> int:
        in_flight = self.loads[index]
        link = self.loads.slots[index].link
        stats = link.stats
        if stats is None:
            return in_flight
        return engine_score(stats.queue, len(link.in_flight) - link.in_flight_at_stats,
                            in_flight, self.now - link.stats_at, stats.period_s)


def request_key(message: HttpRequest | Call | GrpcRequest) -> bytes:
    """The request's affinity key (policy.engine_routing.affinity_key), b"" for none."""
    if isinstance(message, Call):
        return affinity_key(message.session_id, "", b"")
    if isinstance(message, HttpRequest):
        session = ""
        for name, value in message.headers:
            if name == SESSION_HEADER:
                session = value.decode("latin-1")
                break
        return affinity_key(session, message.path, message.body)
    return b""


def choose_by_engine(loads: Loads, capacity: int, rng: random.Random, local: int,
                     message: HttpRequest | Call | GrpcRequest, now: float) -> int:
    """The replica for `message` (an index into the routable slots), or NO_REPLICA."""
    scores = Scores(loads, now)
    key = request_key(message)
    if key:
        preferred = rendezvous(key, [slot.info.replica_id for slot in loads.slots])
        return choose_with_affinity(loads, scores, capacity, preferred, rng, local)
    return choose_by_score(loads, scores, capacity, rng, local)
