"""serve.metrics end to end, written as application code uses it: two replicas count
requests by a tag taken from the request and record a histogram of body sizes; the
controller's /metrics shows Ray's names with exact totals."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from surge import serve
from surge.serve import metrics
from tests.e2e.dashboard_tools import Samples, instance, scrape, total
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

REQUESTS = {"a": (7, b"hello"), "b": (4, b"x" * 50)}  # model -> (requests, body)
ANSWERED = sum(count for count, _ in REQUESTS.values())


@serve.deployment(num_replicas=2)
class Shop:
    def __init__(self) -> None:
        self.requests = metrics.Counter("shop_requests", description="Requests by model.",
                                        tag_keys=("model", "route"))
        self.sizes = metrics.Histogram("shop_body_bytes", description="Request body sizes.",
                                       boundaries=[10, 100, 1000], tag_keys=("model",))

    async def __call__(self, request: Any) -> str:
        model = request.query_params["model"]
        body = await request.body()
        self.requests.inc(tags={"model": model})
        self.sizes.observe(len(body), tags={"model": model})
        return "ok"


def buckets(samples: Samples, model: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in samples.get("ray_shop_body_bytes_bucket", []):
        if labels["model"] == model:
            out[labels["le"]] = out.get(labels["le"], 0) + value
    return out


def test_user_metrics_reach_the_controllers_metrics() -> None:
    with instance() as (url, dashboard):
        serve.run(Shop.bind(), name="shop", route_prefix="/shop")
        with httpx.Client(timeout=30) as client:
            for model, (count, body) in REQUESTS.items():
                for _ in range(count):
                    answer = client.post(f"{url}/shop", params={"model": model}, content=body)
                    assert answer.status_code == 200
        driver_counter = metrics.Counter("shop_driver_side")  # in a driver: kept locally
        driver_counter.inc()

        def counted() -> Samples | None:
            samples = scrape(dashboard)
            done = all(total(samples, "ray_shop_requests_total", model=model) == count
                       and total(samples, "ray_shop_body_bytes_count", model=model) == count
                       for model, (count, _) in REQUESTS.items())
            served = (total(samples, "ray_serve_num_http_requests_total", application="shop")
                      == ANSWERED == total(samples, "ray_serve_deployment_request_counter_total",
                                           deployment="Shop"))
            return samples if done and served else None

        m = eventually(counted, 30, interval_s=0.2, what="every request counted")
        for labels, _ in m["ray_shop_requests_total"]:
            assert set(labels) == {"application", "deployment", "replica", "model", "route"}
            assert (labels["application"], labels["deployment"], labels["route"]) == (
                "shop", "Shop", "/shop")
        healthy = {labels["replica"] for labels, _ in m["ray_serve_deployment_replica_healthy"]}
        assert {labels["replica"] for labels, _ in m["ray_shop_requests_total"]} <= healthy
        assert buckets(m, "a") == {"10.0": 7, "100.0": 7, "1000.0": 7, "+Inf": 7}
        assert buckets(m, "b") == {"10.0": 0, "100.0": 4, "1000.0": 4, "+Inf": 4}
        assert total(m, "ray_shop_body_bytes_sum", model="a") == 7 * 5
        assert total(m, "ray_shop_body_bytes_sum", model="b") == 4 * 50
        assert "# HELP ray_shop_requests_total Requests by model." in httpx.get(
            f"{dashboard}/metrics", timeout=10).text
        assert "ray_shop_driver_side_total" not in m  # a driver's metrics stay in it
        # Ray's names for surge's own metrics counted the same requests (waited for above).
        assert total(m, "ray_serve_num_http_requests_total", application="shop",
                     status_code="200", route="/shop") == ANSWERED
