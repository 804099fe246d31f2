"""`surge pulse --preset chat|completions`: streaming OpenAI requests, and what they tell.

`LLMPreset` makes each request's body from its sequence number alone (a seeded draw of
a prompt length in words and of `max_tokens`, both uniform over their ranges), so
workers and reruns send the same requests. Bodies ask for `stream: true` with
`stream_options.include_usage`, and `ignore_eos` (vLLM's) unless told not to, so output
lengths are the drawn ones.

With `trace` (a Mooncake `.jsonl` or BurstGPT `.csv`, surge.loadtest.traces) the
requests are the trace's instead: sent at its arrival times (divided by `trace_speed`;
the schedule is made from them), each with its input length in words (equal hash ids
give equal words, so prefix reuse is replayed) and its output length as `max_tokens`.

`StreamTracker` follows one response's Server-Sent Events as the generator's parser
hands over body bytes: the first event with content is the first token (TTFT counts
from the request's scheduled time, like every latency of a pulse), the usage chunk
gives the output tokens (else content events are counted). As `vllm bench serve`
measures them: the time from the first to the last content event over the tokens after
the first is the request's time per output token (TPOT), and each gap between content
events is an inter-token latency (ITL; events read together are 0 apart, as vLLM's
client sees chunks that arrive in one read).

With `goodput` (loadtest/slo.py) the report counts the streams that met every objective.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from surge.config.schema import check_keys
from surge.loadtest.schedule import Schedule
from surge.loadtest.slo import Slo
from surge.loadtest.traces import TraceRequest, prompt_words, read_trace

__all__ = ["PRESETS", "LLMPreset", "StreamTracker", "parse_range"]

PRESETS = ("chat", "completions")
_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while",
          "surge", "serves", "models", "under", "sudden", "pulse", "of", "traffic", "from",
          "many", "chat", "users", "asking", "short", "questions", "about", "code", "shoes",
          "weather", "and", "travel", "plans")
# JSON as servers write it: compact (vLLM's) or with spaces (Python's json.dumps default)
_CONTENT = re.compile(rb'"(?:content|text)"\s*:\s*"(?:[^"\\]|\\.)')
_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def parse_range(text: str | int | list[int] | tuple[int, int]) -> tuple[int, int]:
    """`"16:64"`, `32`, or `[16, 64]` -> (low, high), 1 <= low <= high."""
    if isinstance(text, int):
        low = high = text
    elif isinstance(text, list | tuple):
        low, high = (int(v) for v in text)
    else:
        first, _, second = str(text).partition(":")
        low, high = int(first), int(second or first)
    if not 1 <= low <= high:
        raise ValueError(f"a range is LOW:HIGH with 1 <= LOW <= HIGH, got {text!r}")
    return low, high


@dataclass(frozen=True, kw_only=True)
class LLMPreset:
    kind: str = "chat"
    model: str | None = None
    prompt_words: tuple[int, int] = (16, 64)
    max_tokens: tuple[int, int] = (16, 64)
    ignore_eos: bool = True
    seed: int = 0
    trace: str | None = None  # a trace file to replay instead of drawn requests
    trace_speed: float = 1.0  # > 1 replays faster
    goodput: Slo | None = None  # objectives the report counts good streams against
    requests: tuple[TraceRequest, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}")
        object.__setattr__(self, "prompt_words", parse_range(self.prompt_words))
        object.__setattr__(self, "max_tokens", parse_range(self.max_tokens))
        if not self.trace_speed > 0:
            raise ValueError(f"trace_speed must be > 0, got {self.trace_speed}")
        if self.goodput is not None and not isinstance(self.goodput, Slo):
            object.__setattr__(self, "goodput", Slo.parse(self.goodput))
        if self.trace is not None and not self.requests:
            requests = tuple(read_trace(self.trace))
            if not requests:
                raise ValueError(f"{self.trace}: the trace has no requests")
            object.__setattr__(self, "requests", requests)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> LLMPreset:
        check_keys(spec, ("kind", "model", "prompt_words", "max_tokens", "ignore_eos", "seed",
                          "trace", "trace_speed", "goodput"), "llm")
        return cls(**dict(spec))

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "kind": self.kind, "model": self.model, "prompt_words": list(self.prompt_words),
            "max_tokens": list(self.max_tokens), "ignore_eos": self.ignore_eos,
            "seed": self.seed}
        if self.trace is not None:
            spec.update(trace=self.trace, trace_speed=self.trace_speed)
        if self.goodput is not None:
            spec["goodput"] = self.goodput.to_spec()
        return spec

    def trace_times(self, worker: int = 0, workers: int = 1) -> list[tuple[float, int]]:
        """(send time, trace index) of worker `worker`'s share of the trace, in order."""
        return [(r.at_s / self.trace_speed, i) for i, r in enumerate(self.requests)
                if i % workers == worker]

    def trace_schedule(self) -> Schedule:
        """The trace's arrivals as a schedule of 1 s steps (for the report and the
        run's length; the requests go at the trace's own times)."""
        seconds = [0] * (int(self.requests[-1].at_s / self.trace_speed) + 1)
        for r in self.requests:
            seconds[int(r.at_s / self.trace_speed)] += 1
        return Schedule.from_spec([{"rps": float(n), "for_s": 1.0} for n in seconds])

    def trace_body(self, index: int) -> bytes:
        """The body of the trace's request `index`."""
        request = self.requests[index]
        return self._body(" ".join(prompt_words(request, index)),
                          max(1, request.output_length))

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.kind == "chat" else "/v1/completions"

    def body(self, seq: int) -> bytes:
        rng = random.Random(self.seed * 1_000_003 + seq)
        words = rng.randint(*self.prompt_words)
        prompt = " ".join(rng.choice(_WORDS) for _ in range(words))
        return self._body(prompt, rng.randint(*self.max_tokens))

    def _body(self, prompt: str, max_tokens: int) -> bytes:
        request: dict[str, Any] = {"max_tokens": max_tokens,
                                   "stream": True, "stream_options": {"include_usage": True}}
        if self.model is not None:
            request["model"] = self.model
        if self.ignore_eos:
            request["ignore_eos"] = True
        if self.kind == "chat":
            request["messages"] = [{"role": "user", "content": prompt}]
        else:
            request["prompt"] = prompt
        return json.dumps(request, separators=(",", ":")).encode()


