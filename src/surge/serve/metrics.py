"""`surge.serve.metrics`, as `ray.serve.metrics`: user metrics exported at /metrics."""

from surge.replica.metrics import Counter, Gauge, Histogram

__all__ = ["Counter", "Gauge", "Histogram"]
