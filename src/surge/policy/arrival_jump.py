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

A jump says when to decide; how fast the arrivals came is only trusted on more
evidence, since 2-4 arrivals cannot tell a step from chance: at 10 req/s the jumps a
Poisson stream makes by chance (one every few seconds) imply 30x its rate (median),
a 16x step's first jump 16x. So once the last SIZE_ARRIVALS arrivals came within the
span a Poisson stream at the recent rate gives SIZE_P of the time (a 16x step from
10 req/s: 34 ms in, median; a steady 10 req/s Poisson stream: about 9 times an hour),
the watch fires again, once per report, and sets `jump_rate`, (k - 2) / span over those
k arrivals (the mean-gap estimate, unbiased for a Poisson stream), which the urgent
report carries and the decision sizes on (policy/autoscaling.proactive). Not on a bursty
stream: the gaps' squared coefficient of variation (each gap in mean gaps at the recent
rate, so that a ramp in the rate does not read as burstiness; a weighted mean over about
CV2_ARRIVALS arrivals, once CV2_MIN_GAPS were seen) must be at most BURSTY_CV2. A gamma
stream of shape 0.25 (CV2 4, bench/llm_sim_targets.py's replay) makes such runs ten
times a minute, and sizing on them over-scaled the replay (docs/autoscaling.md).

The simulator's LLM flow keeps one too (sim/llm_flow.py), fed the same way: its arrivals,
and a report a tick.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["BURSTY_CV2", "CV2_ARRIVALS", "CV2_MIN_GAPS", "JUMP_ARRIVALS", "JUMP_P", "MIN_RATE",
           "QUANTILES", "RATE_WINDOW_S", "SIZE_ARRIVALS", "SIZE_P", "SIZE_QUANTILE", "ArrivalWatch",
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
# The rate is trusted on this many arrivals within the span that a Poisson stream at the
# recent rate gives 1 in 10^4 of the time (SIZE_QUANTILE mean gaps).
SIZE_ARRIVALS = 6
SIZE_P = 1e-4
SIZE_QUANTILE = poisson_quantile(SIZE_ARRIVALS - 1, SIZE_P)
# ... and only on a stream whose gaps' squared coefficient of variation (1: Poisson)
# is at most this, weighed over about CV2_ARRIVALS gaps.
BURSTY_CV2 = 1.5
CV2_ARRIVALS = 256
# ... and not before this many gaps were seen (a few gaps of a bursty stream read as
# a steady one: its long gaps are rare)
CV2_MIN_GAPS = 32


class ArrivalWatch:
    """One router's arrivals: whether the last few came too close together for its
    recent rate, and, on more of them, how fast. Times are the caller's clock
    (monotonic seconds)."""

    __slots__ = ("_armed", "_gap", "_gap2", "_seen", "_size_armed", "_size_span", "_spans",
                 "_times", "jump_rate", "rate")

    def __init__(self) -> None:
        self.rate = 0.0  # requests/s over about RATE_WINDOW_S
        self.jump_rate = 0.0  # requests/s a jump implied; 0.0: none since the last report
        self._spans = self._spans_at(0.0)
        self._size_span = SIZE_QUANTILE / MIN_RATE
        self._times: deque[float] = deque(maxlen=SIZE_ARRIVALS - 1)
        self._armed = True
        self._size_armed = True
        # the gaps (in mean gaps) and their squares: means over the first CV2_ARRIVALS,
        # then weighted means over about as many; and how many gaps were seen
        self._gap = self._gap2 = 0.0
        self._seen = 0

    def __repr__(self) -> str:
        return (f"<ArrivalWatch rate={self.rate:.2f}/s spans="
                f"{[round(s, 4) for s in self._spans]} armed={self._armed} "
                f"cv2={self.cv2:.2f} jump_rate={self.jump_rate:.1f}/s>")

    @property
    def cv2(self) -> float:
        """The gaps' squared coefficient of variation (1 for a Poisson stream); infinite
        until CV2_MIN_GAPS gaps were seen."""
        if self._seen < CV2_MIN_GAPS or self._gap <= 0.0:
            return math.inf
        return self._gap2 / (self._gap * self._gap) - 1.0

    @staticmethod
    def _spans_at(rate: float) -> tuple[float, ...]:
        per_s = max(rate, MIN_RATE)
        return tuple(q / per_s for q in QUANTILES)

    def arrived(self, now: float) -> bool:
        """Note an arrival at `now`: whether it makes a jump (once per report), or a run
        that sets `jump_rate` (once per report)."""
        times = self._times
        jump = False
        if self._armed:
            for gaps, span in enumerate(self._spans, 1):
                if gaps <= len(times) and now - times[-gaps] < span:
                    jump = True
                    self._armed = False
                    break
        if self._size_armed and len(times) == SIZE_ARRIVALS - 1 and \
                now - times[0] < self._size_span and self.cv2 <= BURSTY_CV2:
            self.jump_rate = (SIZE_ARRIVALS - 2) / max(now - times[0], 1e-9)
            self._size_armed = False
            jump = True
        if times:  # in mean gaps at the recent rate: a rate that moves is not burstiness
            self._gaps((now - times[-1]) * max(self.rate, MIN_RATE))
        times.append(now)
        return jump

    def _gaps(self, gap: float) -> None:
        self._seen += 1
        weight = 1.0 / min(self._seen, CV2_ARRIVALS)
        self._gap += weight * (gap - self._gap)
        self._gap2 += weight * (gap * gap - self._gap2)

    def reported(self, arrivals: float, covers_s: float, rearm: bool = True) -> None:
        """A load report counted `arrivals` over the `covers_s` before it: the recent
        rate takes them in, and it carries the jump's rate, if any, which is then spent; a
        regular report (`rearm`) lets the next jump fire."""
        if covers_s > 0.0:
            weight = 1.0 - math.exp(-covers_s / RATE_WINDOW_S)
            self.rate += weight * (arrivals / covers_s - self.rate)
            self._spans = self._spans_at(self.rate)
            self._size_span = SIZE_QUANTILE / max(self.rate, MIN_RATE)
        self.jump_rate = 0.0
        if rearm:
            self._armed = True
            self._size_armed = True
