"""controller.groups: what the loop asks of a deployment's replicas, kept as they change."""

from __future__ import annotations

from surge.backends.base import LOCAL_PLACEMENT
from surge.config import HTTPOptions
from surge.controller.state import ControllerState, ReplicaRecord
from surge.model import DeploymentId
from surge.policy.lifecycle import ReplicaState

DID = DeploymentId("app", "Model")


def new_state() -> ControllerState:
    return ControllerState("127.0.0.1:1", HTTPOptions(), 1, head=LOCAL_PLACEMENT)


def asks_spec(state: ControllerState, replica_id: str, rank: int = -1) -> ReplicaRecord:
    replica = ReplicaRecord(replica_id, DID, 1, 0.0, rank=rank)
    state.add_replica(replica)
    state.spec_sent(replica)
    return replica


def test_each_replica_gets_the_lowest_rank_no_other_holds() -> None:
    state = new_state()
    assert [asks_spec(state, f"r{i}").rank for i in range(3)] == [0, 1, 2]
    state.remove_replica("r1")
    assert asks_spec(state, "r3").rank == 1  # the freed one first
    asks_spec(state, "adopted", rank=5)  # re-adopted after a restart: keeps its rank
    assert [asks_spec(state, f"r{i}").rank for i in range(4, 7)] == [3, 4, 6]
    state.remove_replica("r0")
    state.remove_replica("r2")
    assert [asks_spec(state, f"r{i}").rank for i in range(7, 10)] == [0, 2, 7]


def test_the_running_changes_are_the_ids_in_or_out_of_running_since_taken() -> None:
    state = new_state()
    a, b = asks_spec(state, "a"), asks_spec(state, "b")
    group = state.group(DID)
    assert group.take_running_changes() == set()  # STARTING is not RUNNING
    a.move(ReplicaState.RUNNING)
    b.move(ReplicaState.RUNNING)
    b.move(ReplicaState.DRAINING)
    assert group.take_running_changes() == {"a", "b"}
    assert group.take_running_changes() == set()
    state.remove_replica("a")
    assert group.take_running_changes() == {"a"}
