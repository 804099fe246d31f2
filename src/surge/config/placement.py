"""Ray Serve's checks of a deployment's placement-group options, with Ray 2.60's messages.

surge places no placement groups (the options are accepted with a warning and not used),
but a deployment Ray refuses is refused here too, when it is declared: a strategy Ray
does not know, bundles that are not a non-empty list of non-empty resource mappings,
a strategy or label selector without bundles, and a first bundle (where Ray puts the
replica itself) smaller than the replica's `ray_actor_options` (`num_cpus` counts as 1
when unset, as Ray's default for a replica).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["STRATEGIES", "override_problem", "placement_group_problem"]

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_STRATEGY_SET = "{" + ", ".join(repr(s) for s in STRATEGIES) + "}"  # as Ray prints its set
_EXAMPLE = 'For example: `[{"CPU": 1.0}, {"GPU": 1.0}]`.'
_FIRST_BUNDLE = ("When using `placement_group_bundles`, the replica actor will be placed in "
                 "the first bundle, so the resource requirements for the actor must be a "
                 "subset of the first bundle.")


def placement_group_problem(options: Mapping[str, Any]) -> str | None:
    """Why Ray refuses these deployment options' placement group (None: it does not)."""
    bundles = options.get("placement_group_bundles")
    if bundles is None:
        for key in ("placement_group_strategy", "placement_group_bundle_label_selector"):
            if options.get(key) is not None:
                return f"If `{key}` is provided, `placement_group_bundles` must also be provided."
        return None
    return override_problem(options) or _fit_problem(bundles[0],
                                                     options.get("ray_actor_options") or {})


def override_problem(options: Mapping[str, Any]) -> str | None:
    """The part of the check that a config file's deployment override fails on its own
    (the strategy, the bundles' shape); the rest depends on the code's options too."""
    strategy = options.get("placement_group_strategy")
    if strategy is not None and strategy not in STRATEGIES:
        return (f"Invalid placement group strategy {strategy}. "
                f"Supported strategies are: {_STRATEGY_SET}.")
    bundles = options.get("placement_group_bundles")
    return None if bundles is None else _bundles_problem(bundles)


def _bundles_problem(bundles: Any) -> str | None:
    if not isinstance(bundles, list):
        return f"Placement group bundles must be a list, got {type(bundles)}."
    if not bundles:
        return ("Bundles must be a non-empty list of resource dictionaries. "
                f"{_EXAMPLE} Got empty list instead.")
    for bundle in bundles:
        if not (isinstance(bundle, Mapping) and all(isinstance(k, str) for k in bundle)
                and all(isinstance(v, int | float) for v in bundle.values())):
            return f"Bundles must be a non-empty list of resource dictionaries. {_EXAMPLE}"
        if not any(bundle.values()):
            return ("Bundles cannot be an empty dictionary or resources with only 0 values. "
                    f"Bundles: {bundles}")
    return None


def _fit_problem(first: Mapping[str, float], actor: Mapping[str, Any]) -> str | None:
    num_cpus = 1 if actor.get("num_cpus") is None else actor["num_cpus"]
    needs = [("num_cpus", "CPU", num_cpus), ("num_gpus", "GPU", actor.get("num_gpus") or 0)]
    for option, resource, amount in needs:
        if first.get(resource, 0) < amount:
            return (f"{_FIRST_BUNDLE} `{option}` for the actor is {amount}, but the bundle "
                    f"only has {first.get(resource, 0)} `{resource}` specified.")
    for resource, amount in (actor.get("resources") or {}).items():
        if first.get(resource, 0) < amount:
            return (f"{_FIRST_BUNDLE} `{resource}` requirement for the actor is {amount}, "
                    f"but the bundle only has {first.get(resource, 0)} `{resource}` "
                    "specified.")
    return None
