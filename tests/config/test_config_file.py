"""Parsing Ray Serve-style config files: accepted as is, warnings, errors with file/line/field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from surge.api.config_apply import application_with_overrides, build_config, build_specs
from surge.api.config_file import load_config, parse_config
from surge.errors import ConfigError

CONFIGS = Path(__file__).parent / "configs"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return path


def test_ray_docs_multi_app_config_parses_as_is() -> None:
    config = load_config(CONFIGS / "ray_docs_multi_app.yaml")
    assert config.http_options.host == "0.0.0.0"
    assert config.http_options.request_timeout_s == 30
    assert config.log_level == "INFO"
    assert [a.name for a in config.applications] == ["text_ml_app", "builder_app"]
    app = config.applications[0]
    assert app.route_prefix == "/summarize"
    assert app.env_vars == {"TEXT_ML_MODE": "production"}
    summarizer = app.deployments[1]
    assert summarizer.options["autoscaling_config"]["max_replicas"] == 4
    assert config.applications[1].args == {"language": "italian"}
    assert config.warnings == ()  # grpc_options and logging_config are real
    assert config.grpc_options.port == 9000 and config.grpc_options.grpc_servicer_functions == ()
    assert config.logging is not None and config.logging.encoding == "TEXT"
    assert config.logging.logs_dir is None and config.logging.enable_access_log


def test_ray_fruit_config_warns_about_ray_only_keys_and_old_names() -> None:
    config = load_config(CONFIGS / "ray_docs_fruit.yaml")
    mango, market = config.applications[0].deployments
    assert mango.options["max_ongoing_requests"] == 100  # from max_concurrent_queries
    assert mango.options["ray_actor_options"] == {"num_cpus": 0.1}
    assert market.options["num_replicas"] == "auto"
    warned = "\n".join(config.warnings)
    for key in ("working_dir", "pip", "memory", "placement_group_bundles",
                "placement_group_strategy", "'max_concurrent_queries' is Ray's old name"):
        assert key in warned


def test_specs_are_built_with_overrides_env_vars_and_builder_args() -> None:
    config = load_config(CONFIGS / "ray_docs_multi_app.yaml")
    text_ml, builder = build_specs(config)
    by_name = {d.config.name: d.config for d in text_ml.deployments}
    assert by_name["Translator"].num_replicas == 2
    assert by_name["Translator"].max_ongoing_requests == 8
    assert by_name["Translator"].user_config == {"language": "german"}
    assert by_name["Translator"].resources.num_cpus == 0.2
    assert by_name["Translator"].resources.env_vars == {"TEXT_ML_MODE": "production"}
    scaling = by_name["Summarizer"].autoscaling_config
    assert scaling is not None and (scaling.min_replicas, scaling.max_replicas) == (1, 4)
    assert text_ml.ingress == "Summarizer" and text_ml.route_prefix == "/summarize"
    (translator,) = builder.deployments
    assert translator.config.user_config == {"language": "italian"}  # from the builder args
    assert translator.config.num_replicas == 1


def test_builder_receives_args(tmp_path: Path) -> None:
    path = write(tmp_path, "applications:\n- name: b\n  import_path: "
                           "tests.config.apps.text_ml:builder\n  args: {language: dutch}\n")
    (spec,) = build_specs(load_config(path))
    assert spec.deployments[0].config.user_config == {"language": "dutch"}


def test_yaml_num_replicas_replaces_code_autoscaling_and_back() -> None:
    from surge.api.config_apply import merged_options

    code = {"autoscaling_config": {"max_replicas": 4}}
    assert merged_options(code, {"num_replicas": 3}, {}) == {"num_replicas": 3}
    assert merged_options({"num_replicas": 2}, {"autoscaling_config": {"max_replicas": 5}},
                          {}) == {"autoscaling_config": {"max_replicas": 5}}
    assert merged_options({"num_replicas": "auto"}, {"autoscaling_config": {}}, {}) == {
        "num_replicas": "auto", "autoscaling_config": {}}


@pytest.mark.parametrize(("text", "expected"), [
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    max_ongoing_request: 3\n",
     ":6: applications[0].deployments[0].max_ongoing_request: unknown key. Did you mean "
     "'max_ongoing_requests'?"),
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    autoscaling_config:\n      min_replicas: 1\n      max_replica: 4\n",
     ":8: applications[0].deployments[0].autoscaling_config.max_replica: unknown key. "
     "Did you mean 'max_replicas'?"),
    ("http_options:\n  prot: 8000\n",
     ":2: http_options.prot: unknown key. Did you mean 'port'?"),
    ("aplications: []\n", ":1: aplications: unknown key. Did you mean 'applications'?"),
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    max_ongoing_requests: 0\n",
     ":6: applications[0].deployments[0].max_ongoing_requests: max_ongoing_requests must be "
     "an integer >= 1, got 0."),
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    autoscaling_config:\n      min_replicas: 5\n      max_replicas: 2\n",
     ":7: applications[0].deployments[0].autoscaling_config.min_replicas: "),
    # the proactive policy's policy_kwargs, as a deploy checks them
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    autoscaling_config:\n      policy:\n        policy_kwargs:\n"
     "          llm_spread_sd: -0.5\n",
     ":9: applications[0].deployments[0].autoscaling_config.policy.policy_kwargs."
     "llm_spread_sd: llm_spread_sd must be a number >= 0, got -0.5."),
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    autoscaling_config:\n      policy:\n        policy_function: proactive\n"
     "        policy_kwargs: {llm_spread: 1}\n",
     ":9: applications[0].deployments[0].autoscaling_config.policy.policy_kwargs."
     "llm_spread: unknown key. Did you mean 'llm_spread_sd'?"),
    ("applications:\n- name: a\n  route_prefix: api\n  import_path: m:app\n",
     ":3: applications[0].route_prefix: Invalid route_prefix 'api', must start with a "
     "forward slash ('/')."),
    ("applications:\n- name: a\n", ":2: applications[0]: import_path is required"),
    ("applications:\n- {name: a, import_path: 'm:a'}\n- {name: a, import_path: 'm:b', "
     "route_prefix: /b}\n", ":3: applications[1].name: application name 'a' is used twice"),
    ("applications:\n- name: a\n  import_path: m:app\n  runtime_env:\n    env_var: {}\n",
     ":5: applications[0].runtime_env.env_var: unknown key. Did you mean 'env_vars'?"),
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    max_replicas_per_node: 2\n    placement_group_bundles: [{CPU: 1}]\n",
     ":6: applications[0].deployments[0].max_replicas_per_node: Setting "
     "max_replicas_per_node is not allowed when placement_group_bundles is provided."),
    # Ray's RayActorOptionsSchema: a deployment's working_dir / py_modules must be URIs
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    ray_actor_options:\n      runtime_env:\n        working_dir: ./src\n",
     ":8: applications[0].deployments[0].ray_actor_options.runtime_env.working_dir: "
     "runtime_envs in the Serve config support only remote URIs in working_dir and "
     "py_modules, or \"local://\" URIs for directories that already exist on every node. "
     "Got error when parsing URI: Expected URI but received path ./src"),
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    ray_actor_options:\n      runtime_env:\n        py_modules: [s3://b/m.zip, lib]\n",
     ":8: applications[0].deployments[0].ray_actor_options.runtime_env.py_modules: "
     "runtime_envs in the Serve config support only remote URIs"),
    # Ray's placement-group checks that an override fails whatever the code sets
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    placement_group_bundles: [{CPU: 1}]\n    placement_group_strategy: BAD\n",
     ":7: applications[0].deployments[0].placement_group_strategy: Invalid placement group "
     "strategy BAD."),
    ("applications:\n- name: a\n  import_path: m:app\n  deployments:\n  - name: D\n"
     "    placement_group_bundles: []\n",
     ":6: applications[0].deployments[0].placement_group_bundles: Bundles must be a "
     "non-empty list"),
    ("backend: k8s\n", ":1: backend: backend 'k8s' is not available"),
    ("http_options:\n  port: 99999\n", ":2: http_options.port: port must be an integer"),
    ("applications: [\n", ":2: not valid YAML"),
])
def test_errors_name_file_line_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert f"{path}{expected}" in str(caught.value)


def test_all_errors_are_reported_together(tmp_path: Path) -> None:
    path = write(tmp_path, "http_options:\n  prot: 1\napplications:\n- name: a\n"
                           "  import_path: m:app\n  deployments:\n  - {name: D, num_replica: 2}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    lines = str(caught.value).splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"{path}:2:") and ":7:" in lines[1]


def test_unknown_deployment_and_unimportable_path_name_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "applications:\n- name: a\n  import_path: "
                           "tests.config.apps.text_ml:app\n  deployments:\n  - name: Nope\n")
    with pytest.raises(ConfigError, match=r":5: applications\[0\]\.deployments\[0\]\.name: "
                                          r"application 'a' has no deployment 'Nope'"):
        build_specs(load_config(path))
    path = write(tmp_path, "applications:\n- name: a\n  import_path: no_such_mod:app\n")
    with pytest.raises(ConfigError, match=r":3: applications\[0\]\.import_path: cannot import"):
        build_specs(load_config(path))
    path = write(tmp_path, "applications:\n- name: a\n  import_path: "
                           "tests.config.apps.text_ml:app\n  args: {x: 1}\n")
    with pytest.raises(ConfigError, match="args are only passed to application builders"):
        build_specs(load_config(path))


def test_an_empty_file_is_an_empty_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "# nothing yet\n"))
    assert config.applications == () and config.http_options.port == 8000
    assert parse_config({"applications": []}).applications == ()


def test_build_writes_a_config_that_loads_back(tmp_path: Path) -> None:
    data = build_config(["tests.config.apps.text_ml:app"])
    (app,) = data["applications"]
    assert app["import_path"] == "tests.config.apps.text_ml:app"
    assert [d["name"] for d in app["deployments"]] == ["Summarizer", "Translator"]
    assert app["deployments"][1]["max_ongoing_requests"] == 4
    path = write(tmp_path, yaml.safe_dump(data, sort_keys=False))
    (spec,) = build_specs(load_config(path))
    assert {d.config.name for d in spec.deployments} == {"Summarizer", "Translator"}


def test_overrides_keep_the_graph_shape() -> None:
    from surge.api.config_apply import import_application, walk_deployments

    config = load_config(CONFIGS / "ray_docs_multi_app.yaml")
    root = import_application("tests.config.apps.text_ml:app")
    bound = application_with_overrides(root, config.applications[0], config.where)
    nodes = walk_deployments(bound)
    assert [n.deployment.name for n in nodes] == ["Summarizer", "Translator"]
    assert nodes[1].deployment.config.max_ongoing_requests == 8
    assert root.deployment.config.max_ongoing_requests == 5  # the original is untouched


def test_placement_groups_are_checked_with_the_codes_options_as_ray(tmp_path: Path) -> None:
    """Ray checks a deployment's placement group against its ray_actor_options once the
    file's options are on top of the code's: bundles from the file, num_cpus from the
    code (Translator sets none: 1, Ray's default for a replica)."""
    path = write(tmp_path, "applications:\n- name: a\n  import_path: "
                           "tests.config.apps.text_ml:app\n  deployments:\n"
                           "  - name: Translator\n    placement_group_bundles: [{GPU: 1}]\n")
    with pytest.raises(ConfigError, match=r":5: applications\[0\]\.deployments\[0\]: When "
                                          r"using `placement_group_bundles`.*`num_cpus` for "
                                          r"the actor is 1, but the bundle only has 0 `CPU`"):
        build_specs(load_config(path))
    path = write(tmp_path, "applications:\n- name: a\n  import_path: "
                           "tests.config.apps.text_ml:app\n  deployments:\n"
                           "  - name: Translator\n    placement_group_bundles: [{CPU: 1}]\n")
    (spec,) = build_specs(load_config(path))  # fits: accepted (and not used)
    assert {d.config.name for d in spec.deployments} == {"Summarizer", "Translator"}


def test_grpc_options_are_read_and_checked(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
grpc_options:
  port: 9100
  grpc_servicer_functions: ["my_pb2_grpc:add_MyServicer_to_server"]
  request_timeout_s: 2.5
applications: []
"""))
    assert config.grpc_options.port == 9100
    assert config.grpc_options.grpc_servicer_functions == ("my_pb2_grpc:add_MyServicer_to_server",)
    assert config.grpc_options.request_timeout_s == 2.5
    with pytest.raises(ConfigError, match="grpc_options"):
        load_config(write(tmp_path, "grpc_options:\n  port: 9100\n  servicers: []\n"))


def test_a_deployments_request_router_config_sets_its_routing_stats_period(
        tmp_path: Path) -> None:
    path = write(tmp_path, "applications:\n- name: a\n  import_path: "
                           "tests.config.apps.text_ml:app\n  deployments:\n"
                           "  - name: Translator\n    request_router_config:\n"
                           "      request_routing_stats_period_s: 0.5\n")
    (spec,) = build_specs(load_config(path))
    by_name = {d.config.name: d.config for d in spec.deployments}
    assert by_name["Translator"].request_router_config.request_routing_stats_period_s == 0.5
    bad = write(tmp_path, "applications:\n- name: a\n  import_path: "
                          "tests.config.apps.text_ml:app\n  deployments:\n"
                          "  - name: Translator\n    request_router_config:\n"
                          "      period: 0.5\n")
    with pytest.raises(ConfigError, match="period"):
        load_config(bad)


@pytest.mark.parametrize("builder", ["build_v2", "build_v1", "build_untyped"])
def test_a_builder_gets_its_args_as_its_pydantic_model_or_as_strings(builder: str) -> None:
    from surge.api.config_apply import import_application

    app = import_application(f"tests.config.apps.typed_builders:{builder}",
                             {"greeting": "hi", "replicas": "2"})
    assert app.deployment.config.num_replicas == 2
    assert app.args == ("hi",)
