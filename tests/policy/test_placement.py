"""policy.placement: proxy_location as a set of nodes, and ports on shared IPs."""

from __future__ import annotations

import pytest

from surge.policy.placement import proxy_nodes, proxy_port


@pytest.mark.parametrize(
    ("location", "replica_nodes", "expected"),
    [
        ("EveryNode", [], {"head"}),
        ("EveryNode", ["a", "b", "a"], {"head", "a", "b"}),
        ("EveryNode", ["head"], {"head"}),
        ("HeadOnly", ["a", "b"], {"head"}),
        ("Disabled", ["a"], set()),
        ("NoServer", ["a"], set()),
    ],
)
def test_proxy_nodes(location: str, replica_nodes: list[str], expected: set[str]) -> None:
    assert proxy_nodes(location, "head", replica_nodes) == expected


@pytest.mark.parametrize(
    ("configured", "taken", "expected"),
    [
        (8000, [], 8000),  # alone on its IP: the configured port
        (8000, [8000], 8001),  # the head's proxy holds 8000 on this IP
        (8000, [8000, 8001, 8003], 8002),  # first gap (a proxy left)
        (8000, [9000], 8000),
        (0, [0, 8000], 0),  # any free port, each proxy its own
    ],
)
def test_proxy_port(configured: int, taken: list[int], expected: int) -> None:
    assert proxy_port(configured, taken) == expected
