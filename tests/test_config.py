"""Configs: Ray Serve's names and defaults, and errors that name the field."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import pytest

from surge import serve
from surge.config import (
    DEFAULT_MAX_ONGOING_REQUESTS,
    DEFAULT_MAX_QUEUE_WAIT_S,
    DEFAULT_MAX_QUEUED_REQUESTS,
    QUEUE_SAFETY_LIMIT,
    AppSpec,
    AutoscalingConfig,
    DeploymentConfig,
    DeploymentSpec,
    HTTPOptions,
    ReplicaResources,
    build_deployment_config,
    from_mapping,
)
from surge.errors import ConfigError, RayServeException
from surge.model import RouteTable, RouteTarget

# -- AutoscalingConfig -------------------------------------------------------------------


def test_autoscaling_defaults_are_rays() -> None:
    config = AutoscalingConfig()
    assert (config.min_replicas, config.max_replicas) == (1, 1)
    assert config.initial_replicas is None
    assert config.target_ongoing_requests == 2.0
    assert config.upscale_delay_s == 30.0
    assert config.downscale_delay_s == 600.0
    assert config.metrics_interval_s == 10.0
    assert config.look_back_period_s == 30.0
    assert config.smoothing_factor == 1.0
    assert config.aggregation_function == "mean"
    assert config.start_replicas == 1


def test_auto_default_is_one_to_a_hundred() -> None:
    config = AutoscalingConfig.default()
    assert (config.min_replicas, config.max_replicas) == (1, 100)
    assert config.target_ongoing_requests == 2.0


def test_start_replicas_prefers_initial_replicas() -> None:
    config = AutoscalingConfig(min_replicas=1, initial_replicas=3, max_replicas=5)
    assert config.start_replicas == 3
    assert AutoscalingConfig(min_replicas=2, max_replicas=5).start_replicas == 2


def test_autoscaling_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        AutoscalingConfig().min_replicas = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_replicas": -1}, "min_replicas"),
        ({"max_replicas": 0}, "max_replicas"),
        ({"min_replicas": 4, "max_replicas": 2}, "min_replicas"),
        ({"min_replicas": 1.5, "max_replicas": 3}, "min_replicas"),
        ({"max_replicas": "10"}, "max_replicas"),
        ({"max_replicas": True}, "max_replicas"),
        ({"min_replicas": 1, "max_replicas": 3, "initial_replicas": 5}, "initial_replicas"),
        ({"max_replicas": 3, "initial_replicas": "2"}, "initial_replicas"),
        ({"target_ongoing_requests": 0}, "target_ongoing_requests"),
        ({"target_ongoing_requests": -1.0}, "target_ongoing_requests"),
        ({"target_ongoing_requests": "2"}, "target_ongoing_requests"),
        ({"target_ongoing_requests": float("nan")}, "target_ongoing_requests"),
        ({"upscale_delay_s": -1}, "upscale_delay_s"),
        ({"downscale_delay_s": float("inf")}, "downscale_delay_s"),
        ({"metrics_interval_s": None}, "metrics_interval_s"),
        ({"look_back_period_s": "30"}, "look_back_period_s"),
        ({"downscale_to_zero_delay_s": -5}, "downscale_to_zero_delay_s"),
        ({"smoothing_factor": 0}, "smoothing_factor"),
        ({"upscale_smoothing_factor": -1.0}, "upscale_smoothing_factor"),
        ({"downscaling_factor": "fast"}, "downscaling_factor"),
        ({"aggregation_function": "median"}, "aggregation_function"),
        ({"standby_replicas": -1}, "standby_replicas"),
    ],
)
def test_autoscaling_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        AutoscalingConfig(**kwargs)


def test_config_error_is_a_value_error_and_a_serve_exception() -> None:
    with pytest.raises(ValueError):
        AutoscalingConfig(min_replicas=-1)
    assert issubclass(ConfigError, RayServeException)


# -- from_mapping ------------------------------------------------------------------------


def test_from_mapping_builds_the_dataclass() -> None:
    config = from_mapping(AutoscalingConfig, {"min_replicas": 2, "max_replicas": 4}, "x")
    assert config == AutoscalingConfig(min_replicas=2, max_replicas=4)


def test_from_mapping_suggests_the_close_key() -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(AutoscalingConfig, {"max_replica": 3}, "app.autoscaling_config")
    assert str(info.value) == ("app.autoscaling_config: unknown key 'max_replica'. "
                               "Did you mean 'max_replicas'?")


def test_from_mapping_lists_known_keys_when_nothing_is_close() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'zzz'\. Known keys: host, port"):
        from_mapping(HTTPOptions, {"zzz": 1}, "http_options")


def test_from_mapping_rejects_a_non_mapping() -> None:
    with pytest.raises(ConfigError, match="http_options: expected a mapping, got list"):
        from_mapping(HTTPOptions, [("port", 1)], "http_options")  # type: ignore[arg-type]


def test_from_mapping_prefixes_validation_errors() -> None:
    with pytest.raises(ConfigError, match=r"^http_options: port must be an integer"):
        from_mapping(HTTPOptions, {"port": 70000}, "http_options")


def test_from_mapping_turns_missing_fields_into_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"^d: .*name"):
        from_mapping(DeploymentConfig, {}, "d")


# -- DeploymentConfig --------------------------------------------------------------------


def test_deployment_defaults_are_rays() -> None:
    config = DeploymentConfig(name="d")
    assert config.max_ongoing_requests == DEFAULT_MAX_ONGOING_REQUESTS == 5
    assert config.max_queued_requests == DEFAULT_MAX_QUEUED_REQUESTS == -1
    assert config.queue_limit == QUEUE_SAFETY_LIMIT
    assert config.num_replicas is None
    assert config.initial_replicas == 1
    assert config.autoscaling_config is None
    assert config.health_check_period_s == 10.0
    assert config.health_check_timeout_s == 30.0
    assert config.graceful_shutdown_timeout_s == 20.0
    assert config.graceful_shutdown_wait_loop_s == 2.0
    assert config.resources == ReplicaResources(num_cpus=1.0, num_gpus=0.0, env_vars={})


def test_explicit_queue_limit_is_used() -> None:
    assert DeploymentConfig(name="d", max_queued_requests=0).queue_limit == 0
    assert DeploymentConfig(name="d", max_queued_requests=7).queue_limit == 7


def test_the_queue_is_bounded_by_time_only_while_max_queued_requests_is_unset() -> None:
    assert DeploymentConfig(name="d").queue_wait_limit_s == DEFAULT_MAX_QUEUE_WAIT_S == 0.1
    assert DeploymentConfig(name="d", max_queue_wait_s=0.5).queue_wait_limit_s == 0.5
    assert DeploymentConfig(name="d", max_queue_wait_s=None).queue_wait_limit_s is None
    # an explicit max_queued_requests keeps Ray's count semantics
    assert DeploymentConfig(name="d", max_queued_requests=7).queue_wait_limit_s is None
    config = build_deployment_config("d", {"max_queue_wait_s": 0.25})
    assert config.max_queue_wait_s == 0.25


def test_initial_replicas() -> None:
    assert DeploymentConfig(name="d", num_replicas=4).initial_replicas == 4
    assert DeploymentConfig(name="d", num_replicas=0).initial_replicas == 0
    auto = AutoscalingConfig(min_replicas=2, initial_replicas=3, max_replicas=9)
    assert DeploymentConfig(name="d", autoscaling_config=auto).initial_replicas == 3


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "deployment name"),
        ({"name": "a#b"}, "deployment name"),
        ({"name": 3}, "deployment name"),
        ({"num_replicas": -1}, "num_replicas"),
        ({"num_replicas": 1.5}, "num_replicas"),
        ({"max_ongoing_requests": 0}, "max_ongoing_requests"),
        ({"max_ongoing_requests": 2.5}, "max_ongoing_requests"),
        ({"max_ongoing_requests": True}, "max_ongoing_requests"),
        ({"max_queued_requests": -2}, "max_queued_requests"),
        ({"max_queued_requests": "10"}, "max_queued_requests"),
        ({"max_queue_wait_s": 0}, "max_queue_wait_s"),
        ({"max_queue_wait_s": -1.0}, "max_queue_wait_s"),
        ({"max_queue_wait_s": "0.1"}, "max_queue_wait_s"),
        ({"max_queue_wait_s": float("nan")}, "max_queue_wait_s"),
        ({"health_check_period_s": -1}, "health_check_period_s"),
        ({"health_check_timeout_s": "30"}, "health_check_timeout_s"),
        ({"graceful_shutdown_timeout_s": -0.5}, "graceful_shutdown_timeout_s"),
        ({"graceful_shutdown_wait_loop_s": float("nan")}, "graceful_shutdown_wait_loop_s"),
    ],
)
def test_deployment_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        DeploymentConfig(**{"name": "d", **kwargs})


# -- build_deployment_config: Ray's spelling ----------------------------------------------


def test_build_with_plain_options() -> None:
    config = build_deployment_config("d", {"num_replicas": 3, "max_ongoing_requests": 8,
                                           "max_queued_requests": 20, "user_config": {"k": 1}})
    assert config == DeploymentConfig(name="d", num_replicas=3, max_ongoing_requests=8,
                                      max_queued_requests=20, user_config={"k": 1})


def test_num_replicas_auto_gives_one_to_a_hundred() -> None:
    config = build_deployment_config("d", {"num_replicas": "auto"})
    assert config.num_replicas is None
    assert config.autoscaling_config == AutoscalingConfig(min_replicas=1, max_replicas=100)
    assert config.initial_replicas == 1


def test_num_replicas_auto_keeps_user_fields() -> None:
    config = build_deployment_config("d", {
        "num_replicas": "auto",
        "autoscaling_config": {"min_replicas": 5, "target_ongoing_requests": 3,
                               "upscale_delay_s": 1.0},
    })
    assert config.autoscaling_config == AutoscalingConfig(
        min_replicas=5, max_replicas=100, target_ongoing_requests=3, upscale_delay_s=1.0)


def test_num_replicas_auto_keeps_user_fields_equal_to_the_plain_defaults() -> None:
    # As in Ray: a field the user set wins even when it equals AutoscalingConfig()'s default.
    config = build_deployment_config("d", {"num_replicas": "auto",
                                           "autoscaling_config": {"max_replicas": 1}})
    assert config.autoscaling_config == AutoscalingConfig(min_replicas=1, max_replicas=1)


def test_num_replicas_auto_with_an_autoscaling_object() -> None:
    given = AutoscalingConfig(max_replicas=7, target_ongoing_requests=4)
    config = build_deployment_config("d", {"num_replicas": "auto",
                                           "autoscaling_config": given})
    assert config.autoscaling_config == AutoscalingConfig(min_replicas=1, max_replicas=7,
                                                          target_ongoing_requests=4)


def test_num_replicas_auto_validates_user_fields() -> None:
    with pytest.raises(ConfigError, match=r"^d\.autoscaling_config: unknown key 'max_replica'"):
        build_deployment_config("d", {"num_replicas": "auto",
                                      "autoscaling_config": {"max_replica": 3}}, "d")
    with pytest.raises(ConfigError, match="min_replicas"):
        build_deployment_config("d", {"num_replicas": "auto",
                                      "autoscaling_config": {"min_replicas": 200}})


def test_autoscaling_config_as_a_dict_or_object() -> None:
    as_dict = build_deployment_config("d", {"autoscaling_config": {"max_replicas": 4}})
    as_object = build_deployment_config(
        "d", {"autoscaling_config": AutoscalingConfig(max_replicas=4)})
    assert as_dict == as_object
    assert as_dict.autoscaling_config == AutoscalingConfig(min_replicas=1, max_replicas=4)


def test_num_replicas_and_autoscaling_config_together_are_rejected() -> None:
    with pytest.raises(ConfigError, match="num_replicas and autoscaling_config cannot both"):
        build_deployment_config("d", {"num_replicas": 2,
                                      "autoscaling_config": {"max_replicas": 4}})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_replicas": "many"}, r"^deployment\.num_replicas must be an integer or 'auto'"),
        ({"autoscaling_config": 3}, r"^deployment\.autoscaling_config must be a dict"),
        ({"num_replicas": "auto", "autoscaling_config": [1]},
         r"^deployment\.autoscaling_config must be a dict"),
        ({"max_ongoing_request": 3},
         r"^deployment: unknown option 'max_ongoing_request'\. Did you mean "
         r"'max_ongoing_requests'\?"),
        ({"autoscaling_config": {"upscale_dely_s": 1}},
         r"^deployment\.autoscaling_config: unknown key 'upscale_dely_s'\. Did you mean "
         r"'upscale_delay_s'\?"),
        ({"max_ongoing_requests": 0}, r"^deployment: max_ongoing_requests must be"),
        ({"ray_actor_options": {"num_cpu": 1}},
         r"^deployment\.ray_actor_options: unknown key 'num_cpu'\. Did you mean 'num_cpus'\?"),
    ],
)
def test_build_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_deployment_config("d", options)


def test_build_does_not_change_its_input() -> None:
    options = {"num_replicas": "auto", "ray_actor_options": {"num_cpus": 2}}
    build_deployment_config("d", options)
    assert options == {"num_replicas": "auto", "ray_actor_options": {"num_cpus": 2}}


# -- ray_actor_options -------------------------------------------------------------------


def test_ray_actor_options_parsed() -> None:
    config = build_deployment_config("d", {"ray_actor_options": {
        "num_cpus": 0.5, "num_gpus": 1, "runtime_env": {"env_vars": {"A": "1", "B": "x"}},
    }})
    assert config.resources == ReplicaResources(num_cpus=0.5, num_gpus=1.0,
                                                env_vars={"A": "1", "B": "x"})
    assert isinstance(config.resources.num_gpus, float)


def test_ray_actor_options_empty_or_missing() -> None:
    assert ReplicaResources.from_ray_actor_options(None) == ReplicaResources()
    assert ReplicaResources.from_ray_actor_options({}) == ReplicaResources()
    assert ReplicaResources.from_ray_actor_options({"runtime_env": None}) == ReplicaResources()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_cpus": -1}, r"ray_actor_options\.num_cpus must be a number >= 0"),
        ({"num_gpus": "1"}, r"ray_actor_options\.num_gpus must be a number >= 0"),
        ({"runtime_env": {"env_vars": {"A": 1}}},
         r"ray_actor_options\.runtime_env\.env_vars must map strings to strings"),
        ({"runtime_env": {"env_vars": ["A=1"]}},
         r"ray_actor_options\.runtime_env\.env_vars must map strings to strings"),
        ({"runtime_env": "conda"}, r"ray_actor_options\.runtime_env must be a mapping"),
        ({"num_gpu": 1}, r"unknown key 'num_gpu'\. Did you mean 'num_gpus'\?"),
        ({"bogus": 1}, r"unknown key 'bogus'\."),
    ],
)
def test_ray_actor_options_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReplicaResources.from_ray_actor_options(options)


def test_ray_only_keys_are_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    options = {"memory": 1 << 30, "resources": {"custom": 1}, "max_concurrency": 10,
               "num_cpus": 2}
    with caplog.at_level(logging.WARNING, logger="surge.config"):
        resources = ReplicaResources.from_ray_actor_options(options, "dep.ray_actor_options")
    # custom resources are kept: the ray backend places replicas by them
    assert resources == ReplicaResources(num_cpus=2.0, resources={"custom": 1.0})
    assert [r.getMessage() for r in caplog.records] == [
        "dep.ray_actor_options: max_concurrency, memory accepted but not used by "
        "the local backend"]


def test_runtime_env_keys_other_than_env_vars_are_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="surge.config"):
        resources = ReplicaResources.from_ray_actor_options(
            {"runtime_env": {"pip": ["x"], "env_vars": {"K": "v"}, "working_dir": "."}})
    assert resources.env_vars == {"K": "v"}
    assert [r.getMessage() for r in caplog.records] == [
        "ray_actor_options.runtime_env: pip, working_dir not supported by surge; only "
        "env_vars is honoured"]


# -- HTTPOptions -------------------------------------------------------------------------


def test_http_defaults() -> None:
    options = HTTPOptions()
    assert (options.host, options.port, options.location) == ("127.0.0.1", 8000, "EveryNode")
    assert options.request_timeout_s is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"port": -1}, "port"),
        ({"port": 65536}, "port"),
        ({"port": "8000"}, "port"),
        ({"request_timeout_s": -1}, "request_timeout_s"),
        ({"keep_alive_timeout_s": "90"}, "keep_alive_timeout_s"),
        ({"max_body_bytes": -1}, "max_body_bytes"),
        ({"location": "Everywhere"}, "proxy location"),
    ],
)
def test_http_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        HTTPOptions(**kwargs)


# -- AppSpec -----------------------------------------------------------------------------


def spec(name: str, **config: Any) -> DeploymentSpec:
    return DeploymentSpec(config=DeploymentConfig(name=name, **config), target_blob=b"t",
                          init_blob=b"i")


def test_app_spec_valid() -> None:
    app = AppSpec(name="app", route_prefix="/api", ingress="A",
                  deployments=(spec("A"), spec("B")))
    assert app.ingress == "A"
    assert AppSpec(name="app", route_prefix="/", ingress="A", deployments=(spec("A"),))
    assert AppSpec(name="app", route_prefix=None, ingress="A", deployments=(spec("A"),))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"route_prefix": "api"},
         r"Invalid route_prefix 'api', must start with a forward slash \('/'\)\."),
        ({"route_prefix": ""}, "Invalid route_prefix '', must start with a forward slash"),
        ({"route_prefix": "/api/"}, "Invalid route_prefix '/api/', may not end with a trailing"),
        ({"route_prefix": "/{hello}"},
         re.escape("Invalid route_prefix '/{hello}', may not contain wildcards")),
        ({"route_prefix": "/a/{b}"}, "may not contain wildcards"),
        ({"deployments": (spec("A"), spec("A"))},
         "application 'app' has two deployments with the same name"),
        ({"ingress": "C"}, "ingress 'C' is not among the deployments"),
        ({"name": None}, "application name must be a string"),
    ],
)
def test_app_spec_errors(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"name": "app", "route_prefix": "/api", "ingress": "A",
                              "deployments": (spec("A"), spec("B"))}
    with pytest.raises(ConfigError, match=message):
        AppSpec(**{**fields, **kwargs})


def test_code_version_follows_code_and_replica_shape_not_scale() -> None:
    base = spec("A").code_version
    assert len(base) == 16
    assert spec("A").code_version == base
    assert spec("A", num_replicas=5).code_version == base  # scaling needs no restart
    assert spec("A", max_ongoing_requests=9).code_version != base
    assert DeploymentSpec(config=DeploymentConfig(name="A"), target_blob=b"other",
                          init_blob=b"i").code_version != base


# -- RouteTable (surge.model) ------------------------------------------------------------


def table(*prefixes: str) -> RouteTable:
    return RouteTable(tuple(RouteTarget(f"app{p}", "ingress", p) for p in prefixes))


@pytest.mark.parametrize(
    ("prefixes", "path", "expected"),
    [
        ((), "/", None),
        (("/",), "/", "/"),
        (("/",), "/anything/at/all", "/"),
        (("/",), "", "/"),
        (("/a",), "/a", "/a"),
        (("/a",), "/a/", "/a"),
        (("/a",), "/a/b", "/a"),
        (("/a",), "/ab", None),
        (("/a",), "/", None),
        (("/", "/a"), "/ab", "/"),
        (("/", "/a"), "/a/x", "/a"),
        (("/a", "/a/b", "/"), "/a/b/c", "/a/b"),  # longest prefix wins, in any order
        (("/a/b", "/a", "/"), "/a/bc", "/a"),
        (("/a/b", "/", "/a"), "/a/b", "/a/b"),
    ],
)
def test_route_table_match(prefixes: tuple[str, ...], path: str, expected: str | None) -> None:
    target = table(*prefixes).match(path)
    if expected is None:
        assert target is None
    else:
        assert target is not None
        assert target.route_prefix == expected
        assert target.app == f"app{expected}"


def test_rays_config_classes_load_and_mean_what_they_say() -> None:
    from surge.config import AutoscalingPolicy, RequestRouterConfig, gRPCOptions
    from surge.policy.autoscaling import ray_default
    from surge.policy.resolve import resolve_policy
    from surge.serve.config import ProxyLocation

    assert HTTPOptions(location=ProxyLocation.HeadOnly).location == "HeadOnly"
    assert ProxyLocation.EveryNode == "EveryNode"
    assert gRPCOptions(grpc_servicer_functions=["a:b"]).grpc_servicer_functions == ("a:b",)
    with pytest.raises(ConfigError, match="import paths"):
        gRPCOptions(grpc_servicer_functions="a:b")  # type: ignore[arg-type]
    scaling = AutoscalingConfig(max_replicas=3, policy=AutoscalingPolicy(  # type: ignore[arg-type]
        policy_function="ray.serve.autoscaling_policy:default_autoscaling_policy"))
    assert scaling.policy == {"policy_function":
                              "ray.serve.autoscaling_policy:default_autoscaling_policy",
                              "policy_kwargs": {}}
    from surge.model import DeploymentId

    assert resolve_policy(scaling, DeploymentId("a", "d")) is ray_default  # Ray's own path
    assert RequestRouterConfig().request_routing_stats_period_s == 10.0


def test_request_router_config_sets_the_routing_stats_period(
        caplog: pytest.LogCaptureFixture) -> None:
    from surge.config import RequestRouterConfig

    config = DeploymentConfig(name="d", request_router_config={  # type: ignore[arg-type]
        "request_routing_stats_period_s": 0.5})
    assert config.request_router_config == RequestRouterConfig(
        request_routing_stats_period_s=0.5)
    assert DeploymentConfig(name="d").request_router_config == RequestRouterConfig()
    for bad in ({"request_routing_stats_period_s": 0}, {"request_routing_stats_timeout_s": -1},
                {"request_routing_stats_period_s": "1"}, {"period": 1}):
        with pytest.raises(ConfigError, match="request_router_config"):
            DeploymentConfig(name="d", request_router_config=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="a dict or RequestRouterConfig"):
        DeploymentConfig(name="d", request_router_config=3)  # type: ignore[arg-type]
    assert RequestRouterConfig().prefix_routing is True
    assert RequestRouterConfig(request_router_kwargs={"prefix_routing": False}
                               ).prefix_routing is False
    for kwargs, message in (
            ({"prefix_routng": False}, "unknown key 'prefix_routng'. Did you mean "
                                       "'prefix_routing'"),
            ({"prefix_routing": "no"}, "prefix_routing must be true or false, got 'no'"),
            ({"prefix_routing": {1, 2}}, "not JSON-serializable"),
            (None, "request_router_kwargs must be a mapping")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            DeploymentConfig(name="d", request_router_config={  # type: ignore[arg-type]
                "request_router_kwargs": kwargs})
    # another router class's kwargs are its own (Ray's PrefixCacheAffinityRouter's here)
    assert RequestRouterConfig(request_router_class="ray.serve.llm.request_router:"
                               "PrefixCacheAffinityRouter",
                               request_router_kwargs={"imbalanced_threshold": 5}
                               ).prefix_routing is True
    with caplog.at_level("WARNING", "surge.config"):
        DeploymentConfig(name="d", request_router_config=RequestRouterConfig(
            request_router_class="my:Router"))
    assert "request_router_class 'my:Router' is not used" in caplog.text


def test_backpressure_config_takes_rays_values_only() -> None:
    from surge.config import BackpressureConfig

    assert DeploymentConfig(name="d", backpressure_config={  # type: ignore[arg-type]
        "status_code": 429}).backpressure_config == BackpressureConfig(status_code=429)
    for bad in ({"status_code": 500}, {"retry_after_s": -1}, {"retry_after": 3}):
        with pytest.raises(ConfigError):
            DeploymentConfig(name="d", backpressure_config=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="rolling_update_percentage"):
        DeploymentConfig(name="d", rolling_update_percentage=0)
    with pytest.raises(ConfigError, match="max_surge_percent"):
        DeploymentConfig(name="d", max_surge_percent=101)


def test_deployment_options_checked_as_ray_checks_them() -> None:
    def f() -> str:
        return "hi"

    with pytest.raises(ConfigError, match=r"Setting max_replicas_per_node is not allowed when "
                                          r"placement_group_bundles is provided\."):
        serve.deployment(max_replicas_per_node=2, placement_group_bundles=[{"CPU": 1}])(f)
    # Ray ignores a first argument that is not callable: the call gives the decorator.
    decorator = serve.deployment("ignored", num_replicas=2)
    assert decorator(f).config.num_replicas == 2 and decorator(f).name == "f"
