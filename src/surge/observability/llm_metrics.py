"""The names of the LLM server's metrics, shared by who records and who draws them.

An LLM replica records these as serve.metrics (surge/llm/metrics.py); the controller
exports them as `ray_<name>` like every user metric and draws them on the dashboard
(surge/controller/llm_timeline.py), finding an LLM deployment by these names alone.
vLLM's are its own names with `:` made `_`, as Ray Serve LLM records them.
"""

from __future__ import annotations

__all__ = ["E2E", "GENERATION_TOKENS", "ITL", "KV_CACHE", "OVERHEAD", "PREFIX_CACHE_HITS",
           "PREFIX_CACHE_QUERIES", "PROMPT_TOKENS", "RUNNING", "TTFT", "WAITING"]

TTFT = "vllm_time_to_first_token_seconds"
ITL = "vllm_inter_token_latency_seconds"
E2E = "vllm_e2e_request_latency_seconds"
PROMPT_TOKENS = "vllm_prompt_tokens"
GENERATION_TOKENS = "vllm_generation_tokens"
RUNNING = "vllm_num_requests_running"
WAITING = "vllm_num_requests_waiting"
KV_CACHE = "vllm_kv_cache_usage_perc"
PREFIX_CACHE_QUERIES = "vllm_prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm_prefix_cache_hits"
OVERHEAD = "surge_llm_replica_overhead_seconds"
