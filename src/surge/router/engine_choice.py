"""The router's LLM-aware choice: the engine's queue, the prompt prefix engines hold,
and session affinity.

Used for a deployment once one of its replicas sent a `RoutingStats` frame (its class
defines `record_routing_stats`; surge's LLMServer does). Each replica's score is its
engine's last reported queue plus the change in this router's in flight there since
(sent minus answered), never less than the router's own in flight there, and its
in-flight count alone once the report is stale (policy/engine_routing.py).

An OpenAI chat or completion request (its whole body in its first frame) goes to the
replica holding the longest prefix of its prompt within the policy's slack
(policy/prefix_index.py: the pool's index, fed by this router's sends, a prompt
recorded for the replica it was sent to, whose engine then caches it, and by the
replicas' PrefixHeld frames: what their engines cached and evicted, whoever sent it). Otherwise a
request with an affinity key (its session id: the `x-session-id` header or a handle's
`options(session_id=...)`; else, on an OpenAI prompt route, the body's first
AFFINITY_PREFIX_BYTES) prefers its rendezvous replica within the slack.
"""

from __future__ import annotations

import random

from surge.policy.engine_routing import (
    LLM_PREFIX_PATHS,
    NO_REPLICA,
    affinity_key,
    choose_by_score,
    choose_with_affinity,
    engine_score,
    rendezvous,
)
from surge.policy.prefix_index import choose_by_prefix, prompt_stream, read_holders
from surge.policy.prompt_names import PromptNames
from surge.router.pool import ReplicaPool
from surge.router.replica_link import Pending
from surge.router.slots import Loads
from surge.transport.messages import Call, GrpcRequest, HttpRequest

__all__ = ["SESSION_HEADER", "Scores", "choose_by_engine", "prompt_chunks", "request_key"]

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


def request_key(message: HttpRequest | Call | GrpcRequest, by_prefix: bool = True) -> bytes:
    """The request's affinity key (policy.engine_routing.affinity_key), b"" for none;
    `by_prefix` False: its session id alone, never a body's first bytes."""
    if isinstance(message, Call):
        return affinity_key(message.session_id, "", b"")
    if isinstance(message, HttpRequest):
        session = ""
        for name, value in message.headers:
            if name == SESSION_HEADER:
                session = value.decode("latin-1")
                break
        return affinity_key(session, message.path, message.body if by_prefix else b"")
    return b""


def prompt_chunks(pending: Pending, named: PromptNames) -> list[int]:
    """The chunk names of the request's prompt ([] for none), read once per request
    (`named`: the pool's recent prompts, whose chunks are not hashed again). Only an
    OpenAI POST whose whole body came carries one."""
    names = pending.prefix
    if names is None:
        names = pending.prefix = []
        message = pending.message
        if (isinstance(message, HttpRequest) and message.method == "POST"
                and not message.more_body and message.path.endswith(LLM_PREFIX_PATHS)):
            stream = prompt_stream(message.body)
            if stream is not None:
                names += named.names(stream)
    return names


def choose_by_engine(pool: ReplicaPool, capacity: int, rng: random.Random, pending: Pending,
                     now: float, by_prefix: bool = True) -> int:
    """The replica for `pending` (an index into the routable slots), or NO_REPLICA.
    `by_prefix` False (the deployment's request_router_kwargs say prefix_routing: false):
    neither its prompt nor its body's first bytes count, only its session and the load."""
    loads = pool.loads
    scores = Scores(loads, now)
    names = prompt_chunks(pending, pool.prompt_names) if by_prefix else []
    if names:
        prefixes = pool.prefixes
        held = read_holders(prefixes, prefixes.held(names), pool.positions(), rng)
        choice = choose_by_prefix(loads, scores, capacity, held, rng, pool.local)
        if choice != NO_REPLICA:
            prefixes.record(loads.slots[choice].info.replica_id, names)
        return choice
    key = request_key(pending.message, by_prefix)
    if key:
        preferred = rendezvous(key, [slot.info.replica_id for slot in loads.slots])
        return choose_with_affinity(loads, scores, capacity, preferred, rng, pool.local)
    return choose_by_score(loads, scores, capacity, rng, pool.local)
