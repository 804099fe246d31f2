"""Replica lifecycle: every pair of states is either in TRANSITIONS or IllegalTransition."""

from __future__ import annotations

import itertools

import pytest

from surge.policy.lifecycle import (
    ALIVE,
    ROUTABLE,
    TRANSITIONS,
    IllegalTransition,
    ReplicaState,
    transition,
)

S = ReplicaState
PAIRS = list(itertools.product(ReplicaState, repeat=2))
LEGAL = [(a, b) for a, b in PAIRS if b in TRANSITIONS[a]]
ILLEGAL = [(a, b) for a, b in PAIRS if b not in TRANSITIONS[a]]


def test_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(ReplicaState)
    for targets in TRANSITIONS.values():
        assert targets <= set(ReplicaState)


def test_table_is_the_drawn_diagram() -> None:
    assert dict(TRANSITIONS) == {
        S.STARTING: {S.STANDBY, S.RUNNING, S.DRAINING, S.STOPPED, S.FAILED},
        S.STANDBY: {S.RUNNING, S.DRAINING, S.STOPPED, S.FAILED},
        S.RUNNING: {S.DRAINING, S.FAILED},
        S.DRAINING: {S.STOPPED, S.FAILED},
        S.STOPPED: set(),
        S.FAILED: set(),
    }


@pytest.mark.parametrize(("current", "new"), LEGAL, ids=lambda s: s.value)
def test_legal_transition_returns_the_new_state(current: ReplicaState,
                                                new: ReplicaState) -> None:
    assert transition(current, new) is new


@pytest.mark.parametrize(("current", "new"), ILLEGAL, ids=lambda s: s.value)
def test_illegal_transition_names_both_states(current: ReplicaState, new: ReplicaState) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(current, new)
    assert (info.value.current, info.value.new) == (current, new)
    assert str(info.value) == f"replica cannot go from {current.value} to {new.value}"


def test_no_state_returns_to_itself_or_to_starting() -> None:
    assert all(a not in TRANSITIONS[a] for a in ReplicaState)
    assert all(S.STARTING not in targets for targets in TRANSITIONS.values())


def test_every_live_state_can_fail_and_terminal_states_are_final() -> None:
    for state in ReplicaState:
        if state in ALIVE:
            assert S.FAILED in TRANSITIONS[state]
        else:
            assert TRANSITIONS[state] == frozenset()
    assert {S.STOPPED, S.FAILED} == set(ReplicaState) - ALIVE


def test_running_is_the_only_routable_state_and_leaves_only_by_draining_or_failing() -> None:
    assert set(ROUTABLE) == {S.RUNNING}
    assert ROUTABLE <= ALIVE
    assert TRANSITIONS[S.RUNNING] == {S.DRAINING, S.FAILED}


def test_every_state_reaches_a_terminal_state() -> None:
    for start in ReplicaState:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & {S.STOPPED, S.FAILED}


def test_states_are_strings() -> None:
    assert S.RUNNING == "RUNNING"
    assert ReplicaState("DRAINING") is S.DRAINING
