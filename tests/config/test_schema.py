"""surge.config.schema: the one mechanism config-like inputs are checked with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import msgspec
import pytest

from surge.api.config_file import load_config
from surge.config import AutoscalingConfig, from_mapping
from surge.config.schema import FieldError, check_keys, choice, closest, decode, number
from surge.errors import ConfigError
from surge.llm.config import LoraConfig
from surge.loadtest.options import load_scenario
from surge.sim.distributions import parse_distribution
from surge.sim.multiplexing import parse_multiplexing
from surge.sim.traffic import parse_schedule


class _Step(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    rps: Annotated[float, msgspec.Meta(gt=0)]


class _Options(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    url: str
    workers: Annotated[int, msgspec.Meta(ge=1)] = 1
    steps: list[_Step] = []
    first: _Step | None = None


def test_closest_offers_a_near_key_and_nothing_for_a_far_one() -> None:
    assert closest("prot", ["port", "host"]) == "port"
    assert closest("zzz", ["port", "host"]) is None


def test_unknown_key_names_the_closest_known_one_and_blames_the_key() -> None:
    with pytest.raises(FieldError) as caught:
        check_keys({"schedul": {}}, ("url", "schedule"), "pulse.yaml")
    assert str(caught.value) == "pulse.yaml: unknown key 'schedul'. Did you mean 'schedule'?"
    assert caught.value.path == ("schedul",)
    assert caught.value.problem == "unknown key. Did you mean 'schedule'?"


def test_an_unknown_key_far_from_all_lists_the_known_ones() -> None:
    with pytest.raises(FieldError, match=r"unknown key 'zzz'\. Known keys: host, port\.$"):
        check_keys({"zzz": 1}, ("host", "port"), "x")


@pytest.mark.parametrize(("kwargs", "value", "message"), [
    ({"ge": 0}, -1, "n must be a number >= 0, got -1."),
    ({"gt": 0}, 0, "n must be a number > 0, got 0."),
    ({"ge": 1, "integer": True}, 1.5, "n must be an integer >= 1, got 1.5."),
    ({"ge": 0, "le": 100, "integer": True}, 101, "n must be an integer in [0, 100], got 101."),
    ({"gt": 0, "le": 1, "allow_none": True}, 2, "n must be a number in (0, 1] (or null), got 2."),
    ({"ge": 0}, True, "n must be a number >= 0, got True."),
    ({"ge": 0}, float("inf"), "n must be a number >= 0, got inf."),
    ({"lt": 100}, "5", "n must be a number < 100, got '5'."),
])
def test_every_range_is_worded_the_same(kwargs: dict[str, object], value: object,
                                        message: str) -> None:
    with pytest.raises(FieldError) as caught:
        number("n", value, **kwargs)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_number_passes_values_in_range_through() -> None:
    assert number("n", 3, ge=1, integer=True) == 3
    assert number("n", None, gt=0, allow_none=True) is None
    assert choice("arrivals", "poisson", ("uniform", "poisson")) == "poisson"


def test_a_dotted_name_is_the_path_blamed() -> None:
    with pytest.raises(FieldError) as caught:
        number("ray_actor_options.num_cpus", -1, ge=0)
    assert caught.value.path == ("ray_actor_options", "num_cpus")


def test_from_mapping_keeps_the_inner_path_under_the_outer_key() -> None:
    with pytest.raises(FieldError) as caught:
        from_mapping(AutoscalingConfig, {"min_replicas": -1}, "d.autoscaling_config",
                     ("autoscaling_config",))
    assert str(caught.value) == ("d.autoscaling_config: min_replicas must be an integer >= 0, "
                                 "got -1.")
    assert caught.value.path == ("autoscaling_config", "min_replicas")


@pytest.mark.parametrize(("data", "message", "path"), [
    ({"url": "x", "worker": 2}, "s.yaml: unknown key 'worker'. Did you mean 'workers'?",
     ("worker",)),
    ({"url": "x", "workers": 0}, "s.yaml.workers must be an integer >= 1, got 0.",
     ("workers",)),
    ({"url": "x", "steps": [{"rps": 0}]}, "s.yaml.steps[0].rps must be a number > 0, got 0.",
     ("steps", 0, "rps")),
    ({"url": "x", "steps": [{"rsp": 1}]},
     "s.yaml.steps[0]: unknown key 'rsp'. Did you mean 'rps'?", ("steps", 0, "rsp")),
    ({"url": "x", "first": {"rp": 1}}, "s.yaml.first: unknown key 'rp'. Did you mean 'rps'?",
     ("first", "rp")),
    ({"workers": 2}, "s.yaml.url is required.", ("url",)),
    ({"url": 3}, "s.yaml.url must be a string, got 3.", ("url",)),
    ({"url": "x", "workers": True}, "s.yaml.workers must be an integer, got True.",
     ("workers",)),
    ([1], "s.yaml must be a mapping, got [1].", ()),
])
def test_decode_words_msgspec_errors_as_the_hand_written_checks(
        data: object, message: str, path: tuple[object, ...]) -> None:
    with pytest.raises(FieldError) as caught:
        decode(_Options, data, "s.yaml")
    assert str(caught.value) == message
    assert caught.value.path == path


def test_decode_builds_the_typed_struct() -> None:
    options = decode(_Options, {"url": "x", "steps": [{"rps": 2}]}, "s.yaml")
    assert options == _Options(url="x", steps=[_Step(rps=2.0)])


def test_a_field_error_is_a_config_error_and_a_value_error() -> None:
    assert issubclass(FieldError, ConfigError)
    assert issubclass(FieldError, ValueError)


def test_the_yaml_loader_places_a_nested_range_error_on_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("applications:\n- name: a\n  import_path: m:app\n  deployments:\n"
                    "  - name: D\n    autoscaling_config:\n      max_replicas: 4\n"
                    "      min_replicas: -1\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}:8: applications[0].deployments[0].autoscaling_config.min_replicas: "
        "min_replicas must be an integer >= 0, got -1.")


def test_a_pulse_scenario_error_names_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "pulse.yaml"
    path.write_text("url: http://x/\nworkers: 0\nllm: {kindd: chat}\n")
    with pytest.raises(ValueError) as caught:
        load_scenario(path)
    assert str(caught.value) == f"{path}:2: workers: workers must be an integer >= 1, got 0."
    path.write_text("url: http://x/\nllm:\n  kindd: chat\n")
    with pytest.raises(ValueError) as caught:
        load_scenario(path)
    assert str(caught.value) == f"{path}:3: llm.kindd: unknown key. Did you mean 'kind'?"


def test_an_llm_config_words_an_unknown_key_as_every_config() -> None:
    with pytest.raises(FieldError, match=r"^lora_config: unknown key 'zzz'\. Known keys: "):
        LoraConfig.from_dict({"zzz": 1}, "lora_config")
    with pytest.raises(FieldError, match=r"^lora_config\.max_num_adapters_per_replica must be "
                                         r"an integer >= 1, got 0\.$"):
        LoraConfig(max_num_adapters_per_replica=0)


@pytest.mark.parametrize(("parse", "message"), [
    (lambda: parse_schedule(
        {"diurnal": {"min_rps": 1, "max_rps": 2, "period": 60}}, "s.traffic.schedule"),
     "s.traffic.schedule.diurnal: unknown key 'period'. Did you mean 'period_s'?"),
    (lambda: parse_schedule(
        {"diurnal": {"min_rps": -1, "max_rps": 2}}, "s.traffic.schedule"),
     "s.traffic.schedule.diurnal.min_rps must be a number >= 0, got -1."),
    (lambda: parse_multiplexing(
        {"models": 2, "load_time_s": 1, "advertise_interval_s": 0}, "s.multiplex"),
     "s.multiplex.advertise_interval_s must be a number > 0, got 0."),
    (lambda: parse_distribution(
        -2, "s.service.service_time_ms"),
     "s.service.service_time_ms must be a number >= 0, got -2."),
])
def test_simulate_scenarios_word_errors_as_every_config(parse: Callable[[], object],
                                                        message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse()
    assert message in str(caught.value)
