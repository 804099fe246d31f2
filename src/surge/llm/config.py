"""`LLMConfig` and friends, with Ray Serve LLM's field names, defaults and checks.

Each class takes keyword arguments (nested configs as dicts or as instances), as Ray's
pydantic models do, and `from_dict` takes a config file's mapping: unknown keys are an
error with a suggestion, since a typo in a model config silently changes what is served.
Fields that only mean something on Ray (placement groups, callbacks) are accepted and
named once in the log. Where surge decides differently (which hardware an engine gets
when nothing says), the docstring of the field says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Self

from surge.config.schema import check_keys, number
from surge.errors import ConfigError

__all__ = ["LLMConfig", "LLMServingArgs", "LoraConfig", "ModelLoadingConfig",
           "deployment_name_for"]

log = logging.getLogger("surge.llm")

# Ray's defaults (ray/llm/_internal/serve/constants.py).
DEFAULT_MULTIPLEX_DOWNLOAD_TIMEOUT_S = 30.0
DEFAULT_MULTIPLEX_DOWNLOAD_TRIES = 3
LORA_SCHEMES = ("s3://", "gs://", "abfss://", "azure://", "file://", "/")
_RAY_ONLY = ("placement_group_config", "callback_config")
_warned: set[str] = set()


class _Config:
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | Self, where: str = "") -> Self:
        if isinstance(data, cls):
            return data
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where or cls.__name__}: expected a mapping, got "
                              f"{type(data).__name__}")
        check_keys(data, [f.name for f in fields(cls)],  # type: ignore[arg-type]
                   where or cls.__name__)
        return cls(**data)

    def model_dump(self) -> dict[str, Any]:
        """A plain dict, as Ray's pydantic models give."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            out[f.name] = value.model_dump() if isinstance(value, _Config) else value
        return out


@dataclass(kw_only=True)
class ModelLoadingConfig(_Config):
    model_id: str
    model_source: str | None = None  # a local path or hub id; default: model_id
    tokenizer_source: str | None = None  # default: model_source

    def __post_init__(self) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise ConfigError("model_loading_config.model_id must be a non-empty string")
        if isinstance(self.model_source, Mapping):
            raise ConfigError("model_loading_config.model_source as a cloud mirror config is "
                              "not supported by surge: download the model and give its path")

    @property
    def source(self) -> str:
        return self.model_source or self.model_id


@dataclass(kw_only=True)
class LoraConfig(_Config):
    dynamic_lora_loading_path: str | None = None
    max_num_adapters_per_replica: int = 16
    download_timeout_s: float | None = DEFAULT_MULTIPLEX_DOWNLOAD_TIMEOUT_S
    max_download_tries: int = DEFAULT_MULTIPLEX_DOWNLOAD_TRIES

    def __post_init__(self) -> None:
        path = self.dynamic_lora_loading_path
        if path is not None:
            if not path.startswith(LORA_SCHEMES):
                raise ConfigError("lora_config.dynamic_lora_loading_path must be a local path "
                                  f"or start with one of {', '.join(LORA_SCHEMES[:-1])}; got "
                                  f"{path!r}")
            self.dynamic_lora_loading_path = path.rstrip("/")
        number("lora_config.max_num_adapters_per_replica", self.max_num_adapters_per_replica,
               ge=1, integer=True)


