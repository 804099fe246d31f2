"""Placement-group options Ray 2.60 refuses when a deployment is declared, refused by
surge too with Ray's messages (surge accepts the valid ones with a warning and does not
place groups). The messages were observed on Ray 2.60's `@serve.deployment`."""

from __future__ import annotations

from typing import Any

import pytest

from surge import serve
from surge.config.placement import placement_group_problem

FIRST = ("When using `placement_group_bundles`, the replica actor will be placed in the "
         "first bundle, so the resource requirements for the actor must be a subset of the "
         "first bundle. ")
EXAMPLE = 'For example: `[{"CPU": 1.0}, {"GPU": 1.0}]`.'


@pytest.mark.parametrize(("options", "message"), [
    ({"placement_group_strategy": "BAD", "placement_group_bundles": [{"CPU": 1}]},
     "Invalid placement group strategy BAD. Supported strategies are: "
     "{'PACK', 'SPREAD', 'STRICT_PACK', 'STRICT_SPREAD'}."),
    ({"placement_group_bundles": [{"GPU": 1}]},  # num_cpus unset counts as 1
     FIRST + "`num_cpus` for the actor is 1, but the bundle only has 0 `CPU` specified."),
    ({"placement_group_bundles": [{"CPU": 1}], "ray_actor_options": {"num_cpus": 2}},
     FIRST + "`num_cpus` for the actor is 2, but the bundle only has 1 `CPU` specified."),
    ({"placement_group_bundles": [{"CPU": 1}], "ray_actor_options": {"num_gpus": 1}},
     FIRST + "`num_gpus` for the actor is 1, but the bundle only has 0 `GPU` specified."),
    ({"placement_group_bundles": [{"CPU": 1}], "ray_actor_options": {"resources": {"x": 1}}},
     FIRST + "`x` requirement for the actor is 1, but the bundle only has 0 `x` specified."),
    ({"placement_group_strategy": "PACK"},
     "If `placement_group_strategy` is provided, `placement_group_bundles` must also be "
     "provided."),
    ({"placement_group_bundle_label_selector": [{"a": "b"}]},
     "If `placement_group_bundle_label_selector` is provided, `placement_group_bundles` "
     "must also be provided."),
    ({"placement_group_bundles": []},
     f"Bundles must be a non-empty list of resource dictionaries. {EXAMPLE} Got empty list "
     "instead."),
    ({"placement_group_bundles": [{"CPU": 0}]},
     "Bundles cannot be an empty dictionary or resources with only 0 values. "
     "Bundles: [{'CPU': 0}]"),
    ({"placement_group_bundles": {"CPU": 1}},
     "Placement group bundles must be a list, got <class 'dict'>."),
    ({"placement_group_bundles": [{"CPU": "1"}]},
     f"Bundles must be a non-empty list of resource dictionaries. {EXAMPLE}"),
])
def test_ray_refuses_these_placement_groups_and_so_does_surge(options: dict[str, Any],
                                                               message: str) -> None:
    assert placement_group_problem(options) == message
    with pytest.raises(ValueError) as info:
        serve.deployment(**options)(lambda: "hi")
    assert str(info.value) == message


def test_options_are_checked_again() -> None:
    fine = serve.deployment(placement_group_bundles=[{"CPU": 1, "GPU": 1}],
                            placement_group_strategy="STRICT_SPREAD",
                            ray_actor_options={"num_cpus": 1, "num_gpus": 0.5})(lambda: "hi")
    with pytest.raises(ValueError, match="Invalid placement group strategy NOPE"):
        fine.options(placement_group_strategy="NOPE")
    assert placement_group_problem({}) is None
