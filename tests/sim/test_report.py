"""The simulation's report (the `surge pulse` format), time to capacity, sweeps, the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from surge.cli.main import main
from surge.loadtest.schedule import Schedule, Segment
from surge.sim.report import report_text, time_to_capacity, write_sim_report
from surge.sim.scenario import ScenarioError
from surge.sim.sweep import parse_sweep, plan_runs, run_sweep, simulate, sweep_table
from tests.sim.test_engine import AUTOSCALED, scenario

STEP = [{"rps": 50, "for_s": 1}, {"rps": 150, "for_s": 2}]


def autoscaled(**changes: Any) -> Any:
    return scenario(traffic__schedule=STEP, deployment__num_replicas=None,
                    deployment__autoscaling_config=AUTOSCALED, **changes)


def test_the_report_is_a_pulse_report_with_the_simulations_figures() -> None:
    run = simulate(autoscaled())
    report = run.report
    assert set(report) == {"version", "run", "summary", "series", "simulation"}
    s = report["summary"]
    assert s["sent"] == 50 + 300 and s["ok"] + s["errors"]["503"] == s["sent"]
    assert s["pulse"]["from_s"] == 1.0 and s["baseline"]["sent"] == 50
    assert s["replica_seconds"] == pytest.approx(7.9)
    assert s["oracle_replica_seconds"] == 5.0  # 1 replica for 1 s, then 2 for 2 s
    assert s["oracle_ratio"] == pytest.approx(7.9 / 5, abs=1e-4)
    assert s["slo_ok_fraction"] == 1.0 and s["failed_fraction"] == 0.0
    assert s["time_to_capacity_s"] == 0.2  # the standby serves from 1.15 s
    assert len(report["series"]) == round(run.simulation.end_s * 10)
    assert report["series"][12]["replicas"] == 2
    assert report["simulation"]["decisions"][0]["to"] == 2
    json.dumps(report)  # plain data
    assert "time to capacity" in report_text(report)


def test_report_files(tmp_path: Path) -> None:
    run = simulate(autoscaled())
    paths = write_sim_report(run.report, tmp_path)
    page = paths["html"].read_text()
    assert "surge simulate report" in page and "<h2>simulation</h2>" in page
    assert json.loads(paths["json"].read_text())["summary"]["replica_seconds"] > 0


def point(t: float, offered: float, ok: float, replicas: int | None = None) -> dict[str, Any]:
    return {"t": t, "offered": offered, "ok": ok, "replicas": replicas}


JUMP = Schedule((Segment(1, 100, 100), Segment(3, 1000, 1000)))


def test_time_to_capacity_waits_for_served_to_match_offered() -> None:
    series = [point(i / 10, 100 if i < 10 else 1000, 100 if i < 15 else 1000)
              for i in range(40)]
    assert time_to_capacity(series, JUMP) == 0.6  # points 1.5 .. 1.9 served in full


def test_a_draining_backlog_does_not_count_as_capacity() -> None:
    """A burst of 2xx (a queue draining) fills the first window while replicas are still
    few; the replica counts say capacity arrives in the point at 2.0 s."""
    series = [point(i / 10, 1000 if i >= 10 else 100,
                    5000 if i == 14 else (100 if i < 10 else 400 if i < 20 else 1000),
                    1 if i < 20 else 3) for i in range(40)]
    assert time_to_capacity(series, JUMP) == 0.1  # served-only judgement: fooled
    assert time_to_capacity(series, JUMP, per_replica_rps=400) == 1.1
    assert time_to_capacity(series[:15], JUMP, per_replica_rps=400) is None
    assert time_to_capacity(series, Schedule((Segment(4, 100, 100),))) is None


# -- sweeps ---------------------------------------------------------------------------------------


def test_sweep_axes_and_their_product() -> None:
    axes = parse_sweep(["policy=ray_default,proactive", "min_replicas=1,2"])
    assert [(a.key, a.values) for a in axes] == [
        ("policy", ("ray_default", "proactive")), ("min_replicas", (1, 2))]
    plans = plan_runs(axes)
    assert [label for label, _ in plans] == [
        "policy=ray_default min_replicas=1", "policy=ray_default min_replicas=2",
        "policy=proactive min_replicas=1", "policy=proactive min_replicas=2"]
    assert plans[0][1] == {"policy": "ray_default", "min_replicas": 1}
    assert plan_runs(parse_sweep(["variant=a,b"]))[1] == ("b", {"variant": "b"})
    assert parse_sweep(["upscaling_factor=null,2"])[0].values == (None, 2)
    for bad in ("policy", "nope=1,2", "policy="):
        with pytest.raises(ScenarioError):
            parse_sweep([bad])
    with pytest.raises(ScenarioError, match="given twice"):
        parse_sweep(["min_replicas=1", "min_replicas=2"])


def test_a_sweep_runs_and_tabulates_each_setting(tmp_path: Path) -> None:
    runs = run_sweep(autoscaled(), parse_sweep(["standby_replicas=0,1"]), tmp_path,
                     html=False)
    table = sweep_table(runs)
    lines = table.splitlines()
    assert lines[0].startswith("| run | policy and settings | within SLO | failed |")
    assert lines[2].startswith("| standby_replicas=0 | proactive, min 1 |")
    assert lines[3].startswith("| standby_replicas=1 | proactive, min 1, +1 standby |")
    assert (tmp_path / "sweep.md").read_text().strip() == table
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["run"] for r in rows] == ["standby_replicas=0", "standby_replicas=1"]
    assert rows[1]["failed_fraction"] <= rows[0]["failed_fraction"]
    assert (tmp_path / "standby_replicas=1" / "report.json").exists()


# -- the command line ----------------------------------------------------------------------------


def scenario_file(tmp_path: Path) -> Path:
    data = {"name": "cli", "cluster": {"nodes": 1, "replicas_per_node": 4, "startup_s": 1},
            "service": {"service_time_ms": 10},
            "traffic": {"schedule": STEP},
            "deployment": {"name": "M", "max_ongoing_requests": 1,
                           "autoscaling_config": AUTOSCALED},
            "variants": {"ray": {"policy": "ray_default"}}}
    path = tmp_path / "cli.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_runs_a_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["simulate", str(scenario_file(tmp_path)), "--out", str(out), "--no-html",
                 "--variant", "ray", "--set", "min_replicas=2"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["run"] == "ray"
    assert report["summary"]["start_replicas"] == 2
    assert "within SLO" in capsys.readouterr().out


def test_cli_sweeps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["simulate", str(scenario_file(tmp_path)), "--out", str(out), "--no-html",
                 "--sweep", "variant=ray", "--sweep", "standby_replicas=0,1"]) == 0
    printed = capsys.readouterr().out
    assert "| ray standby_replicas=1 | ray_default, min 1, +1 standby," in printed
    assert (out / "sweep.md").exists()


def test_cli_explains_a_bad_scenario(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario_file(tmp_path)
    assert main(["simulate", str(path), "--set", "min_replica=2"]) == 2
    assert "Did you mean 'min_replicas'?" in capsys.readouterr().err
    assert main(["simulate", str(path), "--variant", "absent"]) == 2
    assert "no variant 'absent'; the scenario has ray" in capsys.readouterr().err
