"""Options from flags and scenario files; bad input is an error that says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from surge.cli.main import main
from surge.loadtest.options import PulseOptions, load_scenario, parse_header
from surge.loadtest.schedule import Schedule, pulse

SCENARIO = """
url: http://127.0.0.1:9/mlp
method: post
body: '{"x": 1}'
headers: {content-type: application/json}
arrivals: poisson
seed: 7
slo_ms: 50
workers: 2
connections: 64
schedule: [{rps: 10, for_s: 1}, {to_rps: 100, over_s: 0.5}, {rps: 100, for_s: 2}]
"""


def test_scenario_file(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    options = PulseOptions(**load_scenario(path))
    assert options.schedule == Schedule.from_spec(
        [{"rps": 10, "for_s": 1}, {"to_rps": 100, "over_s": 0.5}, {"rps": 100, "for_s": 2}])
    assert options.headers == (("content-type", "application/json"),)
    assert options.body == b'{"x": 1}'
    plan = options.plan(worker=1)
    assert (plan.method, plan.worker, plan.workers, plan.connections) == ("POST", 1, 2, 32)
    described = options.describe()
    assert described["expected_requests"] == 238 and described["workers"] == 2


@pytest.mark.parametrize("text, message", [
    ("url: x\nschedul: {}", "Did you mean 'schedule'"),
    ("- 1", "mapping of options"),
    ("schedule: {baseline_rps: 1}", "peak_rps"),
    ("headers: 3", "headers must be"),
])
def test_bad_scenarios(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_scenario(path)


def test_headers() -> None:
    assert parse_header("X-A:  b c ") == ("X-A", "b c")
    with pytest.raises(ValueError):
        parse_header("nocolon")


@pytest.mark.parametrize("bad", [{"arrivals": "x"}, {"slo_ms": 0}, {"workers": 0},
                                 {"workers": 4, "connections": 2}, {"url": "ftp://x"}])
def test_option_validation(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PulseOptions(**{"url": "http://127.0.0.1/", "schedule": pulse(1, 2), **bad})  # type: ignore[arg-type]


@pytest.mark.parametrize("argv, message", [
    (["pulse", "http://127.0.0.1:9/"], "--baseline RPS"),
    (["pulse", "http://127.0.0.1:9/", "--baseline", "5"], "both --baseline and --peak"),
    (["pulse", "--baseline", "5", "--peak", "6"], "give the URL"),
    (["pulse", "http://127.0.0.1:9/", "--baseline", "5", "--peak", "6", "--body", "@/nope"],
     "nope"),
    (["pulse", "http://127.0.0.1:9/", "--baseline", "5", "--peak", "6", "-H", "x"],
     "name: value"),
])
def test_cli_usage_errors_exit_2(argv: list[str], message: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_flags_override_the_scenario(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    # nothing listens on port 9: the run completes with connection errors, exit 0
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "out"
    assert main(["pulse", "--scenario", str(path), "--baseline", "10", "--peak", "20",
                 "--baseline-s", "0.1", "--ramp", "0", "--hold", "0.1", "--after", "0",
                 "--workers", "1", "--arrivals", "uniform", "--quiet", "--out", str(out)]) == 0
    import json

    report = json.loads((out / "report.json").read_text())
    assert report["run"]["method"] == "POST" and report["run"]["workers"] == 1
    assert report["summary"]["sent"] == 3 == report["summary"]["errors"]["connection"]
    assert "requests sent" in capsys.readouterr().out
