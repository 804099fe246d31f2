"""The chaos suite, short profile: each scenario under ~7 s of load on a fresh instance.

Each run asserts every check of its scenario (tests/chaos/scenarios.py) and prints its
row; the whole table is printed at the end of the session. `bench/chaos.py` runs the
same scenarios longer and harder.
"""

from __future__ import annotations

import pytest

from tests.chaos.harness import Outcome, details, table
from tests.chaos.scenarios import (
    SHORT,
    HangReplica,
    InitRaises,
    KillController,
    KillProxy,
    KillReplica,
    Overload,
    Scenario,
    run_scenario,
)

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

SCENARIOS = [
    pytest.param(KillReplica(), id="kill-replica"),
    pytest.param(KillProxy(), id="kill-proxy"),
    pytest.param(KillController(), id="kill-controller"),
    pytest.param(HangReplica(), id="hang-replica"),
    pytest.param(InitRaises(), id="init-raises"),
    pytest.param(Overload(2), id="overload-2x"),
    pytest.param(Overload(10), id="overload-10x"),
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario: Scenario, outcomes: list[Outcome]) -> None:
    outcome = run_scenario(scenario, SHORT)
    outcomes.append(outcome)
    print(details(outcome))
    print(table([outcome]))
    assert outcome.problems == []
