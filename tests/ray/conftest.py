"""One small Ray cluster per test package (tests/ray/cluster.py); skipped without Ray."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("ray", reason="the ray backend's tests need `pip install 'surge[ray]'`")

from tests.ray.cluster import RayCluster, ray_cluster


@pytest.fixture(scope="package")
def cluster() -> Iterator[RayCluster]:
    with ray_cluster() as running:
        yield running
