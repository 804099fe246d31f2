"""Observability end to end: /metrics during a pulse and the dashboard in headless Chromium.

One instance takes a short pulse (24 closed-loop clients on a 50 ms handler with a
tiny queue: it scales up, rejects with 503, and fails a few requests on purpose); the
metrics and dashboard tests read what it shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from surge import serve
from tests.e2e.dashboard_tools import (
    Load,
    Samples,
    dump_dom,
    find_chromium,
    in_ci,
    instance,
    scrape,
    screenshot,
    total,
)
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

# The families `curl /metrics` must show during a pulse (names as sampled: counters
# end in _total, histograms in _bucket/_count/_sum).
FAMILIES = (
    "serve_num_http_requests_total", "serve_num_http_error_requests_total",
    "serve_num_deployment_http_error_requests_total", "serve_http_request_latency_ms_bucket",
    "serve_num_ongoing_http_requests", "serve_deployment_request_counter_total",
    "serve_deployment_error_counter_total", "serve_deployment_processing_latency_ms_bucket",
    "serve_replica_processing_queries", "serve_deployment_replica_healthy",
    "serve_deployment_replica_starts_total", "serve_deployment_queued_queries",
    "serve_num_ongoing_requests_at_replicas", "serve_num_router_requests_total",
    "serve_autoscaling_target_replicas", "surge_completed_requests_total",
    "surge_rejected_requests_total", "surge_replicas", "surge_target_replicas",
    "surge_autoscaling_decisions_total", "surge_autoscaling_arrival_rate",
    "surge_autoscaling_arrival_slope", "surge_autoscaling_projected_rate",
    "surge_autoscaling_demand_replicas",
)


@serve.deployment(max_ongoing_requests=2, max_queued_requests=2, autoscaling_config={
    "min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 1,
    "upscale_delay_s": 0, "downscale_delay_s": 600})
class Slow:
    async def __call__(self, request: Any) -> str:
        if request.query_params.get("fail"):
            raise RuntimeError("observability test: failing on purpose")
        await asyncio.sleep(0.05)
        return "ok"


@dataclass
class Pulse:
    url: str
    dashboard: str
    during: Samples  # scraped while the pulse ran
    statuses: dict[int, int]  # what the clients got


@pytest.fixture(scope="module")
def pulse() -> Iterator[Pulse]:
    with instance() as (url, dashboard):
        serve.run(Slow.bind(), name="shop", route_prefix="/shop")
        seen: list[Samples] = []

        def complete() -> bool:  # every family has samples (they come within ~1 s)
            seen.append(scrape(dashboard))
            return all(family in seen[-1] for family in FAMILIES)

        with Load(f"{url}/shop", concurrency=24) as heavy:
            eventually(lambda: heavy.statuses[200] > 300, 30, interval_s=0.2,
                       what="300 requests served")
            with contextlib.suppress(AssertionError):  # the test names what is missing
                eventually(complete, 10, interval_s=0.2)
            during = seen[-1]
        for _ in range(3):
            httpx.get(f"{url}/shop?fail=1", timeout=10)
        yield Pulse(url, dashboard, during, dict(heavy.statuses))


def test_metrics_show_every_family_during_a_pulse(pulse: Pulse) -> None:
    for family in FAMILIES:
        assert family in pulse.during, f"{family} missing from /metrics during the pulse"

    app = {"application": "shop", "deployment": "Slow"}

    def settled() -> bool:  # proxies, replicas and routers report at their own pace
        samples = scrape(pulse.dashboard)
        answered = total(samples, "serve_num_http_requests_total", route="/shop")
        ok = total(samples, "serve_num_http_requests_total", status_code="200", **app)
        return (ok == pulse.statuses[200]
                and total(samples, "serve_deployment_processing_latency_ms_count") >= ok + 3
                and total(samples, "surge_completed_requests_total") >= ok + 3
                and total(samples, "serve_deployment_error_counter_total") >= 3
                and total(samples, "serve_num_http_error_requests_total",
                          error_code="500") >= 3
                and total(samples, "serve_deployment_replica_starts_total") >= 2
                and total(samples, "serve_num_router_requests_total") >= answered)

    eventually(settled, 15, interval_s=0.2)
    m = scrape(pulse.dashboard)
    ok = total(m, "serve_num_http_requests_total", status_code="200", route="/shop", **app)
    rejected_503 = total(m, "serve_num_http_requests_total", status_code="503", **app)
    assert ok == pulse.statuses[200] > 300  # every answer the clients got, counted once
    assert rejected_503 == pulse.statuses[503] > 0
    assert total(m, "serve_num_http_error_requests_total", error_code="503") == rejected_503
    assert total(m, "serve_num_http_error_requests_total", error_code="500") >= 3
    assert total(m, "serve_num_deployment_http_error_requests_total", error_code="500",
                 **app) >= 3
    assert total(m, "surge_rejected_requests_total", reason="queue_full", **app) \
        == rejected_503
    latency = [(labels, v) for labels, v in m["serve_http_request_latency_ms_bucket"]
               if labels.get("status_code") == "200"]
    counts = [v for _, v in latency]
    assert counts == sorted(counts) and counts[-1] == ok  # cumulative up to le="+Inf"
    assert total(m, "serve_http_request_latency_ms_count", status_code="200", **app) == ok
    # Each request slept 50 ms in the handler: the replicas' mean says so.
    processed = total(m, "serve_deployment_processing_latency_ms_count", **app)
    assert processed >= ok
    assert total(m, "serve_deployment_processing_latency_ms_sum", **app) / processed >= 40
    assert total(m, "serve_deployment_request_counter_total", **app) == processed
    assert total(m, "serve_deployment_error_counter_total", **app) == 3
    replicas = {labels["replica"] for labels, _ in m["serve_deployment_replica_healthy"]}
    assert len(replicas) >= 2 and total(m, "serve_deployment_replica_healthy") == len(replicas)
    assert total(m, "surge_replicas", state="RUNNING", **app) >= 2
    assert total(m, "serve_autoscaling_target_replicas", **app) >= 2
    assert total(m, "surge_autoscaling_decisions_total", reason="up", **app) >= 1
    offered = total(m, "serve_num_router_requests_total", **app)
    assert offered >= ok + rejected_503
    assert total(m, "surge_completed_requests_total", **app) >= ok
    assert total(pulse.during, "surge_autoscaling_arrival_rate", **app) > 0
    assert len(m["serve_num_ongoing_http_requests"]) == 1  # one proxy worker


def test_dashboard_renders_live_data_in_headless_chromium(pulse: Pulse,
                                                          tmp_path: Path) -> None:
    if find_chromium() is None and not in_ci():
        pytest.skip("no chromium here; scripts/ensure-chromium.sh installs it")
    def points_served_since(since: float) -> list[dict[str, Any]]:
        data = httpx.get(f"{pulse.dashboard}/api/timeline", params={"since": str(since)},
                         timeout=10).json()
        return [p for p in data["samples"]
                if p["deployments"].get("shop#Slow", {}).get("served", 0) > 0]

    with Load(f"{pulse.url}/shop", concurrency=2) as light:  # the latest second is live
        eventually(lambda: sum(light.statuses.values()) > 20, 10, interval_s=0.2,
                   what="the light load served")
        since = time.time()  # the timeline's points are stamped with the wall clock
        eventually(lambda: len(points_served_since(since)) >= 2, 10, interval_s=0.2,
                   what="two timeline points with this load in them")
        dom = dump_dom(f"{pulse.dashboard}/?window=60")
        shot = screenshot(f"{pulse.dashboard}/?window=60", tmp_path / "dashboard.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    row = dom.split('<tr data-deployment="shop#Slow">', 1)[1].split("</tr>", 1)[0]
    assert '<td rowspan="1" class="app">shop</td>' in row
    assert 'class="deployment-name">Slow' in row and "HEALTHY" in row
    running, target = row.split('class="num replicas">', 1)[1].split("<", 1)[0].split(" / ")
    assert int(running) >= 2 and int(target) >= 2
    served = float(row.split('class="num served">', 1)[1].split("<", 1)[0].replace(",", ""))
    assert served > 0, "the served rate shown is not live"
    panel = dom.split('<div class="deployment" data-deployment="shop#Slow">', 1)[1]
    assert '<g class="decision"' in panel  # the scale-up is marked on the timeline
    assert 'class="series series-served"' in panel and 'class="series series-p99"' in panel
    assert dom.count('<tr data-replica="Slow-') >= 2
    assert "→" in dom.split('id="decisions"', 1)[1]  # the decision table lists it


def test_status_and_cli_show_the_dashboard_address(pulse: Pulse) -> None:
    from surge.cli.main import main

    assert serve.status().to_dict()["dashboard_address"] == pulse.dashboard
    assert httpx.get(f"{pulse.dashboard}/-/healthz", timeout=5).text == "success"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        # Ray's status YAML has no place for it; surge's table (--table) names it
        assert main(["status", "--table"]) == 0
    assert f"dashboard {pulse.dashboard}" in out.getvalue()
