"""One simulated LLM replica: an EngineModel stepped on virtual time, as the mock engine is.

surge.testing's MockVLLMEngine loops: wait for work, `step()`, sleep the step's modelled
duration, hand out its tokens. The simulator does the same on its event heap
(sim/llm_flow.py): a step starts when a request is added to an idle engine or when the
step before ends with work left, and its tokens (first tokens, finished sequences)
count at its end. A request reaches the engine `request_s` after it was dispatched (the
frontend's cost, as the mock sleeps it). So one request alone sees exactly the model's
TTFT: `request_s` + the steps up to its first token.

Prompts are token ids: equal Mooncake hash ids give equal 512-token blocks (prefix reuse
survives, as loadtest/traces.prompt_words keeps it for a real run); a request without
hash ids has a first token of its own, so no block of it is ever another's.

Each replica measures its prefill with the meter a real replica uses
(policy/llm_capacity.CapacityMeter), told of each request added to the engine model and
of its first token: prompt tokens answered by a first token per second while its prefill
backlog (prompt tokens added to the engine, no first token yet) was not empty, over the
meter's last 10 s, taken at each report; 0 ("not measured") until a window held enough
busy time. It is below 1 / prefill_s_per_token by the steps' fixed cost and the decode
interleaved (steps that prefill nothing while the batch is full): at
bench/llm_objectives.py's 10 -> 160 req/s step, 34,700-37,600 tokens/s of a nominal
50,000, where real replicas measured 34,300-34,800. Admission reads that rate
(sim/llm_flow.py) and the autoscaling report gives it, with the meter's backlog and mean
prompt, as a real replica's does (`report`). The meter is told of each end but not of
inter-token gaps (a gap a token would be per-token work): the decode step's cost
reported is the timing's.

`probe_capacity` runs one engine closed-loop on a trace's lengths with a fixed number
of requests in flight: what one replica completes per second at that load, the unit of
the LLM report's oracle.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from itertools import cycle

from surge.loadtest.traces import BLOCK_TOKENS, TraceRequest
from surge.policy.engine_load import EngineReport
from surge.policy.llm_capacity import CapacityMeter
from surge.sim.engine_model import VOCAB, EngineModel, EngineTiming, StepOutput

__all__ = ["LLMReplica", "LLMRequest", "probe_capacity", "prompt_tokens"]

# Token ids are 32-bit in block hashes (sim/kv_blocks.py): block ids are folded below this.
_TOKEN_SPACE = 4_000_000_000
# A step that scheduled nothing still takes this long (never a zero-time loop).
_MIN_STEP_S = 1e-4
# The probe measures after this many completions, over this many more.
_PROBE_WARMUP = 50
_PROBE_COMPLETIONS = 300
_PROBE_REQUESTS = 2000  # the trace's first, whose lengths it cycles through


def prompt_tokens(request: TraceRequest, index: int) -> tuple[int, ...]:
    """`input_length` token ids; equal hash ids, equal blocks; else the request's own."""
    n = request.input_length
    if not request.hash_ids:
        return (VOCAB + index % (_TOKEN_SPACE - VOCAB), *range(1, n))
    out: list[int] = []
    for block in request.hash_ids:
        base = block * 7919
        out += [(base + j) % _TOKEN_SPACE for j in range(BLOCK_TOKENS)]
        if len(out) >= n:
            break
    out += range(len(out), n)  # longer than its blocks (never in generated traces)
    return tuple(out[:n])


@dataclass(eq=False, slots=True)
class LLMRequest:
    index: int  # in the trace
    arrived: float
    point: int  # the 100 ms point it arrived in
    trace: TraceRequest
    done: bool = False  # dispatched, timed out or rejected: the router is done with it
    replica: LLMReplica | None = None
    first_at: float | None = None  # its first token
    tokens: int = 0  # output tokens so far
    shed: bool = False  # a replica shed it once: the router tried another (retry_shed)