@dataclass(kw_only=True)
class LLMConfig(_Config):
    model_loading_config: ModelLoadingConfig | Mapping[str, Any]
    runtime_env: dict[str, Any] | None = None
    # "vLLM" (Ray's only value), or surge's extension: "module:Class" of an engine that
    # implements surge.llm.engine.LLMEngine (tests use surge.testing:FakeLLMEngine).
    llm_engine: str = "vLLM"
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    # Set (e.g. "A10G", "H100"): the engine gets tensor_parallel_size x
    # pipeline_parallel_size GPUs. Unset: GPUs as well where this machine has them (as Ray
    # defaults), none where it has none (Ray would wait for a GPU forever, #53603).
    accelerator_type: str | None = None
    accelerator_config: dict[str, Any] | None = None
    placement_group_config: dict[str, Any] | None = None
    lora_config: LoraConfig | Mapping[str, Any] | None = None
    deployment_config: dict[str, Any] = field(default_factory=dict)
    server_cls: Any = None
    experimental_configs: dict[str, Any] = field(default_factory=dict)
    log_engine_metrics: bool | None = True
    callback_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.model_loading_config = ModelLoadingConfig.from_dict(
            self.model_loading_config, "model_loading_config")
        if self.lora_config is not None:
            self.lora_config = LoraConfig.from_dict(self.lora_config, "lora_config")
        if self.accelerator_type == "A10":  # Ray's alias
            self.accelerator_type = "A10G"
        for name, value in (("engine_kwargs", self.engine_kwargs),
                            ("deployment_config", self.deployment_config),
                            ("experimental_configs", self.experimental_configs)):
            if not isinstance(value, Mapping):
                raise ConfigError(f"LLMConfig.{name} must be a mapping")
        if "num_router_replicas" in self.experimental_configs:
            raise ConfigError("The 'num_router_replicas' key in experimental_configs has been "
                              "renamed to 'num_ingress_replicas'.")
        if self.log_engine_metrics and self.engine_kwargs.get("disable_log_stats"):
            raise ConfigError("disable_log_stats cannot be set to True when "
                              "log_engine_metrics is enabled.")
        if {"placement_group_bundles", "placement_group_strategy"} & set(self.deployment_config):
            raise ConfigError("placement_group_bundles and placement_group_strategy must not "
                              "be specified in deployment_config.")
        if self.llm_engine != "vLLM" and ":" not in self.llm_engine:
            raise ConfigError(f"Unsupported engine: {self.llm_engine} (use 'vLLM', or "
                              "'module:Class' of a surge.llm.engine.LLMEngine)")
        for key in _RAY_ONLY:
            if getattr(self, key) and key not in _warned:
                _warned.add(key)
                log.warning("LLMConfig.%s is Ray's; surge accepts it and does not use it", key)

    @property
    def loading(self) -> ModelLoadingConfig:
        assert isinstance(self.model_loading_config, ModelLoadingConfig)
        return self.model_loading_config

    @property
    def lora(self) -> LoraConfig | None:
        assert self.lora_config is None or isinstance(self.lora_config, LoraConfig)
        return self.lora_config

    @property
    def model_id(self) -> str:
        return self.loading.model_id

    @property
    def max_request_context_length(self) -> int | None:
        value = self.engine_kwargs.get("max_model_len")
        return int(value) if value is not None else None

    def engine_gpus(self) -> int:
        """GPUs one engine needs: 0 on a CPU deployment (see accelerator_type)."""
        kind = (self.accelerator_config or {}).get("kind")
        if kind is None:
            kind = "gpu" if self.accelerator_type or os.path.exists("/dev/nvidia0") else "cpu"
        if kind != "gpu":
            return 0
        tp = int(self.engine_kwargs.get("tensor_parallel_size", 1))
        pp = int(self.engine_kwargs.get("pipeline_parallel_size", 1))
        return max(1, tp * pp)


def deployment_name_for(config: LLMConfig) -> str:
    """Ray's rule: the model id, with '/' and '.' replaced."""
    return config.model_id.replace("/", "--").replace(".", "_")


@dataclass(kw_only=True)
class LLMServingArgs(_Config):
    llm_configs: list[Any]
    ingress_cls_config: dict[str, Any] | None = None
    ingress_deployment_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.llm_configs, list | tuple):
            raise ConfigError("llm_configs must be a list of LLMConfigs (or dicts, or paths "
                              "to YAML files of one)")
        configs = []
        for index, entry in enumerate(self.llm_configs):
            where = f"llm_configs[{index}]"
            if isinstance(entry, str):
                configs.append(_config_file(entry, where))
            elif isinstance(entry, LLMConfig | Mapping):
                configs.append(LLMConfig.from_dict(entry, where))
            else:
                raise ConfigError(f"{where}: invalid LLMConfig type: {type(entry).__name__}")
        if not configs:
            raise ConfigError("List of models is empty.")
        if len({c.model_id for c in configs}) != len(configs):
            raise ConfigError("Duplicate models found. Make sure model ids are unique.")
        self.llm_configs = configs
        if self.ingress_cls_config and self.ingress_cls_config.get("ingress_cls"):
            raise ConfigError("ingress_cls_config.ingress_cls is not supported by surge: "
                              "its OpenAI ingress is built in")

    @property
    def configs(self) -> list[LLMConfig]:
        return list(self.llm_configs)


def _config_file(path: str, where: str) -> LLMConfig:
    import yaml

    if not os.path.exists(path):
        raise ConfigError(f"Could not load model config from {path}, as the file does not "
                          "exist.")
    with open(path) as handle:
        return LLMConfig.from_dict(yaml.safe_load(handle), f"{where} ({path})")
