"""`surge config lint`: each rule fires on its trap, stays quiet on a good config."""

from __future__ import annotations

from pathlib import Path

import pytest

from surge.api.config_file import load_config
from surge.api.config_lint import RULES, Finding, lint_config
from surge.cli.main import main

CONFIGS = Path(__file__).parent / "configs"
HEAD = "http_options: {request_timeout_s: 30}\napplications:\n- name: a\n  import_path: "


def lint(tmp_path: Path, deployment: str, *, head: str = HEAD,
         import_path: str = "tests.config.apps.text_ml:batched",
         import_code: bool = True, cores: int = 64) -> list[Finding]:
    path = tmp_path / "serve.yaml"
    path.write_text(f"{head}{import_path}\n  deployments:\n  - name: Batched\n"
                    f"    max_queued_requests: 100\n{deployment}")
    return lint_config(load_config(path), import_code=import_code, cores=cores)


def rules(findings: list[Finding]) -> set[str]:
    return {f.rule for f in findings}


GOOD = ("    max_ongoing_requests: 32\n    graceful_shutdown_timeout_s: 30\n"
        "    autoscaling_config: {min_replicas: 1, max_replicas: 8, upscale_delay_s: 3}\n")


def test_a_good_deployment_has_no_findings(tmp_path: Path) -> None:
    assert lint(tmp_path, GOOD) == []


@pytest.mark.parametrize(("deployment", "rule", "where", "line"), [
    ("    max_ongoing_requests: 32\n    autoscaling_config: {min_replicas: 1}\n",
     "SRG101", "a/Batched.autoscaling_config.max_replicas", 9),
    ("    max_ongoing_requests: 1\n    autoscaling_config: {max_replicas: 4, "
     "target_ongoing_requests: 2}\n", "SRG102", "a/Batched.max_ongoing_requests", 8),
    ("    max_ongoing_requests: 8\n", "SRG103", "a/Batched.max_ongoing_requests", 8),
    ("    max_ongoing_requests: 32\n    autoscaling_config: {max_replicas: 4}\n",
     "SRG105", "a/Batched.autoscaling_config.upscale_delay_s", 9),
    ("    max_ongoing_requests: 32\n    autoscaling_config: {max_replicas: 4, "
     "upscale_delay_s: 3, min_replicas: 0}\n", "SRG106",
     "a/Batched.autoscaling_config.min_replicas", 9),
    ("    max_ongoing_requests: 32\n    autoscaling_config: {max_replicas: 4, "
     "upscale_delay_s: 3, downscale_delay_s: 1}\n", "SRG107",
     "a/Batched.autoscaling_config.downscale_delay_s", 9),
    ("    max_ongoing_requests: 32\n    graceful_shutdown_timeout_s: 5\n", "SRG109",
     "a/Batched.graceful_shutdown_timeout_s", 9),
    ("    max_ongoing_requests: 32\n    autoscaling_config: {max_replicas: 2, "
     "upscale_delay_s: 3, schedule: [{start: '09:00', end: '10:00', min_replicas: 6}]}\n",
     "SRG111", "a/Batched.autoscaling_config.schedule", 9),
    ("    max_ongoing_requests: 32\n    num_replicas: 2\n", "SRG112",
     "a/Batched.num_replicas", 9),
])
def test_each_deployment_rule(tmp_path: Path, deployment: str, rule: str, where: str,
                              line: int) -> None:
    found = [f for f in lint(tmp_path, deployment) if f.rule == rule]
    assert len(found) == 1, found
    finding = found[0]
    assert (finding.where, finding.line) == (where, line)
    assert str(finding).startswith(f"{RULES[rule][0]} {rule} {where}: ")
    assert "(fix: " in str(finding)


@pytest.mark.parametrize(("deployment", "cores", "fires"), [
    (GOOD, 4, False),  # 8 replicas x 1 CPU on 4 cores: 2x, the limit
    (GOOD, 3, True),  # ... on 3: 2.7x
    (GOOD + "    ray_actor_options: {num_cpus: 0.5}\n", 2, False),  # 4 CPUs on 2 cores
    ("    max_ongoing_requests: 32\n    num_replicas: 3\n"
     "    ray_actor_options: {num_cpus: 2}\n", 2, True),  # a fixed count counts too
    ("    max_ongoing_requests: 32\n    num_replicas: 3\n"
     "    ray_actor_options: {num_cpus: 0}\n", 1, False),
])
def test_num_cpus_far_beyond_the_cores(tmp_path: Path, deployment: str, cores: int,
                                       fires: bool) -> None:
    found = [f for f in lint(tmp_path, deployment, cores=cores) if f.rule == "SRG113"]
    assert len(found) == int(fires), found
    if fires:
        (finding,) = found
        assert finding.where == "a/Batched.ray_actor_options.num_cpus"
        assert f"this node's {cores} cores" in finding.message
        assert "lower max_replicas" in finding.fix


