"""The engines' own load as an autoscaling signal: replicas wanted before queues form.

Replicas whose class defines `record_autoscaling_stats` (Ray's hook; surge's LLMServer
reports `engine_waiting`, `engine_running`, `kv_cache_usage`) push it to the controller
every routing-stats period. The controller sums the fresh reports of one deployment into
an `EngineLoad` and `engine_demand` turns it into a number of replicas, which the
proactive policy takes as one more lower bound on its demand (`ScalingInputs.
engine_demand`):

* waiting sequences: an engine runs what its batch and KV cache allow, so the replicas'
  `running` is what they sustain now; with w waiting, (running + w) / running times the
  reporting replicas would run everything (a stalled engine, nothing running yet
  something waiting, asks for one more);
* KV-cache use, a pressure term that rises before anything waits (long prompts and
  outputs fill it while the batch is not full): replicas x mean use / `kv_target`.

Stale reports (older than two periods) are dropped by the caller (`fresh`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["KV_TARGET", "EngineLoad", "EngineReport", "engine_demand", "fresh_load"]

# The KV-cache use each replica is sized for: above it vLLM starts to preempt sequences.
KV_TARGET = 0.8
# A report counts for this many of its periods.
STALE_PERIODS = 2.0


@dataclass(frozen=True)
class EngineReport:
    """One replica's `record_autoscaling_stats`, as the controller received it."""

    replica_id: str
    waiting: float
    running: float
    kv_cache_usage: float  # 0..1
    period_s: float  # how often the replica reports
    at: float = 0.0  # when it arrived (the controller's monotonic clock)


@dataclass(frozen=True)
class EngineLoad:
    """The fresh reports of one deployment, summed (KV use: the mean)."""

    replicas: int
    waiting: float
    running: float
    kv_cache_usage: float


def fresh_load(reports: Iterable[EngineReport], now: float) -> EngineLoad | None:
    """The sum of the reports not older than STALE_PERIODS of their periods; None: none."""
    live = [r for r in reports if now - r.at <= STALE_PERIODS * r.period_s + 0.05]
    if not live:
        return None
    return EngineLoad(len(live), sum(r.waiting for r in live), sum(r.running for r in live),
                      sum(r.kv_cache_usage for r in live) / len(live))


def engine_demand(load: EngineLoad | None, kv_target: float = KV_TARGET) -> float:
    """Replicas the engines' queues and KV caches ask for (0.0: no signal)."""
    if load is None or load.replicas <= 0:
        return 0.0
    queued = 0.0
    if load.waiting > 0:
        queued = (load.replicas * (load.running + load.waiting) / load.running
                  if load.running > 0 else load.replicas + 1.0)
    pressure = load.replicas * load.kv_cache_usage / kv_target if kv_target > 0 else 0.0
    return max(queued, pressure)
