"""Arrival jumps: when a router tells the controller at once that its arrivals jumped.

A router reports within URGENT_REPORT_DELAY_S when its queue starts to grow
(policy/cadence.py), and the controller decides on the open bucket at once. An LLM
deployment's requests queue in its engines, not in its routers (max_ongoing_requests is
at least the engine's batch), so its routers never queue: a step in its arrivals reached
the controller with the next load report (up to 0.1 s) and was decided on at the next
tick (up to 0.1 s more). At LLM rates the step itself is a few requests: at 16 req/s a
0.1 s bucket holds 1.6 of them, and what shows the step first is how close together the
last few arrivals came, against the rate the router saw before.

So such a router keeps an `ArrivalWatch`: the rate of its recent reports (an
exponentially weighted mean over RATE_WINDOW_S), and the times of its last few arrivals.
An arrival whose last k arrivals (k = 2 .. JUMP_ARRIVALS, itself included) came within
a span that a Poisson stream at that rate gives less than JUMP_P of the time is a jump:
the router reports at once (`load_urgent`), at most once per regular report. The test
only says when to decide, never what: the controller runs the same step as at a tick
(the objectives' sizing of the projected rate, policy/llm_objectives.py), so a jump the
replicas absorb scales nothing. The per-arrival cost is a clock read and up to
JUMP_ARRIVALS - 1 comparisons with spans worked out once per report (the Poisson
quantiles are the rate's multiples, computed once: `QUANTILES`).

The simulator's LLM flow keeps one too (sim/llm_flow.py), fed the same way: its arrivals,
and a report a tick.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["JUMP_ARRIVALS", "JUMP_P", "MIN_RATE", "QUANTILES", "RATE_WINDOW_S", "ArrivalWatch",
           "poisson_quantile"]

# The chance, per arrival and per k, that a steady stream at the recent rate is read as
# a jump: 1 in 100. At 16 req/s that is at most a few early reports a minute (each
# an early decision on the same load, at most one per report interval), against a
# step seen on its second or third request.
JUMP_P = 0.01
# Tests on the last 2, 3 and 4 arrivals: two within 0.01 of a mean gap at the recent
# rate, three within 0.15 of one, four within 0.44 of one (QUANTILES).
JUMP_ARRIVALS = 4
# The recent rate: a mean over about this long (two seconds of reports at 0.1 s; a
# step reads as a jump until it has been going for about this long).
RATE_WINDOW_S = 2.0
# A router that saw nothing lately counts as seeing this rate (one request a window).
MIN_RATE = 1.0 / RATE_WINDOW_S


def poisson_quantile(n: int, p: float) -> float:
    """The mean m at which a Poisson count reaches `n` with probability `p`: the span
    (in mean gaps) within which `n` more arrivals come `p` of the time."""
    low, high = 0.0, float(n) + 10.0 * math.sqrt(n) + 10.0
    for _ in range(100):
        mid = (low + high) / 2
        below = sum(math.exp(-mid) * mid**i / math.factorial(i) for i in range(n))
        if 1.0 - below < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2


# For k - 1 = 1, 2, 3 gaps: the span, in mean gaps, that k arrivals fit in JUMP_P of the time.
QUANTILES = tuple(poisson_quantile(n, JUMP_P) for n in range(1, JUMP_ARRIVALS))


class ArrivalWatch:
    """One router's arrivals: whether the last few came too close together for its
    recent rate. Times are the caller's clock (monotonic seconds)."""

    __slots__ = ("_armed", "_spans", "_times", "rate")

    def __init__(self) -> None:
        self.rate = 0.0  # requests/s over about RATE_WINDOW_S
        self._spans = self._spans_at(0.0)
        self._times: deque[float] = deque(maxlen=JUMP_ARRIVALS - 1)
        self._armed = True

    def __repr__(self) -> str:
        return (f"<ArrivalWatch rate={self.rate:.2f}/s spans="
                f"{[round(s, 4) for s in self._spans]} armed={self._armed}>")

    @staticmethod
    def _spans_at(rate: float) -> tuple[float, ...]:
        per_s = max(rate, MIN_RATE)
        return tuple(q / per_s for q in QUANTILES)

    def arrived(self, now: float) -> bool:
        """Note an arrival at `now`: whether it makes a jump (once per report)."""
        times = self._times
        jump = False
        if self._armed:
            for gaps, span in enumerate(self._spans, 1):
                if gaps <= len(times) and now - times[-gaps] < span:
                    jump = True
                    self._armed = False
                    break
        times.append(now)
        return jump

    def reported(self, arrivals: float, covers_s: float, rearm: bool = True) -> None:
        """A load report counted `arrivals` over the `covers_s` before it: the recent
        rate takes them in; a regular report (`rearm`) lets the next jump fire."""
        if covers_s > 0.0:
            weight = 1.0 - math.exp(-covers_s / RATE_WINDOW_S)
            self.rate += weight * (arrivals / covers_s - self.rate)
            self._spans = self._spans_at(self.rate)
        if rearm:
            self._armed = True
