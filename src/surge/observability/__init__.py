"""Observability shared by every surge process: settings, hot-path recording, logging.

`config` holds Ray's `logging_config` and the dashboard address; `recorder` the
counters and fixed-bucket histograms proxies and replicas fill per request and ship
to the controller as deltas; `user_metrics` the registry `serve.metrics` records into,
shipped the same way (`llm_metrics` names the LLM server's, which the dashboard draws;
`quantiles` reads quantiles off histogram bucket deltas); `logs` sets up each
process's logging (TEXT or JSON lines, rotating files, sampled access logs). The
controller aggregates, exposes Prometheus text and draws the dashboard
(surge.controller.observer, .metrics, .web, .llm_timeline).
"""
