"""`surge pulse` end to end: real servers, every request accounted for, the report renders."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from surge import serve
from surge.cli.main import main
from tests.e2e.conftest import Running
from tests.ports import free_port

pytestmark = pytest.mark.e2e

RAW_SERVER = Path(__file__).resolve().parents[2] / "bench" / "apps" / "raw_server.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# 50 -> 300 req/s: 0.5 s baseline, 0.3 s ramp, 1 s hold, 0.3 s down, 0.5 s after.
SHAPE = ["--baseline", "50", "--peak", "300", "--baseline-s", "0.5", "--ramp", "0.3",
         "--hold", "1", "--after", "0.5", "--quiet"]
EXPECTED = 50 * 0.5 + 175 * 0.3 + 300 * 1 + 175 * 0.3 + 50 * 0.5  # 455 requests


@serve.deployment(max_ongoing_requests=50)
class Quick:
    async def __call__(self, request: Any) -> str:
        await asyncio.sleep(0.002)
        return "ok"


def read(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


def assert_accounted(report: dict[str, Any]) -> None:
    s = report["summary"]
    assert s["sent"] == s["ok"] + sum(s["errors"].values()) + s["unanswered"]
    series = report["series"]
    assert sum(p["offered"] for p in series) / 10 == pytest.approx(s["sent"])
    assert sum(p["ok"] for p in series) / 10 == pytest.approx(s["ok"])
    assert [p["t"] for p in series] == [round(i / 10, 1) for i in range(len(series))]


def assert_rendered(out: Path) -> None:
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == 5
    for name in ("overview", "rate", "status", "latency", "replicas"):
        png = (out / f"{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 10_000, name
    assert "p99 back under SLO" in html and "requests sent" in html


def test_pulse_a_surge_app(surge_instance: Running, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    serve.run(Quick.bind(), name="quick", route_prefix="/quick")
    out = tmp_path / "surge"
    code = main(["pulse", f"{surge_instance.url}/quick?x=1", *SHAPE, "--slo-ms", "50",
                 "--out", str(out), "--surge-address", surge_instance.control_address])
    assert code == 0
    report = read(out)
    s = report["summary"]
    assert s["sent"] == EXPECTED
    assert s["ok"] == EXPECTED and s["unanswered"] == 0
    assert s["errors"] == {"503": 0, "timeout": 0, "connection": 0}
    assert s["peak_offered_rps"] == 300.0
    assert s["pulse"]["sent"] == 405 and s["baseline"]["sent"] == 25
    assert s["max_replicas"] == 1
    assert_accounted(report)
    replicas = [p["replicas"] for p in report["series"] if p["replicas"] is not None]
    assert len(replicas) > 0.8 * len(report["series"]) and set(replicas) == {1}
    assert_rendered(out)
    printed = capsys.readouterr().out
    assert "requests sent" in printed and str(out / "report.html") in printed


def test_two_workers_split_the_schedule(surge_instance: Running, tmp_path: Path) -> None:
    serve.run(Quick.bind(), name="quick2", route_prefix="/quick2")
    out = tmp_path / "workers"
    code = main(["pulse", f"{surge_instance.url}/quick2", *SHAPE, "--workers", "2",
                 "--out", str(out)])
    assert code == 0
    report = read(out)
    assert report["summary"]["sent"] == EXPECTED == report["summary"]["ok"]
    assert report["run"]["workers"] == 2
    assert_accounted(report)


@pytest.fixture
def raw_server() -> Any:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(RAW_SERVER), str(port)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().startswith("READY")
    yield f"http://127.0.0.1:{port}/echo?value=x"
    process.terminate()
    process.wait(timeout=10)
    process.stdout.close()


def test_pulse_any_http_server_and_compare(raw_server: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SURGE_ADDRESS", raising=False)
    out = tmp_path / "raw"
    assert main(["pulse", raw_server, *SHAPE, "--arrivals", "poisson", "--seed", "3",
                 "--out", str(out)]) == 0
    report = read(out)
    assert report["run"]["replicas_sampled"] is False
    assert all(p["replicas"] is None for p in report["series"])
    assert report["summary"]["max_replicas"] is None
    assert report["summary"]["ok"] == report["summary"]["sent"] > 300
    assert_accounted(report)
    assert_rendered(out)
    # nobody listens here: every request is a connection error, and the run still ends 0
    dead = tmp_path / "dead"
    assert main(["pulse", f"http://127.0.0.1:{free_port()}/", "--baseline", "20", "--peak",
                 "40", "--baseline-s", "0.2", "--ramp", "0", "--hold", "0.2", "--after", "0",
                 "--quiet", "--out", str(dead)]) == 0
    gone = read(dead)["summary"]
    assert gone["errors"]["connection"] == gone["sent"] == 12 and gone["ok"] == 0
    capsys.readouterr()
    assert main(["pulse", "--compare", str(out / "report.json"), str(dead / "report.json"),
                 "--out", str(tmp_path / "cmp")]) == 0
    table = capsys.readouterr().out
    assert "raw" in table and "dead" in table and "pulse p99" in table
    assert (tmp_path / "cmp" / "compare.png").read_bytes().startswith(PNG_MAGIC)
