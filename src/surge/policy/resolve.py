"""Which autoscaling policy a deployment runs: `autoscaling_config.policy` -> a callable.

`policy_function` is a built-in name (`proactive`, the default, or `ray_default`), a
`module:attr` import path, or a callable / class given directly; `policy_kwargs` go to
the proactive policy's settings, to a user class's constructor (built once) or to each
call of a user function. The controller's autoscaler and the simulator resolve
policies here, so both run the very same decision function.

`HISTORY_S` is how much load history (0.1 s samples) the autoscaler keeps: no policy
can look further back than that.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from surge.config import AutoscalingConfig
from surge.errors import ConfigError
from surge.model import DeploymentId
from surge.policy.autoscaling import (
    Decision,
    PolicyState,
    ProactiveSettings,
    ScalingInputs,
    UserPolicy,
    custom,
    proactive,
    ray_default,
)

__all__ = ["DEFAULT_POLICY", "HISTORY_S", "Policy", "policy_target", "resolve_policy"]

# A minute of 0.1 s samples: more than any built-in window, bounded memory per deployment.
HISTORY_S = 60.0
DEFAULT_POLICY = "proactive"
# Ray's import paths of its own policies: the same decisions, implemented here.
ALIASES = {"ray.serve.autoscaling_policy:default_autoscaling_policy": "ray_default"}

Policy = Callable[[ScalingInputs, AutoscalingConfig, PolicyState], Decision]


def policy_target(spec: Mapping[str, Any] | None) -> Any:
    """What `policy_function` names: a built-in's name (Ray's aliases read as ours, none
    given as the default), a `module:attr` string or the callable itself."""
    target = (spec or {}).get("policy_function", DEFAULT_POLICY) or DEFAULT_POLICY
    return ALIASES.get(target, target) if isinstance(target, str) else target


def resolve_policy(config: AutoscalingConfig, deployment: DeploymentId) -> Policy:
    """The policy named by `autoscaling_config.policy` (a built-in name or module:attr)."""
    spec: Mapping[str, Any] = config.policy or {}
    target = policy_target(spec)
    kwargs = dict(spec.get("policy_kwargs") or {})
    if target == DEFAULT_POLICY:
        try:
            settings = ProactiveSettings.from_kwargs(kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"policy_kwargs of the proactive policy: {exc}") from None
        return lambda inputs, cfg, state: proactive(inputs, cfg, state, settings)
    if target == "ray_default":
        return ray_default
    user = _load_user_policy(target, kwargs)
    return lambda inputs, cfg, state: custom(user, inputs, cfg, state, deployment.name,
                                             deployment.app)


def _load_user_policy(target: Any, kwargs: dict[str, Any]) -> UserPolicy:
    if isinstance(target, str):
        module_name, _, attr = target.partition(":")
        if not attr:
            raise ConfigError(f"autoscaling policy {target!r} is neither a built-in "
                              "('proactive', 'ray_default') nor a 'module:attribute' path")
        try:
            found = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load autoscaling policy {target!r}: {exc}") from None
    else:
        found = target
    if isinstance(found, type):
        found = found(**kwargs)
    elif kwargs:
        original = found
        found = lambda ctx: original(ctx, **kwargs)  # noqa: E731
    if not callable(found):
        raise ConfigError(f"autoscaling policy {target!r} is not callable")
    policy: UserPolicy = found
    return policy
