"""The engines' own load as an autoscaling signal: replicas wanted before queues form.

Replicas whose class defines `record_autoscaling_stats` (Ray's hook; surge's LLMServer
reports `engine_waiting`, `engine_running`, `kv_cache_usage`) push it to the controller
every routing-stats period. The controller sums the fresh reports of one deployment into
an `EngineLoad` and `engine_demand` turns it into a number of replicas, which the
proactive policy takes as one more lower bound on its demand (`ScalingInputs.
engine_demand`):

* waiting sequences: an engine runs at most its batch (max_num_seqs: the deployment's
  `target_ongoing_requests`, which LLMServer sets to it), fewer once its KV cache is full
  (mean use past `kv_target`: then what the replicas run now is what they hold); with w
  waiting, (running + w) / that capacity replicas would run everything (a stalled engine,
  nothing running yet something waiting, asks for one more). Sized by the batch, not by
  what runs now: a request that arrived during a step waits until the next one (~30 ms)
  beside a half-empty batch, and a new replica's first, idle report runs nothing; neither
  is demand (sized by what runs now, each asked for 1.5x the replicas, and chained
  1 -> 2 -> 3 -> 4 within 15 s on a real run);
* KV-cache use, a pressure term that rises before anything waits (long prompts and
  outputs fill it while the batch is not full): replicas x mean use / `kv_target`.

Stale reports (older than two periods) are dropped by the caller (`fresh`).

A replica also reports what its engine measured of its own capacity, for a deployment
with latency objectives (policy/llm_objectives.py): the prompt tokens admitted and not
yet answered with a first token (the prefill backlog), the prefill rate it sustained
while it had such a backlog, the mean prompt length, and the decode step's cost as
`decode_step_s + decode_s_per_seq x batch` fitted to its inter-token gaps
(policy/llm_capacity.py measures them in the replica, for any engine). 0 means "not
measured yet"; summing takes the backlog's sum and the mean of each measured rate over
the replicas that measured it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["KV_TARGET", "EngineLoad", "EngineReport", "engine_capacity", "engine_demand",
           "fresh_load"]

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
    # What the replica measured (0: not yet): see the module's docstring.
    prefill_backlog_tokens: float = 0.0
    prefill_tokens_per_s: float = 0.0
    prompt_tokens: float = 0.0  # mean prompt length of its recent requests
    decode_step_s: float = 0.0
    decode_s_per_seq: float = 0.0


@dataclass(frozen=True)
class EngineLoad:
    """The fresh reports of one deployment, summed (KV use: the mean).

    Capacity fields are per replica (the mean of those that measured them; 0: none did),
    the backlog is the deployment's sum. A simulated replica measures the prefill ones
    with a real replica's meter (policy/llm_capacity.py) and takes the decode ones from
    its engine model's timing: decode_step_s = step_s, decode_s_per_seq =
    decode_s_per_seq.
    """

    replicas: int
    waiting: float
    running: float
    kv_cache_usage: float
    prefill_backlog_tokens: float = 0.0  # prompt tokens admitted, no first token yet (sum)
    prefill_tokens_per_s: float = 0.0  # what one replica sustains while it has a backlog
    prompt_tokens: float = 0.0  # mean prompt length
    decode_step_s: float = 0.0  # a decode step's fixed cost ...
    decode_s_per_seq: float = 0.0  # ... and its cost per sequence in the batch (0: unknown)


def fresh_load(reports: Iterable[EngineReport], now: float) -> EngineLoad | None:
    """The sum of the reports not older than STALE_PERIODS of their periods; None: none."""
    live = [r for r in reports if now - r.at <= STALE_PERIODS * r.period_s + 0.05]
    if not live:
        return None
    fitted = [r for r in live if r.decode_s_per_seq > 0]
    return EngineLoad(len(live), sum(r.waiting for r in live), sum(r.running for r in live),
                      sum(r.kv_cache_usage for r in live) / len(live),
                      prefill_backlog_tokens=sum(r.prefill_backlog_tokens for r in live),
                      prefill_tokens_per_s=_measured_mean(r.prefill_tokens_per_s for r in live),
                      prompt_tokens=_measured_mean(r.prompt_tokens for r in live),
                      decode_step_s=_measured_mean(r.decode_step_s for r in fitted),
                      decode_s_per_seq=_measured_mean(r.decode_s_per_seq for r in fitted))


def _measured_mean(values: Iterable[float]) -> float:
    """The mean of the values above 0 (measured), 0.0 when none is."""
    measured = [v for v in values if v > 0]
    return sum(measured) / len(measured) if measured else 0.0


def engine_demand(load: EngineLoad | None, batch: float = 0.0,
                  kv_target: float = KV_TARGET) -> float:
    """Replicas the engines' queues and KV caches ask for (0.0: no signal).

    `batch` is the sequences one engine runs at once (max_num_seqs; 0: not known)."""
    if load is None or load.replicas <= 0:
        return 0.0
    queued = 0.0
    if load.waiting > 0:
        capacity = engine_capacity(load, batch, kv_target)
        queued = ((load.running + load.waiting) / capacity if capacity > 0
                  else load.replicas + 1.0)
    pressure = load.replicas * load.kv_cache_usage / kv_target if kv_target > 0 else 0.0
    return max(queued, pressure)


def engine_capacity(load: EngineLoad, batch: float, kv_target: float = KV_TARGET) -> float:
    """Sequences one replica runs at once: `batch`, unless it is not known or the KV
    caches are past `kv_target` (then what the replicas run now is all they hold)."""
    running = load.running / load.replicas
    if batch <= 0 or load.kv_cache_usage >= kv_target:
        return min(running, batch) if batch > 0 else running
    return batch
