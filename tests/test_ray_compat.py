"""docs/ray-compat.md is what scripts/ray_compat.py makes of the checked-in snapshot of Ray
Serve's surface and of surge as it is now, so a surge change that makes the table stale
fails here, without Ray (regenerate: python scripts/ray_compat.py --from-snapshot)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ray_compat.py"


def _load_script() -> Any:
    spec = importlib.util.spec_from_file_location("ray_compat", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


compat = _load_script()


def snapshot() -> dict[str, Any]:
    surface: dict[str, Any] = json.loads(compat.snapshot_path().read_text())
    return surface


def test_the_table_is_up_to_date() -> None:
    expected = compat.expected_page(compat.snapshot_path())
    assert compat.TABLE.read_text() == expected, (
        "docs/ray-compat.md is stale: python scripts/ray_compat.py --from-snapshot")


def test_the_snapshot_holds_names_only() -> None:
    surface = snapshot()
    for group in compat.GROUPS:
        for names in surface[group].values():
            assert names == sorted(names) and all(isinstance(n, str) for n in names)


def statuses(surface: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(t.key, r.name): r.status for t in compat.classify(surface, {}) for r in t.rows}


def test_each_answer_comes_from_surges_source() -> None:
    surface = {**snapshot(), "names": {"ray.serve": ["run", "zz_not_in_surge"],
                                       "ray.serve.config": ["RequestRouterConfig"],
                                       "ray.serve.metrics": ["Counter", "zz_not_in_surge"]}}
    found = statuses(surface)
    assert found[("ray.serve", "run")] == compat.IMPLEMENTED
    assert found[("ray.serve", "zz_not_in_surge")] == compat.MISSING
    assert found[("ray.serve.config", "RequestRouterConfig")] == compat.IMPLEMENTED
    # ... of which surge uses some fields (surge.config.RAY_FIELDS_ACCEPTED marks the rest)
    router = "ray.serve.config:RequestRouterConfig"
    assert found[(router, "request_routing_stats_period_s")] == compat.IMPLEMENTED
    assert found[(router, "request_router_class")] == compat.ACCEPTED
    assert found[("ray.serve.metrics", "Counter")] == compat.IMPLEMENTED
    assert found[("ray.serve.metrics", "zz_not_in_surge")] == compat.MISSING
    assert found[("ray.serve:deployment", "placement_group_bundles")] == compat.ACCEPTED
    assert found[("ray.serve:start", "tracing_config")] == compat.ACCEPTED  # **kwargs
    assert found[("ray.serve.schema:ServeDeploySchema", "target_capacity")] == compat.ACCEPTED


def test_a_note_must_name_an_item_both_sides_have() -> None:
    surface = {**snapshot(), "names": {"ray.serve": ["run", "zz_not_in_surge"]}}
    with pytest.raises(SystemExit, match="Ray Serve has no such item"):
        compat.classify(surface, {("ray.serve", "zz_gone_from_ray"): "a note"})
    with pytest.raises(SystemExit, match="surge does not have it"):
        compat.classify(surface, {("ray.serve", "zz_not_in_surge"): "a note"})
    with pytest.raises(SystemExit, match="one line"):
        compat.classify(surface, {("ray.serve", "run"): "two\nlines"})


def test_a_snapshot_that_does_not_fit_the_script_is_stale() -> None:
    surface = snapshot()
    surface["parameters"] = {k: v for k, v in surface["parameters"].items()
                             if k != "ray.serve:run"}
    with pytest.raises(SystemExit, match="regenerate"):
        compat.classify(surface)


def test_each_deliberate_difference_names_a_test_that_exists() -> None:
    root = compat.ROOT
    for behaviour in compat.BEHAVIOURS:
        path, _, name = behaviour.test.partition("::")
        source = (root / path).read_text()
        assert f"def {name}(" in source, f"{behaviour.what}: no test {behaviour.test}"


def test_ray_serve_api_and_the_private_replica_context_accessor_import() -> None:
    # Applications import from ray.serve.api, and Ray's own tests from the context module.
    from surge import serve
    from surge.serve import api
    from surge.serve.context import _get_internal_replica_context

    assert api.get_replica_context is serve.get_replica_context and api.run is serve.run
    assert api.multiplexed is serve.multiplexed
    assert _get_internal_replica_context() is None  # outside a replica
