"""Replicas an LLM deployment needs for its latency objectives (p99 TTFT and TPOT).

An engine's latency has two budgets, and each is spent by a different resource:

* **TTFT, prefill-bound.** A new prompt waits behind the prompt tokens its replica has
  admitted and not yet answered (the *prefill backlog*), then is computed at the
  replica's prefill rate P (tokens/s, measured by the replica while it had a backlog).
  Two demands follow. The flow: prompts of p tokens arriving at rate r (projected over
  the start-up lead, as the proactive policy projects it) need r x p / (P x rho)
  replicas, with rho the utilization at which an M/D/1 queue's mean wait plus its
  service time p/P stays within the TTFT target (rho = 2k / (1 + 2k), k = T / (p/P) - 1,
  kept within [RHO_MIN, RHO_MAX]). The backlog: B tokens, plus the router-queued
  requests' prompts, drained within the target need B / (P x T) replicas. The backlog
  grows as soon as prefill falls behind, whatever the KV cache holds: prefill-heavy load
  with KV use near 30% and a growing queue is seen (llm-d-autoscaling#662).
* **TPOT, decode-bound.** A decode step costs `decode_step_s + decode_s_per_seq x batch`
  (fitted by each replica to its inter-token gaps), so TPOT stays within its target T
  up to a batch of (T - decode_step_s) / decode_s_per_seq, and no engine batches more
  than its max_num_seqs (the deployment's `target_ongoing_requests`). Running, waiting
  and router-queued sequences (all decode once prefilled), plus those the deployment
  will hold beyond them a start-up lead from now and their spread (`margin`), over that
  batch are the decode demand. A target that a step of one sequence already misses is
  unreachable by any number of replicas: the engine's own batch sizes then, and the
  reason says so.
* **KV-bound.** Replicas x mean KV use / KV_TARGET (policy/engine_load.py).

The largest of the three is the demand, and names the reason (`bound`). Until a
replica has measured, documented fallbacks stand in: DEFAULT_PREFILL_TOKENS_PER_S for
P, and for the decode batch the deployment's `target_ongoing_requests` (LLMServer sets
it to the engine's max_num_seqs). Pure: plain numbers in, a number and a reason out.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from surge.config.autoscaling import Objectives
from surge.policy.engine_load import KV_TARGET, EngineLoad

__all__ = [
    "DEFAULT_PREFILL_TOKENS_PER_S",
    "RHO_MAX",
    "RHO_MIN",
    "Bound",
    "ObjectiveDemand",
    "max_decode_batch",
    "objective_demand",
    "prefill_utilization",
    "tpot_reachable",
]

# Prefill tokens/s a replica is assumed to sustain until it measured its own: an 8B
# model's prefill on one GPU is 10^4 tokens/s in order of magnitude.
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0
# The prefill utilization sized for: never past 90% (the wait grows without bound near
# 1), and never below 50% for a target a single prompt alone nearly misses (more
# replicas cannot make one prompt's prefill faster).
RHO_MAX = 0.9
RHO_MIN = 0.5


class Bound(enum.StrEnum):
    """Which resource the demand is sized by."""

    PREFILL = "prefill"  # the TTFT objective: the prefill flow or backlog
    DECODE = "decode"  # the TPOT objective: the decode batch
    KV = "kv"  # the KV cache
    NONE = "none"  # no load


@dataclass(frozen=True)
class ObjectiveDemand:
    replicas: float
    bound: Bound
    reason: str
    signals: Mapping[str, float] = field(default_factory=dict)


def prefill_utilization(ttft_s: float, prefill_s: float) -> float:
    """The utilization at which an M/D/1 queue's TTFT (wait + service) is `ttft_s`."""
    if prefill_s <= 0:
        return RHO_MAX
    k = ttft_s / prefill_s - 1.0  # the wait the target allows, in service times
    if k <= 0:
        return RHO_MIN
    return min(RHO_MAX, max(RHO_MIN, 2 * k / (1 + 2 * k)))


def tpot_reachable(tpot_s: float, step_s: float, per_seq_s: float) -> bool:
    """Whether a step of one sequence meets `tpot_s` (True while unmeasured)."""
    return per_seq_s <= 0 or tpot_s >= step_s + per_seq_s


def max_decode_batch(tpot_s: float, step_s: float, per_seq_s: float, fallback: float) -> float:
    """The batch at which a decode step takes `tpot_s`, never past `fallback` (the
    engine's max_num_seqs: it batches no more, however fast its steps); `fallback` while
    unmeasured, and when no batch meets the target (a step of one sequence misses it):
    then no number of replicas meets it, and sizing one replica a sequence would spend
    the whole budget for nothing."""
    if per_seq_s <= 0 or not tpot_reachable(tpot_s, step_s, per_seq_s):
        return max(fallback, 1.0)
    fitted = (tpot_s - step_s) / per_seq_s
    return max(min(fitted, fallback) if fallback > 0 else fitted, 1.0)


