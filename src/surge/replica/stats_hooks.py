"""Ray's load hooks, called in the replica: `record_routing_stats`, `record_autoscaling_stats`.

A deployment whose class defines either gets it called every routing-stats period
(`request_router_config.request_routing_stats_period_s`, jittered by +-10% as Ray does
so replicas do not report in step), one call at a time, each bounded by
`request_routing_stats_timeout_s`. What comes back goes out at once: the routing stats
as a `RoutingStats` frame to every router holding this replica (the engine's queue,
waiting + running, which policy/engine_routing.py routes on; with a `kv_prefix` key,
what its engine cached and evicted since, as a `PrefixHeld` frame), the autoscaling stats as
an `engine_load` push to the controller (policy/engine_load.py). A hook that raises,
times out or returns something unusable is logged once (then at debug level) and the
loop goes on: a load report never crashes a replica.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

from surge.policy.engine_load import EngineReport
from surge.replica.user_code import UserCode
from surge.transport.messages import PrefixHeld, RoutingStats

__all__ = ["AUTOSCALING_HOOK", "MEASURED_KEYS", "ROUTING_HOOK", "StatsHooks", "engine_report",
           "prefix_frame", "routing_frame"]

log = logging.getLogger("surge.replica")

ROUTING_HOOK = "record_routing_stats"
AUTOSCALING_HOOK = "record_autoscaling_stats"
JITTER = 0.1  # as Ray: each period is drawn from [0.9, 1.1] x the configured one
# What an engine measured of its capacity, read from `record_autoscaling_stats` under
# these names (LLMServer's, policy/llm_capacity.py) for latency objectives; absent: 0.
MEASURED_KEYS = ("prefill_backlog_tokens", "prefill_tokens_per_s", "prompt_tokens",
                 "decode_step_s", "decode_s_per_seq")


def _number(stats: Mapping[str, Any], *names: str) -> float | None:
    for name in names:
        value = stats.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def routing_frame(stats: Any, period_s: float) -> RoutingStats:
    """The frame for what `record_routing_stats` returned: its `waiting` + `running`
    (LLMServer's keys; vLLM's `num_requests_waiting` / `_running` too) as the queue, or
    `queue_len`; -1 when it says none of them."""
    if not isinstance(stats, Mapping):
        raise TypeError(f"{ROUTING_HOOK} returned {type(stats).__name__}, expected a dict")
    waiting = _number(stats, "waiting", "num_requests_waiting")
    running = _number(stats, "running", "num_requests_running")
    queue = _number(stats, "queue_len")
    if waiting is not None or running is not None:
        queue = (waiting or 0.0) + (running or 0.0)
    kv = _number(stats, "kv_cache_usage")
    return RoutingStats(0, -1 if queue is None else round(queue),
                        -1.0 if kv is None else kv, period_s)


def prefix_frame(stats: Mapping[str, Any]) -> PrefixHeld | None:
    """The PrefixHeld frame for `record_routing_stats`'s `kv_prefix` (LLMServer's, from
    its engine's KV events: policy/kv_chunks.py), None when it says nothing new."""
    change = stats.get("kv_prefix")
    if not isinstance(change, Mapping):
        return None
    frame = PrefixHeld(0, [[int(n) for n in chain] for chain in change.get("stored", ())],
                       [int(n) for n in change.get("removed", ())],
                       bool(change.get("cleared", False)))
    return frame if frame.stored or frame.removed or frame.cleared else None


def engine_report(stats: Any, replica_id: str, period_s: float) -> EngineReport:
    """The controller's report for what `record_autoscaling_stats` returned."""
    if not isinstance(stats, Mapping):
        raise TypeError(f"{AUTOSCALING_HOOK} returned {type(stats).__name__}, expected a dict")
    measured = {key: _number(stats, key) or 0.0 for key in MEASURED_KEYS}
    return EngineReport(replica_id, _number(stats, "engine_waiting", "waiting") or 0.0,
                        _number(stats, "engine_running", "running") or 0.0,
                        _number(stats, "kv_cache_usage") or 0.0, period_s, **measured)


class StatsHooks:
    """Calls the user's load hooks every period and hands on what they return."""

    def __init__(self, user: UserCode, replica_id: str, period_s: float, timeout_s: float,
                 to_routers: Callable[[RoutingStats | PrefixHeld], None],
                 to_controller: Callable[[EngineReport], None],
                 rng: random.Random | None = None) -> None:
        self.user = user
        self.replica_id = replica_id
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.to_routers = to_routers
        self.to_controller = to_controller
        self.hooks = [name for name in (ROUTING_HOOK, AUTOSCALING_HOOK)
                      if user.has_method(name)]
        self._rng = rng or random.Random()
        self._warned: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<StatsHooks {self.hooks} every {self.period_s:g}s>"

    def start(self) -> None:
        if self.hooks and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            for name in self.hooks:
                await self.call(name)
            await asyncio.sleep(self.period_s * self._rng.uniform(1 - JITTER, 1 + JITTER))

    async def call(self, name: str) -> bool:
        """Call one hook and send what it returned; False when that failed (logged)."""
        try:
            stats = await asyncio.wait_for(self.user.call(name, (), {}), self.timeout_s)
            if name == ROUTING_HOOK:
                self.to_routers(routing_frame(stats, self.period_s))
                prefixes = prefix_frame(stats)
                if prefixes is not None:
                    self.to_routers(prefixes)
            else:
                self.to_controller(engine_report(stats, self.replica_id, self.period_s))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            level = logging.DEBUG if name in self._warned else logging.WARNING
            self._warned.add(name)
            what = (f"timed out after {self.timeout_s:g}s" if isinstance(exc, TimeoutError)
                    else f"failed: {exc!r}")
            log.log(level, "%s: %s %s (the next period tries again; later failures are "
                    "logged at debug level)", self.replica_id, name, what)
            return False
        return True
