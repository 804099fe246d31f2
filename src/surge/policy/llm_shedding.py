"""Shed, do not fail: whether a replica admits a new LLM request against its TTFT target.

A request admitted to an engine waits behind the prompt tokens already admitted and not
yet answered (the replica's prefill backlog), then its own prompt is computed, at the
prefill rate the replica measured (policy/llm_capacity.py). When that predicted TTFT
exceeds ADMIT_FRACTION of the deployment's TTFT objective the request would likely miss it,
and queueing it makes every request behind it later still: it is answered at once, 429
with Retry-After (the time the backlog needs to drain to where it would be admitted) in
the OpenAI error shape, instead of a timeout or a 5xx later. The autoscaler meanwhile sizes for the
same objective (policy/llm_objectives.py), so while replicas can be added the shed is a
short burst's; at max_replicas it is the excess the budget cannot serve.

Never shed: an idle engine (one prompt alone may take longer than the target: more
replicas would not make it faster), or before the replica measured its prefill rate.
"""

from __future__ import annotations

__all__ = ["ADMIT_FRACTION", "MIN_RETRY_AFTER_S", "predicted_ttft_s", "shed_retry_after"]

# Retry-After is whole seconds on the wire; a shorter wait rounds up to this.
MIN_RETRY_AFTER_S = 1.0
# Admit up to this share of the TTFT target: the prediction is a mean (the prefill rate
# measured over 10 s), and a request admitted at the target's very edge misses it by
# the prediction's error (bench/llm_shed_pulse.py: 88.6% of the served within the
# objectives when admitting up to the whole target).
ADMIT_FRACTION = 0.8


def predicted_ttft_s(backlog_tokens: float, prompt_tokens: float,
                     prefill_tokens_per_s: float) -> float:
    """The TTFT a new prompt would see behind the backlog; 0.0 while unmeasured."""
    if prefill_tokens_per_s <= 0:
        return 0.0
    return (backlog_tokens + prompt_tokens) / prefill_tokens_per_s


def shed_retry_after(backlog_tokens: float, prompt_tokens: float,
                     prefill_tokens_per_s: float, ttft_s: float) -> float | None:
    """None: admit. Else shed, and the Retry-After to answer with (seconds)."""
    if backlog_tokens <= 0 or prefill_tokens_per_s <= 0:
        return None
    predicted = predicted_ttft_s(backlog_tokens, prompt_tokens, prefill_tokens_per_s)
    bound = ADMIT_FRACTION * ttft_s
    if predicted <= bound:
        return None
    return max(MIN_RETRY_AFTER_S, predicted - bound)
