"""A scenario file's keys: each section's, the short aliases that name them, and
overrides by dotted path.

An override names a dotted path into the YAML (`deployment.autoscaling_config.
min_replicas`) or a short alias (`min_replicas`, `policy`, `startup_s`: see ALIASES);
`apply_overrides` sets each on a copy of the scenario's mapping, which is then validated
as a whole (sim/scenario.py), so sweeps and variants are checked as files are.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from surge.config import AutoscalingConfig
from surge.config.schema import closest
from surge.errors import ConfigError
from surge.sim.multiplexing import KEYS as _MULTIPLEX

__all__ = ["ALIASES", "BATCHING_KEYS", "CLUSTER_KEYS", "CONTROL_KEYS", "SERVICE_KEYS",
           "TOP_KEYS", "TRAFFIC_KEYS", "ScenarioError", "apply_overrides", "resolve_key"]


class ScenarioError(ConfigError):
    """A scenario file (or an override) is invalid; the message names file and field."""


# Each section's keys; an unknown one is an error naming the closest (config/schema.py).
TOP_KEYS = ("name", "description", "seed", "start_time", "cluster", "service", "traffic",
            "deployment", "slo_ms", "control", "fine_step_ms", "multiplex", "llm", "variants")
CONTROL_KEYS = ("report_interval_s", "urgent_decisions", "clock_offset_s", "decision_s",
                "fanout_s", "measured")
CLUSTER_KEYS = ("nodes", "replicas_per_node", "proxies_per_node", "startup_s",
                "process_start_s", "weight_load_s", "weight_store", "store_load_s",
                "standby_activation_s", "drain_s")
SERVICE_KEYS = ("service_time_ms", "overhead_ms", "batching")
BATCHING_KEYS = ("max_batch_size", "batch_wait_timeout_s", "per_item_ms")
TRAFFIC_KEYS = ("schedule", "arrivals", "timeout_s")

_AUTOSCALING_FIELDS = tuple(f.name for f in dataclasses.fields(AutoscalingConfig))
ALIASES: dict[str, str] = {
    **{name: f"deployment.autoscaling_config.{name}" for name in _AUTOSCALING_FIELDS
       if name != "policy"},
    "policy": "deployment.autoscaling_config.policy.policy_function",
    "policy_kwargs": "deployment.autoscaling_config.policy.policy_kwargs",
    **{name: f"deployment.{name}" for name in ("num_replicas", "max_ongoing_requests",
                                               "max_queued_requests", "max_queue_wait_s")},
    **{name: f"cluster.{name}" for name in CLUSTER_KEYS},
    **{name: f"service.{name}" for name in SERVICE_KEYS},
    **{name: f"traffic.{name}" for name in ("arrivals", "timeout_s")},
    **{name: f"control.{name}" for name in CONTROL_KEYS},
    **{name: f"multiplex.{name}" for name in _MULTIPLEX},
}  # `schedule` is the autoscaling floors' schedule; traffic's is `traffic.schedule`


def resolve_key(key: str) -> str:
    """A dotted path into the scenario, from itself or a short alias."""
    if "." in key:
        return key
    if key in ALIASES:
        return ALIASES[key]
    if key in TOP_KEYS:
        return key
    close = closest(key, [*ALIASES, *TOP_KEYS])
    hint = f" Did you mean {close!r}?" if close else ""
    raise ScenarioError(f"unknown scenario key {key!r}: give a dotted path like "
                        f"deployment.autoscaling_config.min_replicas or an alias.{hint}")


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any],
                    where: str = "override") -> dict[str, Any]:
    """A deep copy of `data` with each dotted path (or alias) set to its value."""
    result: dict[str, Any] = copy.deepcopy(dict(data))
    for key, value in overrides.items():
        path = resolve_key(str(key)).split(".")
        node: Any = result
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ScenarioError(f"{where}: cannot set {key!r}: "
                                    f"{'.'.join(path[:depth + 1])} is not a mapping")
            node = child
        node[path[-1]] = copy.deepcopy(value)
    return result

