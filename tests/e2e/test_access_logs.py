"""Logs end to end: JSON access lines, sampled, each with its request id; user-code
exceptions with their traceback in the replica's rotating log file; no secrets."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from surge import serve
from tests.e2e.dashboard_tools import instance
from tests.eventually import eventually

pytestmark = pytest.mark.e2e


@serve.deployment
class Echo:
    def __call__(self, request: Any) -> str:
        logging.getLogger("user.echo").warning("echo handling %s", request.url.path)
        if request.query_params.get("fail"):
            raise ValueError("access-log test: failing on purpose")
        return "echo"


def test_json_access_logs_are_sampled_and_carry_request_ids(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    config = {"encoding": "JSON", "logs_dir": str(logs), "access_log_sample_rate": 0.5,
              "access_log_max_per_s": 0}
    with instance(logging_config=config) as (url, _):
        serve.run(Echo.bind(), name="acc", route_prefix="/acc")
        with httpx.Client(timeout=10) as client:
            for i in range(20):
                response = client.post(f"{url}/acc?token=SECRET-QUERY",
                                       content=b"SECRET-BODY",
                                       headers={"x-request-id": f"acc-{i}",
                                                "authorization": "Bearer SECRET-TOKEN"})
                assert response.status_code == 200
            failed = client.get(f"{url}/acc?fail=1", headers={"x-request-id": "acc-fail"})
            assert failed.status_code == 500

        def lines(pattern: str) -> list[dict[str, Any]]:
            found = []
            for path in logs.glob(pattern):
                found += [json.loads(line) for line in path.read_text().splitlines() if line]
            return found

        def access_lines() -> list[dict[str, Any]]:
            return [r for r in lines("proxy_*.log") if r["name"] == "surge.access"]

        eventually(lambda: any(r.get("request_id") == "acc-fail" for r in lines("replica_*")),
                   10, interval_s=0.2, what="the failed request in the replica's log")
        eventually(lambda: len([r for r in access_lines()
                                if r["request_id"].startswith("acc-")]) >= 10, 10,
                   interval_s=0.2, what="10 sampled access lines")
    sampled = [r for r in access_lines() if r["request_id"] in {f"acc-{i}" for i in range(20)}]
    assert len(sampled) == 10  # every second request of 20
    assert all(r["status_code"] == 200 and r["method"] == "POST" and r["path"] == "/acc"
               and r["application"] == "acc" and r["latency_ms"] > 0 for r in sampled)
    assert all(r.get("request_id") for r in lines("*.log") if r["name"] == "surge.access")
    replica = lines("replica_*.log")
    crash = [r for r in replica if r.get("request_id") == "acc-fail" and "exc_text" in r]
    assert crash and "Traceback" in crash[0]["exc_text"] and "ValueError" in crash[0]["exc_text"]
    user = [r for r in replica if r["name"] == "user.echo"]
    assert len(user) == 21 and {r["request_id"] for r in user} >= {"acc-0", "acc-fail"}
    everything = "".join(p.read_text() for p in logs.glob("*.log"))
    assert "SECRET" not in everything  # no bodies, query strings or Authorization
    assert any(r["name"] == "surge.dashboard" for r in lines("controller*.log"))