def test_num_cpus_are_summed_over_every_deployment_of_every_app(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    app = ("- name: {name}\n  route_prefix: /{name}\n  import_path: m:app\n"
           "  deployments:\n  - name: Model\n    num_replicas: 4\n"
           "    ray_actor_options: {{num_cpus: {cpus}}}\n")
    path.write_text("applications:\n" + app.format(name="a", cpus=1)
                    + app.format(name="b", cpus=2))
    config = load_config(path)
    assert "SRG113" not in rules(lint_config(config, import_code=False, cores=6))
    (finding,) = [f for f in lint_config(config, import_code=False, cores=5)
                  if f.rule == "SRG113"]
    assert finding.where == "b/Model.ray_actor_options.num_cpus"  # the largest share
    assert finding.line == 15  # its ray_actor_options (num_cpus is on that line)
    assert finding.message.startswith("the replicas' num_cpus add up to 12 at their most "
                                      "(b/Model 4 x 2, a/Model 4 x 1), 2.4x this node's 5 "
                                      "cores")


def test_unbounded_queue_per_caller(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(HEAD + "tests.config.apps.text_ml:batched\n")
    findings = lint_config(load_config(path))
    (queue,) = [f for f in findings if f.rule == "SRG104"]
    assert queue.where == "a/Batched.max_queued_requests" and "per caller" in queue.message


def test_top_level_rules(tmp_path: Path) -> None:
    findings = lint(tmp_path, GOOD, head="http_options: {keep_alive_timeout_s: 5}\n"
                                         "applications:\n- name: a\n  import_path: ")
    assert rules(findings) == {"SRG108", "SRG110"}
    assert {f.where for f in findings} == {"http_options.request_timeout_s",
                                           "http_options.keep_alive_timeout_s"}


def test_batch_rule_needs_the_code_and_says_when_it_is_missing(tmp_path: Path) -> None:
    assert rules(lint(tmp_path, "    max_ongoing_requests: 8\n", import_code=False)) == {
        "SRG109", "SRG112"}
    findings = lint(tmp_path, GOOD, import_path="no_such_module:app")
    assert rules(findings) == {"SRG002"}
    assert "cannot import" in findings[0].message


def test_code_options_count_and_unknown_deployments_are_errors(tmp_path: Path) -> None:
    # Batched's decorator sets max_ongoing_requests=4; the batch of 16 cannot fill.
    path = tmp_path / "serve.yaml"
    path.write_text(HEAD + "tests.config.apps.text_ml:batched\n  deployments:\n"
                           "  - name: Batchd\n    max_queued_requests: 1\n")
    findings = lint_config(load_config(path))
    assert "SRG003" in rules(findings) and "SRG103" in rules(findings)
    (batch,) = [f for f in findings if f.rule == "SRG103"]
    assert "max_batch_size 16, above max_ongoing_requests 4" in batch.message


def test_num_replicas_auto_is_not_capped_at_one() -> None:
    findings = lint_config(load_config(CONFIGS / "ray_docs_fruit.yaml"), import_code=False)
    assert "SRG101" not in rules(findings)
    assert "SRG001" in rules(findings)


def test_every_rule_is_exercised_and_documented() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    for rule, (level, _) in RULES.items():
        assert level in ("ERROR", "WARNING", "INFO")
        assert f"`{rule}`" in docs, f"docs/configuration.md's lint table lacks {rule}"


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "lint", str(CONFIGS / "traps.yaml")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("ERROR SRG101 traps/Batched.autoscaling_config.max_replicas: ")
               for line in out)
    good = tmp_path / "good.yaml"
    good.write_text(HEAD + "tests.config.apps.text_ml:batched\n  deployments:\n"
                           "  - name: Batched\n    max_queued_requests: 64\n" + GOOD)
    assert main(["config", "lint", str(good)]) == 0
    warned = tmp_path / "warned.yaml"
    warned.write_text(good.read_text().replace("http_options: {request_timeout_s: 30}\n", ""))
    assert main(["config", "lint", str(warned)]) == 0
    assert main(["config", "lint", "--strict", str(warned)]) == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications:\n- name: a\n  import_pat: m:a\n")
    assert main(["config", "lint", str(bad)]) == 1
    assert f"{bad}:3: applications[0].import_pat: unknown key" in capsys.readouterr().err