@dataclass(eq=False)
class LLMReplica:
    replica_id: str
    model: EngineModel
    in_flight: int = 0  # dispatched here and not finished
    saturated_until: float = 0.0  # it shed: the router holds it as full until then
    stepping: bool = False  # a step is under way
    routable: bool = True
    requests: dict[str, LLMRequest] = field(default_factory=dict)
    # the last routing-stats report: (engine queue, in flight then, when)
    reported: tuple[int, int, float] | None = None
    engine_report: EngineReport | None = None  # the last autoscaling stats
    steps: int = 0
    meter: CapacityMeter = field(default_factory=CapacityMeter)  # (see the module's doc)

    @classmethod
    def new(cls, replica_id: str, timing: EngineTiming) -> LLMReplica:
        return cls(replica_id, EngineModel(timing))

    def __repr__(self) -> str:
        return (f"<LLMReplica {self.replica_id} in_flight={self.in_flight} "
                f"routable={self.routable} {self.model!r}>")

    @property
    def queue(self) -> int:
        """What the engine holds: waiting + running sequences (its routing stats)."""
        return len(self.model.waiting) + len(self.model.running)

    def add(self, request: LLMRequest, now: float) -> None:
        sid = str(request.index)
        self.requests[sid] = request
        self.meter.admitted(request.trace.input_length, now)
        self.model.add(sid, prompt_tokens(request.trace, request.index),
                       max(1, request.trace.output_length))

    def first_token(self, request: LLMRequest, now: float) -> None:
        """`request`'s first token came at `now`: its prompt leaves the backlog."""
        self.meter.first_token(request.trace.input_length, now)

    def finished(self, sid: str, now: float) -> LLMRequest:
        """Sequence `sid` finished at `now`: it leaves the replica and its meter."""
        request = self.requests.pop(sid)
        self.meter.ended(request.trace.input_length, answered=True, now=now)
        return request

    def step(self) -> StepOutput | None:
        """The next step (None: the engine is idle); its duration is never zero."""
        if self.model.idle:
            self.stepping = False
            return None
        self.stepping = True
        self.steps += 1
        return self.model.step()

    def report(self, now: float, period_s: float) -> EngineReport:
        """What LLMServer's record_autoscaling_stats would say now: the prefill backlog,
        rate and mean prompt as the replica's meter measured them (0: not yet), as a real
        replica reports them; the decode step's cost from the timing (step_s +
        decode_s_per_seq x batch), which a real replica fits to its inter-token gaps."""
        model, timing = self.model, self.model.timing
        measured = self.meter.report(now)
        return EngineReport(
            self.replica_id, float(len(model.waiting)), float(len(model.running)),
            model.blocks.usage(), period_s, now,
            prefill_backlog_tokens=measured["prefill_backlog_tokens"],
            prefill_tokens_per_s=measured["prefill_tokens_per_s"],
            prompt_tokens=measured["prompt_tokens"],
            decode_step_s=timing.step_s, decode_s_per_seq=timing.decode_s_per_seq)

    @staticmethod
    def duration(out: StepOutput) -> float:
        return out.duration_s if out.duration_s > 0 else _MIN_STEP_S


def probe_capacity(timing: EngineTiming, requests: tuple[TraceRequest, ...],
                   in_flight: int) -> tuple[float, float]:
    """(completions per second, mean request seconds) of one engine kept at `in_flight`
    requests, drawn in turn from `requests`' lengths (virtual time)."""
    lengths = tuple((r.input_length, r.output_length) for r in requests[:_PROBE_REQUESTS])
    return _probe(timing, lengths or ((1, 1),), in_flight)


@functools.lru_cache(maxsize=16)  # a scenario's variants are validated with the same
def _probe(timing: EngineTiming, requests: tuple[tuple[int, int], ...],
           in_flight: int) -> tuple[float, float]:
    model = EngineModel(timing)
    lengths = cycle(requests)
    started: dict[str, float] = {}
    index, now, done = 0, 0.0, 0
    measured_from = spent = 0.0

    def add() -> None:
        nonlocal index
        prompt, output = next(lengths)
        sid = str(index)
        model.add(sid, (VOCAB + index, *range(1, prompt)), max(1, output))
        started[sid] = now
        index += 1

    for _ in range(max(1, in_flight)):
        add()
    while done < _PROBE_WARMUP + _PROBE_COMPLETIONS:
        out = model.step()
        now += out.duration_s if out.duration_s > 0 else _MIN_STEP_S
        for sid in out.finished:
            done += 1
            if done == _PROBE_WARMUP:
                measured_from = now
            elif done > _PROBE_WARMUP:
                spent += now - started[sid]
            del started[sid]
            add()
    return _PROBE_COMPLETIONS / (now - measured_from), spent / _PROBE_COMPLETIONS
