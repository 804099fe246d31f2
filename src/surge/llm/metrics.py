"""The LLM server's metrics, in the names Ray Serve LLM exports vLLM's under.

vLLM names its metrics `vllm:<name>`; Ray Serve LLM records them through Ray's metrics
with the `:` made `_`, and Ray exports them as `ray_vllm_<name>`. These are recorded as
`serve.metrics` in the replica, so the controller exports them the same way, beside
surge's own `surge_llm_*` (the replica's share of each request's latency). Per-request
histograms are recorded as tokens stream; the engine's gauges (waiting, running, KV
cache) and its prefix-cache counters (vLLM's `vllm:prefix_cache_queries` / `_hits`, in
prompt tokens) are sampled every `SAMPLE_S`.
"""

from __future__ import annotations

from surge.llm.engine import EngineStats
from surge.observability import llm_metrics as names
from surge.replica.metrics import Counter, Gauge, Histogram

__all__ = ["SAMPLE_S", "LLMMetrics"]

# Engine gauges are sampled this often: fresh enough for a dashboard and for the
# routing stats, cheap enough to forget.
SAMPLE_S = 0.5

# vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards built for it read the same.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
TAGS = ("model_name",)


class LLMMetrics:
    def __init__(self, model_name: str) -> None:
        tags = {"model_name": model_name}
        self.ttft = Histogram(names.TTFT,
                              "Time to first token, seconds.", TTFT_BUCKETS,
                              TAGS).set_default_tags(tags)
        self.itl = Histogram(names.ITL,
                             "Time between output tokens, seconds.", ITL_BUCKETS,
                             TAGS).set_default_tags(tags)
        self.e2e = Histogram(names.E2E,
                             "End-to-end request latency, seconds.", E2E_BUCKETS,
                             TAGS).set_default_tags(tags)
        self.prompt_tokens = Counter(names.PROMPT_TOKENS, "Prompt tokens processed.",
                                     TAGS).set_default_tags(tags)
        self.generation_tokens = Counter(names.GENERATION_TOKENS, "Tokens generated.",
                                         TAGS).set_default_tags(tags)
        self.running = Gauge(names.RUNNING, "Sequences being decoded.",
                             TAGS).set_default_tags(tags)
        self.waiting = Gauge(names.WAITING, "Sequences waiting to run.",
                             TAGS).set_default_tags(tags)
        self.kv_cache = Gauge(names.KV_CACHE, "KV-cache usage, 0..1.",
                              TAGS).set_default_tags(tags)
        self.prefix_queries = Counter(
            names.PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache.",
            TAGS).set_default_tags(tags)
        self.prefix_hits = Counter(names.PREFIX_CACHE_HITS,
                                   "Prompt tokens found in the prefix cache.",
                                   TAGS).set_default_tags(tags)
        self._prefix_seen = (0, 0)  # the engine's totals at the last sample
        self.overhead = Histogram(
            names.OVERHEAD,
            "Time a request spends in surge's replica before the engine has it (decode, "
            "checks, chat template), seconds.", OVERHEAD_BUCKETS, TAGS).set_default_tags(tags)

    def engine(self, stats: EngineStats) -> None:
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        self.kv_cache.set(stats.kv_cache_usage)
        # the engine keeps totals; the counters grow by what they grew since the last
        # sample (an engine that counts none reports 0 and adds nothing)
        queries, hits = stats.prefix_cache_queries, stats.prefix_cache_hits
        seen_queries, seen_hits = self._prefix_seen
        if queries > seen_queries:
            self.prefix_queries.inc(queries - seen_queries)
        if hits > seen_hits:
            self.prefix_hits.inc(hits - seen_hits)
        self._prefix_seen = (max(queries, seen_queries), max(hits, seen_hits))

    def request_done(self, prompt_tokens: int, generated: int, elapsed_s: float) -> None:
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens)
        if generated:
            self.generation_tokens.inc(generated)
        self.e2e.observe(elapsed_s)
