"""The text table and the HTML page (the PNGs are rendered in tests/e2e/test_pulse.py)."""

from __future__ import annotations

import json

from surge.loadtest.options import PulseOptions
from surge.loadtest.report import compare_table, render_html, summary_table
from surge.loadtest.runner import build_report
from surge.loadtest.schedule import pulse
from surge.loadtest.stats import Record, ReplicaSample, point_of

SCHEDULE = pulse(100, 1000, baseline_s=1, ramp_s=0, hold_s=1, ramp_down_s=0, after_s=1)
OPTIONS = PulseOptions(url="http://127.0.0.1:8000/mlp", schedule=SCHEDULE, slo_ms=100)


def recorded(slow_s: float) -> Record:
    record = Record()
    for second, rps in ((0, 100), (1, 1000), (2, 100)):
        for i in range(rps):
            at = second + i / rps
            latency = 0.25 if second == 1 and i / rps < slow_s else 0.004
            record.sent_at(point_of(at), 0.0005)
            if second == 1 and i % 50 == 0:
                record.error_at("503", point_of(at), point_of(at + 0.001))
            else:
                record.ok_at(point_of(at), point_of(at + latency), latency)
    return record


def report(slow_s: float = 0.3, replicas: bool = True,
           cpu: float | None = None) -> dict[str, object]:
    """`cpu`: the node's CPU during the pulse (half of it busy before and after)."""
    samples = tuple(ReplicaSample(t / 10, 1 if t < 12 else 4, 4,
                                  None if cpu is None else cpu if 10 <= t < 20 else 0.5)
                    for t in range(32))
    return build_report(OPTIONS, recorded(slow_s), samples if replicas else None)


def test_report_json_shape() -> None:
    data = report()
    assert set(data) == {"version", "run", "summary", "series"}
    summary, series = data["summary"], data["series"]
    assert isinstance(summary, dict) and isinstance(series, list)
    assert summary["sent"] == 1200 and summary["ok"] == 1180
    assert summary["errors"] == {"503": 20, "timeout": 0, "connection": 0}
    assert {"t", "offered", "ok", "errors", "p50_ms", "p99_ms", "replicas"} <= set(series[0])
    assert len(series) == 30  # 3 s of schedule; the last answer lands at 2.994 s
    json.dumps(data)  # plain JSON, no numpy or custom types


def test_summary_table_has_the_post_mortem_rows() -> None:
    text = summary_table(report())
    for expected in ("POST" not in text and "GET http://127.0.0.1:8000/mlp",
                     "requests sent", "ok (2xx)", "503 (overload)", "timeouts",
                     "p99.9", "baseline", "pulse", "whole run",
                     "peak offered / served        1,000 / 1,960 req/s",
                     "0.3 s after the pulse began", "1 -> max 4", "on schedule"):
        assert expected in text, expected
    assert "1.67%" in text.splitlines()[5]  # 503s: 20 of 1,200


def test_table_without_replicas_or_recovery() -> None:
    text = summary_table(report(slow_s=1.0, replicas=False))
    assert "never during the pulse (1.0 s over the SLO)" in text
    assert "not sampled" in text


def test_html_is_self_contained() -> None:
    data = report()
    pngs = {name: b"\x89PNG fake " + name.encode()
            for name in ("overview", "rate", "status", "latency", "replicas")}
    page = render_html(data, pngs)
    assert page.count("data:image/png;base64,") == 5
    assert "<table>" in page and "requests sent" in page
    assert "http" not in page.replace("http://127.0.0.1:8000/mlp", "")


def test_compare_table_puts_runs_side_by_side() -> None:
    text = compare_table([report(0.3), report(1.0)], ["surge", "ray"])
    lines = text.splitlines()
    assert lines[0].split() == ["surge", "ray"]
    recovery = next(line for line in lines if line.startswith("p99 back under SLO"))
    assert "0.3 s after" in recovery and "never" in recovery


def test_the_node_cpu_fact_and_the_machine_limit_note() -> None:
    saturated = report(cpu=0.96)
    text = summary_table(saturated)
    assert ("node CPU                     peak 96% of all cores; saturated for 1.0 s while "
            "requests were refused or slow: the machine was the limit, not the replica "
            "count") in text
    assert "the machine was the limit; more replicas on it" in render_html(saturated, PNGS)
    assert saturated["series"][10]["node_cpu_pct"] == 96.0  # type: ignore[index]
    calm = report(cpu=0.6)
    assert "peak 60% of all cores\n" in summary_table(calm)
    assert "the machine was the limit" not in render_html(calm, PNGS)
    assert "node CPU                     not sampled" in summary_table(report())


PNGS = {name: b"png" for name in ("overview", "rate", "status", "latency", "replicas")}
