"""Goodput objectives of an LLM pulse, as `vllm bench serve --goodput` states and counts
them: a stream is good when it met every stated one of time to first token (TTFT), time
per output token after the first (TPOT) and end-to-end latency (E2EL), in milliseconds.

`Slo.parse(["ttft:200", "tpot:50"])` reads vLLM's flag format; a scenario's `llm:` may
give the same as a mapping (`goodput: {ttft: 200, tpot: 50}`). A stream of one token has
a TPOT of 0, as vLLM counts it. surge's TTFT and E2EL run from the request's scheduled
send time (every pulse latency does), so a generator that falls behind counts against
goodput, where vLLM's client times from its actual send.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from surge.config.schema import check_keys, number

__all__ = ["SLO_METRICS", "Slo"]

SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for metric in SLO_METRICS:
            value = getattr(self, f"{metric}_ms")
            if value is not None:
                number(f"goodput {metric}", value, gt=0)
        if self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None:
            raise ValueError("goodput needs at least one of ttft, tpot, e2el (ms), "
                             "as in --goodput ttft:200 tpot:50")

    @classmethod
    def parse(cls, spec: Iterable[str] | Mapping[str, float]) -> Slo:
        """From `["ttft:200", "tpot:50"]` (vLLM's flag) or `{"ttft": 200, "tpot": 50}`."""
        if isinstance(spec, Mapping):
            pairs = dict(spec)
        else:
            pairs = {}
            for item in spec:
                name, sep, value = str(item).partition(":")
                if not sep:
                    raise ValueError(f"a goodput objective is METRIC:MS, got {item!r}")
                try:
                    pairs[name.strip()] = float(value)
                except ValueError:
                    raise ValueError(f"goodput {name.strip()}: {value!r} is not a number "
                                     "of milliseconds") from None
        check_keys(pairs, SLO_METRICS, "goodput")
        return cls(**{f"{name}_ms": value for name, value in pairs.items()})

    def to_spec(self) -> dict[str, float]:
        return {metric: value for metric in SLO_METRICS
                if (value := getattr(self, f"{metric}_ms")) is not None}

    def met(self, ttft_s: float, tpot_s: float, e2el_s: float) -> bool:
        """Whether a stream with these measures (seconds) met every stated objective."""
        return ((self.ttft_ms is None or ttft_s * 1000 <= self.ttft_ms)
                and (self.tpot_ms is None or tpot_s * 1000 <= self.tpot_ms)
                and (self.e2el_ms is None or e2el_s * 1000 <= self.e2el_ms))
