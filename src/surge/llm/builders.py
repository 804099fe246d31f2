"""`build_llm_deployment` and `build_openai_app`, with Ray Serve LLM's signatures.

`build_openai_app` with one model returns the model's LLMServer deployment as the app's
ingress (one hop: proxy → LLMServer replica → engine); with several, an `OpenAiIngress`
in front of one LLMServer deployment each (Ray's shape), whose model map the proxy
routes by (still one hop; see llm/ingress.py). Deployment options are merged
as Ray merges them: surge's LLM defaults, then the config's `deployment_config`, then
`override_serve_options`; a `num_replicas` drops the default autoscaling config.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

from surge.api.deployment import Application, deployment
from surge.errors import ConfigError
from surge.llm.config import LLMConfig, LLMServingArgs, deployment_name_for
from surge.llm.ingress import OpenAiIngress
from surge.llm.server import LLMServer, load_class

__all__ = ["build_llm_deployment", "build_openai_app", "merge_options"]

log = logging.getLogger("surge.llm")

# The ingress only forwards bytes: it must never be the bottleneck of many streams.
INGRESS_MAX_ONGOING_REQUESTS = 10_000


def merge_options(defaults: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Ray's `maybe_apply_llm_deployment_config_defaults`: a deep merge, override wins."""
    base = copy.deepcopy(dict(defaults))
    if "num_replicas" in override:
        base.pop("autoscaling_config", None)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            base[key] = merge_options(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def build_llm_deployment(llm_config: LLMConfig | Mapping[str, Any], *,
                         name_prefix: str | None = None,
                         bind_kwargs: Mapping[str, Any] | None = None,
                         override_serve_options: Mapping[str, Any] | None = None,
                         deployment_cls: type | None = None) -> Application:
    """One LLMServer deployment for `llm_config`, bound (an Application)."""
    config = LLMConfig.from_dict(llm_config, "llm_config")
    cls: Any = deployment_cls or config.server_cls or LLMServer
    if isinstance(cls, str):
        cls = load_class(cls)
    prefix = name_prefix if name_prefix is not None else f"{cls.__name__}:"
    options = cls.get_deployment_options(config)
    name = options.pop("name", None) or deployment_name_for(config)
    options = merge_options(cls.default_options(config) if hasattr(cls, "default_options")
                            else {}, options)
    options.update(override_serve_options or {})
    options["name"] = prefix + name
    app: Application = deployment(cls, **options).bind(llm_config=config,
                                                       **dict(bind_kwargs or {}))
    return app


def build_openai_app(llm_serving_args: LLMServingArgs | Mapping[str, Any]) -> Application:
    """An OpenAI-compatible application serving every model of `llm_serving_args`."""
    args = LLMServingArgs.from_dict(llm_serving_args, "llm_serving_args")
    configs = args.configs
    if len(configs) == 1 and not args.ingress_deployment_config:
        log.info("build_openai_app: one model (%s): its LLMServer is the ingress (one hop)",
                 configs[0].model_id)
        return build_llm_deployment(configs[0])
    servers = {c.model_id: build_llm_deployment(c) for c in configs}
    options = merge_options({"max_ongoing_requests": INGRESS_MAX_ONGOING_REQUESTS,
                             "ray_actor_options": {"num_cpus": 0}},
                            args.ingress_deployment_config)
    options.setdefault("name", "OpenAiIngress")
    if "num_replicas" not in options and "autoscaling_config" not in options:
        options["num_replicas"] = 1
    if options.get("max_ongoing_requests", 1) < 1:
        raise ConfigError("ingress_deployment_config.max_ongoing_requests must be >= 1")
    app: Application = deployment(OpenAiIngress, **options).bind(llm_deployments=servers)
    return app