def _prefill(load: EngineLoad, ttft_s: float, projected_rate: float,
             router_queued: float) -> tuple[float, dict[str, float]]:
    rate = load.prefill_tokens_per_s or DEFAULT_PREFILL_TOKENS_PER_S
    prompt = load.prompt_tokens
    rho = prefill_utilization(ttft_s, prompt / rate)
    flow = projected_rate * prompt / (rate * rho)
    backlog = load.prefill_backlog_tokens + router_queued * prompt
    drain = backlog / (rate * ttft_s)
    return max(flow, drain), {"prefill_tokens_per_s": rate, "prompt_tokens": prompt,
                              "prefill_rho": rho, "prefill_flow_replicas": flow,
                              "prefill_backlog_tokens": backlog,
                              "prefill_backlog_replicas": drain}


def _decode(load: EngineLoad, tpot_s: float, margin: float, fallback_batch: float,
            router_queued: float) -> tuple[float, dict[str, float]]:
    batch = max_decode_batch(tpot_s, load.decode_step_s, load.decode_s_per_seq,
                             fallback_batch)
    sequences = load.running + load.waiting + router_queued + margin
    reachable = tpot_reachable(tpot_s, load.decode_step_s, load.decode_s_per_seq)
    return sequences / batch, {"decode_batch_max": batch, "decode_sequences": sequences,
                               "decode_tpot_reachable": float(reachable),
                               "decode_one_step_s": load.decode_step_s
                               + load.decode_s_per_seq}


def objective_demand(load: EngineLoad, objectives: Objectives, *,
                     projected_rate: float, router_queued: float = 0.0,
                     fallback_batch: float, kv_target: float = KV_TARGET,
                     margin: float = 0.0) -> ObjectiveDemand:
    """Replicas the objectives ask for, given the engines' reports and the offered load.

    `projected_rate` is the offered requests/s over the start-up lead;
    `router_queued` the requests waiting in routers (not yet in any engine's backlog);
    `margin` the requests the deployment will hold a start-up lead from now beyond those
    and the headroom for their swing (policy.autoscaling: llm_in_flight_ahead +
    llm_spread_sd x llm_in_flight_spread).
    """
    signals: dict[str, float] = {}
    demands: dict[Bound, float] = {}
    if objectives.ttft_s is not None:
        demands[Bound.PREFILL], more = _prefill(load, objectives.ttft_s, projected_rate,
                                                router_queued)
        signals.update(more)
    if objectives.tpot_s is not None:
        demands[Bound.DECODE], more = _decode(load, objectives.tpot_s, margin,
                                              fallback_batch, router_queued)
        signals.update(more)
    demands[Bound.KV] = load.replicas * load.kv_cache_usage / kv_target if kv_target > 0 \
        else 0.0
    bound, replicas = max(demands.items(), key=lambda item: item[1])
    if replicas <= 0:
        bound = Bound.NONE
    signals.update({f"{b.value}_replicas": d for b, d in demands.items()})
    signals["kv_cache_usage"] = load.kv_cache_usage
    return ObjectiveDemand(replicas, bound, _reason(bound, replicas, signals), signals)


def _reason(bound: Bound, replicas: float, s: Mapping[str, float]) -> str:
    kv = f"KV {100 * s['kv_cache_usage']:.0f}%"
    if bound is Bound.PREFILL:
        return (f"TTFT: {s['prefill_backlog_tokens']:.0f} prompt tokens waiting, "
                f"{s['prompt_tokens']:.0f} a prompt at {s['prefill_tokens_per_s']:.0f} "
                f"tokens/s a replica -> {replicas:.1f} replicas (prefill-bound; {kv})")
    if bound is Bound.DECODE:
        unreachable = ("" if s["decode_tpot_reachable"] else
                       f"; the TPOT target is unreachable: one sequence's step takes "
                       f"{1000 * s['decode_one_step_s']:.1f} ms, so sized at the engine's batch")
        return (f"TPOT: {s['decode_sequences']:.0f} sequences, at most "
                f"{s['decode_batch_max']:.0f} a replica -> {replicas:.1f} replicas "
                f"(decode-bound; {kv}{unreachable})")
    if bound is Bound.KV:
        return f"{kv} -> {replicas:.1f} replicas (KV-bound)"
    return "no load on the engines"