class StreamTracker:
    """One streamed response: when its content events came, and its output tokens."""

    __slots__ = ("events", "first", "gaps", "last", "tail", "usage")

    def __init__(self) -> None:
        self.first = -1.0  # time of the first content event (schedule seconds)
        self.last = -1.0
        self.events = 0  # content events
        self.gaps: list[float] = []  # seconds between content events (ITL)
        self.usage = -1  # completion_tokens from the usage chunk, if it came
        self.tail = b""  # the unfinished end of the last body part

    def feed(self, data: bytes, now: float) -> None:
        data = self.tail + data
        cut = data.rfind(b"\n\n") + 2
        complete, self.tail = data[:cut], data[cut:][-4096:]
        if not complete:
            return
        found = len(_CONTENT.findall(complete))
        if found:
            if self.first < 0:
                self.first = now
            else:
                self.gaps.append(now - self.last)
            if found > 1:
                self.gaps.extend([0.0] * (found - 1))
            self.last = now
            self.events += found
        usage = _USAGE.search(complete)
        if usage is not None:
            self.usage = int(usage.group(1))

    @property
    def tokens(self) -> int:
        return self.usage if self.usage >= 0 else self.events

    def tpot(self) -> float | None:
        """Seconds per output token after the first (None with fewer than two)."""
        tokens = self.tokens
        if tokens < 2 or self.first < 0:
            return None
        return (self.last - self.first) / (tokens - 1)
