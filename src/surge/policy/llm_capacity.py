"""What a replica's engine sustains, measured in the replica from its own requests.

Any engine: the OpenAI service (llm/service.py) tells the meter when a request is admitted
to the engine (with its prompt's tokens), when its first token came, each later
inter-token gap (with the decode batch then: this replica's requests past their first
token), and when it ended. A simulated replica (sim/llm_replica.py) tells the same meter
of its engine model's admissions and first tokens, so both measure prefill alike. From
that, `report()` gives LLMServer's `record_autoscaling_stats` keys for latency
objectives (policy/llm_objectives.py):

* `prefill_backlog_tokens`: prompt tokens admitted and not yet answered by a first token;
* `prefill_tokens_per_s`: prompt tokens answered per second *while the backlog was not
  empty*, over the last WINDOW_S (what prefill sustains under load, decode steps
  interleaved included);
* `prompt_tokens`: the mean prompt of the requests admitted in the window;
* `decode_step_s`, `decode_s_per_seq`: a least-squares line through the window's
  (batch, inter-token gap) pairs: a decode step's fixed cost and its cost per sequence.
  A window whose batch barely varied gives no slope: the gap over the mean batch is
  taken as the cost per sequence (an upper bound: the fixed cost is counted in it).

A measure keeps its last value through idle windows (capacity does not vanish when the
load does); 0 means "never measured". Time is a parameter (`now`, the service's clock).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

__all__ = ["MIN_GAPS", "WINDOW_S", "CapacityMeter"]

# The window each measure is taken over: long enough for a few hundred requests at
# modest load, short enough to follow a change of prompt mix.
WINDOW_S = 10.0
# A window needs this much busy prefill time, and this many gaps, to measure.
MIN_BUSY_S = 0.05
MIN_GAPS = 20
# A batch that varied less than this (variance, in sequences^2) gives no slope.
MIN_BATCH_VARIANCE = 1.0


@dataclass(slots=True)
class _Totals:
    """Running sums since the meter began (a copy in the history: as of `at`)."""

    at: float = 0.0
    admitted: float = 0.0  # requests admitted
    admitted_tokens: float = 0.0
    answered_tokens: float = 0.0  # prompt tokens whose first token came
    busy_s: float = 0.0  # time with a non-empty backlog
    gaps: float = 0.0  # (batch, gap) pairs and their sums
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0


class CapacityMeter:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.backlog_tokens = 0  # prompt tokens admitted, no first token yet
        self.decoding = 0  # requests past their first token, not ended
        self._now = _Totals()
        # snapshots of the sums at each report, the oldest the window's start (the
        # meter's own: zeros, so the first report measures everything since it began)
        self._history: deque[_Totals] = deque([_Totals()])
        self._busy_since: float | None = None
        self.prefill_tokens_per_s = 0.0
        self.prompt_tokens = 0.0
        self.decode_step_s = 0.0
        self.decode_s_per_seq = 0.0

    def __repr__(self) -> str:
        return (f"<CapacityMeter backlog={self.backlog_tokens} decoding={self.decoding} "
                f"prefill={self.prefill_tokens_per_s:.0f}/s "
                f"decode={self.decode_step_s:.4f}+{self.decode_s_per_seq:.5f}/seq>")

    # -- events ---------------------------------------------------------------------

    def admitted(self, prompt_tokens: int, now: float) -> None:
        self._backlog(prompt_tokens, now)
        self._now.admitted += 1
        self._now.admitted_tokens += prompt_tokens

    def first_token(self, prompt_tokens: int, now: float) -> None:
        self._backlog(-prompt_tokens, now)
        self._now.answered_tokens += prompt_tokens
        self.decoding += 1

    def ended(self, prompt_tokens: int, answered: bool, now: float) -> None:
        """A request ended: finished or aborted, after its first token or before it."""
        if answered:
            self.decoding -= 1
        else:
            self._backlog(-prompt_tokens, now)

    def gap(self, seconds: float, batch: int) -> None:
        """One inter-token gap of a request decoding in a batch of `batch`."""
        t = self._now
        t.gaps += 1
        t.sx += batch
        t.sy += seconds
        t.sxx += batch * batch
        t.sxy += batch * seconds

    def _backlog(self, change: int, now: float) -> None:
        if self._busy_since is not None:
            self._now.busy_s += now - self._busy_since
        self.backlog_tokens = max(0, self.backlog_tokens + change)
        self._busy_since = now if self.backlog_tokens > 0 else None

    # -- the report -----------------------------------------------------------------

    def report(self, now: float) -> dict[str, float]:
        """The measures over the last window (updating each that has enough data)."""
        self._backlog(0, now)  # close the busy time up to now
        current = replace(self._now, at=now)
        self._history.append(current)
        while len(self._history) > 1 and self._history[1].at <= now - self.window_s:
            self._history.popleft()
        self._measure(self._history[0], current)
        return {"prefill_backlog_tokens": float(self.backlog_tokens),
                "prefill_tokens_per_s": self.prefill_tokens_per_s,
                "prompt_tokens": self.prompt_tokens,
                "decode_step_s": self.decode_step_s,
                "decode_s_per_seq": self.decode_s_per_seq}

    def _measure(self, old: _Totals, new: _Totals) -> None:
        busy = new.busy_s - old.busy_s
        answered = new.answered_tokens - old.answered_tokens
        if busy >= MIN_BUSY_S and answered > 0:
            self.prefill_tokens_per_s = answered / busy
        admitted = new.admitted - old.admitted
        if admitted > 0:
            self.prompt_tokens = (new.admitted_tokens - old.admitted_tokens) / admitted
        n = new.gaps - old.gaps
        if n >= MIN_GAPS:
            self.decode_step_s, self.decode_s_per_seq = _fit(
                n, new.sx - old.sx, new.sy - old.sy, new.sxx - old.sxx, new.sxy - old.sxy)


def _fit(n: float, sx: float, sy: float, sxx: float, sxy: float) -> tuple[float, float]:
    """(intercept, slope) of gap against batch; a line through 0 when it cannot fit."""
    mean_x, mean_y = sx / n, sy / n
    var = sxx / n - mean_x * mean_x
    if var >= MIN_BATCH_VARIANCE:
        slope = (sxy / n - mean_x * mean_y) / var
        intercept = mean_y - slope * mean_x
        if slope > 0 and intercept >= 0:
            return intercept, slope
    return 0.0, mean_y / mean_x if mean_x > 0 else 0.0

