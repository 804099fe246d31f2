"""Multi-host tests: hosts as network namespaces (netns.py), a Ray cluster across them
and surge on it (cluster.py). Skipped, with the reason, where namespaces cannot be made
(no iproute2, no CAP_NET_ADMIN) or Ray is not installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.multihost.cluster import HostsCluster, hosts_cluster
from tests.multihost.netns import unavailable_reason

_reason = unavailable_reason()


def skip_without_namespaces() -> None:
    if _reason is not None:
        pytest.skip(f"multi-host tests need Linux network namespaces: {_reason}")


@pytest.fixture(scope="package")
def hosts() -> Iterator[HostsCluster]:
    """The four-host cluster with surge started on it (tests/multihost/cluster.py)."""
    skip_without_namespaces()
    pytest.importorskip("ray", reason="the multi-host tests run surge's ray backend: "
                                      "pip install 'surge[ray]'")
    with hosts_cluster() as cluster:
        cluster.deploy()
        yield cluster
