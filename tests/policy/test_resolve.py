"""policy_target: what `autoscaling_config.policy` names, read one way by a deploy
(resolve_policy) and by a config file's check of the proactive policy's kwargs."""

from __future__ import annotations

from typing import Any

import pytest

from surge.policy.resolve import DEFAULT_POLICY, policy_target


def _mine(ctx: Any) -> tuple[int, dict[str, Any]]:
    return 1, {}


@pytest.mark.parametrize(("spec", "expected"), [
    (None, DEFAULT_POLICY),
    ({}, DEFAULT_POLICY),
    ({"policy_function": None}, DEFAULT_POLICY),
    ({"policy_function": ""}, DEFAULT_POLICY),
    ({"policy_function": "proactive"}, "proactive"),
    ({"policy_function": "ray.serve.autoscaling_policy:default_autoscaling_policy"},
     "ray_default"),
    ({"policy_function": "my.module:policy"}, "my.module:policy"),
    ({"policy_function": _mine}, _mine),
])
def test_policy_target(spec: dict[str, Any] | None, expected: Any) -> None:
    assert policy_target(spec) == expected
