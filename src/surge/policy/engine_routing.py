"""Choose a replica by its engine's queue, with bounded session / prompt-prefix affinity.

For deployments whose replicas report routing stats (`record_routing_stats`, Ray's hook;
surge's LLMServer reports its engine's waiting and running sequences), a replica's
*score* is what its engine holds: the last report's queue (waiting + running) plus the
change in this router's in flight there since that report (sent minus answered: the
engine's queue changed by as much), and never less than this router's own in flight
there. A report older than `stale_after` (two of its periods) is ignored and
the score is the router's own in-flight count, as plain power of two choices.

`choose_by_score` keeps power-of-two-choices semantics on the score: two distinct
replicas are sampled, the lower score wins (ties: fewer in flight), and the capacity
rule holds on both counts: a replica with `capacity` in flight from this router (or
saturated), or whose engine holds `capacity` by its score (every router's requests: it
would refuse the next one), is never chosen; when both samples are full, the lowest
score with room is taken. When every engine is full the choice is NO_REPLICA: the
request waits in the router's bounded queue (its share of `max_queued_requests`) or is
refused at once with 503/429 (policy/admission.py), instead of being sent to an engine
that would only queue it. Locality as in policy/routing.py: the first `local` replicas
are tried first.

Affinity: a request with an affinity key (a session id, or a long prompt's first bytes)
prefers the replica that rendezvous hashing of the key picks among the replicas (the
same one in every router, moving only the keys of a replica that came or went), unless
its score exceeds the least loaded replica's by more than
`max(slack_min, slack_ratio * least)`, or it is full: then the request spills to the
power-of-two choice, so one hot session or prefix never overloads one replica.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from surge.policy.routing import NO_REPLICA, Loads

__all__ = [
    "AFFINITY_PREFIX_BYTES",
    "AFFINITY_SLACK_MIN",
    "AFFINITY_SLACK_RATIO",
    "LLM_PREFIX_PATHS",
    "NO_REPLICA",
    "affinity_key",
    "choose_by_score",
    "choose_with_affinity",
    "engine_score",
    "rendezvous",
    "stale_after",
]

# A prompt-prefix key is the body's first this many bytes: about a system prompt's worth
# of JSON; shorter bodies carry little a prefix cache would save and get no key.
AFFINITY_PREFIX_BYTES = 1024
# The preferred replica may hold this many more than the least loaded one ...
AFFINITY_SLACK_MIN = 2
# ... or this fraction more, whichever is larger, before a request spills elsewhere.
AFFINITY_SLACK_RATIO = 0.5
# The OpenAI routes whose bodies start with the prompt (chat messages, completion prompt).
LLM_PREFIX_PATHS = ("/v1/chat/completions", "/v1/completions")
# A report is stale after this many of its periods (one missed report is tolerated).
STALE_PERIODS = 2.0


def stale_after(period_s: float) -> float:
    """How old a routing-stats report may be and still count (seconds)."""
    return STALE_PERIODS * period_s + 0.05  # + scheduling slack for short periods


def engine_score(queue: int, change: int, in_flight: int, age_s: float,
                 period_s: float) -> int:
    """A replica's score: its engine's queue as last reported plus the `change` in this
    router's in flight there since (may be negative), at least its own in flight;
    `queue` < 0 (no report) or a stale report: the in-flight count alone."""
    if queue < 0 or age_s > stale_after(period_s):
        return in_flight
    return max(queue + change, in_flight)


def choose_by_score(in_flight: Loads | Sequence[int], scores: Loads | Sequence[int],
                    capacity: int, rng: random.Random, local: int = 0) -> int:
    """Index of the replica to send to, or NO_REPLICA if all have `capacity` in flight."""
    n = len(in_flight)
    if 0 < local < n:
        index = _choose(in_flight, scores, capacity, rng, local)
        if index != NO_REPLICA:
            return index
    return _choose(in_flight, scores, capacity, rng, n)


def _better(a: int, b: int, in_flight: Loads | Sequence[int],
            scores: Loads | Sequence[int]) -> int:
    key_a, key_b = (scores[a], in_flight[a]), (scores[b], in_flight[b])
    return a if key_a <= key_b else b


def _room(in_flight: Loads | Sequence[int], scores: Loads | Sequence[int], capacity: int,
          index: int) -> bool:
    return in_flight[index] < capacity and scores[index] < capacity


def _choose(in_flight: Loads | Sequence[int], scores: Loads | Sequence[int], capacity: int,
            rng: random.Random, n: int) -> int:
    if n == 0:
        return NO_REPLICA
    if n == 1:
        return 0 if _room(in_flight, scores, capacity, 0) else NO_REPLICA
    first = rng.randrange(n)
    second = rng.randrange(n - 1)
    if second >= first:
        second += 1
    best = _better(first, second, in_flight, scores)
    if _room(in_flight, scores, capacity, best):
        return best
    return _lowest_with_room(in_flight, scores, capacity, n)


def _lowest_with_room(in_flight: Loads | Sequence[int], scores: Loads | Sequence[int],
                      capacity: int, n: int) -> int:
    best = NO_REPLICA
    for index in range(n):
        if _room(in_flight, scores, capacity, index) and (
                best == NO_REPLICA or _better(best, index, in_flight, scores) == index):
            best = index
    return best


def rendezvous(key: bytes, replica_ids: Sequence[str]) -> int:
    """The index of the replica that highest-random-weight hashing gives `key` (-1: none).

    Every router computes the same answer from the same replica ids, and a replica that
    joins or leaves moves only the keys it wins or held."""
    best, best_weight = NO_REPLICA, b""
    for index, replica_id in enumerate(replica_ids):
        weight = hashlib.blake2b(key, digest_size=8, key=replica_id.encode()[:64]).digest()
        if weight > best_weight:
            best, best_weight = index, weight
    return best


def choose_with_affinity(in_flight: Loads | Sequence[int], scores: Loads | Sequence[int],
                         capacity: int, preferred: int, rng: random.Random, local: int = 0,
                         slack_min: int = AFFINITY_SLACK_MIN,
                         slack_ratio: float = AFFINITY_SLACK_RATIO) -> int:
    """`preferred` (the key's rendezvous replica) unless it is full or its score is over
    the least loaded replica's by more than the slack; then `choose_by_score`."""
    n = len(in_flight)
    if 0 <= preferred < n and _room(in_flight, scores, capacity, preferred):
        least = min(scores[i] for i in range(n) if _room(in_flight, scores, capacity, i))
        if scores[preferred] <= least + max(slack_min, slack_ratio * least):
            return preferred
    return choose_by_score(in_flight, scores, capacity, rng, local)


def affinity_key(session_id: str, path: str, body: bytes,
                 prefix_bytes: int = AFFINITY_PREFIX_BYTES) -> bytes:
    """A request's affinity key: its session id, else (an OpenAI prompt route with a body
    of at least `prefix_bytes`) the body's first `prefix_bytes`; b"" when it has none."""
    if session_id:
        return b"s:" + session_id.encode()
    if prefix_bytes > 0 and len(body) >= prefix_bytes and path.endswith(LLM_PREFIX_PATHS):
        return b"p:" + body[:prefix_bytes]
    return b""
