"""The weight store on the ray backend: one store per node, started by the first
replica's host there; replicas on a node share its entry; nothing is left after."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from surge import serve
from tests.eventually import eventually
from tests.ray.apps import Weighted
from tests.ray.cluster import RayCluster, surge_on

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def test_one_store_per_node_shared_by_its_replicas(cluster: RayCluster, tmp_path: Path) -> None:
    directory = tempfile.mkdtemp(prefix="surge-ray-", dir="/dev/shm")
    source = tmp_path / "m.safetensors"
    save_file({"x": np.arange(1 << 16, dtype=np.float32)}, str(source))
    try:
        reports = tmp_path / "reports"
        reports.mkdir()
        with surge_on(cluster, weight_store={"directory": directory}):
            serve.run(Weighted.bind(str(source), str(reports)), name="weighted",
                      route_prefix="/weighted")

            def three_reports() -> list[dict[str, Any]]:
                found = [json.loads(p.read_text()) for p in reports.glob("*.json")]
                return found if len(found) == 3 else []

            answers = eventually(three_reports, 60, what="3 replicas reporting")
            assert all(a["shared"] for a in answers)
            assert len({a["key"] for a in answers}) == 1
            assert {a["sum"] for a in answers} == {float(np.arange(1 << 16).sum())}
            by_node: dict[object, set[object]] = {}
            for a in answers:
                by_node.setdefault(a["node"], set()).add((a["store_pid"], a["path"]))
            # each node: one store, one entry; different nodes: different stores
            assert all(len(stores) == 1 for stores in by_node.values())
            assert len({next(iter(s)) for s in by_node.values()}) == len(by_node)
            assert len(os.listdir(directory)) == len(by_node)
        eventually(lambda: os.listdir(directory) == [], 30, what="every store's files gone")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
