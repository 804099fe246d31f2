"""The start-up split into process start + weight load, with and without a weight store
on each node: exact times on constant distributions."""

from __future__ import annotations

import random
from typing import Any

import pytest

from surge.policy.reconcile import StartReplicas
from surge.sim.cluster import ClusterState
from surge.sim.scenario import Scenario, ScenarioError
from surge.sim.sweep import simulate
from tests.sim.test_engine import AUTOSCALED, assert_conserved, scenario


def cluster(**keys: Any) -> ClusterState:
    spec = scenario(**{f"cluster__{k}": v for k, v in keys.items()}).cluster
    return ClusterState(spec, random.Random(0))


def ready_times(state: ClusterState) -> list[float]:
    return sorted(when for when, *_ in state._events)


def test_without_a_store_every_replica_pays_process_start_and_weight_load() -> None:
    state = cluster(nodes=2, replicas_per_node=4, process_start_s=0.5, weight_load_s=10)
    state.apply([StartReplicas(3, "test")], now=0.0)
    assert ready_times(state) == [10.5, 10.5, 10.5]
    assert [r.node for r in state.replicas.values()] == [0, 1, 0]  # spread


def test_with_a_store_the_first_replica_on_a_node_loads_and_the_rest_map() -> None:
    state = cluster(nodes=2, replicas_per_node=4, process_start_s=0.5, weight_load_s=10,
                    weight_store=True, store_load_s=0.05)
    state.apply([StartReplicas(3, "test")], now=0.0)
    # node 0: the first loads (10.5); the third waits for it, then maps; node 1 loads
    assert ready_times(state) == [10.5, 10.5, 10.55]
    state.apply([StartReplicas(2, "test")], now=20.0)  # both nodes hold the weights now
    assert ready_times(state)[-2:] == [20.55, 20.55]


def test_warm_replicas_have_filled_their_nodes_stores() -> None:
    state = cluster(nodes=2, replicas_per_node=4, process_start_s=0.5, weight_load_s=10,
                    weight_store=True)
    state.warm(0.0, running=1, standby=0)
    state.apply([StartReplicas(2, "test")], now=1.0)
    assert ready_times(state) == [1.55, 11.5]  # node 0 maps (default 0.05 s); node 1 loads


@pytest.mark.parametrize(("keys", "message"), [
    ({"process_start_s": 1}, r"cluster.weight_load_s is missing"),
    ({"weight_load_s": 1}, r"cluster.process_start_s is missing"),
    ({"weight_store": True}, r"weight_store needs the start-up split"),
    ({"process_start_s": 1, "weight_load_s": 1, "weight_store": "yes"},
     r"weight_store must be true or false"),
])
def test_a_half_split_is_a_clear_error(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario(**{f"cluster__{k}": v for k, v in keys.items()})


def test_the_split_replaces_startup_s_so_a_variant_can_set_it() -> None:
    s = scenario(cluster__process_start_s=1, cluster__weight_load_s=3)
    assert s.cluster.weights is not None and s.cluster.weights.weight_load_s.mean == 3
    assert not s.cluster.weights.store
    base: Scenario = scenario()
    varied = base.with_overrides({"weight_store": True, "process_start_s": 0.3,
                                  "weight_load_s": 5, "store_load_s": 0.01})
    assert varied.cluster.weights is not None and varied.cluster.weights.store


def test_the_store_shortens_a_scale_up_on_one_node() -> None:
    """1 -> 4 replicas on one node after a jump: without the store each new replica loads
    for 5 s; with it the first one's weights were loaded before the run (warm), so the
    new ones map them and serve 0.3 s + 0.01 s after they are asked for."""
    config = {**AUTOSCALED, "standby_replicas": 0, "max_replicas": 4}
    runs = {}
    for store in (False, True):
        runs[store] = simulate(scenario(
            traffic__schedule=[{"rps": 50, "for_s": 1}, {"rps": 300, "for_s": 8}],
            deployment__num_replicas=None, deployment__autoscaling_config=config,
            cluster__process_start_s=0.3, cluster__weight_load_s=5,
            cluster__weight_store=store, cluster__store_load_s=0.01))
        assert_conserved(runs[store].simulation)
    first_full = {store: min(s.t for s in run.simulation.replicas if s.running == 4)
                  for store, run in runs.items()}
    assert first_full[True] < 1.6 < 6.0 < first_full[False]
